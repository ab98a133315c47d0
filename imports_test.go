package onceflow_test

import (
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/onceflow/onceflow"

// importRule: no package matching from, unless it matches one of except, depends (directly
// or through others) on a package matching any of forbidden. A pattern is a path in the
// module: "." is the root package (the runtime), "x/..." is x and below it, "..." every
// package of the module.
type importRule struct {
	from      string
	forbidden []string
	why       string
	except    []string
}

// importRules are the directions of docs/ARCHITECTURE.md: cmd/router → the command line
// (pkg/routercmd) → the runtime (the root package) and plugins (coupon, examples) → inbox,
// outbox → pkg, internal. The command line is the one package of pkg/ above the runtime, and
// only main packages import it; the one package of internal/ above inbox and outbox is the
// runtime's console (internal/console), which the runtime mounts. Package inbox is the
// plugin's contract and inbox/engine runs it: the engine imports the contract, never the
// other way, and a plugin needs only the contract (its tests may run it through the
// engine). The tools module (tools/) may import what it needs; nothing here imports it.
var importRules = []importRule{
	{"pkg/...", []string{"inbox/...", "outbox/...", "coupon/...", ".", "cmd/..."}, "pkg/ knows no layer above it", []string{"pkg/routercmd"}},
	{"internal/...", []string{"inbox/...", "outbox/...", "coupon/...", ".", "cmd/..."}, "internal/ knows no layer above it", []string{"internal/console"}},
	{"internal/console", []string{"coupon/...", ".", "cmd/..."}, "the console is the runtime's: it reads and changes the inbox and the outbox, and knows no runtime and no plugin", nil},
	{"inbox/...", []string{"outbox/...", "coupon/...", ".", "cmd/..."}, "inbox knows no domain, no runtime, and not the outbox (a handler uses both)", nil},
	{"outbox/...", []string{"inbox/...", "coupon/...", ".", "cmd/..."}, "outbox knows no domain, no runtime, and not the inbox", nil},
	{"migrations/...", []string{"inbox/...", "outbox/...", "coupon/...", ".", "cmd/..."}, "the framework's schema depends on no layer", nil},
	{"inbox", []string{"inbox/engine"}, "the contract (inbox) knows no engine: the engine imports it", nil},
	{"coupon/...", []string{".", "cmd/...", "inbox/inboxops"}, "a plugin never imports the runtime, nor the operators' inbox (inboxops)", nil},
	{"coupon/...", []string{"inbox/engine"}, "a plugin needs only the contract (inbox), not the engine that runs it", nil},
	{".", []string{"coupon/...", "examples/...", "cmd/..."}, "the runtime imports no plugin: binaries choose them", nil},
	{"pkg/routercmd", []string{"coupon/...", "examples/...", "cmd/..."}, "the command line imports no plugin: binaries choose them", nil},
	{"...", []string{"pkg/routercmd"}, "only main packages import the command line (pkg/routercmd)", []string{"pkg/routercmd", "cmd/..."}},
	{"...", []string{"tools/..."}, "the library never imports the tools module", nil},
}

// testImportRules hold for the tests of a package too (go list's TestImports and
// XTestImports): a helper's tests use no layer above it either. The tests of the runtime and
// of the command line may import the bundled plugins, and any test the command line.
var testImportRules = importRules[:3]

func matches(pattern, pkg string) bool {
	switch pattern {
	case ".":
		return pkg == module
	case "...":
		return pkg == module || strings.HasPrefix(pkg, module+"/")
	}
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
			if !matches(r.from, pkg) || slices.ContainsFunc(r.except, func(e string) bool { return matches(e, pkg) }) {
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
			module:                  {m("inbox"), m("outbox"), m("pkg/dbx"), m("internal/consoleui")},
			m("internal/consoleui"): {m("internal/metrics")},
			m("cmd/router"):         {module, m("coupon"), m("coupon/notify")},
			m("coupon"):             {m("inbox"), m("outbox"), m("pkg/dbx")},
			m("inbox"):              {m("pkg/dbx"), m("pkg/kafkax"), m("internal/txdefer")},
			m("inbox/inboxtest"):    {m("inbox"), m("internal/testenv")},
			m("inbox/inboxops"):     {m("inbox"), m("pkg/dbx")},
			m("internal/testenv"):   {m("migrations"), m("pkg/dbx")},
		}, 0},
		{"pkg imports inbox", map[string][]string{m("pkg/dbx"): {m("inbox")}}, 1},
		{"internal imports outbox and coupon", map[string][]string{m("internal/testenv"): {m("outbox"), m("coupon")}}, 2},
		{"internal imports the runtime", map[string][]string{m("internal/consoleui"): {module}}, 1},
		{"the console reads the inbox and the outbox", map[string][]string{m("internal/console"): {m("inbox"), m("inbox/inboxops"), m("outbox"), m("internal/consoleui")}}, 0},
		{"the console imports the runtime", map[string][]string{m("internal/console"): {m("internal/consoleui"), m("inbox/inboxops"), module}}, 1},
		{"the console imports a plugin", map[string][]string{m("internal/console"): {m("coupon")}}, 1},
		{"another internal package imports the inbox", map[string][]string{m("internal/consoleui"): {m("inbox")}}, 1},
		{"pkg depends on the runtime through another package", map[string][]string{m("pkg/kafkax"): {m("internal/metrics"), module}}, 1},
		{"inbox imports outbox", map[string][]string{m("inbox"): {m("outbox")}}, 1},
		{"outbox imports inbox and coupon", map[string][]string{m("outbox"): {m("inbox"), m("coupon")}}, 2},
		{"inboxtest imports coupon", map[string][]string{m("inbox/inboxtest"): {m("coupon")}}, 1},
		{"the runtime imports a plugin", map[string][]string{module: {m("coupon/notify")}}, 1},
		{"a plugin imports the runtime", map[string][]string{m("coupon"): {module}}, 1},
		{"a plugin imports the operators' inbox", map[string][]string{m("coupon/notify"): {m("inbox/inboxops")}}, 1},
		{"the engine imports the contract", map[string][]string{m("inbox/engine"): {m("inbox"), m("pkg/dbx")}, m("inbox/inboxops"): {m("inbox/engine"), m("inbox")}}, 0},
		{"the contract imports the engine", map[string][]string{m("inbox"): {m("inbox/engine")}}, 1},
		{"a plugin imports the engine", map[string][]string{m("coupon"): {m("inbox"), m("inbox/engine")}, m("coupon/notify"): {m("inbox/inboxtest"), m("inbox/engine")}}, 2},
		{"the library imports the tools module", map[string][]string{module: {m("tools/chaos")}, m("coupon"): {m("tools/bench")}}, 2},
		{"the command line imports the runtime, inboxops and the libraries", map[string][]string{
			m("pkg/routercmd"): {module, m("inbox"), m("inbox/inboxops"), m("outbox"), m("pkg/dbx"), m("internal/registry")},
			m("cmd/router"):    {m("pkg/routercmd"), module, m("coupon")},
		}, 0},
		{"the command line imports a plugin", map[string][]string{m("pkg/routercmd"): {module, m("coupon/notify")}}, 1},
		{"the runtime imports the command line", map[string][]string{module: {m("pkg/routercmd")}}, 1},
		{"a plugin imports the command line", map[string][]string{m("coupon"): {m("pkg/routercmd"), module}}, 2},
		{"another pkg/ package imports the runtime", map[string][]string{m("pkg/kafkax"): {module}}, 1},
		{"a library imports the command line", map[string][]string{m("inbox/inboxtest"): {m("pkg/routercmd")}, m("pkg/dbx"): {m("pkg/routercmd")}}, 2},
		{"a package named like a layer is not one", map[string][]string{m("pkg/dbx"): {m("inboxes"), "example.com/inbox", module + "x"}}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := importViolations(importRules, tc.deps); len(got) != tc.want {
				t.Errorf("%d violations, want %d: %v", len(got), tc.want, got)
			}
		})
	}
}

