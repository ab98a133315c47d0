package engine_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/internal/testenv"
)

// dataRowSchema is a plugin's table with a column of each kind a value can be refused by,
// a unique key, a foreign key and a CHECK. One row holds the code 'taken'.
var dataRowSchema = map[bool][]string{
	false: {
		`CREATE TABLE data_parent (id INT PRIMARY KEY) ENGINE = InnoDB`,
		`CREATE TABLE data_row (
			k         VARCHAR(64) NOT NULL PRIMARY KEY,
			name      VARCHAR(5),
			txt       TEXT,
			n         SMALLINT,
			at        DATETIME,
			parent_id INT NULL,
			qty       INT,
			code      VARCHAR(10),
			req       VARCHAR(10) NOT NULL DEFAULT '',
			UNIQUE KEY uk_code (code),
			CONSTRAINT qty_positive CHECK (qty >= 0),
			CONSTRAINT fk_parent FOREIGN KEY (parent_id) REFERENCES data_parent (id)
		) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4`,
		`INSERT INTO data_row (k, code) VALUES ('existing', 'taken')`,
	},
	true: {
		`CREATE TABLE data_parent (id INT PRIMARY KEY)`,
		`CREATE TABLE data_row (
			k         VARCHAR(64) NOT NULL PRIMARY KEY,
			name      VARCHAR(5),
			txt       TEXT,
			n         SMALLINT,
			at        TIMESTAMP,
			parent_id INT NULL CONSTRAINT fk_parent REFERENCES data_parent (id),
			qty       INT CONSTRAINT qty_positive CHECK (qty >= 0),
			code      VARCHAR(10) CONSTRAINT uk_code UNIQUE,
			req       VARCHAR(10) NOT NULL DEFAULT ''
		)`,
		`INSERT INTO data_row (k, code) VALUES ('existing', 'taken')`,
	},
}

// dataKind is a handler's INSERT whose values the database refuses, and the server's code
// for it on MariaDB and on PostgreSQL.
type dataKind struct {
	q         string
	arg       any // the value, when q takes one after the key
	mysqlArg  any // MariaDB's value, when it differs
	mysql, pg string
}

// dataKinds are the refused values, one per kind that dbx.IsDataError reports. "ok" is a
// row the database takes.
var dataKinds = map[string]dataKind{
	"bytes":  {q: `INSERT INTO data_row (k, txt) VALUES (?, ?)`, arg: "refund for u\x00bad", mysqlArg: "refund for u\xff\xfebad", mysql: "Error 1366", pg: "SQLSTATE 22021"},
	"long":   {q: `INSERT INTO data_row (k, name) VALUES (?, ?)`, arg: "a name far too long", mysql: "Error 1406", pg: "SQLSTATE 22001"},
	"range":  {q: `INSERT INTO data_row (k, n) VALUES (?, 40000)`, mysql: "Error 1264", pg: "SQLSTATE 22003"},
	"number": {q: `INSERT INTO data_row (k, n) VALUES (?, 'abc')`, mysql: "Error 1366", pg: "SQLSTATE 22P02"},
	"date":   {q: `INSERT INTO data_row (k, at) VALUES (?, '2026-13-45 00:00:00')`, mysql: "Error 1292", pg: "SQLSTATE 22008"},
	"null":   {q: `INSERT INTO data_row (k, req) VALUES (?, NULL)`, mysql: "Error 1048", pg: "SQLSTATE 23502"},
	"fk":     {q: `INSERT INTO data_row (k, parent_id) VALUES (?, 999)`, mysql: "Error 1452", pg: "SQLSTATE 23503"},
	"check":  {q: `INSERT INTO data_row (k, qty) VALUES (?, -1)`, mysql: "Error 4025", pg: "SQLSTATE 23514"},
	"unique": {q: `INSERT INTO data_row (k, code) VALUES (?, 'taken')`, mysql: "Error 1062", pg: "SQLSTATE 23505"},
}

// dataHandler inserts one data_row per delivery. The payload is "key|kind". A kind of
// dataKinds inserts a value the database refuses, and "ok" a row it takes. "down" fails as
// a dependency that is down does, and so does every kind while down is set.
// "invalid-event" fails with an error that says it is permanent, as the errors wrapping
// outbox.ErrInvalidEvent do.
type dataHandler struct {
	down *atomic.Bool // the dependency every delivery calls first; nil: up

	mu      sync.Mutex
	calls   map[string]int // Handle calls per key
	upCalls map[string]int // of them, those made with the dependency up
}

func newDataHandler(down *atomic.Bool) *dataHandler {
	return &dataHandler{down: down, calls: map[string]int{}, upCalls: map[string]int{}}
}

