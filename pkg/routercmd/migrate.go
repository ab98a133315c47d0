package routercmd

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/pressly/goose/v3"
	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/pkg/dbx"
)

func (a *app) migrateCmd() *cobra.Command {
	var reset, status, grants, printGrants bool
	var adminDSN string
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "apply the framework's schema migrations, then each plugin's (privileged DSN: db.admin_dsn)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if printGrants {
				return a.printGrants(ctx)
			}
			if adminDSN != "" {
				a.Config.DB.AdminDSN = adminDSN
			}
			dsn := a.Config.DB.AdminDSN
			c, err := a.DBConfig(true)
			if err != nil {
				return err
			}
			c.MaxOpenConns = 2
			if err := dbx.EnsureDatabase(ctx, c); err != nil {
				return err
			}
			db, err := dbx.Open(ctx, c)
			if err != nil {
				return err
			}
			defer db.Close()
			sets := a.Migrations()
			if status {
				lines, err := migrations.Status(ctx, db, sets...)
				if err != nil {
					return err
				}
				for _, l := range lines {
					printf("%s\n", l)
				}
				return nil
			}
			if reset {
				if err := migrations.Reset(ctx, db, sets...); err != nil {
					return err
				}
				printf("migrate: schema dropped\n")
			}
			before, _ := appliedMigrations(ctx, db, sets) // a set it cannot read fails Up, in Up's words
			if err := migrations.Up(ctx, db, sets...); err != nil {
				return err
			}
			after, err := appliedMigrations(ctx, db, sets)
			if err != nil {
				return err
			}
			printf("%s", migrateReport(before, after, dbx.MaskDSN(dsn)))
			if !grants {
				printf("migrate: grants left as they are (--grants=false)\n")
				return nil
			}
			return a.grantApp(ctx, db, c)
		},
	}
	cmd.Flags().BoolVar(&reset, "reset", false, "roll every migration back first, the plugins' before the framework's (drops the tables: destroys data)")
	cmd.Flags().BoolVar(&status, "status", false, "list applied and pending migrations")
	cmd.Flags().StringVar(&adminDSN, "admin-dsn", "", "privileged DSN (overrides db.admin_dsn)")
	cmd.Flags().BoolVar(&grants, "grants", true, "then grant the application user (the account db.dsn logs in as) its privileges, table by table, "+
		"as the migrations' grants.txt files list them (the migration user needs GRANT OPTION); false leaves grants to the DBA")
	cmd.Flags().BoolVar(&printGrants, "print-grants", false, "print the GRANT statements of every listed table for the user of db.dsn, and connect to nothing")
	return cmd
}

// setMigrations is what one set of migrations has applied in a database.
type setMigrations struct {
	label   string         // "the framework" or "plugin <name>"
	applied map[int64]bool // the applied versions
	latest  int64          // the highest applied version, 0 when none is
}

// appliedMigrations reads what each set has applied, the framework's first, as `router
// migrate --status` does.
func appliedMigrations(ctx context.Context, db *sql.DB, sets []migrations.Set) ([]setMigrations, error) {
	all := append([]migrations.Set{{Name: "onceflow", FS: migrations.FS}}, sets...)
	out := make([]setMigrations, 0, len(all))
	for i, s := range all {
		m := setMigrations{label: "plugin " + s.Name, applied: map[int64]bool{}}
		table := s.Table()
		if i == 0 {
			m.label, table = "the framework", migrations.FrameworkTable
		}
		p, err := migrations.NewProvider(db, s.FS, table)
		if err != nil {
			return nil, fmt.Errorf("migrations of %s: %w", m.label, err)
		}
		st, err := p.Status(ctx)
		if err != nil {
			return nil, fmt.Errorf("migrate status %s: %w", m.label, err)
		}
		for _, v := range st {
			if v.State == goose.StateApplied {
				m.applied[v.Source.Version] = true
				m.latest = max(m.latest, v.Source.Version)
			}
		}
		out = append(out, m)
	}
	return out, nil
}

