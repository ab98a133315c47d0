// Command streamrss measures how much memory `router produce` and `router replay` hold as
// their runs grow: it runs bin/router as a child process at each size and reads the child's
// peak resident set (getrusage's ru_maxrss, the kernel's high-water mark of the process) once
// it exited. `make bench-stream` runs it; docs/BENCHMARKS.md ("Memory of produce and
// replay") has the method and the figures.
//
//	go build -C tools -o ../bin/streamrss ./streamrss && bin/streamrss [-sizes 10000,1000000] [-replay-sizes 10000,100000]
//
// produce sends -sizes orders (30 % of them twice) of the coupon granter's input to a topic
// of its own, deleted afterwards. replay runs over as many inbox rows, in a database of its
// own (onceflow_stream: `router migrate --reset`, then the rows written by INSERT … SELECT
// from MariaDB's sequence engine, all 'failed', each holding an order): a dry run at every
// size (every row read, page by page, with its payload), and the real replay through the
// coupon granter at -replay-sizes (one transaction per row, so bounded by the disk's
// commits). Each line is `BENCH name=stream_rss command=… orders=… max_rss_mb=…`, and the
// ratio of the largest size's peak to the smallest's closes the run.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	_ "github.com/go-sql-driver/mysql"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/pkg/dbx"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

type options struct {
	sizes, replaySizes []int
	adminDSN, dsn      string
	brokers            string
	router             string
	dupRate            float64
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "streamrss: %v\n", err)
		os.Exit(1)
	}
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("size %q: want a positive integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func run() error {
	var o options
	var sizes, replaySizes string
	flag.StringVar(&sizes, "sizes", "10000,1000000", "orders of the produce runs and inbox rows of the dry-run replays (comma separated)")
	flag.StringVar(&replaySizes, "replay-sizes", "5000,50000", "inbox rows of the real replays, through the coupon granter (comma separated; empty: none)")
	flag.StringVar(&o.adminDSN, "admin-dsn", "onceflow_admin:onceflow_admin@tcp(127.0.0.1:3306)/onceflow_stream", "privileged DSN of the measurement's database")
	flag.StringVar(&o.dsn, "dsn", "onceflow:onceflow@tcp(127.0.0.1:3306)/onceflow_stream", "application DSN of the measurement's database")
	flag.StringVar(&o.brokers, "brokers", "127.0.0.1:9092", "Kafka brokers")
	flag.StringVar(&o.router, "router", "bin/router", "the router binary measured")
	flag.Float64Var(&o.dupRate, "dup-rate", 0.3, "produce --dup-rate")
	flag.Parse()
	var err error
	if o.sizes, err = ints(sizes); err != nil {
		return err
	}
	if o.replaySizes, err = ints(replaySizes); err != nil {
		return err
	}
	o.sizes, o.replaySizes = uniqueSorted(o.sizes), uniqueSorted(o.replaySizes)
	if _, err := os.Stat(o.router); err != nil {
		return fmt.Errorf("%v (build it: go build -o bin/router ./cmd/router)", err)
	}
	ctx := context.Background()
	cfgFile, err := writeConfig(o)
	if err != nil {
		return err
	}
	defer os.RemoveAll(filepath.Dir(cfgFile))

	peaks := map[string][]float64{}
	for _, n := range o.sizes {
		mb, err := o.produce(ctx, cfgFile, n)
		if err != nil {
			return err
		}
		peaks["produce"] = append(peaks["produce"], mb)
	}
	all := append(append([]int(nil), o.sizes...), o.replaySizes...)
	for _, n := range uniqueSorted(all) {
		if err := o.fillInbox(ctx, cfgFile, n); err != nil {
			return err
		}
		if contains(o.sizes, n) {
			mb, err := o.replay(cfgFile, n, true)
			if err != nil {
				return err
			}
			peaks["replay_dry_run"] = append(peaks["replay_dry_run"], mb)
		}
		if contains(o.replaySizes, n) {
			mb, err := o.replay(cfgFile, n, false)
			if err != nil {
				return err
			}
			peaks["replay"] = append(peaks["replay"], mb)
		}
	}
	for _, c := range []struct {
		name  string
		sizes []int
	}{{"produce", o.sizes}, {"replay_dry_run", o.sizes}, {"replay", o.replaySizes}} {
		p := peaks[c.name]
		if len(p) < 2 {
			continue
		}
		fmt.Printf("BENCH name=stream_rss_ratio command=%s from=%d to=%d max_rss_ratio=%.2f\n", c.name, c.sizes[0], c.sizes[len(c.sizes)-1], p[len(p)-1]/p[0])
	}
	return nil
}

