package migrations_test

import (
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/coupon/notify"
	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/pkg/testenv"
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
	list, err := migrations.Grants(bundled...)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := d.Admin.Query("SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE()")
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
	twice := migrations.Set{Name: "twice", FS: fstest.MapFS{migrations.GrantsFile: {Data: []byte("inbox SELECT\n")}}}
	if _, err := migrations.Grants(twice); err == nil || !strings.Contains(err.Error(), "inbox") {
		t.Errorf("a plugin listing the framework's inbox: %v, want an error", err)
	}
}
