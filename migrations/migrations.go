// Package migrations holds the framework's SQL schema of the inbox, outbox, relay and
// replay tables. The schema is embedded, so the router binary can apply it with goose by
// `router migrate`. The package applies plugins' own migrations beside it. The plugin
// numbers its own files, and a goose version table of its own, goose_db_version_<plugin>,
// records them. So a plugin's versions never collide with the framework's or another
// plugin's. Files are plain SQL with goose annotations.
//
// A set's files are per dialect. The files of the MySQL family, MariaDB and MySQL 8, are at
// the root of its FS. PostgreSQL's are in a postgres/ directory beside them. Each has its
// own grants.txt. ForDialect refuses a set without files for the database's dialect, and
// names both.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"strings"

	"github.com/pressly/goose/v3"

	"github.com/onceflow/onceflow/pkg/dbx"
)

//go:embed *.sql grants.txt postgres/*.sql postgres/grants.txt
var FS embed.FS

// PostgresDir is the directory of a set's PostgreSQL files.
const PostgresDir = "postgres"

// ForDialect returns the files of fsys for dialect d. They are its postgres/ directory for
// PostgreSQL and its root for the MySQL family. name names the set in the error of a set
// that ships none for d.
func ForDialect(name string, fsys fs.FS, d dbx.Dialect) (fs.FS, error) {
	if fsys == nil {
		return nil, fmt.Errorf("migrations of %s: no files", name)
	}
	dir, err := dialectDir(fsys, d)
	if err != nil {
		return nil, fmt.Errorf("migrations of %s: %w", name, err)
	}
	files, err := fs.Glob(dir, "*.sql")
	if err != nil || len(files) == 0 {
		where := "SQL files at the root of its migrations"
		if d.IsPostgres() {
			where = "a " + PostgresDir + "/ directory of SQL files beside its MySQL ones"
		}
		return nil, fmt.Errorf("%s ships no migrations for %s (the database of db.dsn): it needs %s", name, d, where)
	}
	return dir, nil
}

// dialectDir is the directory of fsys holding d's files.
func dialectDir(fsys fs.FS, d dbx.Dialect) (fs.FS, error) {
	if !d.IsPostgres() {
		return fsys, nil
	}
	return fs.Sub(fsys, PostgresDir)
}

// Supports reports an error naming the plugin and the dialect when a set has no migrations
// for d. The runtime refuses to start such a plugin.
func (s Set) Supports(d dbx.Dialect) error {
	_, err := ForDialect("plugin "+s.Name, s.FS, d)
	return err
}

// FrameworkTable is the goose version table of the framework's migrations, goose's default.
const FrameworkTable = goose.DefaultTablename

// Set is one plugin's migrations, with the plugin's name and its SQL files.
type Set struct {
	Name string
	FS   fs.FS
}

// setName allows lower-case letters, digits, '-' and '_'. So the version table name is a
// plain identifier of at most 64 characters.
var setName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,46}$`)

// Table is the goose version table of s, goose_db_version_<name>, with '-' written as '_'.
func (s Set) Table() string {
	return FrameworkTable + "_" + strings.ReplaceAll(s.Name, "-", "_")
}

func (s Set) label() string { return s.Name }

// checkSets refuses invalid names and two sets sharing a version table.
func checkSets(sets []Set) error {
	seen := map[string]string{}
	for _, s := range sets {
		if !setName.MatchString(s.Name) {
			return fmt.Errorf("migrations of plugin %q: the name must be 1..47 of [a-z0-9_-], starting with a letter or digit (it names the version table)", s.Name)
		}
		if s.FS == nil {
			return fmt.Errorf("migrations of plugin %q: no files", s.Name)
		}
		if other, dup := seen[s.Table()]; dup {
			return fmt.Errorf("migrations of plugins %q and %q would share the version table %s", other, s.Name, s.Table())
		}
		seen[s.Table()] = s.Name
	}
	return nil
}

// Up applies every pending migration. The framework's come first, then each plugin set's in
// the order given. db must be opened with a privileged user. The application user has no
// DDL rights on purpose.
func Up(ctx context.Context, db *sql.DB, plugins ...Set) error {
	if err := checkSets(plugins); err != nil {
		return err
	}
	p, err := provider(db, "the framework", FS, FrameworkTable)
	if err != nil {
		return err
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrate up: %w", err)
	}
	for _, s := range plugins {
		p, err := provider(db, "plugin "+s.Name, s.FS, s.Table())
		if err != nil {
			return fmt.Errorf("migrations of plugin %s: %w", s.Name, err)
		}
		if _, err := p.Up(ctx); err != nil {
			return fmt.Errorf("migrate up plugin %s: %w", s.Name, err)
		}
	}
	return nil
}

// Status reports applied and pending migrations as "<set> version name state" lines. The
// framework's, of set "onceflow", come first.
func Status(ctx context.Context, db *sql.DB, plugins ...Set) ([]string, error) {
	if err := checkSets(plugins); err != nil {
		return nil, err
	}
	all := append([]Set{{Name: "onceflow", FS: FS}}, plugins...)
	var out []string
	for i, s := range all {
		table := s.Table()
		if i == 0 {
			table = FrameworkTable
		}
		p, err := provider(db, s.label(), s.FS, table)
		if err != nil {
			return nil, fmt.Errorf("migrations of %s: %w", s.label(), err)
		}
		st, err := p.Status(ctx)
		if err != nil {
			return nil, fmt.Errorf("migrate status %s: %w", s.label(), err)
		}
		for _, m := range st {
			out = append(out, fmt.Sprintf("%s %05d %s %s", s.label(), m.Source.Version, m.Source.Path, m.State))
		}
	}
	return out, nil
}

// Reset rolls every migration back and so drops the tables. The plugin sets' go first, in
// the reverse of the order given, then the framework's. Tests and `router migrate --reset`
// use it.
func Reset(ctx context.Context, db *sql.DB, plugins ...Set) error {
	if err := checkSets(plugins); err != nil {
		return err
	}
	for i := len(plugins) - 1; i >= 0; i-- {
		s := plugins[i]
		p, err := provider(db, "plugin "+s.Name, s.FS, s.Table())
		if err != nil {
			return fmt.Errorf("migrations of plugin %s: %w", s.Name, err)
		}
		if _, err := p.DownTo(ctx, 0); err != nil {
			return fmt.Errorf("migrate reset plugin %s: %w", s.Name, err)
		}
	}
	p, err := provider(db, "the framework", FS, FrameworkTable)
	if err != nil {
		return err
	}
	if _, err := p.DownTo(ctx, 0); err != nil {
		return fmt.Errorf("migrate reset: %w", err)
	}
	return nil
}

// NewProvider is the goose provider of one set of migrations recorded in table. Tests that
// step through versions use it.
func NewProvider(db *sql.DB, fsys fs.FS, table string) (*goose.Provider, error) {
	return provider(db, table, fsys, table)
}

func provider(db *sql.DB, name string, fsys fs.FS, table string) (*goose.Provider, error) {
	if fsys == nil {
		return nil, errors.New("migrations: no files")
	}
	d := dbx.DialectOf(db)
	files, err := ForDialect(name, fsys, d)
	if err != nil {
		return nil, err
	}
	gd := goose.DialectMySQL
	if d.IsPostgres() {
		gd = goose.DialectPostgres
	}
	p, err := goose.NewProvider(gd, db, files, goose.WithTableName(table),
		goose.WithDisableGlobalRegistry(true))
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	return p, nil
}
