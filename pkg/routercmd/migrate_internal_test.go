package routercmd

import (
	"strings"
	"testing"
)

// TestMigrateReport checks that migrateReport names each set with what it applied. It says
// "up to date" only of what applied nothing.
func TestMigrateReport(t *testing.T) {
	set := func(label string, versions ...int64) setMigrations {
		m := setMigrations{label: label, applied: map[int64]bool{}}
		for _, v := range versions {
			m.applied[v] = true
			m.latest = max(m.latest, v)
		}
		return m
	}
	for _, tc := range []struct {
		name          string
		before, after []setMigrations
		want          string
	}{
		{"empty database",
			[]setMigrations{set("the framework"), set("plugin p")},
			[]setMigrations{set("the framework", 1, 2, 3), set("plugin p", 1)},
			"migrate: the framework: 3 migrations applied, version 0 → 3\nmigrate: plugin p: 1 migration applied, version 0 → 1\nmigrate: 4 migrations applied (dsn)\n"},
		{"nothing to apply",
			[]setMigrations{set("the framework", 1, 2, 3), set("plugin p", 1)},
			[]setMigrations{set("the framework", 1, 2, 3), set("plugin p", 1)},
			"migrate: the framework: up to date at version 3\nmigrate: plugin p: up to date at version 1\nmigrate: schema up to date, nothing applied (dsn)\n"},
		{"a plugin's new migration",
			[]setMigrations{set("the framework", 1, 2, 3), set("plugin p", 1)},
			[]setMigrations{set("the framework", 1, 2, 3), set("plugin p", 1, 2)},
			"migrate: the framework: up to date at version 3\nmigrate: plugin p: 1 migration applied, version 1 → 2\nmigrate: 1 migration applied (dsn)\n"},
		{"an older migration applied late",
			[]setMigrations{set("the framework", 1, 3)},
			[]setMigrations{set("the framework", 1, 2, 3)},
			"migrate: the framework: 1 migration applied, version 3 → 3\nmigrate: 1 migration applied (dsn)\n"},
		{"before unread",
			nil,
			[]setMigrations{set("the framework", 1, 2)},
			"migrate: the framework: now at version 2\nmigrate: schema migrated (dsn)\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := migrateReport(tc.before, tc.after, "dsn"); got != tc.want {
				t.Fatalf("got\n%s\nwant\n%s", got, tc.want)
			}
			if strings.Contains(tc.want, "up to date, nothing applied") != strings.Contains(migrateReport(tc.before, tc.after, "dsn"), "nothing applied") {
				t.Fatal("up to date said of a run that applied something")
			}
		})
	}
}
