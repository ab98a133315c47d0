package engine_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/internal/msgsource"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// TestKafkaOversizedValuesWaitCut checks that records over inbox.max_payload_bytes wait
// for a stalled database cut to their quarantine form. While the inbox table is locked,
// every record is read and held. The subscriber holds the cut prefixes, so the budget's
// bytes stay below one whole record. Once the lock goes, each is quarantined with its full
// size and the sha256 of its whole value. Every good order is granted, and the committed
// offsets reach the end of both partitions. Two big values with the same first 64 KiB stay
// two rows.
func TestKafkaOversizedValuesWaitCut(t *testing.T) {
	kc := testenv.Kafka(t)
	const parts = 2
	in := testenv.TopicWithConfig(t, kc, "order-paid-cut", parts, map[string]string{"max.message.bytes": fmt.Sprint(4 << 20)})
	p := newPipeline(t, pipelineOpts{conns: 8})
	db := p.db.DB
	limit := p.inbox.Config().MaxPayloadBytes

	const bigSize = 2 << 20
	var bigs [][]byte
	for i := range 6 {
		// the same first 64 KiB and more, different tails
		v := []byte(`{"orderId":"big","userId":"u","x":"` + strings.Repeat("a", bigSize) + fmt.Sprintf(`%d"}`, i))
		bigs = append(bigs, v)
	}
	sc := kc.ProducerConfig()
	sc.Producer.MaxMessageBytes = 4 << 20
	sc.Producer.Partitioner = sarama.NewManualPartitioner
	prod, err := sarama.NewSyncProducer(kc.Brokers, sc)
	if err != nil {
		t.Fatal(err)
	}
	var goods []string
	send := func(part int, key string, v []byte) {
		if _, _, err := prod.SendMessage(&sarama.ProducerMessage{Topic: in, Partition: int32(part), Key: sarama.StringEncoder(key), Value: sarama.ByteEncoder(v)}); err != nil {
			t.Fatalf("produce %s: %v", key, err)
		}
	}
	for i, v := range bigs {
		id := fmt.Sprintf("cut-%d", i)
		goods = append(goods, id)
		send(i%parts, id, []byte(orderJSON(id, "u-"+id)))
		send(i%parts, fmt.Sprintf("big-%d", i), v)
	}
	prod.Close()
	records := 2 * len(bigs)

	// The database stalls. A transaction holding the inbox's whole index range, or its
	// table on PostgreSQL, blocks every insert until it ends.
	lock, err := p.db.Admin.Begin()
	if err != nil {
		t.Fatal(err)
	}
	stall := "SELECT id FROM inbox WHERE id >= 0 FOR UPDATE" // REPEATABLE READ: gap locks
	if testenv.Dialect().IsPostgres() {
		stall = "LOCK TABLE inbox IN SHARE MODE" // PostgreSQL takes no gap locks
	}
	if _, err := lock.Exec(stall); err != nil {
		t.Fatal(err)
	}
	unlocked := false
	unlock := func() {
		if !unlocked {
			unlocked = true
			if err := lock.Rollback(); err != nil {
				t.Fatal(err)
			}
		}
	}
	defer unlock()

	group := "g-" + in
	sub, err := kc.NewParallelSubscriber(group, kafkax.ParallelConfig{MaxValueBytes: limit}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.inbox.NewBatcher(engine.BatchConfig{})
	if err != nil {
		t.Fatal(err)
	}
	h := b.HandlerFunc(in)
	var cut atomic.Int64
	runRouter(t, sub, in, func(m *message.Message) error {
		if _, ok := msgsource.CutFrom(m.Context()); ok {
			cut.Add(1)
		}
		return h(m)
	}, func() { _ = b.Close() })

	// A record is in flight once handed to the router, a moment before its handler runs.
	// The wait is for both, and the handler counts the cut ones.
	waitFor(t, "every record read and waiting for the locked inbox", 60*time.Second, func() (bool, string) {
		var n int
		var held int64
		for _, st := range sub.PartitionStats() {
			n += st.InFlight
			held += st.InFlightBytes
		}
		return n == records && cut.Load() >= int64(len(bigs)), fmt.Sprintf("in flight %d of %d, %d bytes, %d handed out cut", n, records, held, cut.Load())
	})
	var held int64
	for _, st := range sub.PartitionStats() {
		held += st.InFlightBytes
	}
	if max := int64(records) * (msgsource.CutPrefixBytes + kafkax.RecordOverhead + 1<<10); held > max || held >= bigSize {
		t.Fatalf("the subscriber holds %d bytes for %d records waiting, want at most %d (cut values, not %d-byte ones)", held, records, max, bigSize)
	}
	if got := cut.Load(); got != int64(len(bigs)) {
		t.Fatalf("%d records handed out cut, want the %d big ones", got, len(bigs))
	}
	unlock()

	waitFor(t, "good orders granted, big values quarantined, committed offsets at the end", 90*time.Second, func() (bool, string) {
		c := count(t, db, "SELECT COUNT(*) FROM user_coupon")
		q := count(t, db, "SELECT COUNT(*) FROM inbox WHERE status = 'failed'")
		var behind int64
		lag := testenv.CommittedLag(t, kc, group, in)
		for _, l := range lag {
			behind += l
		}
		return c == len(goods) && q == len(bigs) && behind == 0, fmt.Sprintf("coupons=%d/%d quarantined=%d/%d lag=%v", c, len(goods), q, len(bigs), lag)
	})
	for i, v := range bigs {
		sum := sha256.Sum256(v)
		fp := hex.EncodeToString(sum[:])
		var size, stored int
		var reason, lastErr string
		err := db.QueryRow(testenv.Rebind("SELECT payload_size, LENGTH(payload), reason, last_error FROM inbox WHERE fingerprint = ? AND status = 'failed'"), fp).Scan(&size, &stored, &reason, &lastErr)
		if err != nil {
			t.Fatalf("big value %d: no quarantined row with the sha256 of its whole value: %v", i, err)
		}
		if size != len(v) || stored != min(msgsource.CutPrefixBytes, limit) || reason != "poison" || !strings.Contains(lastErr, fmt.Sprintf("payload of %d bytes exceeds the limit of %d", len(v), limit)) {
			t.Errorf("big value %d: payload_size %d (want %d), %d bytes stored, reason %s, error %q", i, size, len(v), stored, reason, lastErr)
		}
	}
}