// goList runs go list on the module's packages and returns, per package, the fields format
// lists after its import path.
func goList(t *testing.T, format string) map[string][]string {
	t.Helper()
	out, err := exec.Command("go", "list", "-e", "-f", "{{.ImportPath}} "+format, module+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	res := map[string][]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(l)
		res[f[0]] = f[1:]
	}
	return res
}

// The module's packages follow the rules (go list: each package's dependencies, transitive,
// tests left out), and the tests of pkg/ and internal/ import no layer above them either.
func TestImports(t *testing.T) {
	deps := goList(t, `{{join .Deps " "}}`)
	for _, p := range []string{"", "/inbox", "/inbox/engine", "/outbox", "/pkg/dbx", "/pkg/routercmd", "/internal/testenv", "/internal/console", "/coupon", "/cmd/router"} {
		if _, ok := deps[module+p]; !ok {
			t.Fatalf("go list did not list %s: %v", module+p, deps)
		}
	}
	for _, v := range importViolations(importRules, deps) {
		t.Error(v)
	}
	if !slices.Contains(deps[module+"/inbox/engine"], module+"/inbox") {
		t.Errorf("inbox/engine does not import the contract, inbox: %v", deps[module+"/inbox/engine"])
	}
	tests := goList(t, `{{join .TestImports " "}} {{join .XTestImports " "}}`)
	for _, v := range importViolations(testImportRules, tests) {
		t.Error("test: " + v)
	}
}

