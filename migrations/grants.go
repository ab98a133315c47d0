package migrations

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"slices"
	"strings"

	"github.com/onceflow/onceflow/pkg/dbx"
)

// GrantsFile lists, beside a set's SQL files, what the application user may do on each table
// the set creates. It has one line per table, with the table's name and then its
// privileges, comma separated. The privileges are SELECT, INSERT, UPDATE and DELETE. '#'
// starts a comment.
//
//	coupon_grant      SELECT, INSERT, UPDATE     # INSERT … ON DUPLICATE KEY UPDATE needs UPDATE
//	coupon_grant_log  SELECT, INSERT             # append-only
//
// `router migrate` grants exactly these, table by table, to the user of db.dsn. The
// application user gets no privilege on a database as a whole, none on a table no file
// lists, and never DDL. A table created by a later migration gets its line in the same
// change.
const GrantsFile = "grants.txt"

// appPrivileges are the privileges a grants file may give, in the order statements name
// them.
var appPrivileges = []string{"SELECT", "INSERT", "UPDATE", "DELETE"}

// Grant is what the application user may do on one table.
type Grant struct {
	Table      string
	Privileges []string // of appPrivileges, in their order
}

func (g Grant) String() string { return g.Table + " " + strings.Join(g.Privileges, ", ") }

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

// ParseGrants reads a grants file. source names it in errors.
func ParseGrants(b []byte, source string) ([]Grant, error) {
	var out []Grant
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line, _, _ := strings.Cut(sc.Text(), "#")
		table, privs, _ := strings.Cut(strings.TrimSpace(line), " ")
		if table == "" {
			continue
		}
		bad := func(format string, args ...any) error {
			return fmt.Errorf("%s:%d: %s", source, n, fmt.Sprintf(format, args...))
		}
		if !identifier.MatchString(table) {
			return nil, bad("table %q is not a plain identifier", table)
		}
		if seen[table] {
			return nil, bad("table %s is listed twice", table)
		}
		seen[table] = true
		g := Grant{Table: table}
		has := map[string]bool{}
		for _, p := range strings.Split(privs, ",") {
			p = strings.ToUpper(strings.TrimSpace(p))
			if !slices.Contains(appPrivileges, p) {
				return nil, bad("%s: privilege %q: the application user gets only SELECT, INSERT, UPDATE and DELETE", table, p)
			}
			has[p] = true
		}
		for _, p := range appPrivileges {
			if has[p] {
				g.Privileges = append(g.Privileges, p)
			}
		}
		out = append(out, g)
	}
	return out, sc.Err()
}

// setGrants reads s's grants file for dialect d. A set without one grants nothing.
func setGrants(s Set, d dbx.Dialect) ([]Grant, error) {
	dir, err := dialectDir(s.FS, d)
	if err != nil {
		return nil, fmt.Errorf("grants of %s: %w", s.label(), err)
	}
	b, err := fs.ReadFile(dir, GrantsFile)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("grants of %s: %w", s.label(), err)
	}
	return ParseGrants(b, s.label()+"/"+GrantsFile)
}

// Grants returns the grants of the framework's migrations, then of each plugin set's, for
// dialect d. A table two sets list is an error.
func Grants(d dbx.Dialect, plugins ...Set) ([]Grant, error) {
	if err := checkSets(plugins); err != nil {
		return nil, err
	}
	var out []Grant
	by := map[string]string{}
	for _, s := range append([]Set{{Name: "onceflow", FS: FS}}, plugins...) {
		gs, err := setGrants(s, d)
		if err != nil {
			return nil, err
		}
		for _, g := range gs {
			if other, dup := by[g.Table]; dup {
				return nil, fmt.Errorf("table %s is listed in the grants of both %s and %s", g.Table, other, s.label())
			}
			by[g.Table] = s.label()
		}
		out = append(out, gs...)
	}
	return out, nil
}

// GrantStatements are the statements that give account grants on the tables of the current
// database, in dialect d. account is as dbx.Account returns it.
func GrantStatements(d dbx.Dialect, account string, grants []Grant) []string {
	var out []string
	for _, g := range grants {
		out = append(out, fmt.Sprintf("GRANT %s ON %s TO %s", strings.Join(g.Privileges, ", "), d.Quote(g.Table), account))
	}
	return out
}

// Conn is a pool or one connection, such as a *sql.DB, *sql.Conn or *sql.Tx.
type Conn interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// GrantReport says what ApplyGrants did.
type GrantReport struct {
	Granted  []string // listed tables that exist: granted exactly their privileges
	Missing  []string // listed tables the database does not have (yet): nothing granted
	Unlisted []string // tables of the database no grants file lists (goose's version tables aside): the account cannot use them
}

// ApplyGrants gives account the grants on the tables of db's current database that exist.
// It takes back any other of SELECT, INSERT, UPDATE and DELETE that account holds on them.
// It grants first, so the account never loses what it keeps, not even for a moment. db must
// be opened by a user that may grant them, such as the migration user with GRANT OPTION on
// the database. Grants on a table outlive the table. So a table that `router migrate
// --reset` drops and creates again keeps them.
func ApplyGrants(ctx context.Context, d dbx.Dialect, db Conn, account string, grants []Grant) (GrantReport, error) {
	var rep GrantReport
	schema := "DATABASE()"
	if d.IsPostgres() {
		schema = "current_schema()"
	}
	rows, err := db.QueryContext(ctx, `SELECT table_name FROM information_schema.tables WHERE table_schema = `+schema+` AND table_type = 'BASE TABLE'`)
	if err != nil {
		return rep, fmt.Errorf("grants: list tables: %w", err)
	}
	exists := map[string]bool{}
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			rows.Close()
			return rep, fmt.Errorf("grants: list tables: %w", err)
		}
		exists[t] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return rep, fmt.Errorf("grants: list tables: %w", err)
	}
	listed := map[string]bool{}
	for _, g := range grants {
		listed[g.Table] = true
		if !exists[g.Table] {
			rep.Missing = append(rep.Missing, g.Table)
			continue
		}
		q := fmt.Sprintf("GRANT %s ON %s TO %s", strings.Join(g.Privileges, ", "), d.Quote(g.Table), account)
		if _, err := db.ExecContext(ctx, q); err != nil {
			return rep, fmt.Errorf("grants: %s: %w (the migration user needs GRANT OPTION on the database; or leave grants to the DBA: `router migrate --grants=false`, and `router migrate --print-grants` for the statements)", q, err)
		}
		var extra []string
		for _, p := range appPrivileges {
			if !slices.Contains(g.Privileges, p) {
				extra = append(extra, p)
			}
		}
		if len(extra) > 0 {
			q := fmt.Sprintf("REVOKE %s ON %s FROM %s", strings.Join(extra, ", "), d.Quote(g.Table), account)
			if _, err := db.ExecContext(ctx, q); err != nil {
				return rep, fmt.Errorf("grants: %s: %w", q, err)
			}
		}
		rep.Granted = append(rep.Granted, g.Table)
	}
	for t := range exists {
		if !listed[t] && t != FrameworkTable && !strings.HasPrefix(t, FrameworkTable+"_") {
			rep.Unlisted = append(rep.Unlisted, t)
		}
	}
	slices.Sort(rep.Unlisted)
	return rep, nil
}
