package onceflow

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestComposeClusterMatchesInfraCluster: docker-compose.yml's three-broker profile (not run
// here: the project's machine has no Docker) sets the replication, ISR and group settings
// scripts/infra-cluster.sh gives the cluster every cluster test and `make soak` run on, on
// three nodes with distinct ports, and creates the topics with replication factor 3 and
// min.insync.replicas 2.
func TestComposeClusterMatchesInfraCluster(t *testing.T) {
	want := infraClusterSettings(t)
	if len(want) < 10 {
		t.Fatalf("read %d settings from scripts/infra-cluster.sh: %v", len(want), want)
	}
	raw, err := os.ReadFile("docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Services map[string]struct {
			Profiles    []string          `yaml:"profiles"`
			Environment map[string]string `yaml:"environment"`
			Command     []string          `yaml:"command"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	ports := map[string]string{}
	for _, name := range []string{"kafka-1", "kafka-2", "kafka-3"} {
		svc, ok := doc.Services[name]
		if !ok || len(svc.Profiles) != 1 || svc.Profiles[0] != "cluster" {
			t.Fatalf("service %s missing or not in the cluster profile", name)
		}
		if diffs := settingsDiff(want, svc.Environment); len(diffs) > 0 {
			t.Errorf("%s differs from scripts/infra-cluster.sh: %s", name, strings.Join(diffs, "; "))
		}
		l := svc.Environment["KAFKA_LISTENERS"]
		if prev, dup := ports[l]; dup || l == "" {
			t.Errorf("%s listeners %q (also %s)", name, l, prev)
		}
		ports[l] = name
	}
	topics := strings.Join(doc.Services["kafka-cluster-topics"].Command, "\n")
	if !strings.Contains(topics, "--replication-factor 3") || !strings.Contains(topics, "min.insync.replicas=2") {
		t.Errorf("kafka-cluster-topics does not create RF 3, min.insync.replicas 2 topics:\n%s", topics)
	}

	// The comparison catches a node that drifts.
	drifted := map[string]string{}
	for k, v := range doc.Services["kafka-2"].Environment {
		drifted[k] = v
	}
	drifted["KAFKA_MIN_INSYNC_REPLICAS"] = "1"
	delete(drifted, "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR")
	if d := settingsDiff(want, drifted); len(d) != 2 {
		t.Errorf("a drifted node gave %d differences, want 2: %v", len(d), d)
	}
}

// infraClusterSettings reads the broker settings of scripts/infra-cluster.sh that a
// deployment must share (replication, ISR, group and topic creation: from
// default.replication.factor to auto.create.topics.enable), as compose environment names.
func infraClusterSettings(t *testing.T) map[string]string {
	f, err := os.Open("scripts/infra-cluster.sh")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]string{}
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "default.replication.factor=") {
			in = true
		}
		if !in {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			break
		}
		out["KAFKA_"+strings.ToUpper(strings.ReplaceAll(k, ".", "_"))] = v
		if k == "auto.create.topics.enable" {
			break
		}
	}
	return out
}

func settingsDiff(want, got map[string]string) []string {
	var d []string
	for k, v := range want {
		if got[k] != v {
			d = append(d, fmt.Sprintf("%s=%q, want %q", k, got[k], v))
		}
	}
	return d
}
