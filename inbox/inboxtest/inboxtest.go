// Package inboxtest is the test kit for plugin authors. InMemory runs one message through a
// handler without a database, and records the rows and events it wrote. It serves a
// plugin's first unit test. Run runs a handler behind a real inbox, on a fresh database
// made by DB. It makes the deliveries Kafka makes in practice, and checks that every
// business key took effect exactly once.
//
// For each of Options.Keys business keys, Run delivers the message Options.Message builds
// several times. First it delivers Concurrent copies at once, as two consumers do after a
// rebalance, or as a producer's retries read in one window. Then it delivers Redeliveries
// more, one after another, as after an offset commit lost once the work committed. Each
// copy is a new message, with a new uuid and offset, and the same payload, as a producer's
// duplicates are. Options.Poison messages are delivered alongside, twice. They are
// payloads the handler must refuse, in Decode or with inbox.Permanent.
//
// Each transaction in which the handler finished a key's work, or a step of it, is rolled
// back after Handle returned. It is as if its commit had failed or the process had died
// before it. That happens Options.Rollbacks times before one transaction is let through.
// The inbox retries the delivery. So an effect the handler made outside its transaction
// shows up twice. Such an effect goes through the pool, another connection or a service
// without an idempotency key.
//
// AssertOncePerKey, or Report.OncePerKey, then checks the outcome.
//
//   - Every delivery's outcome was recorded.
//   - Each key was processed exactly once, its other deliveries were duplicates, and its
//     inbox row is done.
//   - Each poison message was quarantined.
//   - The effect the author counts is exactly 1 for each key and 0 for each refused one.
//     A Counter counts it, such as CountEvents("PointsCredited") or a CountQuery.
//
// This example comes from examples/loyalty/points/points_test.go. There grouped selects
// one run without group commit and one with it.
//
//	d := inboxtest.DB(t, 8, migrations.Set{Name: points.Name, FS: points.Migrations})
//	rep := inboxtest.Run(t, points.NewHandler("points-credited"), inboxtest.Options{
//		DB: &d, Grouped: grouped, Message: shipped,
//		Poison: []*message.Message{
//			message.NewMessage("bad-json", []byte(`{"orderId": "o-1"`)),
//		},
//	})
//	inboxtest.AssertOncePerKey(t, rep, inboxtest.CountQuery("SELECT COUNT(*) FROM points_credit WHERE order_id = ?"))
//	inboxtest.AssertOncePerKey(t, rep, inboxtest.CountEvents("PointsCredited"))
//
// Options.Grouped runs the same deliveries through the inbox's group commit, a Batcher, as
// the router does. Like every integration test, Run fails when MariaDB is unreachable, and
// is skipped under go test -short.
package inboxtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/migrations"
)

