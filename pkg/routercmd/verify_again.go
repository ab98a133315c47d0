package routercmd

import "github.com/onceflow/onceflow/pkg/dbx"

// readAgain runs read, and runs it once more when it failed on one of the database server's
// internal temporary tables. dbx.IsTempTableError tells such an error. An audit query that
// groups many rows writes such a table to the server's tmpdir. A file removed from there
// meanwhile fails the query, although nothing is wrong with the data. The audit only reads,
// so running it again is safe. readAgain then returns what the second run returns.
func readAgain[T any](what string, read func() (T, error)) (T, error) {
	v, err := read()
	if !dbx.IsTempTableError(err) {
		return v, err
	}
	printf("NOTE %s failed on a temporary table of the database server (%s); running it once more\n", what, oneLineString(safeText(err.Error()), 300))
	return read()
}
