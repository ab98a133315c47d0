package main

import (
	"fmt"
	"os/exec"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testenv"
)

func TestOwnerPID(t *testing.T) {
	for _, c := range []struct {
		owner string
		pid   int
	}{
		{"vm-17631-4bfbf8", 17631},
		{"ci-runner-3-42-00ff00", 42},
		{"relay-7-abcdef", 7},
		{"my-own-name", 0},
		{"plain", 0},
		{"", 0},
	} {
		if got := ownerPID(c.owner); got != c.pid {
			t.Errorf("ownerPID(%q) = %d, want %d", c.owner, got, c.pid)
		}
	}
}

// TestLeaseHolders names the router whose process owns a relay lease, and an owner that is
// no router of the run as written.
func TestLeaseHolders(t *testing.T) {
	d := testenv.DB(t, 2)
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	h := &harness{appDSN: d.DSN, slots: []*slot{{name: "a"}, {name: "b", cmd: cmd}}}
	if got := h.leaseHolders(); got != "nobody" {
		t.Fatalf("no lease: %s", got)
	}
	until := time.Now().UTC().Add(time.Minute)
	for _, r := range []struct{ shard, owner string }{{"default", fmt.Sprintf("host-%d-abc123", cmd.Process.Pid)}, {"s1", "elsewhere-1-ffffff"}} {
		if _, err := d.DB.Exec(rebind(d.DB, `INSERT INTO relay_lease (shard, owner, expires_at) VALUES (?, ?, ?)`), r.shard, r.owner, until); err != nil {
			t.Fatal(err)
		}
	}
	want := fmt.Sprintf("router b (owner host-%d-abc123) on shard default, owner elsewhere-1-ffffff on shard s1", cmd.Process.Pid)
	if got := h.leaseHolders(); got != want {
		t.Fatalf("holders %q, want %q", got, want)
	}
}

// TestKillableSparesTheArmedRouter: a kill fault hits a running router that is not armed,
// and none when only the armed one runs.
func TestKillableSparesTheArmedRouter(t *testing.T) {
	running := &exec.Cmd{}
	a, b, c := &slot{name: "a"}, &slot{name: "b", cmd: running, armed: []string{"X=1"}}, &slot{name: "c", cmd: running}
	slots := []*slot{a, b, c}
	for _, tc := range []struct {
		first *slot
		want  *slot
	}{{a, c}, {b, c}, {c, c}} {
		if got := killable(slots, tc.first, 0); got != tc.want {
			t.Errorf("first %s: got %v, want %s", tc.first.name, got, tc.want.name)
		}
	}
	if got := killable([]*slot{a, b}, b, 0); got != nil {
		t.Errorf("only the armed router runs: got %s", got.name)
	}
}
