package inboxtest_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/inboxtest"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// greeter greets each user once: a row in greeting and a Greeted event, in the inbox's
// transaction. A payload "refuse:<user>" is refused for good (inbox.Permanent); an empty
// one is poison.
type greeter struct {
	w *outbox.Writer
	// leak, when set, writes the greeting through this pool instead of the transaction:
	// the mistake the kit must catch.
	leak *sql.DB
}

func (g *greeter) Decode(m *message.Message) (inbox.Decoded, error) {
	if len(m.Payload) == 0 {
		return inbox.Decoded{}, inbox.PoisonError("empty payload")
	}
	return inbox.Decoded{Key: string(m.Payload)}, nil
}

func (g *greeter) Handle(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
	if err := g.greet(ctx, tx, d.Key); err != nil {
		return 0, err
	}
	if strings.HasPrefix(d.Key, "refuse:") {
		return 0, inbox.Permanent(errors.New("refused"))
	}
	return inbox.Done, nil
}

func (g *greeter) greet(ctx context.Context, tx *sql.Tx, user string) error {
	var exec func(ctx context.Context, q string, args ...any) (sql.Result, error) = tx.ExecContext
	if g.leak != nil {
		exec = g.leak.ExecContext // another connection: commits whatever the inbox does
	}
	if _, err := exec(ctx, "INSERT INTO greeting (user_id) VALUES (?)", user); err != nil {
		return err
	}
	return g.w.Add(ctx, tx, outbox.Event{ID: "greeted-" + user, Type: "Greeted", Topic: "greeted", Key: user, Payload: []byte(user)})
}

// batchGreeter is greeter with a HandleBatch, for group commit.
type batchGreeter struct{ *greeter }

func (g batchGreeter) HandleBatch(ctx context.Context, tx *sql.Tx, ds []*inbox.Delivery) ([]inbox.Progress, error) {
	ps := make([]inbox.Progress, len(ds))
	for i, d := range ds {
		if strings.HasPrefix(d.Key, "refuse:") {
			ps[i] = inbox.Continue // left for Handle, one at a time
			continue
		}
		if err := g.greet(ctx, tx, d.Key); err != nil {
			return nil, err
		}
		ps[i] = inbox.Done
	}
	return ps, nil
}

var (
	_ inbox.Handler      = (*greeter)(nil)
	_ inbox.BatchHandler = batchGreeter{}
)

func newGreeter(t *testing.T) *greeter {
	t.Helper()
	w, err := outbox.NewWriter("")
	if err != nil {
		t.Fatal(err)
	}
	return &greeter{w: w}
}

func greetingTable(t testing.TB, d inboxtest.Database) {
	d.AdminExec(t, "CREATE TABLE greeting (id BIGINT AUTO_INCREMENT PRIMARY KEY, user_id VARCHAR(128) NOT NULL, KEY (user_id)) ENGINE=InnoDB")
}

// otherPool is a second pool on d: the leaking greeter's writes must not wait for a
// connection of the pool whose connections the inbox's transactions hold.
func otherPool(t testing.TB, d inboxtest.Database) *sql.DB {
	db, err := dbx.Open(context.Background(), dbx.Config{DSN: d.DSN, MaxOpenConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func options(grouped bool) inboxtest.Options {
	return inboxtest.Options{
		Message: func(user string) *message.Message { return message.NewMessage("", []byte(user)) },
		Poison:  []*message.Message{message.NewMessage("", nil), message.NewMessage("", []byte("refuse:mallory"))},
		Setup:   greetingTable,
		Grouped: grouped,
	}
}

var (
	greetings = inboxtest.CountQuery("SELECT COUNT(*) FROM greeting WHERE user_id = ?")
	greeted   = inboxtest.CountEvents("Greeted")
)

// modes are the ways a handler runs: one delivery per transaction, group commit of a plain
// handler (a savepoint per delivery), group commit through HandleBatch. leaked is how many
// times a write outside the transaction happens for one key: once for the injected
// rollback, once for the success.
var modes = []mode{
	{"single", false, false, 2},
	{"grouped plain", true, false, 2},
	{"grouped batch", true, true, 2},
}

type mode struct {
	name           string
	grouped, batch bool
	leaked         int
}

func (m mode) handler(g *greeter) inbox.Handler {
	if m.batch {
		return batchGreeter{g}
	}
	return g
}

// TestOncePerKey: a handler that writes only through its transaction passes, in every
// mode, with every kind of delivery the kit makes.
func TestOncePerKey(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			rep := inboxtest.Run(t, m.handler(newGreeter(t)), options(m.grouped))
			inboxtest.AssertOncePerKey(t, rep, greetings)
			inboxtest.AssertOncePerKey(t, rep, greeted)
			// The run did what it says: every key rolled back once, delivered 1 + 3 + 2 times.
			if rep.Rollbacks < len(rep.Keys) || rep.Outcomes[inbox.OutcomeProcessed] != len(rep.Keys) ||
				rep.Outcomes[inbox.OutcomeDuplicate] < 5*len(rep.Keys) || rep.Deliveries != 6*len(rep.Keys)+4 {
				t.Fatalf("report: %s", rep)
			}
		})
	}
}

