package console

import (
	"regexp"
	"strings"
	"testing"

	"github.com/IBM/sarama"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// TestOverviewGroupLag checks that the overview's consumer groups show every partition of a
// group as Kafka holds it. No consumer of this process reads them. A partition caught up on
// a transactional topic, with its commit marker past the committed offset, has lag 0. A
// partition never committed counts whole.
func TestOverviewGroupLag(t *testing.T) {
	kc := testenv.Kafka(t)
	topic := testenv.Topic(t, kc, "console-lag", 2)
	sc := kc.ProducerConfig()
	sc.Producer.Transaction.ID = "onceflow-test-" + topic
	sc.Producer.Partitioner = sarama.NewManualPartitioner
	p, err := sarama.NewSyncProducer(kc.Brokers, sc)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for part, n := range []int{2, 1} { // partition 0 has offsets 0-1 and marker 2, partition 1 has offset 0 and marker 1
		if err := p.BeginTxn(); err != nil {
			t.Fatal(err)
		}
		for range n {
			if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: topic, Partition: int32(part), Value: sarama.StringEncoder("v")}); err != nil {
				t.Fatal(err)
			}
		}
		if err := p.CommitTxn(); err != nil {
			t.Fatal(err)
		}
	}
	group := "console-lag-" + topic
	client, err := sarama.NewClient(kc.Brokers, kc.SaramaConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	om, err := sarama.NewOffsetManagerFromClient(group, client)
	if err != nil {
		t.Fatal(err)
	}
	pom, err := om.ManagePartition(topic, 0)
	if err != nil {
		t.Fatal(err)
	}
	pom.MarkOffset(2, "") // both records consumed, only the marker is left
	om.Commit()
	_ = pom.Close()
	_ = om.Close()

	lags, err := kc.NewLagReader()
	if err != nil {
		t.Fatal(err)
	}
	defer lags.Close()
	_, base := testConsole(t, Config{DB: offlineDB(t), Groups: []Group{{Name: group, Topics: []string{topic}}}, Lags: lags})
	_, page, _ := get(t, browser(t), base+"/")
	row := func(part, rest string) *regexp.Regexp {
		return regexp.MustCompile(`<td>` + regexp.QuoteMeta(group) + `</td><td>` + regexp.QuoteMeta(topic) + `</td><td class="n">` + part + `</td>` + rest)
	}
	for what, re := range map[string]*regexp.Regexp{
		"partition 0: committed 2, end 3, lag 0":    row("0", `<td class="n">2</td><td class="n">3</td><td class="n">0</td>`),
		"partition 1: committed none, end 2, lag 2": row("1", `<td class="n"><span class="muted">none</span></td><td class="n">2</td><td class="n bad">2</td>`),
	} {
		if !re.MatchString(page) {
			t.Errorf("overview lacks %s", what)
		}
	}
	if t.Failed() {
		i := strings.Index(page, `id="group-lag"`)
		t.Log(page[max(i, 0):])
	}
}

// fixedLags is a GroupLagReader that answers the same partitions for every group.
type fixedLags []kafkax.PartitionLag

func (f fixedLags) GroupLag(string, []string) ([]kafkax.PartitionLag, error) { return f, nil }

// TestOverviewLagTablesSayWhatTheyMeasure checks that the overview's two lag tables say
// what each measures. One is Kafka's, end minus the group's committed offset, read at most
// every 10 s. The other is this process's memory, its latest fetch's high watermark minus
// the offset it marked. They differ for one partition while a backlog drains.
func TestOverviewLagTablesSayWhatTheyMeasure(t *testing.T) {
	lags := fixedLags{{Topic: "orders", Partition: 3, Committed: 100, End: 2030, Lag: 1930}}
	_, base := testConsole(t, Config{DB: offlineDB(t), Groups: []Group{{Name: "g", Topics: []string{"orders"}}}, Lags: lags})
	_, page, _ := get(t, browser(t), base+"/")
	for _, want := range []string{
		"<h2>Consumer groups: lag in Kafka</h2>",
		"as Kafka holds it: the group's committed offset, the partition's end (its high watermark)",
		`<th class="n">lag: end − committed</th>`,
		`<td class="n bad">1,930</td>`,
		"<h2>Partitions consumed by this process: lag in its memory</h2>",
		"the high watermark of its latest fetch minus the offset it marked for commit",
		"read from Kafka at most every 10 s, so while a backlog drains the two lags of one partition differ",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("overview lacks %q", want)
		}
	}
	if t.Failed() {
		t.Log(page)
	}
}