func (h *dataHandler) Decode(m *message.Message) (inbox.Decoded, error) {
	key, kind, _ := strings.Cut(string(m.Payload), "|")
	return inbox.Decoded{Key: key, Value: kind}, nil
}

// errProviderDown is the dependency's error.
var errProviderDown = errors.New("refund provider down")

// permanentError says it is permanent, as outbox.ErrInvalidEvent's errors do.
type permanentError struct{}

func (permanentError) Error() string   { return "event id longer than 36 bytes" }
func (permanentError) Permanent() bool { return true }

func (h *dataHandler) Handle(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
	down := h.down != nil && h.down.Load()
	h.mu.Lock()
	h.calls[d.Key]++
	if !down {
		h.upCalls[d.Key]++
	}
	h.mu.Unlock()
	kind := d.Value.(string)
	switch {
	case down || kind == "down":
		return 0, fmt.Errorf("refund %s: %w", d.Key, errProviderDown)
	case kind == "invalid-event":
		return 0, fmt.Errorf("emit refunded: %w", permanentError{})
	case kind == "ok":
		if _, err := tx.ExecContext(ctx, testenv.Rebind(`INSERT INTO data_row (k, name) VALUES (?, 'ok')`), d.Key); err != nil {
			return 0, fmt.Errorf("insert data_row: %w", err)
		}
		return inbox.Done, nil
	}
	k, ok := dataKinds[kind]
	if !ok {
		return 0, fmt.Errorf("unknown kind %q", kind)
	}
	args := []any{d.Key}
	if strings.Count(k.q, "?") == 2 {
		arg := k.arg
		if k.mysqlArg != nil && !testenv.Dialect().IsPostgres() {
			arg = k.mysqlArg
		}
		args = append(args, arg)
	}
	if _, err := tx.ExecContext(ctx, testenv.Rebind(k.q), args...); err != nil {
		return 0, fmt.Errorf("insert data_row: %w", err)
	}
	return inbox.Done, nil
}

func (h *dataHandler) counts(key string) (calls, up int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls[key], h.upCalls[key]
}

// breakerLog keeps every change of the breaker's state, and the error of each logged line.
type breakerLog struct {
	mu      sync.Mutex
	changes []engine.BreakerStatus
	lines   []string // "message: error" of the logger's Error lines and of a failed probe's line
}

func (l *breakerLog) Delivered(string, engine.Result, time.Duration) {}
func (l *breakerLog) BreakerChanged(_ string, s engine.BreakerStatus) {
	l.mu.Lock()
	l.changes = append(l.changes, s)
	l.mu.Unlock()
}
func (l *breakerLog) Error(msg string, err error, _ watermill.LogFields) {
	l.mu.Lock()
	l.lines = append(l.lines, fmt.Sprintf("%s: %v", msg, err))
	l.mu.Unlock()
}
func (l *breakerLog) Info(msg string, f watermill.LogFields) {
	if strings.HasPrefix(msg, "circuit breaker probe failed") {
		l.mu.Lock()
		l.lines = append(l.lines, fmt.Sprintf("%s: %v", msg, f["err"]))
		l.mu.Unlock()
	}
}
func (l *breakerLog) Debug(string, watermill.LogFields)                {}
func (l *breakerLog) Trace(string, watermill.LogFields)                {}
func (l *breakerLog) With(watermill.LogFields) watermill.LoggerAdapter { return l }

func (l *breakerLog) snapshot() ([]engine.BreakerStatus, []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]engine.BreakerStatus(nil), l.changes...), append([]string(nil), l.lines...)
}

// newDataInbox is h's inbox on a fresh database with data_row, with its breaker and
// delayed redelivery on. A counted failure opens the breaker, with one attempt and ratio
// 0.5. A delivery whose attempts run out is delayed.
func newDataInbox(t *testing.T, h inbox.Handler, ic engine.Config, log *breakerLog) (testenv.Database, *engine.Inbox) {
	t.Helper()
	d := testenv.DB(t, 16)
	for _, q := range dataRowSchema[testenv.Dialect().IsPostgres()] {
		d.AdminExec(t, q)
	}
	ic.BizType = "refunds"
	if ic.BackoffInitial == 0 {
		ic.BackoffInitial, ic.BackoffMax = time.Millisecond, 10*time.Millisecond
	}
	ib, err := engine.New(d.DB, h, ic, log, log)
	if err != nil {
		t.Fatal(err)
	}
	return d, ib
}

