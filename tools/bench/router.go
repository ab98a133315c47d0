package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/IBM/sarama"

	"github.com/onceflow/onceflow/pkg/dbx"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// routerGroup measures the real router binary (-router-bin, bin/router) as a child process,
// with the stock coupon plugin and the router's default settings (group commit, the
// exactly-once relay), on topics, a consumer group, a transactional id and a positions topic
// of the bench's own, on the bench database:
//
//   - mode=peak: -router-orders orders pre-loaded, -dup-pct (30 %) of them delivered twice (the peer
//     group's input), then the router started and timed until a read_committed watcher has
//     seen every order's event;
//   - mode=rate<N>: a second, fresh router; once its consumer group is stable, a generator
//     offers -router-rate orders/s (-warmup-seconds unmeasured, then -router-seconds).
//
// Each run samples the child's VmRSS every 100 ms and reads its VmHWM (the kernel's
// high-water mark) and its user + system CPU (/proc/<pid>/stat) once every event was seen,
// then stops it with SIGTERM and checks the database (every order granted, nothing left
// unpublished).
func (s *suite) routerGroup(ctx context.Context) error {
	if s.cfg.routerN <= 0 && s.cfg.routerRate <= 0 && s.cfg.routerBig <= 0 && s.cfg.routerPayloads <= 0 {
		return nil
	}
	bin, err := filepath.Abs(s.cfg.routerBin)
	if err != nil {
		return err
	}
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("router: %v (build it: make build)", err)
	}
	if s.cfg.routerN > 0 {
		if err := s.routerPeak(ctx, bin); err != nil {
			return fmt.Errorf("router peak: %w", err)
		}
	}
	if s.cfg.routerRate > 0 {
		if err := s.routerAtRate(ctx, bin); err != nil {
			return fmt.Errorf("router rate: %w", err)
		}
	}
	if s.cfg.routerBig > 0 {
		if err := s.routerStalled(ctx, bin); err != nil {
			return fmt.Errorf("router stalled: %w", err)
		}
	}
	if s.cfg.routerPayloads > 0 {
		if err := s.routerStalledPayloads(ctx, bin); err != nil {
			return fmt.Errorf("router stalled, payloads: %w", err)
		}
	}
	return nil
}

