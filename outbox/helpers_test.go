package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/dbx"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// testLogger forwards the relay's log lines to the test log. It must not be used after the
// test has returned, so every relay goroutine is stopped and waited for before that.
type testLogger struct {
	t      testing.TB
	mu     sync.Mutex
	errors int
}

func (l *testLogger) Error(msg string, err error, fields watermill.LogFields) {
	l.mu.Lock()
	l.errors++
	l.mu.Unlock()
	l.t.Logf("relay error: %s: %v %v", msg, err, fields)
}
func (l *testLogger) Info(msg string, fields watermill.LogFields) {
	l.t.Logf("relay: %s %v", msg, fields)
}
func (l *testLogger) Debug(string, watermill.LogFields)                {}
func (l *testLogger) Trace(string, watermill.LogFields)                {}
func (l *testLogger) With(watermill.LogFields) watermill.LoggerAdapter { return l }

func (l *testLogger) Errors() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.errors
}

func newWriter(t testing.TB) *outbox.Writer {
	t.Helper()
	w, err := outbox.NewWriter("")
	if err != nil {
		t.Fatalf("NewWriter: %v", err)
	}
	return w.WithDialect(testenv.Dialect())
}

// newProducer is a real idempotent Sarama producer, closed when the test ends.
func newProducer(t testing.TB, k kafkax.Config) sarama.SyncProducer {
	t.Helper()
	p, err := k.NewSyncProducer()
	if err != nil {
		t.Fatalf("producer: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Logf("close producer: %v", err)
		}
	})
	return p
}

func newRelay(t testing.TB, db *sql.DB, p outbox.Producer, cfg outbox.RelayConfig) *outbox.Relay {
	t.Helper()
	r, err := outbox.NewRelay(db, p, cfg, &testLogger{t: t})
	if err != nil {
		t.Fatalf("NewRelay: %v", err)
	}
	return r
}

// addCommitted stores events in one committed transaction.
func addCommitted(t testing.TB, ctx context.Context, db *sql.DB, w *outbox.Writer, evs ...outbox.Event) {
	t.Helper()
	err := dbx.InTx(ctx, db, func(tx *sql.Tx) error {
		for _, e := range evs {
			if err := w.Add(ctx, tx, e); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("add events: %v", err)
	}
}

// rebind gives q, written with '?' placeholders, the placeholders of db's dialect.
func rebind(db *sql.DB, q string) string { return dbx.DialectOf(db).Rebind(q) }

func countRows(t testing.TB, db *sql.DB, where string) int {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM outbox WHERE " + where).Scan(&n); err != nil {
		t.Fatalf("count outbox rows (%s): %v", where, err)
	}
	return n
}

func pendingRows(t testing.TB, db *sql.DB) int { return countRows(t, db, "published_at IS NULL") }

// waitAllPublished waits (bounded) until every committed row has been published.
func waitAllPublished(t testing.TB, db *sql.DB, want int, bound time.Duration) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		pending := pendingRows(t, db)
		if pending == 0 {
			if total := countRows(t, db, "1=1"); total != want {
				t.Fatalf("outbox holds %d rows, want %d", total, want)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %d of %d outbox rows still unpublished", bound, pending, countRows(t, db, "1=1"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func readAll(t testing.TB, k kafkax.Config, topic string) []kafkax.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	recs, err := k.ReadAll(ctx, topic, 2*time.Second)
	if err != nil {
		t.Fatalf("read back %s: %v", topic, err)
	}
	return recs
}

// exactlyOnceProblems compares the event ids found on Kafka (header event_id) with the ids
// that must be there. It returns one line per missing, duplicated or unexpected id.
func exactlyOnceProblems(recs []kafkax.Record, want []string) []string {
	seen := map[string]int{}
	for _, r := range recs {
		seen[r.Headers[outbox.HeaderEventID]]++
	}
	var problems []string
	wanted := map[string]bool{}
	for _, id := range want {
		wanted[id] = true
		switch n := seen[id]; {
		case n == 0:
			problems = append(problems, "missing "+id)
		case n > 1:
			problems = append(problems, fmt.Sprintf("duplicate %s (%d times)", id, n))
		}
	}
	for id, n := range seen {
		if !wanted[id] {
			problems = append(problems, fmt.Sprintf("unexpected %q (%d times)", id, n))
		}
	}
	sort.Strings(problems)
	return problems
}

func assertExactlyOnce(t testing.TB, recs []kafkax.Record, want []string) {
	t.Helper()
	problems := exactlyOnceProblems(recs, want)
	if len(problems) == 0 {
		return
	}
	shown := problems
	if len(shown) > 20 {
		shown = shown[:20]
	}
	t.Fatalf("%d records on Kafka for %d events: %d problems, e.g.:\n  %s", len(recs), len(want), len(problems), strings.Join(shown, "\n  "))
}

// fakeProducer records what it is asked to send and fails the calls listed in failOn
// (1-based call numbers).
type fakeProducer struct {
	mu     sync.Mutex
	calls  int
	failOn map[int]bool
	sent   []*sarama.ProducerMessage
}

func (f *fakeProducer) SendMessages(msgs []*sarama.ProducerMessage) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.failOn[f.calls] {
		return fmt.Errorf("fake broker down (call %d)", f.calls)
	}
	f.sent = append(f.sent, msgs...)
	return nil
}

func (f *fakeProducer) snapshot() (calls int, sent []*sarama.ProducerMessage) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls, append([]*sarama.ProducerMessage(nil), f.sent...)
}

func headerValue(m *sarama.ProducerMessage, key string) string {
	for _, h := range m.Headers {
		if string(h.Key) == key {
			return string(h.Value)
		}
	}
	return ""
}
