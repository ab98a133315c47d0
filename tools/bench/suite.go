package main

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/pkg/dbx"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// suite is one invocation of the bench: its configuration, the services it measures on,
// and the results it has reported so far. The measurements are its methods.
type suite struct {
	cfg *config
	db  *sql.DB       // the application's pool on the bench database
	kc  kafkax.Config // the bench's Kafka client settings
	// lock holds the bench database's named lock for the life of the process; its
	// connection (the privileged user's) also runs the TRUNCATEs and the grants.
	lock *sql.Conn
	// account is the application user's account (dbx.Account), which the grants name.
	account string
	// dialect is the bench database's (MariaDB unless -dsn is a postgres:// one).
	dialect dbx.Dialect

	// services are the pids of the MariaDB and Kafka the CPU meters read (findServices).
	services map[string]string

	// workers is how many goroutines parallel uses: -workers, unless a measurement set
	// another for its duration (withWorkers).
	workers int

	results []result
	// round, when not 0, tags the lines report prints with the round of a repeated
	// measurement (the chart skips them; the medians of the rounds are reported after
	// them, untagged).
	round int
}

func newSuite(cfg *config) *suite {
	kc := kafkax.Config{Brokers: []string{cfg.brokers}, ClientID: "onceflow-bench"}
	kc = kc.WithDefaults()
	return &suite{cfg: cfg, kc: kc, workers: cfg.workers}
}

func runtimeProcs() int { return runtime.GOMAXPROCS(0) }

// openDB creates and migrates the bench database, takes its lock and opens the
// application's pool (s.db).
func (s *suite) openDB(ctx context.Context) error {
	if err := dbx.CreateDatabase(ctx, s.cfg.adminDSN); err != nil {
		return err
	}
	admin, err := dbx.Open(ctx, dbx.Config{DSN: s.cfg.adminDSN, MaxOpenConns: 2})
	if err != nil {
		return err
	}
	defer admin.Close()
	// Two benches on one database truncate each other's tables and relay each other's
	// outbox rows: refuse to start while another holds the lock.
	lockDB, err := dbx.Open(ctx, dbx.Config{DSN: s.cfg.adminDSN, MaxOpenConns: 1})
	if err != nil {
		return err
	}
	if s.lock, err = lockDB.Conn(ctx); err != nil {
		return err
	}
	var got sql.NullBool
	lockQ := "SELECT GET_LOCK(CONCAT(DATABASE(), '.onceflow-bench'), 0) = 1"
	if s.dialect = dbx.DialectOf(admin); s.dialect.IsPostgres() {
		lockQ = "SELECT pg_try_advisory_lock(hashtext(current_database() || '.onceflow-bench'))"
	}
	if err := s.lock.QueryRowContext(ctx, lockQ).Scan(&got); err != nil {
		return err
	}
	if !got.Bool {
		return fmt.Errorf("another bench is running against this database (%s); wait for it, or stop it", dbx.MaskDSN(s.cfg.adminDSN))
	}
	couponSchema := migrations.Set{Name: coupon.PluginName, FS: coupon.Migrations}
	_ = migrations.Reset(ctx, admin, couponSchema)
	if err := migrations.Up(ctx, admin, couponSchema); err != nil {
		return err
	}
	// The application user's grants, table by table, as `router migrate` gives them.
	if s.account, err = dbx.Account(ctx, dbx.Config{DSN: s.cfg.appDSN}); err != nil {
		return err
	}
	grants, err := migrations.Grants(s.dialect, couponSchema)
	if err != nil {
		return err
	}
	if _, err := migrations.ApplyGrants(ctx, s.dialect, s.lock, s.account, grants); err != nil {
		return err
	}
	s.db, err = dbx.Open(ctx, dbx.Config{DSN: s.cfg.appDSN, MaxOpenConns: s.cfg.workers + 8})
	return err
}

// grantOwn gives the application user the rows of tables the bench creates for itself (the
// plain handler's, the naive consumer's, the Watermill forwarder's): the migrations' grants
// do not list them.
func (s *suite) grantOwn(ctx context.Context, tables ...string) error {
	var gs []migrations.Grant
	for _, t := range tables {
		gs = append(gs, migrations.Grant{Table: strings.Trim(t, "`"), Privileges: []string{"SELECT", "INSERT", "UPDATE", "DELETE"}})
	}
	rep, err := migrations.ApplyGrants(ctx, s.dialect, s.lock, s.account, gs)
	if err == nil && len(rep.Missing) > 0 {
		err = fmt.Errorf("grant %v: no such table", rep.Missing)
	}
	return err
}