// routerStalled (mode=stalled): -router-big records of -router-big-bytes (over
// inbox.max_payload_bytes) and as many good orders reach a router whose database is
// stalled — a transaction holds the inbox's whole index range, so no delivery can be
// recorded — for -router-stall; its peak RSS shows what waiting records cost it. Once the
// database is back, every good order must be granted and every big record quarantined.
func (s *suite) routerStalled(ctx context.Context, bin string) error {
	if err := s.truncate(ctx); err != nil {
		return err
	}
	maxMsg := fmt.Sprint(s.cfg.routerBigBytes + 64<<10)
	in, cleanIn, err := makeTopicWith(s.kc, "bench-router-big", int32(s.cfg.e2eParts), map[string]*string{"max.message.bytes": &maxMsg})
	if err != nil {
		return err
	}
	defer cleanIn()
	out, cleanOut, err := makeTopic(s.kc, "bench-router-granted", int32(s.cfg.e2eParts))
	if err != nil {
		return err
	}
	defer cleanOut()
	sc := s.kc.ProducerConfig()
	sc.Producer.MaxMessageBytes = s.cfg.routerBigBytes + 64<<10
	producer, err := sarama.NewSyncProducer(s.kc.Brokers, sc)
	if err != nil {
		return err
	}
	defer producer.Close()
	n := s.cfg.routerBig
	for i := range n {
		o := order("good", i)
		big := o.Encode()
		big = append(big[:len(big)-1], []byte(`,"pad":"`+strings.Repeat("x", s.cfg.routerBigBytes-len(big)-10)+`"}`)...)
		msgs := []*sarama.ProducerMessage{
			{Topic: in, Key: sarama.StringEncoder(o.OrderID), Value: sarama.ByteEncoder(o.Encode())},
			{Topic: in, Key: sarama.StringEncoder(fmt.Sprintf("big-%d", i)), Value: sarama.ByteEncoder(big)},
		}
		if err := producer.SendMessages(msgs); err != nil {
			return err
		}
	}
	// The stall: every claim of an inbox row waits (and times out, and retries) behind it.
	stall, err := s.stallInbox(ctx)
	if err != nil {
		return err
	}
	defer stall.Rollback()
	w, err := watch(s.kc, out)
	if err != nil {
		return err
	}
	defer w.close()
	c, err := s.startRouter(bin, "stalled", in, out)
	if err != nil {
		return err
	}
	defer c.stop()
	time.Sleep(s.cfg.routerStall)
	stalledMB := c.hwmMB()
	if err := stall.Rollback(); err != nil {
		return err
	}
	t0 := time.Now()
	if err := c.waitSeen(w, n, 5*time.Minute); err != nil {
		return err
	}
	var quarantined int
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if err := s.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM inbox WHERE status = 'failed' AND payload_size IS NOT NULL").Scan(&quarantined); err != nil {
			return err
		}
		if quarantined >= n || time.Now().After(deadline) {
			break
		}
	}
	recovered := time.Since(t0)
	hwm := c.hwmMB()
	if err := c.stop(); err != nil {
		return err
	}
	if err := checkGranted(ctx, s.db, n); err != nil {
		return err
	}
	if quarantined != n {
		return fmt.Errorf("%d of %d big records quarantined", quarantined, n)
	}
	s.report("router", "mode", "stalled", "big_records", n, "big_bytes", s.cfg.routerBigBytes, "orders", n, "stall_s", s.cfg.routerStall.Seconds(),
		"max_rss_mb", hwm, "max_rss_stalled_mb", stalledMB, "recovered_s", recovered.Seconds(), "quarantined", quarantined, "granted", n,
		"rss_sampled_max_mb", c.sampledMaxMB())
	return nil
}

// routerStalledPayloads (mode=stalled_payloads): -router-payloads orders of
// -router-payload-bytes each, under inbox.max_payload_bytes, so none is cut and each waits
// whole, reach a router whose database is stalled for -router-payload-stall, on
// -e2e-partitions partitions. Its peak RSS is read 10 s after its start, at the end of the
// stall, and over the processing once the database is back, until every order is granted.
func (s *suite) routerStalledPayloads(ctx context.Context, bin string) error {
	if err := s.truncate(ctx); err != nil {
		return err
	}
	size := s.cfg.routerPayloadBytes
	maxMsg := fmt.Sprint(size + 64<<10)
	in, cleanIn, err := makeTopicWith(s.kc, "bench-router-payload", int32(s.cfg.e2eParts), map[string]*string{"max.message.bytes": &maxMsg})
	if err != nil {
		return err
	}
	defer cleanIn()
	out, cleanOut, err := makeTopic(s.kc, "bench-router-granted", int32(s.cfg.e2eParts))
	if err != nil {
		return err
	}
	defer cleanOut()
	sc := s.kc.ProducerConfig()
	sc.Producer.MaxMessageBytes = size + 64<<10
	producer, err := sarama.NewSyncProducer(s.kc.Brokers, sc)
	if err != nil {
		return err
	}
	defer producer.Close()
	n := s.cfg.routerPayloads
	for i := 0; i < n; i += 10 {
		var msgs []*sarama.ProducerMessage
		for j := i; j < min(i+10, n); j++ {
			o := order("pay", j)
			v, err := paddedOrder(o.Encode(), size)
			if err != nil {
				return err
			}
			msgs = append(msgs, &sarama.ProducerMessage{Topic: in, Key: sarama.StringEncoder(o.OrderID), Value: sarama.ByteEncoder(v)})
		}
		if err := producer.SendMessages(msgs); err != nil {
			return err
		}
	}
	stall, err := s.stallInbox(ctx)
	if err != nil {
		return err
	}
	defer stall.Rollback()
	w, err := watch(s.kc, out)
	if err != nil {
		return err
	}
	defer w.close()
	c, err := s.startRouter(bin, "stalled_payloads", in, out)
	if err != nil {
		return err
	}
	defer c.stop()
	first := min(10*time.Second, s.cfg.routerPayloadStall)
	time.Sleep(first)
	firstMB := c.hwmMB()
	time.Sleep(s.cfg.routerPayloadStall - first)
	stalledMB := c.hwmMB()
	c.resetSampled()
	if err := stall.Rollback(); err != nil {
		return err
	}
	t0 := time.Now()
	if err := c.waitSeen(w, n, 10*time.Minute); err != nil {
		return err
	}
	recovered := time.Since(t0)
	processingMB := c.sampledMaxMB()
	hwm := c.hwmMB()
	if err := c.stop(); err != nil {
		return err
	}
	if err := checkGranted(ctx, s.db, n); err != nil {
		return err
	}
	s.report("router", "mode", "stalled_payloads", "payloads", n, "payload_bytes", size, "partitions", s.cfg.e2eParts,
		"stall_s", s.cfg.routerPayloadStall.Seconds(), "max_rss_mb", hwm, "max_rss_first_mb", firstMB, "first_s", first.Seconds(),
		"max_rss_stalled_mb", stalledMB, "rss_processing_max_mb", processingMB, "recovered_s", recovered.Seconds(), "granted", n)
	return nil
}

