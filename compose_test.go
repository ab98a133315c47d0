package onceflow

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// The development services are written down once, in deploy/dev/services.env: scripts/infra.sh
// (and the three scripts it sources) and docker-compose.yml (with its init scripts,
// deploy/dev/initdb-*.sh) both read it. The tests below check that each side takes its
// databases, users, grants, topics, ports and versions from there, and that the two agree.
// Nothing here needs Docker or a running service: compose's side is read from the YAML (its
// variables filled in from the data file, as Compose does) and its shell parts are run with
// the tools they call replaced by stubs that print; infra.sh's side is sourced, and its
// provisioning functions are run with the database clients and the Kafka tool stubbed.

const servicesEnv = "deploy/dev/services.env"

// devFiles are the files of both sides, copied into a scratch tree for each run.
var devFiles = []string{
	"scripts/infra.sh", "scripts/infra-postgres.sh", "scripts/infra-cluster.sh", "scripts/infra-galera.sh",
	"deploy/dev/sql.sh", "deploy/dev/initdb-mysql.sh", "deploy/dev/initdb-postgres.sh",
	"docker-compose.yml",
}

// envLine is the data file's one form of line: KEY=VALUE, the value bare or in double quotes,
// with none of the characters bash, Compose's .env reader and this parser could read apart.
var envLine = regexp.MustCompile("^(DEV_[A-Z0-9_]+)=(?:\"([^\"$\\\\`']*)\"|([^\\s\"$\\\\`'#]*))$")

// devData is the data file, parsed: its keys in order and their values.
type devData struct {
	keys []string
	vals map[string]string
}

func parseServicesEnv(text string) (devData, error) {
	d := devData{vals: map[string]string{}}
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		m := envLine.FindStringSubmatch(line)
		if m == nil {
			return d, fmt.Errorf("line %d: %q is not KEY=VALUE (KEY DEV_*, no $ \\ ' ` in VALUE, spaces only in double quotes)", i+1, line)
		}
		if _, dup := d.vals[m[1]]; dup {
			return d, fmt.Errorf("line %d: %s given twice", i+1, m[1])
		}
		d.keys = append(d.keys, m[1])
		d.vals[m[1]] = m[2] + m[3]
	}
	if len(d.keys) == 0 {
		return d, fmt.Errorf("no KEY=VALUE line")
	}
	return d, nil
}

func (d devData) String() string {
	var b strings.Builder
	for _, k := range d.keys {
		fmt.Fprintf(&b, "%s=\"%s\"\n", k, d.vals[k])
	}
	return b.String()
}

func (d devData) words(k string) []string { return strings.Fields(d.vals[k]) }

// perturbed is d with every value changed (a word gets an x, a number grows by 7): a side that
// copied a value instead of reading it no longer agrees.
func (d devData) perturbed() devData {
	word := regexp.MustCompile(`[A-Za-z0-9_.-]+`)
	p := devData{keys: d.keys, vals: map[string]string{}}
	for k, v := range d.vals {
		p.vals[k] = word.ReplaceAllStringFunc(v, func(w string) string {
			if n, err := strconv.Atoi(w); err == nil {
				return strconv.Itoa(n + 7)
			}
			return w + "x"
		})
	}
	return p
}

func readServicesData(t *testing.T) devData {
	t.Helper()
	raw, err := os.ReadFile(servicesEnv)
	if err != nil {
		t.Fatal(err)
	}
	d, err := parseServicesEnv(string(raw))
	if err != nil {
		t.Fatalf("%s: %v", servicesEnv, err)
	}
	return d
}

// TestComposeServicesEnvFormat: the data file parses, the values the scripts and compose split
// are there, and Compose reads it by itself (the repository's .env is a link to it).
func TestComposeServicesEnvFormat(t *testing.T) {
	d := readServicesData(t)
	for _, k := range []string{"DEV_MYSQL_PORT", "DEV_POSTGRES_PORT", "DEV_KAFKA_PORT", "DEV_KAFKA_TOPICS",
		"DEV_KAFKA_TOPIC_PARTITIONS", "DEV_DATABASES", "DEV_NAMED_DATABASES", "DEV_ADMIN_USER", "DEV_APP_USER"} {
		if d.vals[k] == "" {
			t.Errorf("%s: %s missing or empty", servicesEnv, k)
		}
	}
	if target, err := os.Readlink(".env"); err != nil || filepath.Clean(target) != servicesEnv {
		t.Errorf(".env: want a link to %s (Compose reads .env from the project directory), got %q, %v", servicesEnv, target, err)
	}
	for _, bad := range []string{"DEV_X=a b", "DEV_X=$HOME", "DEV_X=\"it's\"", "dev_x=1", "DEV_X=1 # note", "DEV_X=`id`"} {
		if _, err := parseServicesEnv(bad); err == nil {
			t.Errorf("parseServicesEnv(%q) accepted a line bash and Compose could read apart", bad)
		}
	}
}