// truncate empties the tables a measurement writes, with TRUNCATE on the bench's admin
// connection (the application user may only DELETE): a DELETE of the previous round's
// rows left InnoDB purging them, and their half-empty pages, under the next round.
func (s *suite) truncate(ctx context.Context) error {
	for _, t := range []string{"inbox", "coupon_grant", "coupon_grant_log", "user_coupon", "outbox", "coupon_stock", "coupon_budget"} {
		if _, err := s.lock.ExecContext(ctx, "TRUNCATE TABLE "+t); err != nil {
			return fmt.Errorf("truncate %s: %w", t, err)
		}
	}
	return nil
}

func (s *suite) granter(ctx context.Context, topic string) (*coupon.Granter, coupon.Config, error) {
	cfg := coupon.DefaultConfig()
	// Never the real topics: a relay left running on the bench database (another bench
	// process) once published 150,000 bench events into coupon-granted.
	// Runs with a relay pass their own topic, for both kinds of event (a failed grant there
	// fails checkGranted); the others never relay, and name no existing topic.
	cfg.GrantedTopic, cfg.FailedTopic = "bench-unrelayed-granted", "bench-unrelayed-failed"
	if topic != "" {
		cfg.GrantedTopic, cfg.FailedTopic = topic, topic
	}
	if err := coupon.EnsureCampaign(ctx, s.db, cfg); err != nil {
		return nil, cfg, err
	}
	g, err := coupon.NewGranter(cfg, nil, nil)
	return g, cfg, err
}

// coupon builds the coupon plugin's handler on the bench's pool, as the router builds it
// (Granter.Handler: its inserts prepared on the pool), for a fresh campaign whose events go
// to topic (see granter); contract: only what a plugin author writes (inbox.Typed, the
// Inserters, the outbox writer, Prepare for slow calls), its HandleBatch left out. The
// returned func closes it.
func (s *suite) coupon(ctx context.Context, topic string, contract bool) (inbox.Handler, coupon.Config, func(), error) {
	g, cfg, err := s.granter(ctx, topic)
	if err != nil {
		return nil, cfg, nil, err
	}
	h, err := g.Handler(s.db)
	if err != nil {
		return nil, cfg, nil, err
	}
	closer := h.(io.Closer)
	closeH := func() { _ = closer.Close() }
	if contract {
		h = contractOnly(h)
	}
	return h, cfg, closeH, nil
}

// contractOnly is h with only the methods of the plugin author's contract: Decode and Handle,
// and Prepare when h has one.
func contractOnly(h inbox.Handler) inbox.Handler {
	if p, ok := h.(inbox.Preparer); ok {
		return struct {
			inbox.Handler
			inbox.Preparer
		}{h, p}
	}
	return struct{ inbox.Handler }{h}
}

func order(prefix string, i int) coupon.OrderPaid {
	return coupon.OrderPaid{OrderID: fmt.Sprintf("%s-%07d", prefix, i), UserID: fmt.Sprintf("u%d", i%100000), AmountCents: 1999,
		PaidAt: time.Date(2026, 11, 11, 0, 0, 0, 0, time.UTC).Add(time.Duration(i) * time.Millisecond)}
}

// parallel runs fn for 0..n-1 on s.workers goroutines and returns the elapsed time.
func (s *suite) parallel(n int, fn func(i int) error) (time.Duration, error) {
	var next atomic.Int64
	var wg sync.WaitGroup
	var firstErr atomic.Value
	start := time.Now()
	for range s.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n || firstErr.Load() != nil {
					return
				}
				if err := fn(i); err != nil {
					firstErr.Store(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if e := firstErr.Load(); e != nil {
		return 0, e.(error)
	}
	return time.Since(start), nil
}

// withWorkers sets how many goroutines parallel uses; the returned func restores it.
func (s *suite) withWorkers(n int) (restore func()) {
	saved := s.workers
	s.workers = n
	return func() { s.workers = saved }
}

// startProfile starts the CPU profile when -cpuprofile is set; the returned func stops it
// and writes the allocation profile when -memprofile is set.
func (c *config) startProfile() (func(), error) {
	stop := func() {
		if c.memProfile == "" {
			return
		}
		if f, err := os.Create(c.memProfile); err == nil {
			_ = pprof.Lookup("allocs").WriteTo(f, 0)
			f.Close()
		}
	}
	if c.cpuProfile == "" {
		return stop, nil
	}
	f, err := os.Create(c.cpuProfile)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close(); stop() }, nil
}
