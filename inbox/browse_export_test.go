package inbox

// PageSQL is Store.Page's statement, for the tests that EXPLAIN it.
func PageSQL(s *Store, q PageQuery) (string, []any, error) { return s.pageSQL(q) }
