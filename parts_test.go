package onceflow

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/metrics"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// events is what the parts of a test did, in order.
type events struct {
	mu  sync.Mutex
	log []string
}

func (e *events) add(s string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.log = append(e.log, s)
}

func (e *events) String() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return strings.Join(e.log, ", ")
}

// testPart records its start, the end of its run and its stop in ev. Its run waits for its
// ctx, after telling running; with runErr set it returns at once, runErr or nil.
func testPart(name string, ev *events, running *sync.WaitGroup, startErr error, runErr *error) part {
	running.Add(1)
	return part{name: name,
		start: func(context.Context) error {
			ev.add("start " + name)
			return startErr
		},
		run: func(ctx context.Context) error {
			running.Done()
			if runErr != nil {
				ev.add("fail " + name)
				return *runErr
			}
			<-ctx.Done()
			ev.add("end " + name)
			return nil
		},
		stop: func() { ev.add("stop " + name) },
	}
}

// Parts start in order, run together until ctx ends, and stop in reverse order: a part's
// run ends, then its stop runs, before the part before it is stopped.
func TestRunPartsStopsInReverse(t *testing.T) {
	var ev events
	var running sync.WaitGroup
	parts := []part{testPart("a", &ev, &running, nil, nil), {name: "quiet"}, testPart("b", &ev, &running, nil, nil), testPart("c", &ev, &running, nil, nil)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runParts(ctx, watermill.NopLogger{}, parts) }()
	running.Wait()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("runParts: %v, want nil after a cancellation", err)
	}
	if got, want := ev.String(), "start a, start b, start c, end c, stop c, end b, stop b, end a, stop a"; got != want {
		t.Fatalf("events: %s\nwant:   %s", got, want)
	}
}

// A start that fails stops the parts started before it, in reverse order, and its error is
// returned as it is; nothing runs.
func TestRunPartsStartFails(t *testing.T) {
	var ev events
	var running sync.WaitGroup
	bad := errors.New("bad setting")
	parts := []part{testPart("a", &ev, &running, nil, nil), testPart("b", &ev, &running, nil, nil),
		testPart("c", &ev, &running, bad, nil), testPart("d", &ev, &running, nil, nil)}
	if err := runParts(context.Background(), watermill.NopLogger{}, parts); err != bad {
		t.Fatalf("runParts: %v, want the start's error as it is", err)
	}
	if got, want := ev.String(), "start a, start b, start c, stop b, stop a"; got != want {
		t.Fatalf("events: %s\nwant:   %s", got, want)
	}
}

// The first run that fails, or returns before it was stopped, stops every part in reverse
// order; runParts returns the failure, prefixed with the part's name.
func TestRunPartsRunFails(t *testing.T) {
	broken := errors.New("connection lost")
	for _, tc := range []struct {
		name   string
		runErr error
		want   error
	}{
		{"fails", broken, broken},
		{"returns", nil, errStoppedEarly},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ev events
			var running sync.WaitGroup
			parts := []part{testPart("a", &ev, &running, nil, nil), testPart("b", &ev, &running, nil, &tc.runErr), testPart("c", &ev, &running, nil, nil)}
			done := make(chan error, 1)
			go func() { done <- runParts(context.Background(), watermill.NopLogger{}, parts) }()
			var err error
			select {
			case err = <-done:
			case <-time.After(60 * time.Second):
				t.Fatal("runParts still running after a part's run returned")
			}
			if !errors.Is(err, tc.want) || !strings.HasPrefix(err.Error(), "b: ") {
				t.Fatalf("runParts: %v, want %v prefixed with the part's name", err, tc.want)
			}
			if got, want := ev.String(), "start a, start b, start c, fail b, end c, stop c, stop b, end a, stop a"; got != want {
				t.Fatalf("events: %s\nwant:   %s", got, want)
			}
		})
	}
}

// errKilled is what a part killed by a test returns.
var errKilled = errors.New("killed by the test")

