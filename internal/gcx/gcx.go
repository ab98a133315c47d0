// Package gcx applies the router's garbage-collector settings (runtime.gogc,
// runtime.memory_limit_mb) unless the process environment already sets GOGC or GOMEMLIMIT,
// which always win.
//
// The default is Go's own (100): with kafka.window 256 a router's heap stays within
// ≈2× its live heap and its RSS near 125 MB at full load, at no measurable cost in CPU
// per order against 200 or 400 (docs/BENCHMARKS.md, "Why the defaults":
// kafka.window 256 and runtime.gogc 100).
// Raise it to trade memory for fewer collections; set runtime.memory_limit_mb in a
// memory-limited container.
package gcx

import (
	"fmt"
	"os"
	"runtime/debug"
)

// DefaultPercent is the router's default GOGC.
const DefaultPercent = 100

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
