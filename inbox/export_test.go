package inbox

import "time"

// WhereOf is Filter.where, for the external tests that check a filter's query plan.
func WhereOf(f Filter, now time.Time) ([]string, []any) { return f.where(now) }