func contains(xs []int, x int) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

func uniqueSorted(xs []int) []int {
	var out []int
	for _, x := range xs {
		if !contains(out, x) {
			out = append(out, x)
		}
	}
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

// writeConfig writes the router's configuration for the measurement: the databases, the
// broker, no admin listener.
func writeConfig(o options) (string, error) {
	dir, err := os.MkdirTemp("", "streamrss-")
	if err != nil {
		return "", err
	}
	f := filepath.Join(dir, "router.yaml")
	yaml := fmt.Sprintf("db:\n  dsn: '%s'\n  admin_dsn: '%s'\nkafka:\n  brokers: [%s]\nadmin:\n  listen: ''\n", o.dsn, o.adminDSN, o.brokers)
	return f, os.WriteFile(f, []byte(yaml), 0o600)
}

// measured is one finished child: its peak resident set, how long it ran, and the last lines
// of its output.
type measured struct {
	maxRSSMB float64
	elapsed  time.Duration
	tail     []string
}

// runRouter runs the router with args and returns its peak resident set once it exited. Its
// output is read as it comes and only the last lines are kept, so a million-line replay
// costs this process nothing.
func (o options) runRouter(cfgFile string, args ...string) (measured, error) {
	var m measured
	cmd := exec.Command(o.router, append([]string{"--config", cfgFile}, args...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return m, err
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return m, err
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		m.tail = append(m.tail, sc.Text())
		if len(m.tail) > 8 {
			m.tail = m.tail[1:]
		}
	}
	_, _ = io.Copy(io.Discard, out)
	err = cmd.Wait()
	m.elapsed = time.Since(start)
	if err != nil {
		return m, fmt.Errorf("router %s: %w\n%s", strings.Join(args, " "), err, strings.Join(m.tail, "\n"))
	}
	ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	if !ok {
		return m, errors.New("no resource usage of the child on this system")
	}
	m.maxRSSMB = float64(ru.Maxrss) / 1024 // kilobytes on Linux
	return m, nil
}

func lastWith(lines []string, prefix string) string {
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.HasPrefix(lines[i], prefix) {
			return lines[i]
		}
	}
	return ""
}

// produce runs `router produce` of n orders to a fresh topic and reports its peak.
func (o options) produce(ctx context.Context, cfgFile string, n int) (float64, error) {
	kc := kafkax.Config{Brokers: strings.Split(o.brokers, ","), ClientID: "onceflow-streamrss"}.WithDefaults()
	topic := fmt.Sprintf("stream-rss-%d-%d", n, time.Now().UnixNano())
	admin, err := sarama.NewClusterAdmin(kc.Brokers, kc.SaramaConfig())
	if err != nil {
		return 0, fmt.Errorf("kafka %s: %w (start it with `scripts/infra.sh up`)", o.brokers, err)
	}
	defer admin.Close()
	if err := admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: 12, ReplicationFactor: 1}, false); err != nil {
		return 0, fmt.Errorf("create topic %s: %w", topic, err)
	}
	defer func() { _ = admin.DeleteTopic(topic) }()
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if parts, err := kc.CheckTopics(topic); err == nil && parts[topic] == 12 {
			break
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("topic %s not ready", topic)
		}
	}
	m, err := o.runRouter(cfgFile, "produce", "--plugin", coupon.PluginName, "--topic", topic, "--orders", strconv.Itoa(n),
		"--dup-rate", fmt.Sprint(o.dupRate), "--seed", "1", "--prefix", fmt.Sprintf("rss-%d", n))
	if err != nil {
		return 0, err
	}
	line := lastWith(m.tail, "PRODUCED ")
	if !strings.Contains(line, fmt.Sprintf("orders=%d ", n)) {
		return 0, fmt.Errorf("produce of %d orders said %q", n, line)
	}
	deliveries := field(line, "deliveries")
	fmt.Printf("BENCH name=stream_rss command=produce orders=%d deliveries=%s max_rss_mb=%.1f seconds=%.1f\n", n, deliveries, m.maxRSSMB, m.elapsed.Seconds())
	return m.maxRSSMB, nil
}

