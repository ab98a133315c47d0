package main

import (
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/onceflow/onceflow/pkg/dbx"
)

// cpuMeter reads the CPU time (user + system) used by the processes of a measurement on
// this host: MariaDB, the Kafka broker, and this process (router side: consumer, inbox,
// relay, watcher) — or, in the router group (router.go), the router binary as a child
// process ("router"), or the lean group's pipeline ("lean", lean.go), the bench then left out. CPU per order is steadier than throughput on a shared, noisy machine,
// and says where the 2 cores go.
type cpuMeter struct {
	pids  map[string]string // role → pid
	start map[string]time.Duration
}

// newCPUMeter starts a meter on the bench and the services (findServices; a role it did not
// find: the last process of its kind on this host).
func newCPUMeter(services map[string]string) *cpuMeter {
	m := &cpuMeter{pids: map[string]string{"bench": "self"}, start: map[string]time.Duration{}}
	for role, pid := range services {
		m.pids[role] = pid
	}
	if len(services) < 2 {
		dirs, _ := filepath.Glob("/proc/[0-9]*")
		for _, d := range dirs {
			cmd, err := os.ReadFile(filepath.Join(d, "cmdline"))
			if err != nil {
				continue
			}
			c := string(cmd)
			switch {
			case services["db"] != "":
			case strings.HasPrefix(c, "/usr/sbin/mariadbd") || strings.HasPrefix(c, "/usr/sbin/mysqld"):
				m.pids["db"] = filepath.Base(d)
			}
			switch {
			case services["kafka"] != "":
			case strings.Contains(c, "kafka.Kafka"):
				m.pids["kafka"] = filepath.Base(d)
			}
		}
	}
	for role, pid := range m.pids {
		m.start[role] = procCPU(pid)
	}
	return m
}

// findServices returns the MariaDB ("db") and Kafka ("kafka") processes the bench measures
// on: those listening on the port of -dsn and of the first of -brokers (`ss -ltnpH`, the
// listening socket's process). When one is not found, newCPUMeter takes the last process
// of its kind on this host — wrong when a second MariaDB or broker runs beside (e.g. the
// chaos instance's).
func findServices(cfg *config) map[string]string {
	pids := map[string]string{}
	if dsn, err := dbx.ParseDSNInfo(cfg.appDSN); err == nil {
		if pid := listener(dsn.Addr); pid != "" {
			pids["db"] = pid
		}
	}
	if pid := listener(strings.Split(cfg.brokers, ",")[0]); pid != "" {
		pids["kafka"] = pid
	}
	return pids
}

var pidRe = regexp.MustCompile(`pid=(\d+)`)

// listener is the pid of the process listening on addr's port, "" when it cannot be told.
func listener(addr string) string {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return ""
	}
	out, err := exec.Command("ss", "-ltnpH", "sport = :"+port).Output()
	if err != nil {
		return ""
	}
	if m := pidRe.FindStringSubmatch(string(out)); m != nil {
		return m[1]
	}
	return ""
}

// perOrder returns the CPU µs per order each role used since the meter started, keyed as
// BENCH fields ("db_cpu_us_per_order" …), then the total.
func (m *cpuMeter) perOrder(orders int) []any { return m.per("order", orders) }

// perEvent is perOrder for a measurement of events ("db_cpu_us_per_event" …).
func (m *cpuMeter) perEvent(events int) []any { return m.per("event", events) }

func (m *cpuMeter) per(unit string, n int) []any {
	var kv []any
	var total float64
	for _, role := range []string{"db", "kafka", "router", "lean", "bench"} {
		pid, ok := m.pids[role]
		if !ok {
			continue
		}
		us := float64((procCPU(pid) - m.start[role]).Microseconds()) / float64(n)
		total += us
		kv = append(kv, role+"_cpu_us_per_"+unit, us)
	}
	return append(kv, "total_cpu_us_per_"+unit, total)
}

// procCPU is the user + system CPU time of a process (/proc/PID/stat, clock ticks of 10 ms).
// PostgreSQL serves each connection from a process of its own: for its postmaster it is the
// time of the postmaster, of its live children and of the children it has reaped (a backend
// whose connection closed), so the difference of two readings is the server's CPU between
// them.
func procCPU(pid string) time.Duration {
	f := procStat(pid)
	if len(f) < 15 {
		return 0
	}
	num := func(i int) int64 { n, _ := strconv.ParseInt(f[i], 10, 64); return n }
	ticks := num(11) + num(12)
	if comm, _ := os.ReadFile("/proc/" + pid + "/comm"); strings.TrimSpace(string(comm)) == "postgres" {
		ticks += num(13) + num(14) // reaped children
		dirs, _ := filepath.Glob("/proc/[0-9]*")
		for _, d := range dirs {
			if c := procStat(filepath.Base(d)); len(c) >= 13 && c[1] == pid {
				u, _ := strconv.ParseInt(c[11], 10, 64)
				k, _ := strconv.ParseInt(c[12], 10, 64)
				ticks += u + k
			}
		}
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}

// procStat is /proc/PID/stat's fields after the command name: state, ppid, … (index 11 is
// utime, 12 stime, 13 cutime, 14 cstime).
func procStat(pid string) []string {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return nil
	}
	s := string(b)
	i := strings.LastIndex(s, ")")
	if i < 0 || i+2 > len(s) {
		return nil
	}
	return strings.Fields(s[i+2:])
}

// calibrate times a fixed piece of CPU work (JSON-encoding and decoding 100,000 small
// structs, then sorting their keys: what the router's own work looks like) on one
// goroutine, while no measurement runs. The machine is shared: in slow stretches the same
// work takes up to twice as long, and every figure of the run moves with it. The bench
// reports it at the start, before the end-to-end runs and at the end, so a run can be
// read against it.
func (s *suite) calibrate(when string) {
	type item struct {
		OrderID string `json:"orderId"`
		UserID  string `json:"userId"`
		Amount  int64  `json:"amountCents"`
	}
	start := time.Now()
	keys := make([]string, 0, 100000)
	for i := range 100000 {
		b, _ := json.Marshal(item{OrderID: "order-" + strconv.Itoa(i*7919%100000), UserID: "u" + strconv.Itoa(i), Amount: int64(i)})
		var back item
		_ = json.Unmarshal(b, &back)
		keys = append(keys, back.OrderID)
	}
	sort.Strings(keys)
	s.report("calibration", "when", when, "work_ms", float64(time.Since(start).Microseconds())/1000)
}