// TestComposeAndInfraAgree: with the data file, and with every value of it changed, infra.sh
// and docker-compose.yml make the same databases, users, grants, topics, ports and versions,
// and those of the data file.
func TestComposeAndInfraAgree(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Fatal("bash is needed to read scripts/infra.sh")
	}
	d := readServicesData(t)
	for name, data := range map[string]devData{"data file": d, "every value changed": d.perturbed()} {
		if problems := devAgreement(t, data, nil); len(problems) > 0 {
			t.Errorf("%s: infra.sh and docker-compose.yml disagree:\n  %s", name, strings.Join(problems, "\n  "))
		}
	}

	// Each of these makes the sides disagree, and the check says so.
	for _, c := range []struct {
		name    string
		data    devData
		file    string
		from    string
		to      string
		mention string
	}{
		{"compose creates 6 partitions", d, "docker-compose.yml",
			"--partitions ${DEV_KAFKA_TOPIC_PARTITIONS} --replication-factor 1", "--partitions 6 --replication-factor 1", "partitions"},
		{"compose copies the partitions", d.perturbed(), "docker-compose.yml",
			"--partitions ${DEV_KAFKA_TOPIC_PARTITIONS} --replication-factor 1", "--partitions " + d.vals["DEV_KAFKA_TOPIC_PARTITIONS"] + " --replication-factor 1", "partitions"},
		{"compose publishes a copied MySQL port", d.perturbed(), "docker-compose.yml",
			"127.0.0.1:${DEV_MYSQL_PORT}:3306", "127.0.0.1:" + d.vals["DEV_MYSQL_PORT"] + ":3306", "mysql port"},
		{"compose's MySQL init leaves a user out", d, "deploy/dev/initdb-mysql.sh",
			"dev_mysql_sql '%' |", "dev_mysql_sql '%' | grep -v \"$DEV_MONITOR_USER\" |", "mysql SQL"},
		{"compose's PostgreSQL init writes its own SQL", d, "deploy/dev/initdb-postgres.sh",
			"dev_pg_sql |", "echo \"CREATE ROLE $DEV_APP_USER LOGIN;\" |", "postgres SQL"},
		{"infra.sh copies the topics", d.perturbed(), "scripts/infra.sh",
			"${INFRA_TOPICS:-$DEV_KAFKA_TOPICS}", "${INFRA_TOPICS:-" + d.vals["DEV_KAFKA_TOPICS"] + "}", "topics"},
		{"infra-postgres.sh copies the port", d.perturbed(), "scripts/infra-postgres.sh",
			"${INFRA_PG_PORT:-$DEV_POSTGRES_PORT}", "${INFRA_PG_PORT:-" + d.vals["DEV_POSTGRES_PORT"] + "}", "postgres port"},
	} {
		problems := devAgreement(t, c.data, func(root string) {
			p := filepath.Join(root, c.file)
			raw, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(raw), c.from) {
				t.Fatalf("%s: %s no longer has %q", c.name, c.file, c.from)
			}
			if err := os.WriteFile(p, []byte(strings.Replace(string(raw), c.from, c.to, 1)), 0o644); err != nil {
				t.Fatal(err)
			}
		})
		if !slices.ContainsFunc(problems, func(p string) bool { return strings.Contains(p, c.mention) }) {
			t.Errorf("%s: the check found no disagreement about %s (found: %q)", c.name, c.mention, problems)
		}
	}
}

// devFacts is what one side sets up.
type devFacts struct {
	MySQLPort, PostgresPort, KafkaPort, KafkaControllerPort string
	ClusterPorts, ClusterControllerPorts                    []string
	KafkaVersion, PostgresVersion, KafkaHeap, ClusterHeap   string
	MySQLSQL, PostgresSQL                                   []string // statements, the MySQL ones with the host as HOST
	Topics, ClusterTopics                                   []string // "bootstrap=… topic=… partitions=… rf=… config=…"
}

// devAgreement writes the two sides' files and the data d into a scratch tree (mutate, when
// given, changes the tree before it is read), reads what each side sets up, and returns how
// they differ from each other and from d.
func devAgreement(t *testing.T, d devData, mutate func(root string)) []string {
	t.Helper()
	root := t.TempDir()
	for _, f := range devFiles {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(root, f), string(raw))
	}
	writeFile(t, filepath.Join(root, servicesEnv), d.String())
	if mutate != nil {
		mutate(root)
	}
	var problems []string
	infra, err := infraFacts(root)
	if err != nil {
		problems = append(problems, "infra.sh: "+err.Error())
	}
	compose, cproblems := composeFacts(root, d)
	problems = append(problems, cproblems...)
	problems = append(problems, compareFacts("infra.sh", "docker-compose.yml", infra, compose)...)
	problems = append(problems, expectFacts("infra.sh", infra, d)...)
	problems = append(problems, expectFacts("docker-compose.yml", compose, d)...)
	return problems
}

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// infraDriver sources scripts/infra.sh (which then defines its functions and runs nothing)
// and runs its provisioning with the clients stubbed: the SQL it would send and the topic
// commands it would run go to files in $OUT, its settings to $OUT/vars.
const infraDriver = `set -Eeuo pipefail
source "$ROOT/scripts/infra.sh" >/dev/null
db_root() { if [[ "$*" != *"SELECT CONCAT"* ]]; then printf '%s\n' "${@: -1}" >>"$OUT/mysql.sql"; fi; }
db_provision
pg_psql() { cat >>"$OUT/postgres.sql"; }
pg_provision
kafka_tool() { printf '%s\n' "$*" >>"$OUT/topics"; }
kafka_create_topics "" >/dev/null
kafka_tool() { printf '%s\n' "$*" >>"$OUT/cluster-topics"; }
cluster_create_topics >/dev/null
{
  echo "mysql_port=$DB_PORT"
  echo "postgres_port=$PG_PORT"
  echo "postgres_version=$PG_VERSION"
  echo "kafka_port=$KAFKA_PORT"
  echo "kafka_controller_port=$KAFKA_CONTROLLER_PORT"
  echo "kafka_version=$KAFKA_VERSION"
  echo "kafka_heap=$KAFKA_HEAP"
  echo "cluster_heap=$CLUSTER_HEAP_OPTS"
  for n in 1 2 3; do echo "cluster_port=$(cluster_port "$n")"; echo "cluster_controller_port=$(cluster_ctrl_port "$n")"; done
} >"$OUT/vars"
`

