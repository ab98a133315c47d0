package kafkax_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/onceflow/onceflow/pkg/kafkax"
)

// TestCheckTopicName: Kafka's rule, 1 to 249 of [A-Za-z0-9._-] and not "." or "..",
// against the regexp that states it, on names at and around every edge.
func TestCheckTopicName(t *testing.T) {
	rule := regexp.MustCompile(`^[A-Za-z0-9._-]{1,249}$`)
	names := []string{"", ".", "..", "...", "order-paid", "a.b_c-D9", "no spaces", "ü", "a\x00", "a/b", "a\xff",
		strings.Repeat("a", 249), strings.Repeat("a", 250), "topic\n", "Z", "-", "_"}
	for c := 0; c < 256; c++ {
		names = append(names, "t"+string(rune(c)), "t"+string([]byte{byte(c)}))
	}
	for _, n := range names {
		want := rule.MatchString(n) && n != "." && n != ".."
		if got := kafkax.CheckTopicName(n) == nil; got != want {
			t.Errorf("CheckTopicName(%q) valid = %v, want %v", n, got, want)
		}
	}
}
