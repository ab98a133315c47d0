package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// idleSettle is how long the idle group leaves a router alone after its consumer group is
// stable before it measures: its relay backs off to its longest poll within 2 s.
const idleSettle = 5 * time.Second

// idleGroup measures what the router binary costs when there is nothing to do: `router run
// --plugins coupon-granter` on an empty input topic of its own, the default settings, as the
// router group starts it. First -idle-seconds with no router, for the services' own CPU
// (other clients of the broker and the database included), then the router is started,
// left idle until its group is stable and idleSettle more, and measured -idle-seconds:
// its own user + system CPU (/proc/<pid>/stat) in ms per second, and the broker's and
// MariaDB's over the same seconds, beside their own before it started (`*_added_ms_per_s`:
// the difference, what serving the idle router costs them; noisy where other clients run).
func (s *suite) idleGroup(ctx context.Context) error {
	secs := s.cfg.idleSecs
	if secs <= 0 {
		return nil
	}
	bin, err := filepath.Abs(s.cfg.routerBin)
	if err != nil {
		return err
	}
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("idle: %v (build it: make build)", err)
	}
	in, out, clean, err := s.routerTopics(ctx)
	if err != nil {
		return err
	}
	defer clean()
	window := time.Duration(secs) * time.Second
	services := func() map[string]time.Duration {
		m := map[string]time.Duration{}
		for role, pid := range s.services {
			m[role] = procCPU(pid)
		}
		return m
	}
	msPerS := func(d time.Duration, over time.Duration) float64 {
		return float64(d.Microseconds()) / 1000 / over.Seconds()
	}
	b0, t0 := services(), time.Now()
	time.Sleep(window)
	b1, baseOver := services(), time.Since(t0)

	c, err := s.startRouter(bin, "idle", in, out)
	if err != nil {
		return err
	}
	defer c.stop()
	if err := waitGroupStable(s.kc, routerGroupName(in), 2*time.Minute, c); err != nil {
		return err
	}
	time.Sleep(idleSettle)
	r0, m0, t1 := procCPU(c.pidStr()), services(), time.Now()
	time.Sleep(window)
	r1, m1, over := procCPU(c.pidStr()), services(), time.Since(t1)
	select {
	case <-c.exited:
		return fmt.Errorf("idle: the router exited (%v); its log: %s%s", c.waitErr, c.logPath, c.logTail())
	default:
	}
	hwm := c.hwmMB()
	if err := c.stop(); err != nil {
		return err
	}
	kv := []any{"seconds", secs, "router_ms_per_s", msPerS(r1-r0, over)}
	for _, role := range []string{"kafka", "db"} {
		if _, ok := s.services[role]; !ok {
			continue
		}
		with, without := msPerS(m1[role]-m0[role], over), msPerS(b1[role]-b0[role], baseOver)
		kv = append(kv, role+"_ms_per_s", with, role+"_base_ms_per_s", without, role+"_added_ms_per_s", with-without)
	}
	s.report("idle", append(kv, "max_rss_mb", hwm)...)
	return nil
}
