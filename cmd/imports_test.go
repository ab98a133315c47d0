package onceflowcmd_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/onceflow/onceflow"

// importRule: no package matching from depends (directly or through others) on a package
// matching any of forbidden. A pattern is a path in the module; "x/..." is x and below it.
type importRule struct {
	from      string
	forbidden []string
	why       string
}

// importRules are the directions of docs/ARCHITECTURE.md: cmd/router → runtime (cmd, with
// its console cmd/console) and plugins (coupon, examples) → inbox, outbox → pkg. Programs
// under cmd/ other than the runtime (bench, chaos, router) may import what they need.
var importRules = []importRule{
	{"pkg/...", []string{"inbox/...", "outbox/...", "coupon/...", "cmd/..."}, "pkg/ knows no layer above it"},
	{"internal/...", []string{"inbox/...", "outbox/...", "coupon/...", "cmd/..."}, "internal/ knows no layer above it"},
	{"inbox/...", []string{"outbox/...", "coupon/...", "cmd/..."}, "inbox knows no domain, no runtime, and not the outbox (a handler uses both)"},
	{"outbox/...", []string{"inbox/...", "coupon/...", "cmd/..."}, "outbox knows no domain, no runtime, and not the inbox"},
	{"migrations/...", []string{"inbox/...", "outbox/...", "coupon/...", "cmd/..."}, "the framework's schema depends on no layer"},
	{"coupon/...", []string{"cmd/..."}, "a plugin never imports the runtime"},
	{"cmd", []string{"coupon/...", "examples/..."}, "the runtime imports no plugin: binaries choose them"},
	{"cmd/console", []string{"coupon/...", "examples/...", "cmd"}, "the console is the runtime's: it imports no plugin (a plugin speaks through inbox.Plugin.History), and the runtime imports it"},
}

func matches(pattern, pkg string) bool {
	rel, ok := strings.CutPrefix(pkg, module+"/")
	if !ok {
		return false
	}
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return rel == base || strings.HasPrefix(rel, base+"/")
	}
	return rel == pattern
}

// importViolations lists "pkg → dep (why)" for every dependency a rule forbids.
func importViolations(rules []importRule, deps map[string][]string) []string {
	var out []string
	for pkg, ds := range deps {
		for _, r := range rules {
			if !matches(r.from, pkg) {
				continue
			}
			for _, d := range ds {
				for _, f := range r.forbidden {
					if matches(f, d) {
						out = append(out, pkg+" → "+d+" ("+r.why+")")
					}
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

// The rules catch an upward import, directly or through another package, and accept the
// directions they describe.
func TestImportRules(t *testing.T) {
	m := func(p string) string { return module + "/" + p }
	cases := []struct {
		name string
		deps map[string][]string
		want int
	}{
		{"allowed directions", map[string][]string{
			m("cmd"):         {m("inbox"), m("outbox"), m("pkg/dbx"), m("cmd/console")},
			m("cmd/console"): {m("inbox"), m("outbox"), m("pkg/metrics")},
			m("cmd/router"):  {m("cmd"), m("coupon"), m("coupon/notify")},
			m("cmd/bench"):   {m("coupon"), m("inbox")},
			m("coupon"):      {m("inbox"), m("outbox"), m("pkg/dbx")},
			m("inbox"):       {m("pkg/dbx"), m("pkg/kafkax")},
			m("pkg/testenv"): {m("migrations"), m("pkg/dbx")},
		}, 0},
		{"pkg imports inbox", map[string][]string{m("pkg/dbx"): {m("inbox")}}, 1},
		{"pkg depends on cmd through another package", map[string][]string{m("pkg/metrics"): {m("pkg/kafkax"), m("cmd")}}, 1},
		{"inbox imports outbox", map[string][]string{m("inbox"): {m("outbox")}}, 1},
		{"outbox imports inbox and coupon", map[string][]string{m("outbox"): {m("inbox"), m("coupon")}}, 2},
		{"inboxtest imports coupon", map[string][]string{m("inbox/inboxtest"): {m("coupon")}}, 1},
		{"the runtime imports a plugin", map[string][]string{m("cmd"): {m("coupon/notify")}}, 1},
		{"a plugin imports the runtime", map[string][]string{m("coupon"): {m("cmd")}}, 1},
		{"the console imports a plugin and the runtime", map[string][]string{m("cmd/console"): {m("coupon"), m("cmd")}}, 2},
		{"a package named like a layer is not one", map[string][]string{m("pkg/dbx"): {m("inboxes"), "example.com/inbox"}}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := importViolations(importRules, tc.deps); len(got) != tc.want {
				t.Errorf("%d violations, want %d: %v", len(got), tc.want, got)
			}
		})
	}
}

// The module's packages follow the rules (go list: each package's dependencies, transitive,
// tests left out).
func TestImports(t *testing.T) {
	out, err := exec.Command("go", "list", "-e", "-f", `{{.ImportPath}} {{join .Deps " "}}`, module+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := map[string][]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(l)
		deps[f[0]] = f[1:]
	}
	for _, p := range []string{"cmd", "inbox", "outbox", "pkg/dbx", "coupon"} {
		if _, ok := deps[module+"/"+p]; !ok {
			t.Fatalf("go list did not list %s: %s", p, out)
		}
	}
	for _, v := range importViolations(importRules, deps) {
		t.Error(v)
	}
}
