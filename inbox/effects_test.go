package inbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/testenv"
)

// effects is a plain one-step handler written only with the inbox.Handler API: each
// delivery inserts one row into grouped_effect, a table with no unique key, so a second
// effect of one key shows as a second row. Hooks make chosen keys misbehave.
type effects struct {
	mu    sync.Mutex
	calls map[string]int       // Handle calls per key
	txs   map[string][]*sql.Tx // the transaction of each call, per key
	// misbehave, when set, runs before the key's insert of call n (1-based); its error is
	// returned after the insert, so the rolled-back write is a real one.
	misbehave func(ctx context.Context, key string, n int) error
	progress  func(key string, n int) inbox.Progress // nil: Done
}

var _ inbox.Handler = (*effects)(nil)

func newEffects() *effects {
	return &effects{calls: map[string]int{}, txs: map[string][]*sql.Tx{}}
}

// Decode: the payload is "key" or "key|variant" (another variant of a key is another
// fingerprint: a conflict).
func (h *effects) Decode(m *message.Message) (inbox.Decoded, error) {
	key, _, _ := strings.Cut(string(m.Payload), "|")
	if key == "" {
		return inbox.Decoded{}, inbox.PoisonError("empty key")
	}
	return inbox.Decoded{Key: key}, nil
}

func (h *effects) Handle(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
	h.mu.Lock()
	h.calls[d.Key]++
	n := h.calls[d.Key]
	h.txs[d.Key] = append(h.txs[d.Key], tx)
	h.mu.Unlock()
	if _, err := tx.ExecContext(ctx, "INSERT INTO grouped_effect (k, step) VALUES (?, ?)", d.Key, d.Step); err != nil {
		return inbox.Done, err
	}
	if h.misbehave != nil {
		if err := h.misbehave(ctx, d.Key, n); err != nil {
			return inbox.Done, err
		}
	}
	if h.progress != nil {
		return h.progress(d.Key, n), nil
	}
	return inbox.Done, nil
}

func (h *effects) callsOf(key string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls[key]
}

// transactions returns the distinct transactions Handle ran in, and those of key's calls.
func (h *effects) transactions() map[*sql.Tx]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[*sql.Tx]int{}
	for _, txs := range h.txs {
		for _, tx := range txs {
			out[tx]++
		}
	}
	return out
}

func (h *effects) firstTx(key string) *sql.Tx {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.txs[key]) == 0 {
		return nil
	}
	return h.txs[key][0]
}

type groupedSetup struct {
	db    testenv.Database
	inbox *inbox.Inbox
	b     *inbox.Batcher
}

// newEffectsInbox is h's inbox on a fresh database with the grouped_effect table.
func newEffectsInbox(t *testing.T, h inbox.Handler, ic inbox.Config) *groupedSetup {
	t.Helper()
	d := testenv.DB(t, 16)
	d.AdminExec(t, "CREATE TABLE grouped_effect (id BIGINT AUTO_INCREMENT PRIMARY KEY, k VARCHAR(64) NOT NULL, step INT NOT NULL, KEY (k))")
	ic.BizType = "grouped"
	if ic.BackoffInitial == 0 {
		ic.BackoffInitial, ic.BackoffMax = time.Millisecond, 10*time.Millisecond
	}
	ib, err := inbox.New(d.DB, h, ic, watermill.NopLogger{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &groupedSetup{db: d, inbox: ib}
}

// newGrouped is h's inbox behind a Batcher.
func newGrouped(t *testing.T, h inbox.Handler, ic inbox.Config, bc inbox.BatchConfig) *groupedSetup {
	t.Helper()
	g := newEffectsInbox(t, h, ic)
	b, err := g.inbox.NewBatcher(bc)
	if err != nil {
		t.Fatalf("NewBatcher: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	g.b = b
	return g
}

// send runs every payload through the Batcher at once, each on its own goroutine (as the
// router does), and returns the results by payload index.
func (g *groupedSetup) send(t *testing.T, payloads []string) []inbox.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out := make([]inbox.Result, len(payloads))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, p := range payloads {
		wg.Go(func() {
			<-start
			r, err := g.b.Process(ctx, message.NewMessage(watermill.NewUUID(), []byte(p)), inbox.Source{Topic: "grouped", Offset: int64(i)})
			if err != nil {
				t.Errorf("%s: %v", p, err)
			}
			out[i] = r
		})
	}
	close(start)
	wg.Wait()
	return out
}

func keys(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%04d", prefix, i)
	}
	return out
}

func outcomes(rs []inbox.Result) map[string]int {
	m := map[string]int{}
	for _, r := range rs {
		k := string(r.Outcome)
		if r.Reason != "" {
			k += "/" + string(r.Reason)
		}
		m[k]++
	}
	return m
}