// stallTx is a transaction that holds the inbox's whole index range, on a pool of its own.
type stallTx struct {
	db *sql.DB
	tx *sql.Tx
}

// stallInbox begins a transaction that locks the inbox's whole index range: gap locks, so
// no claim of a new row passes until Rollback. Its pool sets no idle transaction timeout,
// because the transaction waits far longer than the 30 s default of db.idle_tx_timeout
// between its statements; with it the server would end the stall early and the rollback
// would fail with a bad connection.
func (s *suite) stallInbox(ctx context.Context) (*stallTx, error) {
	db, err := dbx.Open(ctx, dbx.Config{DSN: s.cfg.appDSN, MaxOpenConns: 1, IdleTxTimeout: dbx.NoIdleTxTimeout})
	if err != nil {
		return nil, err
	}
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	if err == nil {
		_, err = tx.ExecContext(ctx, "SELECT id FROM inbox WHERE id >= 0 FOR UPDATE")
		if err != nil {
			_ = tx.Rollback()
		}
	}
	if err != nil {
		db.Close()
		return nil, err
	}
	return &stallTx{db: db, tx: tx}, nil
}

// Rollback ends the stall and closes its pool. A second call returns sql.ErrTxDone.
func (t *stallTx) Rollback() error {
	err := t.tx.Rollback()
	if err != sql.ErrTxDone {
		t.db.Close()
	}
	return err
}

// paddedOrder is the order's JSON with a "pad" field that makes it exactly size bytes.
func paddedOrder(o []byte, size int) ([]byte, error) {
	const pre, post = `,"pad":"`, `"}`
	pad := size - (len(o) - 1) - len(pre) - len(post)
	if pad < 0 {
		return nil, fmt.Errorf("an order of %d bytes does not fit in %d", len(o), size)
	}
	v := make([]byte, 0, size)
	v = append(v, o[:len(o)-1]...)
	v = append(v, pre...)
	v = append(v, strings.Repeat("x", pad)...)
	return append(v, post...), nil
}

// routerTopics empties the bench tables and creates the run's input and output topics; the
// returned func deletes them.
func (s *suite) routerTopics(ctx context.Context) (in, out string, clean func(), err error) {
	if err := s.truncate(ctx); err != nil {
		return "", "", nil, err
	}
	in, cleanIn, err := makeTopic(s.kc, "bench-router-order-paid", int32(s.cfg.e2eParts))
	if err != nil {
		return "", "", nil, err
	}
	out, cleanOut, err := makeTopic(s.kc, "bench-router-granted", int32(s.cfg.e2eParts))
	if err != nil {
		cleanIn()
		return "", "", nil, err
	}
	return in, out, func() { cleanOut(); cleanIn() }, nil
}

