package main

import (
	"slices"
	"testing"

	"github.com/onceflow/onceflow/pkg/dbx"
)

func TestDSNPerDialect(t *testing.T) {
	for _, c := range []struct {
		d    dbx.Dialect
		want string
	}{
		{dbx.MariaDB, "onceflow:onceflow@tcp(127.0.0.1:3307)/onceflow_chaos?timeout=5s&readTimeout=60s&writeTimeout=60s"},
		{dbx.Postgres, "postgres://onceflow:onceflow@127.0.0.1:5433/onceflow_chaos?connect_timeout=5&sslmode=disable"},
	} {
		addr := "127.0.0.1:3307"
		if c.d.IsPostgres() {
			addr = "127.0.0.1:5433"
		}
		got := dsn(c.d, "onceflow:onceflow", addr, "onceflow_chaos")
		if got != c.want {
			t.Errorf("%s: dsn %q, want %q", c.d, got, c.want)
		}
		if _, err := dbx.ParseDSNInfo(got); err != nil {
			t.Errorf("%s: the routers' DSN %q does not parse: %v", c.d, got, err)
		}
	}
}

// The harness reads a DSN's servers from its address part only, as the routers do: a
// tcp(...) list in a parameter is refused, never dialed.
func TestDSNServersFromTheAddressPart(t *testing.T) {
	if got := dsnServers("u:p@tcp(a:1,b:2,c:3)/db?timeout=5s"); !slices.Equal(got, []string{"a:1", "b:2", "c:3"}) {
		t.Errorf("servers %q, want a:1 b:2 c:3", got)
	}
	smuggled := "u:p@tcp(a:1)/db?x=@tcp(evil:1,evil:2)"
	if got := dsnServers(smuggled); got != nil {
		t.Errorf("servers of %s: %q, want none", smuggled, got)
	}
	if db, err := openDB(smuggled); err == nil {
		db.Close()
		t.Errorf("openDB(%s) accepted it", smuggled)
	}
}

func TestCHAOSLineNamesTheDatabase(t *testing.T) {
	rep := Report{Orders: 3, LagChecked: true}
	for _, c := range []struct {
		d    dbx.Dialect
		want string
	}{
		{"", "CHAOS ok orders=3 kills=1 broker_restarts=0 db_restarts=2 lost=0 duplicates=0 lag=0"},
		{dbx.MariaDB, "CHAOS ok orders=3 kills=1 broker_restarts=0 db_restarts=2 lost=0 duplicates=0 lag=0"},
		{dbx.Postgres, "CHAOS ok db=postgres orders=3 kills=1 broker_restarts=0 db_restarts=2 lost=0 duplicates=0 lag=0"},
	} {
		got := runSummary(rep, runInfo{Kills: 1, DBRestarts: 2, Dialect: c.d}, nil)
		if got != c.want {
			t.Errorf("%q: %s, want %s", c.d, got, c.want)
		}
	}
	got := runSummary(rep, runInfo{Dialect: dbx.Postgres}, []string{"harness(x)"})
	if want := "CHAOS FAIL db=postgres orders=3 "; got[:len(want)] != want {
		t.Errorf("FAIL line: %s", got)
	}
}