// migrateReport says what `router migrate` applied, set by set, from one version to the
// next. A last line sums it up for the database at dsn. It says "up to date" only where
// nothing was applied. A set missing from before, because it was unreadable then, is
// reported at its version now.
func migrateReport(before, after []setMigrations, dsn string) string {
	var b strings.Builder
	total, unknown := 0, false
	for i, a := range after {
		if i >= len(before) || before[i].label != a.label {
			fmt.Fprintf(&b, "migrate: %s: now at version %d\n", a.label, a.latest)
			unknown = true
			continue
		}
		was, n := before[i], 0
		for v := range a.applied {
			if !was.applied[v] {
				n++
			}
		}
		if n == 0 {
			fmt.Fprintf(&b, "migrate: %s: up to date at version %d\n", a.label, a.latest)
		} else {
			fmt.Fprintf(&b, "migrate: %s: %s applied, version %d → %d\n", a.label, plural(n, "migration"), was.latest, a.latest)
		}
		total += n
	}
	switch {
	case unknown:
		fmt.Fprintf(&b, "migrate: schema migrated (%s)\n", dsn)
	case total == 0:
		fmt.Fprintf(&b, "migrate: schema up to date, nothing applied (%s)\n", dsn)
	default:
		fmt.Fprintf(&b, "migrate: %s applied (%s)\n", plural(total, "migration"), dsn)
	}
	return b.String()
}

// plural is n and noun, with an s unless n is 1.
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// grantApp gives the account that db.dsn logs in as its privileges on the tables of admin's
// database. admin is the migration user's pool. grantApp says what it granted.
func (a *app) grantApp(ctx context.Context, admin *sql.DB, adminCfg dbx.Config) error {
	d := dbx.DialectOf(admin)
	list, err := migrations.Grants(d, a.Migrations()...)
	if err != nil {
		return err
	}
	if a.Config.DB.DSN == "" {
		printf("migrate: no db.dsn, so no application user to grant to: `router migrate --print-grants` with db.dsn set prints the statements\n")
		return nil
	}
	appCfg, err := a.DBConfig(false)
	if err != nil {
		return err
	}
	account, err := dbx.Account(ctx, appCfg)
	if err != nil {
		return fmt.Errorf("migrate: the application user (db.dsn): %w", err)
	}
	if self, err := dbx.Account(ctx, adminCfg); err == nil && self == account {
		printf("migrate: db.dsn logs in as the migration user %s: nothing to grant\n", account)
		return nil
	}
	rep, err := migrations.ApplyGrants(ctx, d, admin, account, list)
	if err != nil {
		return err
	}
	printf("migrate: granted %s its privileges on %d tables (%s)\n", account, len(rep.Granted), strings.Join(rep.Granted, ", "))
	if len(rep.Missing) > 0 {
		printf("migrate: listed but not in the database, nothing granted: %s\n", strings.Join(rep.Missing, ", "))
	}
	if len(rep.Unlisted) > 0 {
		printf("migrate: WARNING: no grants file lists %s: the application user cannot use them\n", strings.Join(rep.Unlisted, ", "))
	}
	return nil
}

// printGrants prints the GRANT statements for the user of db.dsn. They are for a DBA who
// keeps the grants. The DBA runs them in the application's database after
// `router migrate --grants=false`. printGrants connects to nothing, so it writes the
// account's host as '%'.
func (a *app) printGrants(context.Context) error {
	if _, err := a.DBConfig(false); err != nil {
		return err
	}
	info, err := dbx.ParseDSNInfo(a.Config.DB.DSN)
	if err != nil {
		return badInput(fmt.Errorf("db.dsn: %w", err))
	}
	d := dbx.MariaDB
	account := "`" + strings.ReplaceAll(info.User, "`", "``") + "`@`%`"
	if info.Postgres {
		d, account = dbx.Postgres, `"`+strings.ReplaceAll(info.User, `"`, `""`)+`"`
	}
	list, err := migrations.Grants(d, a.Migrations()...)
	if err != nil {
		return err
	}
	printf("-- the application user's privileges, table by table (write its host as your account has it)\n")
	for _, q := range migrations.GrantStatements(d, account, list) {
		printf("%s;\n", q)
	}
	return nil
}
