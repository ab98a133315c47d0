package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// slot is one supervised `router run` process: while wanted it is (re)started; a SIGKILL
// from the harness restarts it after the delay the fault chose, an unexpected exit (e.g.
// the broker was down at start-up) after a second. A start can be armed with extra
// environment (the relay crash point); an armed process that exits with 137 on its own hit
// its crash point and is counted as a relay crash.
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
	armed                    []string // extra environment of the next start only
	armedStarts, crashes     int
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
			s.armed = nil
			s.armedStarts++
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
			s.notBefore = time.Now().Add(time.Second)
			s.logf("router %s crashed at its relay crash point (right after a Kafka commit, rows not marked; log %s): restarting in 1s", s.name, logPath)
		case s.want && !s.quit:
			if armed != nil && s.armed == nil {
				// It exited before reaching its crash point (a service was down): the next
				// start carries the crash point again.
				s.armed = armed
				s.armedStarts--
			}
			s.unplanned++
			s.notBefore = time.Now().Add(time.Second)
			s.logf("router %s exited on its own (%v; log %s): restarting in 1s", s.name, err, logPath)
		}
		s.mu.Unlock()
	}
}

// armNext adds env to the next start of the slot (only that one).
func (s *slot) armNext(env ...string) {
	s.mu.Lock()
	s.armed = env
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
