package migrations_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/coupon/notify"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/pkg/dbx"
)

func TestParseGrants(t *testing.T) {
	gs, err := migrations.ParseGrants([]byte("# comment\n\nt_one  select, Insert   # trailing\nt_two DELETE,SELECT\n"), "f")
	if err != nil {
		t.Fatal(err)
	}
	if len(gs) != 2 || gs[0].String() != "t_one SELECT, INSERT" || gs[1].String() != "t_two SELECT, DELETE" {
		t.Fatalf("%v", gs)
	}
	for _, bad := range []string{
		"t DROP",                 // DDL is never the application's
		"t SELECT, GRANT OPTION", // nor granting
		"t",                      // no privilege
		"t SELECT,",              // an empty one
		"t-1 SELECT",             // not an identifier
		"t SELECT\nt INSERT",     // twice
	} {
		if _, err := migrations.ParseGrants([]byte(bad), "f"); err == nil || !strings.HasPrefix(err.Error(), "f:") {
			t.Errorf("%q: %v, want an error naming the file and line", bad, err)
		}
	}
}

var bundled = []migrations.Set{
	{Name: coupon.PluginName, FS: coupon.Migrations},
	{Name: notify.PluginName, FS: notify.Migrations},
}

// Every table the framework's and the bundled plugins' migrations create has its line in a
// grants file (a migration that adds a table without one fails here), and no file lists a
// table twice.
func TestEveryMigratedTableIsGranted(t *testing.T) {
	d := testenv.DB(t, 2, bundled...)
	list, err := migrations.Grants(testenv.Dialect(), bundled...)
	if err != nil {
		t.Fatal(err)
	}
	schema := "DATABASE()"
	if testenv.Dialect().IsPostgres() {
		schema = "current_schema()"
	}
	rows, err := d.Admin.Query("SELECT table_name FROM information_schema.tables WHERE table_schema = " + schema)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var tb string
		if err := rows.Scan(&tb); err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(tb, migrations.FrameworkTable) {
			continue
		}
		if !slices.ContainsFunc(list, func(g migrations.Grant) bool { return g.Table == tb }) {
			t.Errorf("table %s is in no grants file (%s beside its migration)", tb, migrations.GrantsFile)
		}
	}
	twice := migrations.Set{Name: "twice", FS: fstest.MapFS{migrations.GrantsFile: {Data: []byte("inbox SELECT\n")},
		migrations.PostgresDir + "/" + migrations.GrantsFile: {Data: []byte("inbox SELECT\n")}}}
	if _, err := migrations.Grants(testenv.Dialect(), twice); err == nil || !strings.Contains(err.Error(), "inbox") {
		t.Errorf("a plugin listing the framework's inbox: %v, want an error", err)
	}
}

// ApplyGrants grants exactly the listed privileges on the tables that exist, takes back the
// ones a shorter list no longer has, and reports the listed tables not created yet and the
// tables no list names.
func TestApplyGrants(t *testing.T) {
	g := testenv.GrantsDB(t)
	ctx := context.Background()
	admin, err := dbx.Open(ctx, dbx.Config{DSN: g.AdminDSN, MaxOpenConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	for _, q := range []string{"CREATE TABLE kept (id INT PRIMARY KEY)", "CREATE TABLE other (id INT PRIMARY KEY)"} {
		if _, err := admin.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	apply := func(privs ...string) migrations.GrantReport {
		t.Helper()
		rep, err := migrations.ApplyGrants(ctx, testenv.Dialect(), admin, g.Account, []migrations.Grant{{Table: "kept", Privileges: privs}, {Table: "later", Privileges: []string{"SELECT"}}})
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	rep := apply("SELECT", "INSERT", "DELETE")
	if strings.Join(rep.Granted, ",") != "kept" || strings.Join(rep.Missing, ",") != "later" || strings.Join(rep.Unlisted, ",") != "other" {
		t.Fatalf("%+v", rep)
	}
	app, err := dbx.Open(ctx, dbx.Config{DSN: g.DSN, MaxOpenConns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	mustRun := func(q string, ok bool) {
		t.Helper()
		_, err := app.Exec(q)
		switch {
		case ok && err != nil:
			t.Errorf("%s: %v", q, err)
		case !ok && !dbx.IsAccessDenied(err):
			t.Errorf("%s: %v, want access denied", q, err)
		}
	}
	mustRun("INSERT INTO kept VALUES (1)", true)
	mustRun("DELETE FROM kept", true)
	mustRun("UPDATE kept SET id = 2", false)
	mustRun("SELECT * FROM other", false)

	apply("SELECT") // the list shrank: INSERT and DELETE go
	mustRun("SELECT * FROM kept", true)
	mustRun("INSERT INTO kept VALUES (1)", false)
	mustRun("DELETE FROM kept", false)
	stmts := migrations.GrantStatements(testenv.Dialect(), g.Account, []migrations.Grant{{Table: "kept", Privileges: []string{"SELECT", "UPDATE"}}})
	if want := "GRANT SELECT, UPDATE ON " + testenv.Dialect().Quote("kept") + " TO " + g.Account; len(stmts) != 1 || stmts[0] != want {
		t.Errorf("statements %q, want %q", stmts, want)
	}
}