// TestOutsideTransactionCaught: a handler whose write goes through another connection
// commits it even when the inbox's transaction rolls back; the kit's injected rollback makes
// the retry write it again, and OncePerKey names every key (and the refused message, whose
// write should have rolled back with its refusal).
func TestOutsideTransactionCaught(t *testing.T) {
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			g := newGreeter(t)
			opts := options(m.grouped)
			setup := opts.Setup
			opts.Setup = func(t testing.TB, d inboxtest.Database) {
				setup(t, d)
				g.leak = otherPool(t, d)
			}
			rep := inboxtest.Run(t, m.handler(g), opts)
			err := rep.OncePerKey(greetings)
			if err == nil {
				t.Fatal("OncePerKey passed a handler that writes outside its transaction")
			}
			t.Logf("as it should, OncePerKey failed:\n%v", err)
			for _, want := range []string{fmt.Sprintf("key key-000: %d effects, want 1", m.leaked), "(key refuse:mallory): 1 effects, want 0"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the error does not say %q", want)
				}
			}
			// Its events go through the transaction: those are right.
			inboxtest.AssertOncePerKey(t, rep, greeted)
		})
	}
}

// TestRollbacksOff: without injected rollbacks, duplicates and concurrent copies alone do
// not reveal a write outside the transaction (the inbox serialises the copies of a key):
// why Options.Rollbacks is on by default.
func TestRollbacksOff(t *testing.T) {
	g := newGreeter(t)
	opts := options(false)
	opts.Poison = nil
	opts.Rollbacks = -1
	opts.Setup = func(t testing.TB, d inboxtest.Database) {
		greetingTable(t, d)
		g.leak = otherPool(t, d)
	}
	rep := inboxtest.Run(t, g, opts)
	if rep.Rollbacks != 0 {
		t.Fatalf("%d rollbacks injected with Rollbacks -1", rep.Rollbacks)
	}
	inboxtest.AssertOncePerKey(t, rep, greetings)
}

// twoSteps is a two-step handler whose state is its own table: step "a" then step "b",
// each committed with the inbox's step (Continue, then Done).
type twoSteps struct{}

func (twoSteps) Decode(m *message.Message) (inbox.Decoded, error) {
	return inbox.Decoded{Key: string(m.Payload)}, nil
}

func (twoSteps) Handle(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
	var done int
	if err := tx.QueryRowContext(ctx, testenv.Rebind("SELECT COUNT(*) FROM step_log WHERE k = ?"), d.Key).Scan(&done); err != nil {
		return 0, err
	}
	step, next := "a", inbox.Continue
	if done > 0 {
		step, next = "b", inbox.Done
	}
	_, err := tx.ExecContext(ctx, testenv.Rebind("INSERT INTO step_log (k, s) VALUES (?, ?)"), d.Key, step)
	return next, err
}

// TestEveryStepRolledBack: each step of a multi-step handler is rolled back once before it
// commits, in a transaction of its own (StepsPerTx 1: two per key) or sharing one (2: one).
func TestEveryStepRolledBack(t *testing.T) {
	for _, perTx := range []int{1, 2} {
		t.Run(fmt.Sprint("steps per transaction ", perTx), func(t *testing.T) {
			rep := inboxtest.Run(t, twoSteps{}, inboxtest.Options{
				Message: func(key string) *message.Message { return message.NewMessage("", []byte(key)) },
				Inbox:   inbox.Config{StepsPerTx: perTx},
				Setup: func(t testing.TB, d inboxtest.Database) {
					d.AdminExec(t, "CREATE TABLE step_log (id BIGINT AUTO_INCREMENT PRIMARY KEY, k VARCHAR(128) NOT NULL, s CHAR(1) NOT NULL, KEY (k)) ENGINE=InnoDB")
				},
			})
			for _, s := range []string{"a", "b"} {
				inboxtest.AssertOncePerKey(t, rep, inboxtest.CountQuery("SELECT COUNT(*) FROM step_log WHERE s = '"+s+"' AND k = ?"))
			}
			if want := len(rep.Keys) * (3 - perTx); rep.Rollbacks != want {
				t.Fatalf("%d rollbacks injected, want %d (every transaction rolled back once)", rep.Rollbacks, want)
			}
		})
	}
}