// TestDataErrorsQuarantinedAtOnce checks a handler's INSERT that the database refuses for
// its values. The values are an invalid byte sequence, a NUL on PostgreSQL, a string too
// long, a number out of range, text that is not a number, a bad datetime and a NULL. They
// also break a foreign key, a CHECK and a business table's unique key. Each delivery is
// quarantined at its first attempt with reason data and the database's message. It is
// never retried, never delayed and never counted by the breaker. The test runs one at a
// time and group-committed. The dependency's failure that follows shows that the same
// inbox does retry, delay and count a failure that is not the message's own.
func TestDataErrorsQuarantinedAtOnce(t *testing.T) {
	for _, grouped := range []bool{false, true} {
		t.Run(map[bool]string{false: "one at a time", true: "group commit"}[grouped], func(t *testing.T) {
			h := newDataHandler(nil)
			log := &breakerLog{}
			d, ib := newDataInbox(t, h, engine.Config{MaxAttempts: 3, DelayedRetries: 2, DelayedBackoff: time.Hour, DelayedBackoffMax: time.Hour,
				BreakerMinCalls: 1, BreakerFailureRatio: 0.5, BreakerOpenFor: time.Millisecond}, log)
			process := func(ctx context.Context, m *message.Message, src inbox.Source) (engine.Result, error) {
				return ib.Process(ctx, m, src, engine.ProcessOptions{})
			}
			if grouped {
				b, err := ib.NewBatcher(engine.BatchConfig{Linger: 50 * time.Millisecond})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { b.Close() })
				process = b.Process
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()

			var payloads []string
			for kind := range dataKinds {
				payloads = append(payloads, "bad-"+kind+"|"+kind)
			}
			payloads = append(payloads, "invalid-event|invalid-event")
			for i := range 5 {
				payloads = append(payloads, fmt.Sprintf("good-%d|ok", i))
			}
			results := make([]engine.Result, len(payloads))
			var wg sync.WaitGroup
			for i, p := range payloads {
				wg.Go(func() {
					r, err := process(ctx, message.NewMessage(watermill.NewUUID(), []byte(p)), inbox.Source{Topic: "refunds", Offset: int64(i)})
					if err != nil {
						t.Errorf("%s: %v", p, err)
					}
					results[i] = r
				})
			}
			wg.Wait()
			for i, p := range payloads {
				key, kind, _ := strings.Cut(p, "|")
				r := results[i]
				calls, _ := h.counts(key)
				switch kind {
				case "ok":
					if r.Outcome != engine.OutcomeProcessed || calls != 1 {
						t.Errorf("%s: %s after %d calls, want processed at once", key, r.Outcome, calls)
					}
					continue
				case "invalid-event":
					if r.Outcome != engine.OutcomeQuarantined || r.Reason != engine.ReasonPermanent || calls != 1 {
						t.Errorf("%s: %s/%s after %d calls, want quarantined as permanent at the first", key, r.Outcome, r.Reason, calls)
					}
					continue
				}
				if r.Outcome != engine.OutcomeQuarantined || r.Reason != engine.ReasonData || calls != 1 {
					t.Errorf("%s: %s/%s after %d calls (%v), want quarantined as data at the first", key, r.Outcome, r.Reason, calls, r.Err)
				}
				var status string
				var reason, lastErr sql.NullString
				var attempts, rounds int
				err := d.DB.QueryRow(testenv.Rebind(`SELECT status, reason, attempts, delayed_rounds, last_error FROM inbox WHERE dedup_key = ?`), key).
					Scan(&status, &reason, &attempts, &rounds, &lastErr)
				if err != nil {
					t.Fatalf("%s: %v", key, err)
				}
				code := map[bool]string{false: dataKinds[kind].mysql, true: dataKinds[kind].pg}[testenv.Dialect().IsPostgres()]
				if status != "failed" || reason.String != "data" || attempts != 1 || rounds != 0 || !strings.Contains(lastErr.String, code) {
					t.Errorf("%s: row %s/%s, %d attempts, %d delayed rounds, last error %q; want failed/data after 1 attempt, not delayed, with the server's %s",
						key, status, reason.String, attempts, rounds, lastErr.String, code)
				}
			}
			if s := ib.Breaker(); s.Opens != 0 || s.State != engine.BreakerClosed {
				t.Fatalf("breaker %v, opened %d times (last error %q) by values the database refused", s.State, s.Opens, s.LastError)
			}

			// A dependency is down for five deliveries, as many as the good ones. Each is
			// retried, then delayed, and counted by the breaker. The breaker opens on five
			// failures of ten attempts. Its log line and status carry the dependency's
			// error. The retries run as probes, one at a time, and each failed one doubles
			// the wait.
			for i := range 5 {
				wg.Go(func() {
					key := fmt.Sprintf("dependency-%d", i)
					r, err := process(ctx, message.NewMessage(watermill.NewUUID(), []byte(key+"|down")), inbox.Source{Topic: "refunds", Offset: int64(100 + i)})
					if calls, _ := h.counts(key); err != nil || r.Outcome != engine.OutcomeDelayed || calls != 3 {
						t.Errorf("%s: %s after %d calls (%v), want delayed after 3", key, r.Outcome, calls, err)
					}
				})
			}
			wg.Wait()
			s := ib.Breaker()
			if s.Opens == 0 || !strings.Contains(s.LastError, errProviderDown.Error()) {
				t.Fatalf("breaker opened %d times, last error %q: want opened by %q", s.Opens, s.LastError, errProviderDown)
			}
			_, lines := log.snapshot()
			opened := false
			for _, l := range lines {
				if strings.HasPrefix(l, "circuit breaker open") {
					opened = true
					if !strings.Contains(l, errProviderDown.Error()) {
						t.Errorf("log line %q does not carry the error that opened the breaker", l)
					}
				}
			}
			if !opened {
				t.Errorf("no log line of the breaker opening in %q", lines)
			}
		})
	}
}

