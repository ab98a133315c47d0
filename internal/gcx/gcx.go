// Package gcx applies the router's garbage-collector settings, runtime.gogc and
// runtime.memory_limit_mb. GOGC and GOMEMLIMIT in the process environment always win over
// them.
//
// The default is Go's own 100. See docs/BENCHMARKS.md, section "kafka.window 1024,
// kafka.max_in_flight_bytes 64 MiB and runtime.gogc 100". Raise it to trade memory for
// fewer collections. Set runtime.memory_limit_mb in a memory-limited container.
package gcx

import (
	"fmt"
	"os"
	"runtime/debug"
)

// DefaultPercent is the router's default GOGC.
const DefaultPercent = 100

// Validate reports a setting the runtime cannot take. percent is -1 for off, or 1..100000.
// Off needs a memory limit, or the heap would grow without bound.
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

// Apply sets GOGC to percent unless GOGC is in the environment. It sets the soft memory
// limit to memoryLimitMB MiB unless GOMEMLIMIT is, and 0 means no limit. It returns what is
// in effect, for the start-up log.
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