func (s *suite) routerPeak(ctx context.Context, bin string) error {
	n := s.cfg.routerN
	in, out, clean, err := s.routerTopics(ctx)
	if err != nil {
		return err
	}
	defer clean()
	deliveries, err := s.loadPeerInput(in, n)
	if err != nil {
		return err
	}
	w, err := watch(s.kc, out)
	if err != nil {
		return err
	}
	defer w.close()
	cpu := newCPUMeter(s.services)
	delete(cpu.pids, "bench") // the bench only watches here: its CPU is not the pipeline's
	start := time.Now()
	c, err := s.startRouter(bin, "peak", in, out)
	if err != nil {
		return err
	}
	defer c.stop()
	cpu.pids["router"], cpu.start["router"] = c.pidStr(), 0 // from its start
	profDone := s.profileRouter(c, w)
	if err := c.waitSeen(w, n, 10*time.Minute); err != nil {
		return err
	}
	if err := <-profDone; err != nil {
		return err
	}
	allocs, err := s.routerAllocs(c, n)
	if err != nil {
		return err
	}
	el := time.Since(start)
	kv := cpu.perOrder(n)
	hwm := c.hwmMB()
	routerUS := float64(procCPU(c.pidStr()).Microseconds()) / float64(n)
	startMs := float64(w.first().Sub(start).Microseconds()) / 1000
	if err := c.stop(); err != nil {
		return err
	}
	if err := checkGranted(ctx, s.db, n); err != nil {
		return err
	}
	s.report("router", append([]any{"mode", "peak", "orders_per_s", float64(n) / el.Seconds(), "max_rss_mb", hwm, "cpu_us_per_order", routerUS,
		"orders", n, "deliveries", deliveries, "start_ms", startMs, "steady_orders_per_s", float64(n) / (el.Seconds() - startMs/1000),
		"rss_sampled_max_mb", c.sampledMaxMB()}, append(kv, allocs...)...)...)
	return nil
}

func (s *suite) routerAtRate(ctx context.Context, bin string) error {
	rate := s.cfg.routerRate
	in, out, clean, err := s.routerTopics(ctx)
	if err != nil {
		return err
	}
	defer clean()
	w, err := watch(s.kc, out)
	if err != nil {
		return err
	}
	defer w.close()
	producer, err := s.kc.NewSyncProducer()
	if err != nil {
		return err
	}
	defer producer.Close()
	mode := fmt.Sprintf("rate%d", rate)
	c, err := s.startRouter(bin, mode, in, out)
	if err != nil {
		return err
	}
	defer c.stop()
	if err := waitGroupStable(s.kc, routerGroupName(in), 2*time.Minute, c); err != nil {
		return err
	}
	r, err := s.pace(producer, c, w, in, "router", "rwarm", "rlat")
	if err != nil {
		return err
	}
	if err := checkGranted(ctx, s.db, r.warm+r.count); err != nil {
		return err
	}
	p50, p99, _, err := latencies(s.kc, in, w, "rlat", 0, r.count)
	if err != nil {
		return err
	}
	s.report("router", append([]any{"mode", mode, "offered_per_s", rate, "orders_per_s", r.achieved, "max_rss_mb", r.hwm,
		"cpu_us_per_order", r.kv[slicesIndex(r.kv, "router_cpu_us_per_order")+1], "orders", r.count, "seconds", s.cfg.routerSecs,
		"p50_ms", p50, "p99_ms", p99, "rss_sampled_max_mb", c.sampledMaxMB()}, r.kv...)...)
	return nil
}

// pacedRun is what pace measured.
type pacedRun struct {
	warm, count int     // orders of the warm-up, and measured
	achieved    float64 // measured orders per second
	kv          []any   // CPU per order by process (cpuMeter.perOrder)
	hwm         float64 // the child's peak RSS, MB
}