// TestBreakerProbeNotStarvedByBadData lets a dependency fail, then recover. Meanwhile good
// refunds and refunds whose data the database refuses wait on the open breaker. The
// database refuses a NUL in a text column on PostgreSQL, and a value too long on MariaDB.
// Once the dependency is back, every good refund finishes. Every bad one is quarantined at
// its first refusal. Each of them runs exactly once with the dependency up. No refusal
// opens the breaker, so every time it opened, the dependency's error did. Were the bad
// refunds counted as failures, they would be retried. As probes they would keep the
// breaker opening, each time for twice as long, while the good ones waited.
func TestBreakerProbeNotStarvedByBadData(t *testing.T) {
	const good, bad = 10, 30
	var down atomic.Bool
	down.Store(true)
	h := newDataHandler(&down)
	log := &breakerLog{}
	badKind := map[bool]string{false: "long", true: "bytes"}[testenv.Dialect().IsPostgres()]
	_, ib := newDataInbox(t, h, engine.Config{MaxAttempts: 20, DelayedRetries: -1,
		BreakerMinCalls: 5, BreakerFailureRatio: 0.9, BreakerOpenFor: 20 * time.Millisecond}, log)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var payloads []string
	for i := range bad {
		payloads = append(payloads, fmt.Sprintf("bad-%02d|%s", i, badKind))
		if i < good {
			payloads = append(payloads, fmt.Sprintf("good-%02d|ok", i))
		}
	}
	results := make([]engine.Result, len(payloads))
	var wg sync.WaitGroup
	for i, p := range payloads {
		wg.Go(func() {
			r, err := ib.Process(ctx, message.NewMessage(watermill.NewUUID(), []byte(p)), inbox.Source{Topic: "refunds", Offset: int64(i)}, engine.ProcessOptions{})
			if err != nil {
				t.Errorf("%s: %v", p, err)
			}
			results[i] = r
		})
	}
	waitFor(t, "the breaker open and a probe failed", 30*time.Second, func() (bool, string) {
		s := ib.Breaker()
		return s.Opens >= 2, fmt.Sprintf("%v, opened %d times", s.State, s.Opens)
	})
	down.Store(false)
	wg.Wait()

	outcomes := map[string]int{}
	for i, p := range payloads {
		key, kind, _ := strings.Cut(p, "|")
		r := results[i]
		outcomes[string(r.Outcome)+"/"+string(r.Reason)]++
		_, up := h.counts(key)
		want := engine.OutcomeProcessed
		if kind != "ok" {
			want = engine.OutcomeQuarantined
		}
		if r.Outcome != want || (want == engine.OutcomeQuarantined && r.Reason != engine.ReasonData) || up != 1 {
			t.Errorf("%s: %s/%s after %d attempts with the dependency up, want %s after one", key, r.Outcome, r.Reason, up, want)
		}
	}
	changes, lines := log.snapshot()
	opens := 0
	for _, s := range changes {
		if s.State != engine.BreakerOpen {
			continue
		}
		opens++
		if !strings.Contains(s.LastError, errProviderDown.Error()) {
			t.Errorf("the breaker opened on %q, not the dependency's error", s.LastError)
		}
	}
	st := ib.Breaker()
	t.Logf("outcomes %v; the breaker opened %d times, now %v; %d log lines", outcomes, opens, st.State, len(lines))
	if opens < 2 || st.State != engine.BreakerClosed {
		t.Fatalf("the breaker opened %d times and is %v: want it opened by the outage and closed after it", opens, st.State)
	}
	for _, l := range lines {
		if strings.Contains(l, "<nil>") {
			t.Errorf("breaker log line without its error: %q", l)
		}
	}
}
