package inboxtest_test

import (
	"os"
	"strings"
	"testing"
)

// TestDocExampleIsTheLoyaltyTest checks that the package doc's example is the loyalty
// example's test, line for line. Every line of it is a line of
// examples/loyalty/points/points_test.go.
func TestDocExampleIsTheLoyaltyTest(t *testing.T) {
	doc, err := os.ReadFile("inboxtest.go")
	if err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile("../../examples/loyalty/points/points_test.go")
	if err != nil {
		t.Fatal(err)
	}
	lines := map[string]bool{}
	for _, l := range strings.Split(string(example), "\n") {
		lines[strings.TrimSpace(l)] = true
	}
	code := 0
	for _, l := range strings.Split(string(doc), "\n") {
		c, ok := strings.CutPrefix(l, "//\t")
		if !ok {
			continue
		}
		code++
		if c = strings.TrimSpace(c); !lines[c] {
			t.Errorf("the package doc's example line %q is not in the loyalty example's test", c)
		}
	}
	if code == 0 {
		t.Fatal("the package doc has no example")
	}
}