func infraFacts(root string) (devFacts, error) {
	var f devFacts
	out, err := os.MkdirTemp("", "infra-facts")
	if err != nil {
		return f, err
	}
	defer os.RemoveAll(out)
	cmd := exec.Command("bash", "-c", infraDriver)
	// Only what the driver needs: no INFRA_* or KAFKA_HEAP_OPTS of the caller.
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "ROOT=" + root, "OUT=" + out}
	if b, err := cmd.CombinedOutput(); err != nil {
		return f, fmt.Errorf("%v: %s", err, b)
	}
	vars, err := os.ReadFile(filepath.Join(out, "vars"))
	if err != nil {
		return f, err
	}
	for _, line := range strings.Split(strings.TrimSpace(string(vars)), "\n") {
		k, v, _ := strings.Cut(line, "=")
		switch k {
		case "mysql_port":
			f.MySQLPort = v
		case "postgres_port":
			f.PostgresPort = v
		case "postgres_version":
			f.PostgresVersion = v
		case "kafka_port":
			f.KafkaPort = v
		case "kafka_controller_port":
			f.KafkaControllerPort = v
		case "kafka_version":
			f.KafkaVersion = v
		case "kafka_heap":
			f.KafkaHeap = v
		case "cluster_heap":
			f.ClusterHeap = v
		case "cluster_port":
			f.ClusterPorts = append(f.ClusterPorts, v)
		case "cluster_controller_port":
			f.ClusterControllerPorts = append(f.ClusterControllerPorts, v)
		}
	}
	read := func(name string) string { b, _ := os.ReadFile(filepath.Join(out, name)); return string(b) }
	f.MySQLSQL = mysqlStatements(read("mysql.sql"))
	f.PostgresSQL = sqlLines(read("postgres.sql"))
	f.Topics = topicCommands(read("topics"))
	f.ClusterTopics = topicCommands(read("cluster-topics"))
	return f, nil
}

