package routercmd_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/IBM/sarama"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/pkg/routercmd"
)

// TestTopicsCommand checks that `router topics` creates the missing topics that a plugin
// reads and writes, with the partitions asked for. Run again, it changes nothing. An
// explicit --partitions that an existing topic does not have is reported, not applied.
func TestTopicsCommand(t *testing.T) {
	testenv.Integration(t)
	k := testenv.Kafka(t)
	suffix := make([]byte, 5)
	_, _ = rand.Read(suffix)
	in, out := "topics-in-"+hex.EncodeToString(suffix), "topics-out-"+hex.EncodeToString(suffix)
	admin, err := sarama.NewClusterAdmin(k.Brokers, k.SaramaConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, tp := range []string{in, out} {
			_ = admin.DeleteTopic(tp)
		}
		admin.Close()
	})
	p := inbox.Plugin{
		Name: "topics-test", Topics: []string{in}, ConsumerGroup: "topics-test", BizType: "topics",
		Writes: func(any) ([]string, error) { return []string{out}, nil },
		Build:  func(context.Context, inbox.PluginEnv) (inbox.Handler, error) { return nil, nil },
	}
	reg := []inbox.Plugin{p}
	brokers := strings.Join(k.Brokers, ",")
	partitions := func(topic string) int {
		t.Helper()
		parts, err := k.CheckTopics(topic)
		if err != nil {
			return 0
		}
		return parts[topic]
	}

	got, err := cli(t, reg, "--brokers", brokers, "topics", "--partitions", "3", "--replication-factor", "1", "--dry-run")
	if err != nil || !strings.Contains(got, "2 topics to create (dry run)") || partitions(in) != 0 {
		t.Fatalf("dry run: %v\n%s", err, got)
	}
	got, err = cli(t, reg, "--brokers", brokers, "topics", "--partitions", "3", "--replication-factor", "1")
	if err != nil {
		t.Fatalf("topics: %v\n%s", err, got)
	}
	for _, want := range []string{in + " ", "topics-test (reads)", out + " ", "topics-test (writes)", "2 topics created, 0 existed"} {
		if !strings.Contains(got, want) {
			t.Fatalf("output lacks %q:\n%s", want, got)
		}
	}
	if partitions(in) != 3 || partitions(out) != 3 {
		t.Fatalf("partitions %d and %d, want 3", partitions(in), partitions(out))
	}
	got, err = cli(t, reg, "--brokers", brokers, "topics")
	if err != nil || !strings.Contains(got, "0 topics created, 2 existed\n") {
		t.Fatalf("again: %v\n%s", err, got)
	}
	got, err = cli(t, reg, "--brokers", brokers, "topics", "--partitions", "5")
	if err != nil || !strings.Contains(got, "exists with 3 partitions, not 5: left as it is") || !strings.Contains(got, "(2 with other partitions than --partitions, not changed)") {
		t.Fatalf("other partitions: %v\n%s", err, got)
	}
	if partitions(in) != 3 {
		t.Fatalf("partitions of %s changed to %d", in, partitions(in))
	}
	for _, args := range [][]string{
		{"topics", "--partitions", "0"},
		{"topics", "--replication-factor", "99"},
		{"topics", "--plugins", "nope"},
	} {
		if _, err := cli(t, reg, append([]string{"--brokers", brokers}, args...)...); routercmd.ExitCode(err) != 2 {
			t.Errorf("%v: %v, want exit 2", args, err)
		}
	}
}
