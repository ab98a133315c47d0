package outbox

// SetBulkBatch makes RetrySelected and DropSelected release n refused events per
// transaction, until restore is called. Tests make many batches of few events with it.
func SetBulkBatch(n int) (restore func()) {
	old := bulkBatch
	bulkBatch = n
	return func() { bulkBatch = old }
}
