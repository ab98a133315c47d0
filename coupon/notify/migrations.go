package notify

import (
	"embed"
	"io/fs"
)

//go:embed migrations/*.sql migrations/grants.txt migrations/postgres/*.sql migrations/postgres/grants.txt
var migrationFiles embed.FS

// Migrations create the notifier's table, notification. They are goose SQL files numbered
// by this plugin. `router migrate` applies them after the framework's, with the version
// table goose_db_version_coupon_notifier. grants.txt, a migrations.GrantsFile, says what
// the application user may do on the table.
var Migrations fs.FS = func() fs.FS {
	s, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		panic(err)
	}
	return s
}()
