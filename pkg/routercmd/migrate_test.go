package routercmd_test

import (
	"context"
	"fmt"
	"io/fs"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/migrations"
)

// TestMigrateSaysWhatItApplied checks that `router migrate` says what it applied, set by
// set, from which version to which. It says "up to date" only when it applied nothing. On
// an empty database it applies every migration of the framework and of a plugin. Run again,
// it applies nothing. After a plugin's last version is rolled back, it applies that one.
func TestMigrateSaysWhatItApplied(t *testing.T) {
	d := testenv.DB(t, 2)
	ctx := context.Background()
	// Nothing of onceflow is left, neither a table nor a version table.
	if err := migrations.Reset(ctx, d.Admin); err != nil {
		t.Fatal(err)
	}
	d.AdminExec(t, "DROP TABLE "+migrations.FrameworkTable)
	var built []*tally
	reg := []inbox.Plugin{tallyPlugin(&built)}
	migrate := func() string {
		t.Helper()
		out, err := cli(t, reg, "--dsn", d.DSN, "migrate", "--admin-dsn", d.AdminDSN, "--grants=false")
		if err != nil {
			t.Fatalf("migrate: %v\n%s", err, out)
		}
		return out
	}
	expect := func(out string, want, unwanted []string) {
		t.Helper()
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("migrate's output lacks %q:\n%s", w, out)
			}
		}
		for _, u := range unwanted {
			if strings.Contains(out, u) {
				t.Errorf("migrate's output says %q:\n%s", u, out)
			}
		}
	}
	files, latest := frameworkMigrations(t), latestFrameworkMigration(t)

	expect(migrate(), []string{
		fmt.Sprintf("migrate: the framework: %d migrations applied, version 0 → %d\n", files, latest),
		"migrate: plugin tally-counter: 2 migrations applied, version 0 → 2\n",
		fmt.Sprintf("migrate: %d migrations applied (", files+2),
	}, []string{"up to date"})

	expect(migrate(), []string{
		fmt.Sprintf("migrate: the framework: up to date at version %d\n", latest),
		"migrate: plugin tally-counter: up to date at version 2\n",
		"migrate: schema up to date, nothing applied (",
	}, []string{"migrations applied", "migration applied"})

	p, err := migrations.NewProvider(d.Admin, reg[0].Migrations, migrationsOf(reg[0]).Table())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.DownTo(ctx, 1); err != nil {
		t.Fatal(err)
	}
	expect(migrate(), []string{
		fmt.Sprintf("migrate: the framework: up to date at version %d\n", latest),
		"migrate: plugin tally-counter: 1 migration applied, version 1 → 2\n",
		"migrate: 1 migration applied (",
	}, []string{"schema up to date"})
}

// frameworkMigrations is the number of the framework's migrations for the tests' database.
func frameworkMigrations(t *testing.T) int {
	t.Helper()
	dir, err := migrations.ForDialect("the framework", migrations.FS, testenv.Dialect())
	if err != nil {
		t.Fatal(err)
	}
	files, err := fs.Glob(dir, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	return len(files)
}
