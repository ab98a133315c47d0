package testenv

import (
	"bufio"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"

	"github.com/onceflow/onceflow/pkg/kafkax"
)

const howToGetJars = "the Kafka jars come from `bash scripts/infra.sh up` (they are fetched into .run/kafka/libs, or $INFRA_RUN_DIR/kafka/libs)"

// PrivateKafka is a single-node KRaft Kafka broker that belongs to one test. The broker and
// the controller run in one JVM. It runs as a child process of the test binary, from the
// jars that scripts/infra.sh fetched, on free ports, with its data in the test's temp dir.
// Unlike the shared broker, it may be stopped and started again with the same ports and
// data. So a test can take the broker away from the code under test without disturbing
// anyone else. It is killed when the test ends.
type PrivateKafka struct {
	t       testing.TB
	dir     string
	libs    string
	props   string
	port    int
	ctrl    int
	startup time.Duration
	// In a cluster of StartPrivateCluster, these are this node's id, the quorum's voters
	// and the cluster's replication settings. A single broker has id 1 and is its own
	// quorum.
	id       int
	voters   string
	replicas int

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
	runs int
}

// StartPrivateKafka formats a fresh KRaft data dir and starts the broker. It returns once
// the broker answers metadata requests. It fails the test when java or the jars are
// missing, and skips it under -short.
func StartPrivateKafka(t testing.TB) *PrivateKafka {
	t.Helper()
	Integration(t)
	libs, err := kafkaLibs()
	if err != nil {
		t.Fatalf("testenv: private Kafka: %v; %s", err, howToGetJars)
	}
	if _, err := exec.LookPath("java"); err != nil {
		t.Fatalf("testenv: private Kafka needs java (17+) on PATH: %v; %s", err, howToGetJars)
	}
	ports, err := freePorts(2)
	if err != nil {
		t.Fatalf("testenv: private Kafka: %v", err)
	}
	k := &PrivateKafka{t: t, dir: t.TempDir(), libs: libs, port: ports[0], ctrl: ports[1], startup: 120 * time.Second,
		id: 1, voters: fmt.Sprintf("1@127.0.0.1:%d", ports[1]), replicas: 1}
	t.Cleanup(k.Kill) // registered after TempDir: runs before the dir is removed
	if err := k.writeConfig(); err != nil {
		t.Fatalf("testenv: private Kafka: %v", err)
	}
	if err := k.format(newClusterID()); err != nil {
		t.Fatalf("testenv: private Kafka: %v", err)
	}
	k.Start()
	return k
}

// Brokers is the broker's bootstrap address.
func (k *PrivateKafka) Brokers() []string { return []string{k.Addr()} }

// Addr is the broker's address.
func (k *PrivateKafka) Addr() string { return fmt.Sprintf("127.0.0.1:%d", k.port) }

// ID is the broker's node id. It is 1 for a single broker, and 1..n in a cluster.
func (k *PrivateKafka) ID() int32 { return int32(k.id) }

// Config is a client config for this broker, as Kafka returns one for the shared broker.
func (k *PrivateKafka) Config() kafkax.Config {
	c := kafkax.Config{Brokers: k.Brokers(), ClientID: "onceflow-test", SessionTimeout: 6 * time.Second,
		RebalanceTimeout: 10 * time.Second, HeartbeatEvery: time.Second, MaxPollWait: 50 * time.Millisecond}
	c = c.WithDefaults()
	return c
}

// Dir is the broker's directory. It holds server.properties, data/, server.log and
// stdout.log.
func (k *PrivateKafka) Dir() string { return k.dir }

// Running reports whether the broker process is alive.
func (k *PrivateKafka) Running() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.aliveLocked()
}

func (k *PrivateKafka) aliveLocked() bool {
	if k.cmd == nil {
		return false
	}
	select {
	case <-k.done:
		return false
	default:
		return true
	}
}

