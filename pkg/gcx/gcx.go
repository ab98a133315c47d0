// Package gcx applies the router's garbage-collector settings (runtime.gogc,
// runtime.memory_limit_mb) unless the process environment already sets GOGC or GOMEMLIMIT,
// which always win.
//
// Why the router raises GOGC: a router holds many parked goroutines (one per un-acked
// message and its Watermill handler) and a small live heap, so with Go's default GOGC=100
// it collects every few megabytes and each cycle scans every goroutine stack. In the e2e
// bench on 2 cores the collector took 14–18 % of the router process's CPU at GOGC=100 and
// 5 % at 400 (heap ≈ 5× the live ≈ 50–70 MB then; docs/BENCHMARKS.md, "Why the defaults":
// runtime.gogc 400).
package gcx

import (
	"fmt"
	"os"
	"runtime/debug"
)

// DefaultPercent is the router's default GOGC.
const DefaultPercent = 400

// Validate reports a setting the runtime cannot take: percent is -1 (off) or 1..100000;
// off needs a memory limit, or the heap would grow without bound.
func Validate(percent, memoryLimitMB int) error {
	switch {
	case percent != -1 && (percent < 1 || percent > 100000):
		return fmt.Errorf("runtime.gogc %d outside 1..100000 (or -1: off, with runtime.memory_limit_mb)", percent)
	case memoryLimitMB < 0:
		return fmt.Errorf("runtime.memory_limit_mb %d is negative (0: no limit)", memoryLimitMB)
	case percent == -1 && memoryLimitMB == 0 && os.Getenv("GOMEMLIMIT") == "":
		return fmt.Errorf("runtime.gogc -1 turns the collector off: set runtime.memory_limit_mb (or GOMEMLIMIT) too")
	}
	return nil
}

// Apply sets GOGC to percent unless GOGC is in the environment, and the soft memory limit
// to memoryLimitMB MiB (0: none) unless GOMEMLIMIT is. It returns what is in effect, for
// the start-up log.
func Apply(percent, memoryLimitMB int) string {
	gogc := fmt.Sprintf("gogc=%d", percent)
	if env := os.Getenv("GOGC"); env != "" {
		gogc = "gogc=" + env + " (GOGC)"
	} else {
		debug.SetGCPercent(percent)
	}
	limit := "memory_limit=none"
	if env := os.Getenv("GOMEMLIMIT"); env != "" {
		limit = "memory_limit=" + env + " (GOMEMLIMIT)"
	} else if memoryLimitMB > 0 {
		debug.SetMemoryLimit(int64(memoryLimitMB) << 20)
		limit = fmt.Sprintf("memory_limit=%dMiB", memoryLimitMB)
	}
	return gogc + " " + limit
}