func field(line, key string) string {
	for _, f := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(f, key+"="); ok {
			return v
		}
	}
	return "?"
}

// fillInbox gives the measurement's database a fresh schema and n 'failed' inbox rows of the
// coupon biz type, each holding an order the coupon granter accepts.
func (o options) fillInbox(ctx context.Context, cfgFile string, n int) error {
	if _, err := o.runRouter(cfgFile, "migrate", "--reset"); err != nil {
		return err
	}
	db, err := dbx.Open(ctx, dbx.Config{DSN: o.adminDSN, MaxOpenConns: 1})
	if err != nil {
		return err
	}
	defer db.Close()
	const chunk = 100_000
	start := time.Now()
	for from := 1; from <= n; from += chunk {
		to := min(from+chunk-1, n)
		q := fmt.Sprintf(`INSERT INTO inbox (dedup_key, biz_type, status, reason, message_uuid, topic, kafka_partition, kafka_offset,
 payload, fingerprint, attempts, last_error, expire_at)
 SELECT CONCAT('rss-', LPAD(seq, 8, '0')), ?, 'failed', 'retries_exhausted', UUID(), 'order-paid', seq %% 12, seq,
 CONCAT('{"orderId":"rss-', LPAD(seq, 8, '0'), '","userId":"u', seq %% 100000, '","amountCents":1999,"paidAt":"2026-11-11T00:00:00Z"}'),
 SHA2(CONCAT('rss-', seq), 256), 1, 'wallet service down', NOW(6) + INTERVAL 7 DAY
 FROM seq_%d_to_%d`, from, to)
		if _, err := db.ExecContext(ctx, q, coupon.BizType); err != nil {
			return fmt.Errorf("fill the inbox (rows %d..%d): %w", from, to, err)
		}
	}
	var have int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM inbox").Scan(&have); err != nil || have != n {
		return fmt.Errorf("inbox holds %d rows (%v), want %d", have, err, n)
	}
	if _, err := db.ExecContext(ctx, "ANALYZE TABLE inbox"); err != nil {
		return err
	}
	fmt.Printf("streamrss: %d failed inbox rows written in %.1f s\n", n, time.Since(start).Seconds())
	return nil
}

// replay runs `router replay` over the n failed rows (a dry run, or the real one) and
// reports its peak.
func (o options) replay(cfgFile string, n int, dryRun bool) (float64, error) {
	args := []string{"replay", "--biz-type", coupon.BizType, "--status", "failed"}
	name := "replay"
	if dryRun {
		args = append(args, "--dry-run")
		name = "replay_dry_run"
	}
	m, err := o.runRouter(cfgFile, args...)
	if err != nil {
		return 0, err
	}
	line := lastWith(m.tail, "REPLAY ")
	want := fmt.Sprintf("selected=%d processed=%d ", n, map[bool]int{true: 0, false: n}[dryRun])
	if !strings.Contains(line, want) {
		return 0, fmt.Errorf("%s over %d rows said %q, want %q", name, n, line, want)
	}
	fmt.Printf("BENCH name=stream_rss command=%s rows=%d max_rss_mb=%.1f seconds=%.1f rows_per_s=%.0f\n", name, n, m.maxRSSMB, m.elapsed.Seconds(), float64(n)/m.elapsed.Seconds())
	return m.maxRSSMB, nil
}