// A part of `router run` that stops while the runtime runs stops the runtime: Run returns
// an error naming the part (not bad input: exit 1), and every other part has stopped by then, its
// listeners closed. A part ends with an error of its own, or returns nil as if its loop had
// ended; nothing restarts it.
func TestRunStopsWhenAPartStops(t *testing.T) {
	testenv.Integration(t)
	for _, tc := range []struct {
		part string
		fail bool // the part returns errKilled; otherwise nil, before the runtime asked it to stop
	}{
		{"relay", false},
		{"relay", true},
		{"http", true},
		{"redeliverer " + coupon.PluginName, false},
		{"cleaner", true},
		{"admin", false},
		{"router", false},
	} {
		name := tc.part + " ends"
		if tc.fail {
			name = tc.part + " fails"
		}
		t.Run(name, func(t *testing.T) {
			rt, cfg := couponRuntime(t)
			k := newKiller(tc.part, tc.fail)
			rt.wrapRun = k.wrap
			done := make(chan error, 1)
			go func() { done <- rt.Run(context.Background()) }()
			var err error
			select {
			case <-k.started:
			case err := <-done:
				t.Fatalf("run returned before the %s part ran: %v", tc.part, err)
			case <-time.After(60 * time.Second):
				t.Fatalf("the %s part never ran", tc.part)
			}
			close(k.kill)
			select {
			case err = <-done:
			case <-time.After(60 * time.Second):
				t.Fatalf("run still running after its %s part stopped: the process is half-alive", tc.part)
			}
			if err == nil || isBadInput(err) || !strings.HasPrefix(err.Error(), tc.part+": ") {
				t.Fatalf("run: %v (bad input: %t), want an error that is not bad input with an error naming the %s part", err, isBadInput(err), tc.part)
			}
			if tc.fail != errors.Is(err, errKilled) {
				t.Fatalf("run: %v, want the part's own error: %v", err, tc.fail)
			}
			if n := k.running.Load(); n != 0 {
				t.Fatalf("%d parts still running after Run returned", n)
			}
			for _, addr := range []string{cfg.Admin.Listen, cfg.HTTP.Listen} {
				if c, err := net.DialTimeout("tcp", addr, 5*time.Second); err == nil {
					c.Close()
					t.Errorf("%s still accepts connections after Run returned", addr)
				}
			}
		})
	}
}

