package dbx

import (
	"context"
	"testing"
)

func TestRebind(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"SELECT 1", "SELECT 1"},
		{"SELECT a FROM t WHERE b = ? AND c IN (?, ?)", "SELECT a FROM t WHERE b = $1 AND c IN ($2, $3)"},
		{"SELECT '?', \"a?\", `b?` FROM t WHERE x = ?", "SELECT '?', \"a?\", `b?` FROM t WHERE x = $1"},
		{"SELECT 'it''s ?' WHERE y = ?", "SELECT 'it''s ?' WHERE y = $1"},
		{"SELECT 1 -- why?\nWHERE z = ?", "SELECT 1 -- why?\nWHERE z = $1"},
		{"SELECT 'unterminated ?", "SELECT 'unterminated ?"},
	} {
		if got := Postgres.Rebind(c.in); got != c.want {
			t.Errorf("Rebind(%q) = %q, want %q", c.in, got, c.want)
		}
		if got := MariaDB.Rebind(c.in); got != c.in {
			t.Errorf("MariaDB.Rebind(%q) = %q, want it unchanged", c.in, got)
		}
	}
}

func TestParseDialect(t *testing.T) {
	for in, want := range map[string]Dialect{"": "", "MariaDB": MariaDB, "mysql8": MySQL8, " postgres ": Postgres} {
		if d, err := ParseDialect(in); err != nil || d != want {
			t.Errorf("ParseDialect(%q) = %q, %v; want %q", in, d, err, want)
		}
	}
	if _, err := ParseDialect("oracle"); err == nil {
		t.Error("oracle: no error")
	}
	if err := (Config{DSN: "u@tcp(h:1)/d", Dialect: "postgres"}.WithDefaults()).Validate(); err == nil {
		t.Error("dialect postgres with a MySQL DSN: no error")
	}
}

func TestPostgresDSN(t *testing.T) {
	info, err := ParseDSNInfo("postgres://app:secret@127.0.0.1:5432/shop?sslmode=disable")
	if err != nil || !info.Postgres || info.User != "app" || info.DBName != "shop" || info.Addr != "127.0.0.1:5432" {
		t.Fatalf("%+v %v", info, err)
	}
	if m := MaskDSN("postgres://app:secret@127.0.0.1:5432/shop"); m != "postgres://app:***@127.0.0.1:5432/shop" {
		t.Errorf("mask: %s", m)
	}
	if _, err := ParseDSNInfo("postgres://app@127.0.0.1:5432/"); err == nil {
		t.Error("no database name: no error")
	}
	if _, err := Open(context.Background(), Config{DSN: "postgres://app@127.0.0.1:1/shop"}); err == nil {
		t.Error("open on a closed port: no error")
	}
}
