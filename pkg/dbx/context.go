package dbx

import "context"

type dialectKey struct{}

// ContextWithDialect marks ctx as running statements in transactions of a pool of dialect
// d. The inbox marks its handlers' contexts so. This serves code that holds a transaction
// but not its pool, such as an Inserter or an outbox Writer without UseStatements.
func ContextWithDialect(ctx context.Context, d Dialect) context.Context {
	return context.WithValue(ctx, dialectKey{}, d)
}

// DialectFromContext returns the dialect ContextWithDialect left in ctx. ok is false when
// there is none.
func DialectFromContext(ctx context.Context) (d Dialect, ok bool) {
	d, ok = ctx.Value(dialectKey{}).(Dialect)
	return d, ok
}