// pace offers -router-rate orders/s to the running child c on topic in: -warmup-seconds of
// orders named warm, then -router-seconds of orders named lat, the measured ones. Once w
// has seen every event it stops c. role names c's CPU in the figures ("router", "lean").
func (s *suite) pace(producer sarama.SyncProducer, c *child, w *watcher, in, role, warm, lat string) (pacedRun, error) {
	rate := s.cfg.routerRate
	r := pacedRun{warm: rate * s.cfg.warmSecs, count: rate * s.cfg.routerSecs}
	e := &e2eRun{s: s}
	if err := e.produceOrders(producer, in, warm, 0, r.warm, float64(rate)); err != nil {
		return r, err
	}
	cpu := newCPUMeter(s.services)
	delete(cpu.pids, "bench")
	cpu.pids[role], cpu.start[role] = c.pidStr(), procCPU(c.pidStr())
	t0 := time.Now()
	if err := e.produceOrders(producer, in, lat, 0, r.count, float64(rate)); err != nil {
		return r, err
	}
	if err := c.waitSeen(w, r.warm+r.count, 5*time.Minute); err != nil {
		return r, err
	}
	r.achieved = float64(r.count) / time.Since(t0).Seconds()
	// The measured orders and the warm-up's tail, as the e2e latency runs count them.
	r.kv = cpu.perOrder(r.count)
	r.hwm = c.hwmMB()
	return r, c.stop()
}

// slicesIndex is the index of key in kv (alternating keys and values); -1 when absent.
func slicesIndex(kv []any, key string) int {
	for i := 0; i < len(kv); i += 2 {
		if kv[i] == key {
			return i
		}
	}
	return -1
}

// routerGroupName is the consumer group of a router run on topic in.
func routerGroupName(in string) string { return "bench-router-" + in }

// child is one running `router run`: its process, its RSS sampler, its log.
type child struct {
	cmd       *exec.Cmd
	logPath   string
	exited    chan struct{}
	waitErr   error
	adminAddr string // with admin.pprof, for -router-cpuprofile and -router-memprofile

	mu        sync.Mutex
	maxRSSKB  float64
	stopOnce  sync.Once
	stopErr   error
	samplerWG sync.WaitGroup
}

// startRouter writes the run's configuration and starts `bin run --plugins coupon-granter`
// with it; its output goes to .run/bench-router-<mode>.log.
func (s *suite) startRouter(bin, mode, in, out string) (*child, error) {
	dir, err := os.MkdirTemp("", "bench-router-")
	if err != nil {
		return nil, err
	}
	positions, dropPositions := positionsTopic(s.kc)
	adminAddr := ""
	// The idle router has its admin listener, as admin.listen's default gives one: its
	// readiness checks run in the background.
	if mode == "peak" && (s.cfg.routerProfile != "" || s.cfg.routerMemProfile != "") || mode == "idle" {
		if adminAddr, err = freePort(); err != nil {
			return nil, err
		}
	}
	yaml := fmt.Sprintf(`db:
  dsn: '%s'
  admin_dsn: '%s'
kafka:
  brokers: [%s]
relay:
  transactional_id: bench-router-%d
  positions_topic: %s
admin:
  listen: '%s'
  pprof: %t
log:
  level: warn
plugins:
  coupon-granter:
    topics: [%s]
    consumer_group: %s
    granted_topic: %s
    failed_topic: %s
`, s.cfg.appDSN, s.cfg.adminDSN, s.cfg.brokers, time.Now().UnixNano(), positions, adminAddr, adminAddr != "", in, routerGroupName(in), out, out)
	cfgPath := filepath.Join(dir, "router.yaml")
	if err := os.WriteFile(cfgPath, []byte(yaml), 0o600); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "--config", cfgPath, "run", "--plugins", "coupon-granter")
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "ONCEFLOW_") {
			cmd.Env = append(cmd.Env, e)
		}
	}
	if s.cfg.routerEnv != "" {
		cmd.Env = append(cmd.Env, strings.Split(s.cfg.routerEnv, ",")...)
	}
	c, err := startChild(cmd, "bench-router-"+mode, func() { os.RemoveAll(dir); dropPositions() })
	if err != nil {
		return nil, err
	}
	c.adminAddr = adminAddr
	fmt.Printf("bench: router %s started (pid %d, log %s)\n", mode, cmd.Process.Pid, c.logPath)
	return c, nil
}

