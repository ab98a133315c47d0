package coupon

import (
	"embed"
	"io/fs"
)

//go:embed migrations/*.sql migrations/grants.txt migrations/postgres/*.sql migrations/postgres/grants.txt
var migrationFiles embed.FS

// Migrations are the coupon granter's tables (coupon_grant, coupon_grant_log, coupon_stock,
// coupon_budget, user_coupon): goose SQL files numbered by this plugin, applied by `router
// migrate` after the framework's, with the version table goose_db_version_coupon_granter, and
// grants.txt, what the application user may do on each (migrations.GrantsFile).
var Migrations = mustSub(migrationFiles, "migrations")

func mustSub(f fs.FS, dir string) fs.FS {
	s, err := fs.Sub(f, dir)
	if err != nil {
		panic(err)
	}
	return s
}
