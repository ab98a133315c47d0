package inbox_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/inboxtest"
)

// parcels books a parcel with a carrier's HTTP service for each paid order, then records the
// booking in the order's transaction.
type parcels struct {
	carrier string          // the carrier's booking URL
	booked  *inbox.Inserter // parcel (order_id, parcel_id)
}

var (
	_ inbox.Handler  = (*parcels)(nil)
	_ inbox.Preparer = (*parcels)(nil)
)

func (p *parcels) Decode(m *message.Message) (inbox.Decoded, error) {
	return inbox.Decoded{Key: string(m.Payload)}, nil // the order id
}

// Prepare calls the carrier before the step's transaction, holding no lock. It runs again on
// every attempt, redelivery and replay, and a call whose answer was lost may have booked, so
// the call carries an Idempotency-Key of the business key and the step: the carrier takes
// each repetition for the same booking.
func (p *parcels) Prepare(ctx context.Context, d *inbox.Delivery) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.carrier, strings.NewReader(d.Key))
	if err != nil {
		return err
	}
	req.Header.Set("Idempotency-Key", d.Key+"/book-parcel")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("book parcel: %w", err) // a failed attempt: retried
	}
	defer resp.Body.Close()
	var booking struct {
		ParcelID string `json:"parcelId"`
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("book parcel: %s", resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&booking); err != nil {
		return fmt.Errorf("book parcel: %w", err)
	}
	d.Prepared = booking.ParcelID
	return nil
}

// Handle records what Prepare booked, in the delivery's transaction.
func (p *parcels) Handle(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
	parcel, ok := d.Prepared.(string)
	if !ok {
		return 0, errors.New("no parcel booked")
	}
	return inbox.Done, p.booked.Insert(ctx, tx, d.Key, parcel)
}

// carrier is a fake carrier's booking service. It books one parcel per Idempotency-Key,
// and gives the same answer for every request with a key it has seen.
type carrier struct {
	mu     sync.Mutex
	keys   []string          // the Idempotency-Key of each request, in order
	parcel map[string]string // parcel id by key
}

func (c *carrier) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := r.Header.Get("Idempotency-Key")
	c.keys = append(c.keys, key)
	if c.parcel[key] == "" {
		c.parcel[key] = fmt.Sprintf("parcel-%d", len(c.parcel)+1)
	}
	_ = json.NewEncoder(w).Encode(map[string]string{"parcelId": c.parcel[key]})
}

// ExamplePreparer shows a handler whose step calls an outside service. Prepare makes the
// call outside any transaction, with an idempotency key of the business key and the step.
// It leaves the answer in d.Prepared for Handle. A retry prepares again. The carrier sees
// the same key and books nothing more.
func ExamplePreparer() {
	c := &carrier{parcel: map[string]string{}}
	srv := httptest.NewServer(c)
	defer srv.Close()
	booked, err := inbox.NewInserter("parcel", "order_id", "parcel_id")
	if err != nil {
		panic(err)
	}
	h := &parcels{carrier: srv.URL, booked: booked}

	d := &inbox.Delivery{Key: "o-1"}
	for attempt := 1; attempt <= 2; attempt++ { // the first attempt's transaction failed, say
		d.Attempt, d.Prepared = attempt, nil
		err := h.Prepare(context.Background(), d)
		fmt.Println(attempt, d.Prepared, err)
	}
	fmt.Println(c.keys, len(c.parcel), "parcel booked")
	// Output:
	// 1 parcel-1 <nil>
	// 2 parcel-1 <nil>
	// [o-1/book-parcel o-1/book-parcel] 1 parcel booked
}

// TestPreparerExampleInMemory runs the example's handler as the inbox runs it, Prepare then
// Handle. The handler records the parcel Prepare booked.
func TestPreparerExampleInMemory(t *testing.T) {
	c := &carrier{parcel: map[string]string{}}
	srv := httptest.NewServer(c)
	defer srv.Close()
	booked, err := inbox.NewInserter("parcel", "order_id", "parcel_id")
	if err != nil {
		t.Fatal(err)
	}
	out := inboxtest.InMemory(t, &parcels{carrier: srv.URL, booked: booked}, message.NewMessage("m-1", []byte("o-7")))
	if rows := out.Table("parcel"); out.Err != nil || len(rows) != 1 || rows[0].Value("order_id") != "o-7" || rows[0].Value("parcel_id") != "parcel-1" {
		t.Fatalf("error %v, rows %v; want one parcel row (o-7, parcel-1)", out.Err, out.Rows)
	}
	if len(c.keys) != 1 || c.keys[0] != "o-7/book-parcel" {
		t.Fatalf("the carrier saw keys %q, want one request keyed o-7/book-parcel", c.keys)
	}
}

// TestPluginsGuideShowsThePreparer checks that docs/PLUGINS.md shows the example's
// handler. Its Go code block under "Outside calls and idempotency keys" is a part of this
// file, verbatim. So it compiles and cannot drift.
func TestPluginsGuideShowsThePreparer(t *testing.T) {
	guide, err := os.ReadFile("../docs/PLUGINS.md")
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.ReadFile("prepare_example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	text := string(guide)
	start := strings.Index(text, "\n## Outside calls and idempotency keys\n")
	if start < 0 {
		t.Fatal(`docs/PLUGINS.md has no "## Outside calls and idempotency keys" section`)
	}
	section := text[start+1:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	block := regexp.MustCompile("(?s)```go\n(.*?)```").FindStringSubmatch(section)
	if block == nil {
		t.Fatal("the section has no Go code block")
	}
	if !strings.Contains(string(self), block[1]) || !strings.Contains(block[1], `req.Header.Set("Idempotency-Key", d.Key+"/book-parcel")`) {
		t.Fatalf("the section's Go code block is not a part of inbox/prepare_example_test.go: copy it from there\n%s", block[1])
	}
}
