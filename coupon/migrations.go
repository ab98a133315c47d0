package coupon

import (
	"embed"
	"io/fs"
)

//go:embed migrations/*.sql migrations/grants.txt migrations/postgres/*.sql migrations/postgres/grants.txt
var migrationFiles embed.FS

// Migrations create the coupon granter's tables coupon_grant, coupon_grant_log,
// coupon_stock, coupon_budget and user_coupon. They are goose SQL files numbered by this
// plugin. `router migrate` applies them after the framework's, with the version table
// goose_db_version_coupon_granter. grants.txt, a migrations.GrantsFile, says what the
// application user may do on each table.
var Migrations = mustSub(migrationFiles, "migrations")

func mustSub(f fs.FS, dir string) fs.FS {
	s, err := fs.Sub(f, dir)
	if err != nil {
		panic(err)
	}
	return s
}
