package inboxops

import "time"

// WhereOf is Filter.where, for the external tests that check a filter's query plan.
func WhereOf(f Filter, now time.Time) ([]string, []any) { return f.where(now) }

// PageSQL is Store.Page's statement, for the tests that EXPLAIN it.
func PageSQL(s *Store, q PageQuery) (string, []any, error) { return s.pageSQL(q) }
