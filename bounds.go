package onceflow

import (
	"fmt"
	"reflect"
	"strings"
	"time"
)

// bound is the range a numeric or duration setting may take, inclusive: min..max, or
// fmin..fmax for a fraction (float).
type bound struct {
	min, max   int64
	fmin, fmax float64
	float      bool
}

func durations(lo, hi time.Duration) bound { return bound{min: int64(lo), max: int64(hi)} }
func counts(lo, hi int64) bound            { return bound{min: lo, max: hi} }
func fractions(lo, hi float64) bound       { return bound{fmin: lo, fmax: hi, float: true} }

// bounds gives every numeric and duration setting its range; validate checks them all in
// one pass before anything connects, each failure one line naming the key, its value and
// the range (exit 2). TestEveryNumberHasABound keeps it complete.
var bounds = map[string]bound{
	"db.max_open_conns":            counts(1, 1000),
	"kafka.session_timeout":        durations(time.Second, 30*time.Minute),
	"kafka.rebalance_timeout":      durations(time.Second, 30*time.Minute),
	"kafka.heartbeat":              durations(100*time.Millisecond, time.Minute),
	"kafka.max_poll_wait":          durations(time.Millisecond, 30*time.Second),
	"kafka.window":                 counts(1, 100000),
	"kafka.max_in_flight_bytes":    counts(1<<20, 1<<40),
	"inbox.max_attempts":           counts(1, 1000),
	"inbox.backoff_initial":        durations(time.Millisecond, time.Hour),
	"inbox.backoff_max":            durations(time.Millisecond, 24*time.Hour),
	"inbox.retention":              durations(time.Hour, 10*365*24*time.Hour),
	"inbox.max_payload_bytes":      counts(1, 1<<24-1),
	"inbox.max_metadata_bytes":     counts(256, 1<<16-1),
	"inbox.handler_timeout":        durations(time.Millisecond, 24*time.Hour),
	"inbox.steps_per_transaction":  counts(1, 100),
	"inbox.batch_size":             counts(1, 10000),
	"inbox.batch_linger":           durations(0, time.Second),
	"inbox.batch_workers":          counts(1, 64),
	"inbox.max_in_flight_calls":    counts(1, 1_000_000),
	"inbox.cleanup_interval":       durations(time.Second, 24*time.Hour),
	"inbox.cleanup_batch":          counts(1, 100000),
	"relay.batch_size":             counts(1, 100000),
	"relay.poll_interval":          durations(time.Millisecond, time.Minute),
	"relay.linger":                 durations(0, time.Second),
	"relay.lag_bound":              durations(time.Second, 7*24*time.Hour),
	"relay.shards":                 counts(1, 1024),
	"relay.positions_min_replicas": counts(1, 16),
	"relay.lease_ttl":              durations(time.Second, 10*time.Minute),
	"relay.txn_timeout":            durations(time.Second, 15*time.Minute),
	"relay.retry_backoff":          durations(time.Millisecond, time.Minute),
	"relay.max_retry_backoff":      durations(time.Millisecond, 10*time.Minute),
	"relay.retention":              durations(0, 10*365*24*time.Hour),
	"relay.cleanup_interval":       durations(time.Second, 24*time.Hour),
	"relay.cleanup_batch":          counts(1, 100000),
	"http.max_body_bytes":          counts(2, 1<<24),
	"http.request_timeout":         durations(100*time.Millisecond, 10*time.Minute),
	"http.outcome_wait":            durations(time.Millisecond, 10*time.Minute),
	"http.idempotency_ttl":         durations(time.Minute, 10*365*24*time.Hour),
	"otel.sample_ratio":            fractions(0, 1),
	"runtime.gogc":                 counts(-1, 100000),
	"runtime.memory_limit_mb":      counts(0, 1<<30),
}

// settingValue finds key (section.name, or section.sub.name) in cfg by its mapstructure
// tags.
func settingValue(cfg Config, key string) (reflect.Value, bool) {
	v := reflect.ValueOf(cfg)
	for _, part := range strings.Split(key, ".") {
		if v.Kind() != reflect.Struct {
			return reflect.Value{}, false
		}
		found := false
		for i := 0; i < v.NumField(); i++ {
			if v.Type().Field(i).Tag.Get("mapstructure") == part {
				v, found = v.Field(i), true
				break
			}
		}
		if !found {
			return reflect.Value{}, false
		}
	}
	return v, true
}

// checkBounds checks every setting of bounds, in the settings list's order.
func (c Config) checkBounds() error {
	for _, d := range defaults {
		b, ok := bounds[d.key]
		if !ok {
			continue
		}
		v, ok := settingValue(c, d.key)
		if !ok {
			return fmt.Errorf("%s: no such setting in the configuration", d.key) // TestEveryNumberHasABound
		}
		if b.float {
			if x := v.Float(); !(x >= b.fmin && x <= b.fmax) { // NaN is outside too
				return fmt.Errorf("%s %g outside %g..%g", d.key, x, b.fmin, b.fmax)
			}
			continue
		}
		if v.Type() == reflect.TypeOf(time.Duration(0)) {
			if x := v.Int(); x < b.min || x > b.max {
				return fmt.Errorf("%s %s outside %s..%s", d.key, time.Duration(x), time.Duration(b.min), time.Duration(b.max))
			}
			continue
		}
		if x := v.Int(); x < b.min || x > b.max {
			return fmt.Errorf("%s %d outside %d..%d", d.key, x, b.min, b.max)
		}
	}
	return nil
}

var (
	reflectDuration = reflect.TypeOf(time.Duration(0))
	reflectInt      = reflect.Int
	reflectFloat    = reflect.Float64
)
