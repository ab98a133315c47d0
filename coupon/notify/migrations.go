package notify

import (
	"embed"
	"io/fs"
)

//go:embed migrations/*.sql migrations/grants.txt migrations/postgres/*.sql migrations/postgres/grants.txt
var migrationFiles embed.FS

// Migrations are the notifier's table (notification): goose SQL files numbered by this
// plugin, applied by `router migrate` after the framework's, with the version table
// goose_db_version_coupon_notifier, and grants.txt, what the application user may do on it
// (migrations.GrantsFile).
var Migrations fs.FS = func() fs.FS {
	s, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		panic(err)
	}
	return s
}()