// Options describe a Run. Only Message is required. The zero value of every other field
// stands for its default.
type Options struct {
	// Message builds the message of business key key, a payload the handler's Decode maps
	// to that key. It is called once per key, and every delivery of the key is a copy.
	Message func(key string) *message.Message
	// Keys is how many business keys are delivered, 20 by default. They are named
	// KeyPrefix followed by a number, as in key-000, key-001 and so on. KeyPrefix is "key-"
	// by default.
	Keys      int
	KeyPrefix string
	// Concurrent is how many copies of each key are delivered at once, 4 by default. All
	// keys' copies and the poison messages run at the same time.
	Concurrent int
	// Redeliveries is how many more copies of each key are delivered, one after another,
	// once every concurrent copy has finished. It is 2 by default, and a negative value
	// delivers none.
	Redeliveries int
	// Rollbacks is how many times each transaction of a key is rolled back, after Handle
	// or HandleBatch returned, before one is let through to commit. It is 1 by default, and
	// a negative value rolls back none. The inbox retries such a delivery as it would after
	// a failed commit. So each step of a multi-step handler is rolled back this many times
	// before it commits. Each rollback counts as an attempt, so keep Inbox.MaxAttempts above
	// Rollbacks × steps.
	Rollbacks int
	// Poison are messages the handler must refuse. Decode cannot decode them, or Handle
	// answers them with inbox.Permanent. Each is delivered twice, the second time as a
	// redelivery of the same record, and must end quarantined. A refused message whose key
	// Decode read must have no effect.
	Poison []*message.Message

	// Grouped delivers through a Batcher, by group commit, instead of one delivery per
	// transaction. Batch configures the Batcher.
	Grouped bool
	Batch   engine.BatchConfig

	// Inbox configures the inbox. Run sets defaults beyond the inbox's own. BizType is
	// "inboxtest", and the backoff goes from 1ms to 10ms. MaxAttempts is 10, because the
	// injected rollbacks count as attempts.
	Inbox engine.Config

	// DB is the database to run in, made by DB with the plugin's migrations. When it is
	// nil, Run makes a fresh one with the framework's migrations and Migrations.
	DB         *Database
	Migrations []migrations.Set
	// Setup, when set, runs on the database before the first delivery. It may create the
	// tables of a plugin without migrations, or rows the handler expects.
	Setup func(t testing.TB, db Database)

	// Timeout bounds the whole run, 2m by default. Logger receives the inbox's log lines,
	// and by default none logs them.
	Timeout time.Duration
	Logger  watermill.LoggerAdapter
}

func (o *Options) setDefaults() {
	if o.Keys == 0 {
		o.Keys = 20
	}
	if o.KeyPrefix == "" {
		o.KeyPrefix = "key-"
	}
	if o.Concurrent == 0 {
		o.Concurrent = 4
	}
	if o.Redeliveries == 0 {
		o.Redeliveries = 2
	}
	if o.Rollbacks == 0 {
		o.Rollbacks = 1
	}
	if o.Inbox.BizType == "" {
		o.Inbox.BizType = "inboxtest"
	}
	if o.Inbox.MaxAttempts == 0 {
		o.Inbox.MaxAttempts = 10
	}
	if o.Inbox.BackoffInitial == 0 && o.Inbox.BackoffMax == 0 {
		o.Inbox.BackoffInitial, o.Inbox.BackoffMax = time.Millisecond, 10*time.Millisecond
	}
	if o.Timeout == 0 {
		o.Timeout = 2 * time.Minute
	}
	if o.Logger == nil {
		o.Logger = watermill.NopLogger{}
	}
}

// Topic is the topic the synthetic deliveries claim to come from.
const Topic = "inboxtest"