// Start starts the broker again, with the same ports and data dir, and waits until it
// answers metadata requests. It fails the test if the broker does not come up.
func (k *PrivateKafka) Start() {
	k.t.Helper()
	k.launch()
	k.waitReady()
}

// launch starts the broker process.
func (k *PrivateKafka) launch() {
	k.t.Helper()
	k.mu.Lock()
	if k.aliveLocked() {
		k.mu.Unlock()
		k.t.Fatalf("testenv: private Kafka on :%d is already running", k.port)
	}
	k.runs++
	out, err := os.OpenFile(filepath.Join(k.dir, "stdout.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		k.mu.Unlock()
		k.t.Fatalf("testenv: private Kafka: %v", err)
	}
	fmt.Fprintf(out, "---- start #%d at %s\n", k.runs, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command("java", "-Xms128m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true",
		"-Dkafka.logs.dir="+k.dir, "-Dlog4j2.configurationFile="+filepath.Join(k.dir, "log4j2.xml"),
		"-cp", filepath.Join(k.libs, "*"), "kafka.Kafka", k.props)
	cmd.Dir = k.dir
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		out.Close()
		k.mu.Unlock()
		k.t.Fatalf("testenv: start private Kafka: %v", err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		out.Close()
		close(done)
	}()
	k.cmd, k.done = cmd, done
	k.mu.Unlock()
}

// waitReady waits until the broker answers metadata requests with itself in the cluster.
func (k *PrivateKafka) waitReady() {
	k.t.Helper()
	k.mu.Lock()
	done := k.done
	k.mu.Unlock()
	deadline := time.Now().Add(k.startup)
	for {
		err := k.ping()
		if err == nil {
			return
		}
		select {
		case <-done:
			k.t.Fatalf("testenv: private Kafka exited during start-up (%s):\n%s", k.dir, k.logTail(30))
		default:
		}
		if time.Now().After(deadline) {
			k.Kill()
			k.t.Fatalf("testenv: private Kafka on :%d not ready after %s: %v\n%s", k.port, k.startup, err, k.logTail(30))
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// ping asks the broker for the cluster metadata. Once the metadata lists the broker, the
// node has registered with its controller and serves requests.
func (k *PrivateKafka) ping() error {
	sc := sarama.NewConfig()
	sc.Version = kafkax.Version
	sc.Net.DialTimeout = time.Second
	sc.Net.ReadTimeout = 3 * time.Second
	sc.Metadata.Retry.Max = 0
	admin, err := sarama.NewClusterAdmin(k.Brokers(), sc)
	if err != nil {
		return err
	}
	defer admin.Close()
	brokers, _, err := admin.DescribeCluster()
	if err != nil {
		return err
	}
	for _, b := range brokers {
		if b.ID() == int32(k.id) {
			return nil
		}
	}
	return fmt.Errorf("node %d not among the %d brokers of the cluster metadata", k.id, len(brokers))
}

// Stop stops the broker as an operator would. It sends SIGTERM for a controlled shutdown,
// and SIGKILL if the broker is still running 30s later. It returns once the process has
// exited.
func (k *PrivateKafka) Stop() { k.stop(syscall.SIGTERM, 30*time.Second) }

// Kill sends the broker SIGKILL, as a crash, and waits for the process to exit. It does
// nothing when the broker is not running.
func (k *PrivateKafka) Kill() { k.stop(syscall.SIGKILL, 0) }

func (k *PrivateKafka) stop(sig syscall.Signal, grace time.Duration) {
	k.mu.Lock()
	cmd, done := k.cmd, k.done
	alive := k.aliveLocked()
	k.mu.Unlock()
	if !alive {
		return
	}
	_ = cmd.Process.Signal(sig)
	if grace > 0 {
		select {
		case <-done:
			return
		case <-time.After(grace):
			k.t.Logf("testenv: private Kafka pid %d still running %s after %s; SIGKILL", cmd.Process.Pid, grace, sig)
			_ = cmd.Process.Signal(syscall.SIGKILL)
		}
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		k.t.Errorf("testenv: private Kafka pid %d did not exit after SIGKILL", cmd.Process.Pid)
	}
}

func (k *PrivateKafka) writeConfig() error {
	data := filepath.Join(k.dir, "data")
	if err := os.MkdirAll(data, 0o755); err != nil {
		return err
	}
	k.props = filepath.Join(k.dir, "server.properties")
	isr := max(1, k.replicas-1) // 1 of 1, 2 of 3
	props := fmt.Sprintf(`# private test broker (onceflow internal/testenv)
process.roles=broker,controller
node.id=%[4]d
listeners=PLAINTEXT://127.0.0.1:%[1]d,CONTROLLER://127.0.0.1:%[2]d
advertised.listeners=PLAINTEXT://127.0.0.1:%[1]d
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
controller.quorum.voters=%[5]s
log.dirs=%[3]s
num.partitions=1
default.replication.factor=%[6]d
min.insync.replicas=%[7]d
offsets.topic.replication.factor=%[6]d
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=%[6]d
transaction.state.log.min.isr=%[7]d
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=%[6]d
share.coordinator.state.topic.min.isr=%[7]d
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
num.network.threads=2
num.io.threads=2
log.segment.bytes=104857600
`, k.port, k.ctrl, data, k.id, k.voters, k.replicas, isr)
	if err := os.WriteFile(k.props, []byte(props), 0o644); err != nil {
		return err
	}
	log4j := fmt.Sprintf(`<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="WARN">
  <Appenders>
    <File name="server" fileName="%s"><PatternLayout pattern="[%%d] %%p %%m (%%c)%%n"/></File>
  </Appenders>
  <Loggers>
    <Logger name="kafka.request.logger" level="WARN"/>
    <Logger name="state.change.logger" level="WARN"/>
    <Root level="INFO"><AppenderRef ref="server"/></Root>
  </Loggers>
</Configuration>
`, filepath.Join(k.dir, "server.log"))
	return os.WriteFile(filepath.Join(k.dir, "log4j2.xml"), []byte(log4j), 0o644)
}

// newClusterID is a random KRaft cluster id in the string form of Kafka's Uuid.
func newClusterID() string {
	var cid string
	for cid == "" || cid[0] == '-' { // a leading '-' would read as an option
		id := make([]byte, 16)
		_, _ = rand.Read(id)
		cid = base64.RawURLEncoding.EncodeToString(id)
	}
	return cid
}

// format writes the KRaft meta.properties of the node of cluster cid, as kafka-storage
// format does for scripts/infra.sh.
func (k *PrivateKafka) format(cid string) error {
	cmd := exec.Command("java", "-Xmx256m", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true",
		"-Dlog4j2.configurationFile="+filepath.Join(k.dir, "log4j2.xml"),
		"-cp", filepath.Join(k.libs, "*"), "kafka.tools.StorageTool", "format", "-t", cid, "-c", k.props)
	cmd.Dir = k.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("kafka-storage format: %v\n%s", err, out)
	}
	return nil
}

// logTail returns the last n lines of the broker's server log and stdout.
func (k *PrivateKafka) logTail(n int) string {
	var b strings.Builder
	for _, name := range []string{"server.log", "stdout.log"} {
		f, err := os.Open(filepath.Join(k.dir, name))
		if err != nil {
			continue
		}
		var lines []string
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			lines = append(lines, sc.Text())
			if len(lines) > n {
				lines = lines[1:]
			}
		}
		f.Close()
		fmt.Fprintf(&b, "== %s ==\n%s\n", name, strings.Join(lines, "\n"))
	}
	return b.String()
}

// kafkaLibs finds the Kafka jars in $INFRA_RUN_DIR/kafka/libs, else in .run/kafka/libs
// under the repository root. It finds the root from the working directory upwards.
func kafkaLibs() (string, error) {
	var candidates []string
	if d := os.Getenv("INFRA_RUN_DIR"); d != "" {
		candidates = append(candidates, filepath.Join(d, "kafka", "libs"))
	}
	if root, err := repoRoot(); err == nil {
		candidates = append(candidates, filepath.Join(root, ".run", "kafka", "libs"))
	}
	for _, c := range candidates {
		if jars, _ := filepath.Glob(filepath.Join(c, "kafka_2.13-*.jar")); len(jars) > 0 {
			return c, nil
		}
	}
	if len(candidates) == 0 {
		return "", errors.New("repository root not found (no go.mod of github.com/onceflow/onceflow above the working directory)")
	}
	return "", fmt.Errorf("no kafka_2.13-*.jar in %s", strings.Join(candidates, " or "))
}

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.Contains(string(b), "module github.com/onceflow/onceflow\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("repository root not found")
		}
		dir = parent
	}
}

// freePorts returns n distinct TCP ports that were free on 127.0.0.1 a moment ago.
func freePorts(n int) ([]int, error) {
	var (
		ports []int
		ls    []net.Listener
	)
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// PrivateCluster is a KRaft cluster of Nodes that belongs to one test, as PrivateKafka does.
// Each node is a broker and a controller. All of them form a static quorum, which a
// majority keeps. The nodes are child processes of the test binary on free ports, with
// their data in the test's temp dir, and are killed when the test ends. Its internal topics
// hold the consumer offsets and the transaction state. They have a replica on every node
// and min.insync.replicas of one less, as the broker default for new topics has.
type PrivateCluster struct {
	Nodes []*PrivateKafka
}

// StartPrivateCluster formats and starts an n-node cluster. Replication factor 3 with
// min.insync.replicas 2 needs n of 3 or more. It returns once every node answers with
// itself in the cluster's metadata. It fails the test when java or the jars are missing,
// and skips it under -short.
func StartPrivateCluster(t testing.TB, n int) *PrivateCluster {
	t.Helper()
	Integration(t)
	libs, err := kafkaLibs()
	if err != nil {
		t.Fatalf("testenv: private Kafka cluster: %v; %s", err, howToGetJars)
	}
	if _, err := exec.LookPath("java"); err != nil {
		t.Fatalf("testenv: private Kafka cluster needs java (17+) on PATH: %v; %s", err, howToGetJars)
	}
	ports, err := freePorts(2 * n)
	if err != nil {
		t.Fatalf("testenv: private Kafka cluster: %v", err)
	}
	var voters []string
	for i := range n {
		voters = append(voters, fmt.Sprintf("%d@127.0.0.1:%d", i+1, ports[n+i]))
	}
	c := &PrivateCluster{}
	cid := newClusterID()
	for i := range n {
		k := &PrivateKafka{t: t, dir: t.TempDir(), libs: libs, port: ports[i], ctrl: ports[n+i], startup: 120 * time.Second,
			id: i + 1, voters: strings.Join(voters, ","), replicas: n}
		t.Cleanup(k.Kill)
		if err := k.writeConfig(); err != nil {
			t.Fatalf("testenv: private Kafka cluster: %v", err)
		}
		if err := k.format(cid); err != nil {
			t.Fatalf("testenv: private Kafka cluster: %v", err)
		}
		c.Nodes = append(c.Nodes, k)
	}
	// A node waits for a quorum of controllers. So start them all, then wait for each.
	for _, k := range c.Nodes {
		k.launch()
	}
	for _, k := range c.Nodes {
		k.waitReady()
	}
	return c
}

// Brokers is the cluster's bootstrap list of every node.
func (c *PrivateCluster) Brokers() []string {
	var out []string
	for _, k := range c.Nodes {
		out = append(out, k.Addr())
	}
	return out
}

// Config is a client config for the cluster.
func (c *PrivateCluster) Config() kafkax.Config {
	k := c.Nodes[0].Config()
	k.Brokers = c.Brokers()
	return k
}

// Node is the node with broker id id, or nil if there is none.
func (c *PrivateCluster) Node(id int32) *PrivateKafka {
	for _, k := range c.Nodes {
		if k.ID() == id {
			return k
		}
	}
	return nil
}