// startChild starts cmd with its output in .run/<name>.log and samples its resident set;
// cleanup runs once it has exited.
func startChild(cmd *exec.Cmd, name string, cleanup func()) (*child, error) {
	if err := os.MkdirAll(".run", 0o755); err != nil {
		return nil, err
	}
	logPath := filepath.Join(".run", name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // a ^C goes to the bench, which stops it
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	c := &child{cmd: cmd, logPath: logPath, exited: make(chan struct{})}
	go func() {
		c.waitErr = cmd.Wait()
		logf.Close()
		cleanup()
		close(c.exited)
	}()
	c.samplerWG.Add(1)
	go c.sample()
	return c, nil
}

func (c *child) pidStr() string { return strconv.Itoa(c.cmd.Process.Pid) }

// sample reads the child's VmRSS every 100 ms until it exits.
func (c *child) sample() {
	defer c.samplerWG.Done()
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		if kb := procStatusKB(c.pidStr(), "VmRSS:"); kb > 0 {
			c.mu.Lock()
			c.maxRSSKB = max(c.maxRSSKB, kb)
			c.mu.Unlock()
		}
		select {
		case <-c.exited:
			return
		case <-t.C:
		}
	}
}

// resetSampled starts the largest VmRSS sample over: sampledMaxMB then covers what follows.
func (c *child) resetSampled() {
	c.mu.Lock()
	c.maxRSSKB = 0
	c.mu.Unlock()
}

func (c *child) sampledMaxMB() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.maxRSSKB / 1024
}

// hwmMB is the child's peak resident set so far (VmHWM), in MiB.
func (c *child) hwmMB() float64 { return procStatusKB(c.pidStr(), "VmHWM:") / 1024 }

// waitSeen waits until w has seen n events; it fails at once if the router exits.
func (c *child) waitSeen(w *watcher, n int, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		w.mu.Lock()
		seen := len(w.seen)
		w.mu.Unlock()
		if seen >= n {
			return nil
		}
		select {
		case <-c.exited:
			return fmt.Errorf("the router exited (%v) after %d of %d events; its log: %s%s", c.waitErr, seen, n, c.logPath, c.logTail())
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out: a read_committed consumer saw %d of %d events (router log %s)", seen, n, c.logPath)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (c *child) logTail() string {
	b, _ := os.ReadFile(c.logPath)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 10 {
		lines = lines[len(lines)-10:]
	}
	return "\n  " + strings.Join(lines, "\n  ")
}

// first is when the watcher saw its first event (the zero time before it saw one).
func (w *watcher) first() time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	var t time.Time
	for _, at := range w.seen {
		if t.IsZero() || at.Before(t) {
			t = at
		}
	}
	return t
}

// stop ends the router with SIGTERM (SIGKILL after 40 s) and waits for it; an exit status
// other than 0 is an error. Later calls return the first's result.
func (c *child) stop() error {
	c.stopOnce.Do(func() {
		select {
		case <-c.exited:
		default:
			_ = c.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-c.exited:
			case <-time.After(40 * time.Second):
				_ = c.cmd.Process.Signal(syscall.SIGKILL)
				<-c.exited
				c.stopErr = fmt.Errorf("the router did not stop within 40 s of SIGTERM (log %s)", c.logPath)
			}
		}
		c.samplerWG.Wait()
		if c.stopErr == nil && c.waitErr != nil {
			c.stopErr = fmt.Errorf("router: %v (log %s)%s", c.waitErr, c.logPath, c.logTail())
		}
	})
	return c.stopErr
}