// composeService is what the checks read of a compose service.
type composeService struct {
	Image       string            `yaml:"image"`
	Profiles    []string          `yaml:"profiles"`
	Ports       []string          `yaml:"ports"`
	Volumes     []string          `yaml:"volumes"`
	Entrypoint  []string          `yaml:"entrypoint"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Healthcheck struct {
		Test []string `yaml:"test"`
	} `yaml:"healthcheck"`
}

// composeVar is a variable reference in a compose value: $$ (a literal $), ${NAME...} or $NAME.
var composeVar = regexp.MustCompile(`\$\$|\$\{([^}]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)`)

// interpolate fills in the compose values' variables from d, as Compose does with its .env;
// a variable d lacks, or a default or other modifier (a second place for a value), is a problem.
func interpolate(n *yaml.Node, d devData, problems *[]string) {
	if n.Kind == yaml.ScalarNode {
		n.Value = composeVar.ReplaceAllStringFunc(n.Value, func(m string) string {
			if m == "$$" {
				return "$"
			}
			sub := composeVar.FindStringSubmatch(m)
			name := sub[1] + sub[2]
			if v, ok := d.vals[name]; ok {
				return v
			}
			*problems = append(*problems, fmt.Sprintf("docker-compose.yml: %s (line %d) is not a variable of %s, or not plain ${NAME}", m, n.Line, servicesEnv))
			return m
		})
	}
	for _, c := range n.Content {
		interpolate(c, d, problems)
	}
}

func composeFacts(root string, d devData) (devFacts, []string) {
	var f devFacts
	var problems []string
	bad := func(format string, a ...any) {
		problems = append(problems, "docker-compose.yml: "+fmt.Sprintf(format, a...))
	}
	raw, err := os.ReadFile(filepath.Join(root, "docker-compose.yml"))
	if err != nil {
		return f, []string{err.Error()}
	}
	var node yaml.Node
	if err := yaml.Unmarshal(raw, &node); err != nil {
		return f, []string{"docker-compose.yml: " + err.Error()}
	}
	interpolate(&node, d, &problems)
	var doc struct {
		Services map[string]composeService `yaml:"services"`
	}
	if err := node.Decode(&doc); err != nil {
		return f, append(problems, "docker-compose.yml: "+err.Error())
	}
	svc := func(name string) composeService {
		s, ok := doc.Services[name]
		if !ok {
			bad("no service %s", name)
		}
		return s
	}
	// published returns the host port of "127.0.0.1:HOST:CONTAINER" when CONTAINER is want
	// ("" = the same as HOST).
	published := func(name, want string) string {
		s := svc(name)
		if len(s.Ports) != 1 {
			bad("%s publishes %d ports, want 1", name, len(s.Ports))
			return ""
		}
		p := strings.Split(s.Ports[0], ":")
		if len(p) != 3 || p[0] != "127.0.0.1" || (want != "" && p[2] != want) || (want == "" && p[2] != p[1]) {
			bad("%s publishes %q", name, s.Ports[0])
			return ""
		}
		return p[1]
	}
	tag := func(name, image string) string {
		repo, tag, _ := strings.Cut(svc(name).Image, ":")
		if repo != image {
			bad("%s runs %q, want %s", name, svc(name).Image, image)
		}
		return tag
	}

	f.MySQLPort = published("mysql", "3306")
	f.PostgresPort = published("postgres", "5432")
	f.PostgresVersion = tag("postgres", "postgres")

	kafka := svc("kafka")
	f.KafkaPort = published("kafka", "")
	f.KafkaVersion = tag("kafka", "apache/kafka")
	f.KafkaHeap = kafka.Environment["KAFKA_HEAP_OPTS"]
	if a := kafka.Environment["KAFKA_ADVERTISED_LISTENERS"]; a != "PLAINTEXT://127.0.0.1:"+f.KafkaPort {
		bad("kafka advertises %q, not the port it publishes (%s)", a, f.KafkaPort)
	}
	if l := kafka.Environment["KAFKA_LISTENERS"]; !strings.HasPrefix(l, "PLAINTEXT://0.0.0.0:"+f.KafkaPort+",CONTROLLER://127.0.0.1:") {
		bad("kafka listens on %q", l)
	} else {
		f.KafkaControllerPort = strings.TrimPrefix(l, "PLAINTEXT://0.0.0.0:"+f.KafkaPort+",CONTROLLER://127.0.0.1:")
	}
	if v := kafka.Environment["KAFKA_CONTROLLER_QUORUM_VOTERS"]; v != "1@127.0.0.1:"+f.KafkaControllerPort {
		bad("kafka's voters %q are not its controller listener", v)
	}
	if p := kafka.Environment["KAFKA_NUM_PARTITIONS"]; p != d.vals["DEV_KAFKA_TOPIC_PARTITIONS"] {
		bad("kafka's num.partitions %q, want DEV_KAFKA_TOPIC_PARTITIONS %q", p, d.vals["DEV_KAFKA_TOPIC_PARTITIONS"])
	}

	var voters []string
	for n := 1; n <= 3; n++ {
		name := fmt.Sprintf("kafka-%d", n)
		s := svc(name)
		if v := tag(name, "apache/kafka"); v != f.KafkaVersion {
			bad("%s runs Kafka %s, kafka %s", name, v, f.KafkaVersion)
		}
		adv := s.Environment["KAFKA_ADVERTISED_LISTENERS"]
		port := strings.TrimPrefix(adv, "PLAINTEXT://127.0.0.1:")
		l := s.Environment["KAFKA_LISTENERS"]
		ctrl, ok := strings.CutPrefix(l, "PLAINTEXT://127.0.0.1:"+port+",CONTROLLER://127.0.0.1:")
		if port == adv || !ok {
			bad("%s listens on %q and advertises %q", name, l, adv)
		}
		f.ClusterPorts = append(f.ClusterPorts, port)
		f.ClusterControllerPorts = append(f.ClusterControllerPorts, ctrl)
		voters = append(voters, fmt.Sprintf("%d@127.0.0.1:%s", n, ctrl))
		if p := s.Environment["KAFKA_NUM_PARTITIONS"]; p != d.vals["DEV_KAFKA_TOPIC_PARTITIONS"] {
			bad("%s's num.partitions %q, want DEV_KAFKA_TOPIC_PARTITIONS %q", name, p, d.vals["DEV_KAFKA_TOPIC_PARTITIONS"])
		}
		if n == 1 {
			f.ClusterHeap = s.Environment["KAFKA_HEAP_OPTS"]
		} else if h := s.Environment["KAFKA_HEAP_OPTS"]; h != f.ClusterHeap {
			bad("%s's heap %q, kafka-1's %q", name, h, f.ClusterHeap)
		}
	}
	for n := 1; n <= 3; n++ {
		if v := svc(fmt.Sprintf("kafka-%d", n)).Environment["KAFKA_CONTROLLER_QUORUM_VOTERS"]; v != strings.Join(voters, ",") {
			bad("kafka-%d's voters %q, want the three controllers %q", n, v, strings.Join(voters, ","))
		}
	}

	var err2 error
	if f.Topics, err2 = composeTopics(svc("kafka-topics")); err2 != nil {
		bad("kafka-topics: %v", err2)
	}
	if f.ClusterTopics, err2 = composeTopics(svc("kafka-cluster-topics")); err2 != nil {
		bad("kafka-cluster-topics: %v", err2)
	}
	mysql, err2 := composeInit(root, svc("mysql"), "mysql")
	if err2 != nil {
		bad("mysql's init: %v", err2)
	}
	f.MySQLSQL = mysqlStatements(mysql)
	pg, err2 := composeInit(root, svc("postgres"), "psql")
	if err2 != nil {
		bad("postgres's init: %v", err2)
	}
	f.PostgresSQL = sqlLines(pg)

	// The health checks use the data file's users.
	if h := strings.Join(svc("mysql").Healthcheck.Test, " "); !strings.Contains(h, "-u"+d.vals["DEV_APP_USER"]+" -p"+d.vals["DEV_APP_PASSWORD"]+" ") {
		bad("mysql's health check %q does not connect as DEV_APP_USER", h)
	}
	return f, problems
}

// composeTopics runs a topic service's script (entrypoint bash -ec) with kafka-topics.sh
// replaced by a stub that prints its arguments.
func composeTopics(s composeService) ([]string, error) {
	if !slices.Equal(s.Entrypoint, []string{"/bin/bash", "-ec"}) || len(s.Command) != 1 {
		return nil, fmt.Errorf("entrypoint %q, command %q: want bash -ec and one script", s.Entrypoint, s.Command)
	}
	const tool = "/opt/kafka/bin/kafka-topics.sh"
	if !strings.Contains(s.Command[0], tool) {
		return nil, fmt.Errorf("the script does not run %s", tool)
	}
	script := "kafka_topics_stub() { printf '%s\\n' \"$*\"; }\n" + strings.ReplaceAll(s.Command[0], tool, "kafka_topics_stub")
	cmd := exec.Command("bash", "-ec", script)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("running its script: %v", err)
	}
	return topicCommands(string(out)), nil
}

// composeInit runs the init script a database service mounts in /docker-entrypoint-initdb.d,
// with the directory it mounts for it mapped to the scratch tree's, and client (mysql or
// psql) a stub that prints the SQL it is given.
func composeInit(root string, s composeService, client string) (string, error) {
	var script, dir, dirTarget string
	for _, v := range s.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) < 2 || !strings.HasPrefix(parts[0], "./") {
			continue
		}
		if strings.HasPrefix(parts[1], "/docker-entrypoint-initdb.d/") {
			script = parts[0]
		} else {
			dir, dirTarget = parts[0], parts[1]
		}
	}
	if script == "" || dir == "" {
		return "", fmt.Errorf("volumes %q: want an init script in /docker-entrypoint-initdb.d and the directory it reads", s.Volumes)
	}
	raw, err := os.ReadFile(filepath.Join(root, script))
	if err != nil {
		return "", err
	}
	stubs := filepath.Join(root, "stubs-"+client)
	out := filepath.Join(root, client+".out")
	if err := os.MkdirAll(stubs, 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(stubs, client), []byte("#!/bin/sh\ncat >>\""+out+"\"\n"), 0o755); err != nil {
		return "", err
	}
	local := strings.ReplaceAll(string(raw), dirTarget+"/", filepath.Join(root, dir)+"/")
	cmd := exec.Command("bash", "-ec", local)
	cmd.Env = []string{"PATH=" + stubs + ":" + os.Getenv("PATH")}
	for k, v := range s.Environment {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("%v: %s", err, b)
	}
	b, err := os.ReadFile(out)
	return string(b), err
}

func sqlLines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

var sqlHost = regexp.MustCompile(`'@'(127\.0\.0\.1|localhost|%)'`)

// mysqlStatements: the distinct statements, each user's host written HOST (infra.sh makes the
// users for 127.0.0.1 and localhost, compose for %), sorted.
func mysqlStatements(s string) []string {
	var out []string
	for _, l := range sqlLines(s) {
		out = append(out, sqlHost.ReplaceAllString(l, "'@'HOST'"))
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// topicCommands turns kafka-topics --create command lines into
// "bootstrap=… topic=… partitions=… rf=… config=…", sorted; other lines (--list) are left out.
func topicCommands(s string) []string {
	var out []string
	for _, l := range sqlLines(s) {
		args := strings.Fields(l)
		if !slices.Contains(args, "--create") {
			continue
		}
		get := func(flag string) string {
			if i := slices.Index(args, flag); i >= 0 && i+1 < len(args) {
				return strings.Trim(args[i+1], `"`)
			}
			return ""
		}
		out = append(out, fmt.Sprintf("bootstrap=%s topic=%s partitions=%s rf=%s config=%s",
			get("--bootstrap-server"), get("--topic"), get("--partitions"), get("--replication-factor"), get("--config")))
	}
	slices.Sort(out)
	return out
}

// compareFacts: what a and b set up differently.
func compareFacts(aName, bName string, a, b devFacts) []string {
	var d []string
	diff := func(what string, x, y any) {
		if fmt.Sprint(x) != fmt.Sprint(y) {
			d = append(d, fmt.Sprintf("%s: %s %v, %s %v", what, aName, x, bName, y))
		}
	}
	diff("mysql port", a.MySQLPort, b.MySQLPort)
	diff("postgres port", a.PostgresPort, b.PostgresPort)
	diff("postgres version", a.PostgresVersion, b.PostgresVersion)
	diff("kafka port", a.KafkaPort, b.KafkaPort)
	diff("kafka controller port", a.KafkaControllerPort, b.KafkaControllerPort)
	diff("kafka version", a.KafkaVersion, b.KafkaVersion)
	diff("kafka heap", a.KafkaHeap, b.KafkaHeap)
	diff("cluster ports", a.ClusterPorts, b.ClusterPorts)
	diff("cluster controller ports", a.ClusterControllerPorts, b.ClusterControllerPorts)
	diff("cluster heap", a.ClusterHeap, b.ClusterHeap)
	lines := func(what string, x, y []string) {
		for _, l := range x {
			if !slices.Contains(y, l) {
				d = append(d, fmt.Sprintf("%s: only %s: %s", what, aName, l))
			}
		}
		for _, l := range y {
			if !slices.Contains(x, l) {
				d = append(d, fmt.Sprintf("%s: only %s: %s", what, bName, l))
			}
		}
	}
	lines("mysql SQL", a.MySQLSQL, b.MySQLSQL)
	lines("postgres SQL", a.PostgresSQL, b.PostgresSQL)
	lines("topics", a.Topics, b.Topics)
	lines("cluster topics", a.ClusterTopics, b.ClusterTopics)
	return d
}

// expectFacts: where what side sets up is not what d says.
func expectFacts(side string, f devFacts, d devData) []string {
	var p []string
	want := func(what, got, key string) {
		if got != d.vals[key] {
			p = append(p, fmt.Sprintf("%s: %s %q, want %s %q", side, what, got, key, d.vals[key]))
		}
	}
	want("mysql port", f.MySQLPort, "DEV_MYSQL_PORT")
	want("postgres port", f.PostgresPort, "DEV_POSTGRES_PORT")
	want("postgres version", f.PostgresVersion, "DEV_POSTGRES_VERSION")
	want("kafka port", f.KafkaPort, "DEV_KAFKA_PORT")
	want("kafka controller port", f.KafkaControllerPort, "DEV_KAFKA_CONTROLLER_PORT")
	want("kafka version", f.KafkaVersion, "DEV_KAFKA_VERSION")
	want("kafka heap", f.KafkaHeap, "DEV_KAFKA_HEAP_OPTS")
	want("cluster heap", f.ClusterHeap, "DEV_CLUSTER_HEAP_OPTS")
	var bootstrap []string
	for n := 1; n <= 3; n++ {
		port, ctrl := "", ""
		if len(f.ClusterPorts) == 3 && len(f.ClusterControllerPorts) == 3 {
			port, ctrl = f.ClusterPorts[n-1], f.ClusterControllerPorts[n-1]
		}
		want(fmt.Sprintf("cluster node %d port", n), port, fmt.Sprintf("DEV_CLUSTER_PORT_%d", n))
		want(fmt.Sprintf("cluster node %d controller port", n), ctrl, fmt.Sprintf("DEV_CLUSTER_CONTROLLER_PORT_%d", n))
		bootstrap = append(bootstrap, "127.0.0.1:"+d.vals[fmt.Sprintf("DEV_CLUSTER_PORT_%d", n)])
	}

	topics := func(what string, got []string, bootstrap, rf, config string) {
		var w []string
		for _, t := range d.words("DEV_KAFKA_TOPICS") {
			w = append(w, fmt.Sprintf("bootstrap=%s topic=%s partitions=%s rf=%s config=%s", bootstrap, t, d.vals["DEV_KAFKA_TOPIC_PARTITIONS"], rf, config))
		}
		slices.Sort(w)
		if !slices.Equal(got, w) {
			p = append(p, fmt.Sprintf("%s: %s %q, want (DEV_KAFKA_TOPICS, DEV_KAFKA_TOPIC_PARTITIONS) %q", side, what, got, w))
		}
	}
	topics("topics", f.Topics, "127.0.0.1:"+d.vals["DEV_KAFKA_PORT"], "1", "")
	topics("cluster topics", f.ClusterTopics, strings.Join(bootstrap, ","), "3", "min.insync.replicas=2")

	has := func(what string, stmts []string, prefix string) {
		if !slices.ContainsFunc(stmts, func(s string) bool { return strings.HasPrefix(s, prefix) }) {
			p = append(p, fmt.Sprintf("%s: %s: no %s…", side, what, prefix))
		}
	}
	for _, u := range []string{"ADMIN", "APP", "TLS", "MONITOR"} {
		has("mysql SQL", f.MySQLSQL, fmt.Sprintf("CREATE USER IF NOT EXISTS '%s'@'HOST' IDENTIFIED BY '%s'", d.vals["DEV_"+u+"_USER"], d.vals["DEV_"+u+"_PASSWORD"]))
	}
	for _, db := range d.words("DEV_DATABASES") {
		has("mysql SQL", f.MySQLSQL, "CREATE DATABASE IF NOT EXISTS `"+db+"`")
	}
	admin := d.vals["DEV_ADMIN_USER"]
	for _, db := range append(d.words("DEV_NAMED_DATABASES"), d.vals["DEV_GRANTS_TEST_DATABASES"]) {
		has("mysql SQL", f.MySQLSQL, fmt.Sprintf("GRANT %s ON `%s`.* TO '%s'@'HOST' WITH GRANT OPTION", d.vals["DEV_ADMIN_PRIVILEGES"], strings.ReplaceAll(db, "_", `\_`), admin))
	}
	testDBs := strings.ReplaceAll(d.vals["DEV_TEST_DATABASES"], "_", `\_`)
	has("mysql SQL", f.MySQLSQL, fmt.Sprintf("GRANT %s, %s ON `%s`.* TO '%s'@'HOST' WITH GRANT OPTION", d.vals["DEV_ADMIN_PRIVILEGES"], d.vals["DEV_ADMIN_TEST_PRIVILEGES"], testDBs, admin))
	for _, u := range []string{"APP", "TLS"} {
		has("mysql SQL", f.MySQLSQL, fmt.Sprintf("GRANT %s ON `%s`.* TO '%s'@'HOST';", d.vals["DEV_APP_TEST_PRIVILEGES"], testDBs, d.vals["DEV_"+u+"_USER"]))
	}
	has("mysql SQL", f.MySQLSQL, fmt.Sprintf("GRANT %s ON *.* TO '%s'@'HOST';", d.vals["DEV_MONITOR_PRIVILEGES"], d.vals["DEV_MONITOR_USER"]))

	has("postgres SQL", f.PostgresSQL, fmt.Sprintf("ALTER ROLE %s %s PASSWORD '%s';", admin, d.vals["DEV_PG_ADMIN_ATTRIBUTES"], d.vals["DEV_ADMIN_PASSWORD"]))
	has("postgres SQL", f.PostgresSQL, fmt.Sprintf("ALTER ROLE %s %s PASSWORD '%s';", d.vals["DEV_APP_USER"], d.vals["DEV_PG_APP_ATTRIBUTES"], d.vals["DEV_APP_PASSWORD"]))
	has("postgres SQL", f.PostgresSQL, fmt.Sprintf("GRANT %s TO %s;", strings.Join(d.words("DEV_PG_ADMIN_ROLES"), ", "), admin))
	for _, db := range d.words("DEV_NAMED_DATABASES") {
		has("postgres SQL", f.PostgresSQL, fmt.Sprintf("SELECT 'CREATE DATABASE %s OWNER %s'", db, admin))
	}
	return p
}

// TestInfraScriptsReadServicesEnv: the scripts name no value of the data file outside their
// comments (a copy would stay behind when the file changes), and every value of the data file
// is read by one side or the other.
func TestInfraScriptsReadServicesEnv(t *testing.T) {
	d := readServicesData(t)
	scripts := []string{"scripts/infra.sh", "scripts/infra-postgres.sh", "scripts/infra-cluster.sh", "scripts/infra-galera.sh",
		"deploy/dev/sql.sh", "deploy/dev/initdb-mysql.sh", "deploy/dev/initdb-postgres.sh"}
	var all strings.Builder
	for _, f := range scripts {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		all.Write(raw)
		for _, c := range literalCopies(string(raw), d) {
			t.Errorf("%s: %s", f, c)
		}
	}
	compose, err := os.ReadFile("docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	all.Write(compose)
	for _, k := range d.keys {
		if !regexp.MustCompile(`\$\{?` + k + `\b`).MatchString(all.String()) {
			t.Errorf("%s: %s is read by neither the scripts nor docker-compose.yml", servicesEnv, k)
		}
	}

	// The check finds a copied value.
	copied := "db_status() {\n  mariadb -u" + d.vals["DEV_APP_USER"] + " -p" + d.vals["DEV_APP_PASSWORD"] + " -P" + d.vals["DEV_MYSQL_PORT"] +
		" # " + d.vals["DEV_ADMIN_USER"] + " in a comment is fine\n  create " + d.words("DEV_KAFKA_TOPICS")[0] + "\n}\n"
	c := strings.Join(literalCopies(copied, d), "\n")
	for _, k := range []string{"DEV_APP_USER", "DEV_APP_PASSWORD", "DEV_MYSQL_PORT", "DEV_KAFKA_TOPICS"} {
		if !strings.Contains(c, " of "+k+" ") {
			t.Errorf("literalCopies missed the copy of %s in\n%s\nfound:\n%s", k, copied, c)
		}
	}
	if strings.Contains(c, " of DEV_ADMIN_USER ") {
		t.Errorf("literalCopies took a comment for code:\n%s", c)
	}
}

// literalCopies lists the values of d that the code of a script (its comments left out)
// names: the words of a value that are not common words (with a _ - . % in them, or numbers
// of four digits or more), and the users and passwords as a client's -u/-p or quoted.
func literalCopies(script string, d devData) []string {
	comment := regexp.MustCompile(`(^|\s)#.*$`)
	var code []string
	for _, l := range strings.Split(script, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "# shellcheck") {
			continue
		}
		code = append(code, comment.ReplaceAllString(l, ""))
	}
	text := strings.Join(code, "\n")
	number := regexp.MustCompile(`^[0-9]{4,}$`)
	distinctive := regexp.MustCompile(`[_.%-]`)
	var found []string
	seen := map[string]bool{}
	for _, k := range d.keys {
		var res []string
		for _, w := range strings.FieldsFunc(d.vals[k], func(r rune) bool { return r == ' ' || r == ',' }) {
			w = strings.TrimSuffix(w, "%")
			switch {
			case number.MatchString(w):
				res = append(res, `(^|[^0-9])`+w+`($|[^0-9])`)
			case distinctive.MatchString(w):
				res = append(res, `(^|[^A-Za-z0-9_.-])`+regexp.QuoteMeta(w)+`($|[^A-Za-z0-9_.-])`)
			}
		}
		v := regexp.QuoteMeta(d.vals[k])
		if strings.HasSuffix(k, "_USER") {
			res = append(res, `-u`+v+`\b`, `'`+v+`'`, `user `+v+`\b`)
		}
		if strings.HasSuffix(k, "_PASSWORD") {
			res = append(res, `-p`+v+`\b`, `'`+v+`'`)
		}
		for _, re := range res {
			if m := regexp.MustCompile(re).FindString(text); m != "" && !seen[k+m] {
				seen[k+m] = true
				found = append(found, fmt.Sprintf("%q is a copy of %s (%s): read the variable", strings.TrimSpace(m), k, d.vals[k]))
			}
		}
	}
	return found
}

// TestComposeServerSettingsMatchInfra: the settings docker-compose.yml gives its MySQL,
// PostgreSQL and Kafka servers are those scripts/infra.sh gives MariaDB (db_settings),
// PostgreSQL (pg_init) and the one broker (server.properties), apart from those that only
// make sense in a container.
func TestComposeServerSettingsMatchInfra(t *testing.T) {
	services := composeServices(t)

	// MariaDB: every setting of db_settings but the TLS files (compose has no TLS of its own).
	settings := exec.Command("bash", "-c", `set -e; source scripts/infra.sh >/dev/null; DB_TLS_DIR=/tls; db_settings`)
	settings.Env = []string{"PATH=" + os.Getenv("PATH")}
	out, err := settings.Output()
	if err != nil {
		t.Fatal(err)
	}
	mariadb := map[string]string{}
	for _, l := range sqlLines(string(out)) {
		if strings.HasPrefix(l, "#") {
			continue
		}
		k, v, _ := strings.Cut(l, "=")
		k = strings.ReplaceAll(strings.TrimSpace(k), "-", "_")
		if !strings.HasPrefix(k, "ssl_") {
			mariadb[k] = strings.TrimSpace(v)
		}
	}
	if len(mariadb) < 6 {
		t.Fatalf("read %d settings from db_settings: %v", len(mariadb), mariadb)
	}
	mysqlFlags := func(command []string) map[string]string {
		got := map[string]string{}
		for _, c := range command {
			k, v, _ := strings.Cut(strings.TrimPrefix(c, "--"), "=")
			k = strings.ReplaceAll(k, "-", "_")
			if k != "bind_address" && k != "default_authentication_plugin" { // the container's own
				got[k] = v
			}
		}
		return got
	}
	if d := settingsDiff(mariadb, mysqlFlags(services["mysql"].Command)); len(d) > 0 || len(mysqlFlags(services["mysql"].Command)) != len(mariadb) {
		t.Errorf("compose's mysql flags %q differ from db_settings %v: %v", services["mysql"].Command, mariadb, d)
	}

	// PostgreSQL: every -c of compose is set so in pg_init's postgresql.conf.
	raw, err := os.ReadFile("scripts/infra-postgres.sh")
	if err != nil {
		t.Fatal(err)
	}
	conf := regexp.MustCompile(`(?m)^([a-z_]+) = '?([^'\n]*)'?$`).FindAllStringSubmatch(string(raw), -1)
	pg := map[string]string{}
	for _, m := range conf {
		pg[m[1]] = m[2]
	}
	pgFlags := map[string]string{}
	cmd := services["postgres"].Command
	for i := 1; i+1 < len(cmd); i += 2 {
		if cmd[i] != "-c" {
			t.Fatalf("compose's postgres command %q: want postgres -c k=v ...", cmd)
		}
		k, v, _ := strings.Cut(cmd[i+1], "=")
		pgFlags[k] = v
	}
	if len(pgFlags) < 2 {
		t.Fatalf("compose's postgres command %q sets %d settings", cmd, len(pgFlags))
	}
	if d := settingsDiff(pgFlags, pg); len(d) > 0 {
		t.Errorf("compose's postgres settings differ from scripts/infra-postgres.sh's: %v", d)
	}

	// The one broker: replication, ISR, group and topic creation settings.
	want := infraBrokerSettings(t, "scripts/infra.sh")
	if len(want) < 9 {
		t.Fatalf("read %d settings from scripts/infra.sh: %v", len(want), want)
	}
	if d := settingsDiff(want, services["kafka"].Environment); len(d) > 0 {
		t.Errorf("compose's kafka differs from scripts/infra.sh: %s", strings.Join(d, "; "))
	}

	// The comparisons catch a drifted setting.
	drifted := mysqlFlags(append(slices.Clone(services["mysql"].Command), "--max-connections=100"))
	pgDrifted := map[string]string{"max_connections": "100"}
	brokerDrifted := map[string]string{}
	for k, v := range services["kafka"].Environment {
		brokerDrifted[k] = v
	}
	brokerDrifted["KAFKA_MIN_INSYNC_REPLICAS"] = "2"
	if len(settingsDiff(mariadb, drifted)) != 1 || len(settingsDiff(pgDrifted, pg)) != 1 || len(settingsDiff(want, brokerDrifted)) != 1 {
		t.Errorf("a drifted setting went unnoticed")
	}
}

func composeServices(t *testing.T) map[string]composeService {
	t.Helper()
	raw, err := os.ReadFile("docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Services map[string]composeService `yaml:"services"`
	}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	return doc.Services
}

// TestComposeClusterMatchesInfraCluster: docker-compose.yml's three-broker profile (not run
// here: the project's machine has no Docker) sets the replication, ISR and group settings
// scripts/infra-cluster.sh gives the cluster every cluster test and `make soak` run on, on
// three nodes with distinct ports, and creates the topics with replication factor 3 and
// min.insync.replicas 2.
func TestComposeClusterMatchesInfraCluster(t *testing.T) {
	want := infraBrokerSettings(t, "scripts/infra-cluster.sh")
	if len(want) < 10 {
		t.Fatalf("read %d settings from scripts/infra-cluster.sh: %v", len(want), want)
	}
	services := composeServices(t)
	ports := map[string]string{}
	for _, name := range []string{"kafka-1", "kafka-2", "kafka-3"} {
		svc, ok := services[name]
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
	topics := strings.Join(services["kafka-cluster-topics"].Command, "\n")
	if !strings.Contains(topics, "--replication-factor 3") || !strings.Contains(topics, "min.insync.replicas=2") {
		t.Errorf("kafka-cluster-topics does not create RF 3, min.insync.replicas 2 topics:\n%s", topics)
	}

	// The comparison catches a node that drifts.
	drifted := map[string]string{}
	for k, v := range services["kafka-2"].Environment {
		drifted[k] = v
	}
	drifted["KAFKA_MIN_INSYNC_REPLICAS"] = "1"
	delete(drifted, "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR")
	if d := settingsDiff(want, drifted); len(d) != 2 {
		t.Errorf("a drifted node gave %d differences, want 2: %v", len(d), d)
	}
}

// infraBrokerSettings reads the broker settings of a script's server.properties that a
// deployment must share (replication, ISR, group and topic creation: from
// default.replication.factor to auto.create.topics.enable), as compose environment names.
func infraBrokerSettings(t *testing.T, script string) map[string]string {
	f, err := os.Open(script)
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
