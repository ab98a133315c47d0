package httpcmd_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/inbox/httpcmd"
	"github.com/onceflow/onceflow/internal/testenv"
)

// nameCommand stores the body's name, {"name": "..."}, in a VARCHAR(5) column, with the
// client token as its key.
type nameCommand struct{}

func (nameCommand) Decode(m *message.Message) (inbox.Decoded, error) {
	var req struct{ Name string }
	if err := json.Unmarshal(m.Payload, &req); err != nil {
		return inbox.Decoded{}, inbox.PoisonError(`body: not {"name": "..."}`)
	}
	return inbox.Decoded{Key: "-", Value: req.Name}, nil
}

func (nameCommand) Handle(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
	name := d.Value.(string)
	if _, err := tx.ExecContext(ctx, testenv.Rebind(`INSERT INTO named (token, name) VALUES (?, ?)`), d.Key, name); err != nil {
		return 0, fmt.Errorf("insert named: %w", err)
	}
	return inbox.Done, d.Respond(http.StatusCreated, map[string]string{"name": name})
}

// TestDataErrorAnswers422 checks a request whose value the database refuses, a name longer
// than its VARCHAR(5) column. It answers 422 with a fixed JSON error and reason data,
// never 500 and never the database's message. So does its retry with the same key, which
// the same refusal meets again. Its row is quarantined as data. The test runs with a
// transaction per request and with group commit.
func TestDataErrorAnswers422(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(mode(batch), func(t *testing.T) {
			d := testenv.DB(t, 8)
			d.AdminExec(t, `CREATE TABLE named (token VARCHAR(255) PRIMARY KEY, name VARCHAR(5) NOT NULL)`)
			ib, err := engine.NewCommand(d.DB, nameCommand{}, engine.Config{BizType: "naming", MaxAttempts: 3, BackoffInitial: time.Millisecond}, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			var runner httpcmd.Runner = ib
			if batch {
				b, err := ib.NewBatcher(engine.BatchConfig{MaxSize: 8})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { b.Close() })
				runner = b
			}
			h, err := httpcmd.New([]httpcmd.Route{{Method: http.MethodPost, Path: "/v1/names", Runner: runner}}, httpcmd.Config{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(h)
			t.Cleanup(srv.Close)
			post := func(key, name string) (int, []byte) {
				req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/names", strings.NewReader(fmt.Sprintf(`{"name": %q}`, name)))
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set(httpcmd.HeaderKey, key)
				resp, err := srv.Client().Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				var body json.RawMessage
				if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
					t.Fatalf("%s: %v", key, err)
				}
				return resp.StatusCode, body
			}
			if status, body := post("fits-1", "abc"); status != http.StatusCreated {
				t.Fatalf("a name that fits: %d %s, want 201", status, body)
			}
			for try := range 2 {
				status, body := post("too-long-1", "a name far too long")
				var e struct{ Reason string }
				_ = json.Unmarshal(body, &e)
				text := errorText(t, body)
				if status != http.StatusUnprocessableEntity || e.Reason != string(engine.ReasonData) || !strings.Contains(text, "refused a value of this request") {
					t.Fatalf("try %d, a name too long: %d %s, want 422 with reason data", try, status, body)
				}
				for _, db := range []string{"Data too long", "1406", "SQLSTATE", "22001", "named", "varying"} {
					if strings.Contains(string(body), db) {
						t.Errorf("the answer %s shows the database's message (%q)", body, db)
					}
				}
			}
			var status, reason string
			if err := d.DB.QueryRow(testenv.Rebind(`SELECT status, reason FROM inbox WHERE dedup_key = ?`), "too-long-1").Scan(&status, &reason); err != nil {
				t.Fatal(err)
			}
			if status != "failed" || reason != string(engine.ReasonData) {
				t.Fatalf("the refused request's row is %s/%s, want failed/data", status, reason)
			}
		})
	}
}