// procStatusKB is a "kB" field of /proc/<pid>/status (VmRSS:, VmHWM:); 0 when unreadable.
func procStatusKB(pid, field string) float64 {
	b, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			if err == nil {
				return kb
			}
		}
	}
	return 0
}

// waitGroupStable waits until the consumer group is Stable with at least one member: the
// router has joined and been given its partitions.
func waitGroupStable(kc kafkax.Config, group string, limit time.Duration, c *child) error {
	sc := sarama.NewConfig()
	sc.Version = kafkax.Version
	admin, err := sarama.NewClusterAdmin(kc.Brokers, sc)
	if err != nil {
		return kafkax.Unreachable(kc.Brokers, err)
	}
	defer admin.Close()
	deadline := time.Now().Add(limit)
	for {
		gs, err := admin.DescribeConsumerGroups([]string{group})
		if err == nil && len(gs) == 1 && gs[0].State == "Stable" && len(gs[0].Members) > 0 {
			return nil
		}
		select {
		case <-c.exited:
			return fmt.Errorf("%s exited (%v) before its group %s was stable; its log: %s%s", filepath.Base(c.cmd.Path), c.waitErr, group, c.logPath, c.logTail())
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("consumer group %s not stable after %s (router log %s)", group, limit, c.logPath)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// profileRouter, with -router-cpuprofile, takes the router's CPU profile for
// -router-cpuprofile-seconds from its first output. The channel reports the outcome once.
func (s *suite) profileRouter(c *child, w *watcher) <-chan error {
	done := make(chan error, 1)
	if c.adminAddr == "" || s.cfg.routerProfile == "" {
		done <- nil
		return done
	}
	go func() {
		for w.first().IsZero() {
			time.Sleep(10 * time.Millisecond)
		}
		done <- getProfile(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", c.adminAddr, s.cfg.routerProfileSecs), s.cfg.routerProfile)
	}()
	return done
}

// routerAllocs, with -router-memprofile, writes the router's allocation profile (every
// allocation since it started; its totals are sampled estimates) and returns the exact
// counts per order of n, from the runtime's MemStats (the profile's debug=1 text):
// allocs_per_order (Mallocs) and alloc_bytes_per_order (TotalAlloc), start-up included.
func (s *suite) routerAllocs(c *child, n int) ([]any, error) {
	if s.cfg.routerMemProfile == "" {
		return nil, nil
	}
	if err := getProfile(fmt.Sprintf("http://%s/debug/pprof/allocs", c.adminAddr), s.cfg.routerMemProfile); err != nil {
		return nil, err
	}
	resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/allocs?debug=1", c.adminAddr))
	if err != nil {
		return nil, fmt.Errorf("router profile: %w", err)
	}
	defer resp.Body.Close()
	text, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("router profile: %w", err)
	}
	mallocs, bytes := memStat(string(text), "Mallocs"), memStat(string(text), "TotalAlloc")
	if mallocs <= 0 || bytes <= 0 {
		return nil, errors.New("router profile: no Mallocs or TotalAlloc in its MemStats")
	}
	return []any{"allocs_per_order", mallocs / float64(n), "alloc_bytes_per_order", bytes / float64(n)}, nil
}

// memStat reads "# name = value" of a heap profile's debug=1 text; 0 when absent.
func memStat(text, name string) float64 {
	for line := range strings.Lines(text) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "# "+name+" = "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}

// getProfile writes the profile served at url to path.
func getProfile(url, path string) error {
	resp, err := http.Get(url)
	if err != nil {
		return fmt.Errorf("router profile: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("router profile: %s", resp.Status)
	}
	f, err := os.Create(path)
	if err == nil {
		_, err = io.Copy(f, resp.Body)
		err = errors.Join(err, f.Close())
	}
	return err
}

func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}