// Run delivers opts' messages to h behind an inbox and returns what happened. Check the
// result with AssertOncePerKey. Run fails t only when the run cannot be set up, such as
// its database, inbox or Batcher. The Report says what the deliveries did.
func Run(t testing.TB, h inbox.Handler, opts Options) *Report {
	t.Helper()
	if opts.Message == nil {
		t.Fatal("inboxtest: Options.Message is required")
	}
	opts.setDefaults()
	if opts.Keys < 1 || opts.Concurrent < 1 {
		t.Fatalf("inboxtest: Options.Keys (%d) and Options.Concurrent (%d) must be positive", opts.Keys, opts.Concurrent)
	}
	var d Database
	if opts.DB != nil {
		d = *opts.DB
	} else {
		d = DB(t, 8, opts.Migrations...)
	}
	if opts.Setup != nil {
		opts.Setup(t, d)
	}
	inj := &injector{max: opts.Rollbacks, keys: map[string]*keyState{}}
	ib, err := engine.New(d.DB, wrap(h, inj), opts.Inbox, opts.Logger, nil)
	if err != nil {
		t.Fatalf("inboxtest: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), opts.Timeout)
	defer cancel()
	if err := ib.CheckServer(ctx); err != nil {
		t.Fatalf("inboxtest: %v", err)
	}
	rep := &Report{DB: d, BizType: ib.BizType(), Table: ib.Config().Table, opts: opts,
		Results: map[string][]engine.Result{}, Outcomes: map[engine.Outcome]int{}}
	process := func(ctx context.Context, m *message.Message, src inbox.Source) (engine.Result, error) {
		return ib.Process(ctx, m, src, engine.ProcessOptions{})
	}
	var batcher *engine.Batcher
	if opts.Grouped {
		b, err := ib.NewBatcher(opts.Batch)
		if err != nil {
			t.Fatalf("inboxtest: group commit: %v", err)
		}
		defer b.Close()
		batcher, process = b, b.Process
	}

	var (
		mu     sync.Mutex
		offset int64
		wg     sync.WaitGroup
	)
	nextOffset := func() int64 {
		mu.Lock()
		defer mu.Unlock()
		offset++
		return offset
	}
	record := func(key string, poison int, res engine.Result, err error) {
		mu.Lock()
		defer mu.Unlock()
		rep.Deliveries++
		if err != nil {
			rep.Errors = append(rep.Errors, fmt.Errorf("%s: %w", deliveryName(key, poison), err))
			return
		}
		rep.Outcomes[res.Outcome]++
		if poison >= 0 {
			rep.Poison[poison] = append(rep.Poison[poison], res)
			return
		}
		rep.Results[key] = append(rep.Results[key], res)
	}
	deliver := func(key string, poison int, m *message.Message, src inbox.Source) {
		res, err := process(ctx, m, src)
		record(key, poison, res, err)
	}

	originals := make([]*message.Message, opts.Keys)
	for i := range opts.Keys {
		key := fmt.Sprintf("%s%03d", opts.KeyPrefix, i)
		rep.Keys = append(rep.Keys, key)
		if originals[i] = opts.Message(key); originals[i] == nil {
			t.Fatalf("inboxtest: Options.Message(%q) returned nil", key)
		}
	}
	rep.Poison = make([][]engine.Result, len(opts.Poison))
	poisonSrc := make([]inbox.Source, len(opts.Poison))
	// Deliver the concurrent copies of every key and each poison message, all at once.
	for i, key := range rep.Keys {
		for range opts.Concurrent {
			src := inbox.Source{Topic: Topic, Partition: int32(i % 4), Offset: nextOffset()}
			wg.Go(func() { deliver(key, -1, copyOf(originals[i]), src) })
		}
	}
	for j, m := range opts.Poison {
		poisonSrc[j] = inbox.Source{Topic: Topic, Partition: int32(j % 4), Offset: nextOffset()}
		wg.Go(func() { deliver("", j, copyOf(m), poisonSrc[j]) })
	}
	wg.Wait()
	// Then deliver the redeliveries, one after another for each key, and the poison
	// records again.
	for i, key := range rep.Keys {
		wg.Go(func() {
			for range opts.Redeliveries {
				deliver(key, -1, copyOf(originals[i]), inbox.Source{Topic: Topic, Partition: int32(i % 4), Offset: nextOffset()})
			}
		})
	}
	for j, m := range opts.Poison {
		wg.Go(func() { deliver("", j, copyOf(m), poisonSrc[j]) })
	}
	wg.Wait()
	rep.Rollbacks = inj.total()
	if opts.Grouped {
		rep.Batch = batcher.Stats()
	}
	t.Logf("inboxtest: %s", rep)
	return rep
}

// copyOf is another message with m's payload and metadata. It has a new uuid, as a
// producer's retry or a second send of the same event has.
func copyOf(m *message.Message) *message.Message {
	c := message.NewMessage(watermill.NewUUID(), append([]byte(nil), m.Payload...))
	for k, v := range m.Metadata {
		c.Metadata.Set(k, v)
	}
	return c
}

func deliveryName(key string, poison int) string {
	if poison >= 0 {
		return fmt.Sprintf("poison message %d", poison)
	}
	return "key " + key
}

// ErrInjectedRollback is the error Run gives the inbox in place of a finished handler's
// success, so that its transaction rolls back. See Options.Rollbacks.
var ErrInjectedRollback = errors.New("inboxtest: transaction rolled back after the handler returned (injected)")
