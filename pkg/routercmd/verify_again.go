package routercmd

import "github.com/onceflow/onceflow/pkg/dbx"

// readAgain runs read, and once more when it failed on one of the database server's
// internal temporary tables (dbx.IsTempTableError). An audit query that groups many rows
// writes one to the server's tmpdir, and a file removed from there meanwhile fails it
// although nothing is wrong with the data. The audit only reads, so running it again is
// safe. The second error, if any, is returned.
func readAgain[T any](what string, read func() (T, error)) (T, error) {
	v, err := read()
	if !dbx.IsTempTableError(err) {
		return v, err
	}
	printf("NOTE %s failed on a temporary table of the database server (%s); running it once more\n", what, oneLineString(safeText(err.Error()), 300))
	return read()
}
