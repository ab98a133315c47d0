package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// slot is one supervised `router run` process: while wanted it is (re)started; a SIGKILL
// from the harness restarts it after the delay the fault chose, an unexpected exit (e.g.
// the broker was down at start-up) after a second. The slot can be armed with extra
// environment (the relay crash point): every start carries it until a process exits with
// 137 on its own, i.e. hit its crash point, which is counted as a relay crash and disarms.
type slot struct {
	name   string
	bin    string
	args   []string
	env    []string
	logDir string
	logf   func(format string, args ...any)

	mu                       sync.Mutex
	cmd                      *exec.Cmd
	want, quit, killed       bool
	notBefore                time.Time
	restartDelay             time.Duration
	starts, kills, unplanned int
	armed                    []string // extra environment of every start until the crash
	arms, crashes            int
	done                     chan struct{}
}

func newSlot(name, bin string, args, env []string, logDir string, logf func(string, ...any)) *slot {
	s := &slot{name: name, bin: bin, args: args, env: env, logDir: logDir, logf: logf, done: make(chan struct{})}
	go s.loop()
	return s
}

func (s *slot) loop() {
	defer close(s.done)
	for {
		s.mu.Lock()
		want, quit, nb := s.want, s.quit, s.notBefore
		s.mu.Unlock()
		if quit {
			return
		}
		if !want || time.Now().Before(nb) {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		s.mu.Lock()
		s.starts++
		n := s.starts
		env, armed := s.env, s.armed
		if armed != nil {
			env = append(append([]string(nil), s.env...), armed...)
		}
		s.mu.Unlock()
		logPath := filepath.Join(s.logDir, fmt.Sprintf("router-%s-%02d.log", s.name, n))
		out, err := os.Create(logPath)
		if err != nil {
			s.logf("router %s: %v", s.name, err)
			time.Sleep(time.Second)
			continue
		}
		cmd := exec.Command(s.bin, s.args...)
		cmd.Env = env
		cmd.Stdout, cmd.Stderr = out, out
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // the terminal's ^C goes to the harness only
		if err := cmd.Start(); err != nil {
			out.Close()
			s.logf("router %s: start: %v", s.name, err)
			s.mu.Lock()
			s.notBefore = time.Now().Add(time.Second)
			s.mu.Unlock()
			continue
		}
		s.mu.Lock()
		s.cmd = cmd
		if !s.want || s.quit { // stopped while this start was in flight
			_ = cmd.Process.Signal(syscall.SIGTERM)
		}
		s.mu.Unlock()
		err = cmd.Wait()
		out.Close()
		s.mu.Lock()
		s.cmd = nil
		switch {
		case s.killed:
			s.killed = false
			s.notBefore = time.Now().Add(s.restartDelay)
		case armed != nil && cmd.ProcessState != nil && cmd.ProcessState.ExitCode() == 137:
			s.crashes++
			s.armed = nil
			s.notBefore = time.Now().Add(time.Second)
			s.logf("router %s crashed at its relay crash point (right after a Kafka commit, rows not marked; log %s): restarting in 1s", s.name, logPath)
		case s.want && !s.quit:
			s.unplanned++
			s.notBefore = time.Now().Add(time.Second)
			s.logf("router %s exited on its own (%v; log %s): restarting in 1s", s.name, err, logPath)
		}
		s.mu.Unlock()
	}
}

// arm adds env to every start of the slot until a process hits its crash point.
func (s *slot) arm(env ...string) {
	s.mu.Lock()
	s.armed = env
	s.arms++
	s.mu.Unlock()
}

// isArmed reports whether the slot's starts carry a crash point.
func (s *slot) isArmed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.armed != nil
}

// disarm drops the crash point from the next starts.
func (s *slot) disarm() {
	s.mu.Lock()
	s.armed = nil
	s.mu.Unlock()
}

// crashCount is the number of processes that hit their crash point.
func (s *slot) crashCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.crashes
}

// pid is the running process's id, 0 when none runs.
func (s *slot) pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// allowStart lifts delayStart and the restart delay of a kill: the slot starts again now.
func (s *slot) allowStart() {
	s.mu.Lock()
	s.notBefore = time.Now()
	s.restartDelay = 0
	s.mu.Unlock()
}

// delayStart keeps the slot from starting a process before t.
func (s *slot) delayStart(t time.Time) {
	s.mu.Lock()
	if t.After(s.notBefore) {
		s.notBefore = t
	}
	s.mu.Unlock()
}

// start makes the slot wanted (join).
func (s *slot) start() {
	s.mu.Lock()
	s.want = true
	s.mu.Unlock()
}

// running reports whether a process is up right now.
func (s *slot) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}

// kill sends SIGKILL to the current process; it is restarted after restart. It reports
// false when no process was running.
func (s *slot) kill(restart time.Duration) (int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.cmd.Process == nil {
		return 0, false
	}
	s.killed = true
	s.restartDelay = restart
	if err := s.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		s.killed = false
		return 0, false
	}
	s.kills++
	return s.cmd.Process.Pid, true
}

// stop ends the process gracefully (SIGTERM, SIGKILL after grace) and leaves it stopped.
func (s *slot) stop(grace time.Duration) {
	s.mu.Lock()
	s.want = false
	cmd := s.cmd
	s.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	deadline := time.Now().Add(grace)
	for s.running() {
		if time.Now().After(deadline) {
			s.mu.Lock()
			if s.cmd == cmd {
				_ = cmd.Process.Signal(syscall.SIGKILL)
			}
			s.mu.Unlock()
			s.logf("router %s did not stop within %s: SIGKILL", s.name, grace)
			deadline = time.Now().Add(time.Hour)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// close stops the process and the supervisor.
func (s *slot) close(grace time.Duration) {
	s.stop(grace)
	s.mu.Lock()
	s.quit = true
	s.mu.Unlock()
	<-s.done
}

// startFleet creates the run's three router slots (a, b and c, through the proxies) and
// starts a and b; c joins and leaves during the run.
func (h *harness) startFleet() {
	routerEnv := append(cleanEnv(), "ONCEFLOW_CONFIG="+h.cfgPath, "ONCEFLOW_KAFKA_BROKERS="+h.routerBrokers,
		"ONCEFLOW_DB_ADMIN_DSN="+h.adminDSN, "ONCEFLOW_DB_DSN="+dsn(h.o.dialect, "onceflow:onceflow", h.routerDBAddr, h.o.dbName))
	if h.o.routerEnv != "" {
		routerEnv = append(routerEnv, strings.Split(h.o.routerEnv, ",")...)
		h.logf("router environment: %s", h.o.routerEnv)
	}
	plugins := "coupon-granter," + misbehaverPlugin
	if h.p.noMisbehaver {
		plugins = "coupon-granter"
	}
	on := h.p.alwaysOn()
	var names []string
	for i := range on + 1 {
		n := string(rune('a' + i))
		h.slots = append(h.slots, newSlot(n, h.bin, []string{"run", "--plugins", plugins}, routerEnv, h.o.runDir, h.logf))
		if i < on {
			h.slots[i].start()
			names = append(names, n)
		}
	}
	h.logf("routers %s starting (%s joins and leaves during the run; plugins %s); logs %s/router-*.log",
		strings.Join(names, ", "), h.slots[on].name, plugins, h.o.runDir)
	time.Sleep(3 * time.Second)
}

// closeFleet stops every router and its supervisor, all at once.
func (h *harness) closeFleet() {
	var wg sync.WaitGroup
	for _, s := range h.slots {
		wg.Add(1)
		go func() { defer wg.Done(); s.close(40 * time.Second) }()
	}
	wg.Wait()
}