// cmd/ holds only main packages: what a user imports lives elsewhere.
func TestCmdHoldsOnlyMainPackages(t *testing.T) {
	names := goList(t, "{{.Name}}")
	n := 0
	for pkg, name := range names {
		if !matches("cmd/...", pkg) {
			continue
		}
		n++
		if len(name) != 1 || name[0] != "main" {
			t.Errorf("%s is package %v, not a main package", pkg, name)
		}
	}
	if n == 0 {
		t.Fatalf("go list found no package under cmd/: %v", names)
	}
}

// A team's own module (examples/…) imports only what a team needs of this module: the
// contract (inbox), the outbox, the test kit (inbox/inboxtest), migrations and pkg/. Its
// plugin packages, all but its main package, depend on no engine, even through another
// package.
func TestExampleModulesImportOnlyPublicPackages(t *testing.T) {
	mods, err := filepath.Glob("examples/*/go.mod")
	if err != nil || len(mods) == 0 {
		t.Fatalf("no module under examples/: %v", err)
	}
	allowed := func(p string) bool {
		for _, a := range []string{"inbox", "inbox/inboxtest", "outbox", "migrations", "pkg/..."} {
			if matches(a, p) {
				return true
			}
		}
		return false
	}
	for _, mod := range mods {
		cmd := exec.Command("go", "list", "-e", "-f",
			`{{.ImportPath}} {{.Name}}|{{join .Imports " "}} {{join .TestImports " "}} {{join .XTestImports " "}}|{{join .Deps " "}}`, "./...")
		cmd.Dir = filepath.Dir(mod)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list in %s: %v", cmd.Dir, err)
		}
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			parts := strings.Split(l, "|")
			head := strings.Fields(parts[0])
			for _, imp := range strings.Fields(parts[1]) {
				if matches("...", imp) && !allowed(imp) {
					t.Errorf("%s imports %s: a team's module needs only inbox, outbox, inbox/inboxtest, migrations and pkg/", head[0], imp)
				}
			}
			if head[1] != "main" && slices.Contains(strings.Fields(parts[2]), module+"/inbox/engine") {
				t.Errorf("%s depends on inbox/engine: a plugin needs only the contract", head[0])
			}
		}
	}
}