// couponRuntime is the runtime of `router run` with the coupon plugin on a database and a
// topic of the test's own, with every part on: the relay, the admin listener and the HTTP
// commands.
func couponRuntime(t *testing.T) (*Runtime, Config) {
	t.Helper()
	d := testenv.DB(t, 8, migrations.Set{Name: coupon.PluginName, FS: coupon.Migrations})
	kc := testenv.Kafka(t)
	topic := testenv.Topic(t, kc, "order-paid", 1)
	cfg := DefaultConfig()
	cfg.DB.DSN = d.DSN
	cfg.Kafka.Brokers = kc.Brokers
	cfg.Admin.Listen = freeAddr(t)
	cfg.HTTP.Listen = freeAddr(t)
	cfg.Relay.CheckTopics = false
	cfg.Relay.TransactionalID = "test-" + topic
	cfg.Plugins = map[string]map[string]any{coupon.PluginName: {"topics": []any{topic}, "consumer_group": "g-" + topic}}
	rt, err := New(cfg, []inbox.Plugin{coupon.Plugin()}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	return rt, cfg
}

// A cancelled `router run` stops its parts in reverse order of their start: the router
// first, so its handlers finish, and the relay last, so it publishes what the others
// committed. Run returns nil.
func TestRunStopsPartsInReverse(t *testing.T) {
	testenv.Integration(t)
	rt, _ := couponRuntime(t)
	var ended events
	var running atomic.Int64
	rt.wrapRun = func(name string, run func(context.Context) error) func(context.Context) error {
		return func(ctx context.Context) error {
			running.Add(1)
			defer ended.add(name)
			return run(ctx)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rt.Run(ctx) }()
	for deadline := time.Now().Add(60 * time.Second); running.Load() < 7; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d parts run, want 7", running.Load())
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v, want nil after a cancellation", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("run did not stop")
	}
	want := "router, http, admin, history, redeliverer " + coupon.PluginName + ", cleaner, relay"
	if got := ended.String(); got != want {
		t.Fatalf("runs ended in the order %s\nwant:                      %s", got, want)
	}
}

// `router relay` is a list of parts too: it serves the admin listener while the relay
// runs, and a cancellation stops both and returns nil.
func TestRelayCommandStopsOnCancel(t *testing.T) {
	testenv.Integration(t)
	d := testenv.DB(t, 4)
	kc := testenv.Kafka(t)
	addr := freeAddr(t)
	cfgFile := filepath.Join(t.TempDir(), "router.yaml")
	body := fmt.Sprintf("db:\n  dsn: %q\nkafka:\n  brokers: [%q]\nadmin:\n  listen: %q\nrelay:\n  transactional_id: %q\n",
		d.DSN, kc.Brokers[0], addr, "test-relay-"+filepath.Base(t.TempDir()))
	if err := os.WriteFile(cfgFile, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runRouter(ctx, cfgFile, "relay") }()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if resp, err := http.Get("http://" + addr + "/healthz"); err == nil {
			resp.Body.Close()
			break
		}
		select {
		case err := <-done:
			t.Fatalf("relay returned before its admin listener answered: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the relay's admin listener never answered")
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("relay: %v, want nil after a cancellation", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("relay did not stop")
	}
	if c, err := net.DialTimeout("tcp", addr, 5*time.Second); err == nil {
		c.Close()
		t.Fatalf("%s still accepts connections after the relay stopped", addr)
	}
}

// killer wraps the runs of a runtime's parts: it counts those running, and stops victim's
// when kill is closed.
type killer struct {
	victim  string
	fail    bool
	running atomic.Int64
	started chan struct{} // closed once victim runs
	kill    chan struct{}
	once    sync.Once
}

func newKiller(victim string, fail bool) *killer {
	return &killer{victim: victim, fail: fail, started: make(chan struct{}), kill: make(chan struct{})}
}

func (k *killer) wrap(name string, run func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		k.running.Add(1)
		defer k.running.Add(-1)
		if name != k.victim {
			return run(ctx)
		}
		inner, cancel := context.WithCancel(ctx)
		defer cancel()
		errc := make(chan error, 1)
		go func() { errc <- run(inner) }()
		k.once.Do(func() { close(k.started) })
		select {
		case err := <-errc:
			return err
		case <-k.kill:
		}
		cancel()
		if err := <-errc; err != nil {
			return err
		}
		if k.fail {
			return errKilled
		}
		return nil
	}
}

// startPart starts pt and runs it in the background, as runParts does; the returned func
// stops it.
func startPart(ctx context.Context, pt part) (func(), error) {
	if pt.start != nil {
		if err := pt.start(ctx); err != nil {
			return nil, err
		}
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if pt.run != nil {
			_ = pt.run(rctx)
		}
	}()
	return func() {
		cancel()
		<-done
		if pt.stop != nil {
			pt.stop()
		}
	}, nil
}

// startAdmin starts the admin part over db, kc and m; the returned func stops it.
func (s *Setup) startAdmin(ctx context.Context, db *sql.DB, kc kafkax.Config, m *metrics.Metrics) (func(), error) {
	return startPart(ctx, (&pipeline{s: s, db: db, kc: kc, m: m}).admin())
}

// startHTTP starts the HTTP commands' part over db, plugins and m; the returned func stops
// it.
func (s *Setup) startHTTP(ctx context.Context, db *sql.DB, plugins []Plugin, obs *observer, m *metrics.Metrics) (func(), error) {
	return startPart(ctx, (&pipeline{s: s, db: db, plugins: plugins, obs: obs, m: m}).http())
}
