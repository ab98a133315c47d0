package engine_test

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/IBM/sarama"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"

	"github.com/onceflow/onceflow/internal/testenv"
)

// record is one Kafka record of the poison test, sent to a chosen partition.
type record struct {
	key, value []byte
	headers    []sarama.RecordHeader
	good       string // the order id when the value is a good order, else ""
}

// TestKafkaPoisonNeverStallsAPartition sends outside records of every odd kind, in the
// middle of each partition between good orders. They go through the router's default path
// on the real broker, the parallel subscriber and group commit. Every good order is
// granted once, including those whose key, headers or message id are not UTF-8. Every
// poison record is quarantined. The group's committed offsets reach the end of every
// partition. A tombstone whose quarantine failed on the NOT NULL payload would be
// redelivered over and over, and the committed offset would never pass it.
func TestKafkaPoisonNeverStallsAPartition(t *testing.T) {
	kc := testenv.Kafka(t)
	const parts = 3
	in := testenv.TopicWithConfig(t, kc, "order-paid-poison", parts, map[string]string{"max.message.bytes": fmt.Sprint(4 << 20)})
	p := newPipeline(t, pipelineOpts{conns: 16})
	db := p.db.DB

	uuidHeader := func(v string) sarama.RecordHeader {
		return sarama.RecordHeader{Key: []byte(wkafka.UUIDHeaderKey), Value: []byte(v)}
	}
	good := func(id string) record {
		return record{key: []byte(id), value: []byte(orderJSON(id, "u-"+id)), good: id, headers: []sarama.RecordHeader{uuidHeader("uuid-" + id)}}
	}
	odd := func(id string, mutate func(*record)) record { r := good(id); mutate(&r); return r }
	var bigHeaders []sarama.RecordHeader
	for i := range 7 {
		bigHeaders = append(bigHeaders, sarama.RecordHeader{Key: []byte(fmt.Sprintf("h%d", i)), Value: []byte(strings.Repeat("ü", 5<<10))})
	}
	poison := []record{
		{key: []byte("tomb"), value: nil},       // tombstone
		{key: []byte("empty"), value: []byte{}}, // empty value
		{key: []byte("utf8"), value: []byte(`{"orderId":"x","userId":"u","amountCents":"` + "\xff\xfe" + `"}`)},
		{key: []byte("big"), value: []byte(`{"orderId":"big","userId":"u","x":"` + strings.Repeat("a", 2<<20) + `"}`)},
		{key: []byte("headers"), value: []byte(orderJSON("hdr", "u")), headers: bigHeaders}, // 70 KiB of headers
	}
	var recs [][]record // per partition
	var goods []string
	for part := range parts {
		var rs []record
		for i := range 40 {
			id := fmt.Sprintf("kp-%d-%02d", part, i)
			switch i {
			case 10:
				rs = append(rs, odd(id, func(r *record) { r.key = []byte("\xff\xfe" + id) }))
			case 15:
				rs = append(rs, odd(id, func(r *record) {
					r.headers = append(r.headers, sarama.RecordHeader{Key: []byte("trace\xff"), Value: []byte("v\xfe\xfd")})
				}))
			case 20:
				rs = append(rs, odd(id, func(r *record) { r.headers = []sarama.RecordHeader{uuidHeader("\xff\xfe" + id)} }))
			case 25:
				rs = append(rs, odd(id, func(r *record) { r.headers = []sarama.RecordHeader{uuidHeader("x" + strings.Repeat("é", 40))} }))
			default:
				rs = append(rs, good(id))
			}
			goods = append(goods, id)
			if i == 12 {
				rs = append(rs, poison...)
			}
		}
		recs = append(recs, rs)
	}

	sc := kc.ProducerConfig()
	sc.Producer.MaxMessageBytes = 4 << 20
	sc.Producer.Partitioner = sarama.NewManualPartitioner
	prod, err := sarama.NewSyncProducer(kc.Brokers, sc)
	if err != nil {
		t.Fatal(err)
	}
	for part, rs := range recs {
		for _, r := range rs {
			m := &sarama.ProducerMessage{Topic: in, Partition: int32(part), Headers: r.headers}
			if r.key != nil {
				m.Key = sarama.ByteEncoder(r.key)
			}
			if r.value != nil {
				m.Value = sarama.ByteEncoder(r.value)
			}
			if _, _, err := prod.SendMessage(m); err != nil {
				t.Fatalf("produce %q: %v", r.key, err)
			}
		}
	}
	prod.Close()

	group := "g-" + in
	var received atomic.Int64
	startBatchRouter(t, kc, group, in, p.inbox, &received)
	wantPoison := parts * len(poison)
	waitFor(t, "every good order granted, every poison record quarantined, committed offsets at the end", 90*time.Second, func() (bool, string) {
		c := count(t, db, "SELECT COUNT(*) FROM user_coupon")
		q := count(t, db, "SELECT COUNT(*) FROM inbox WHERE status = 'failed'")
		lag := testenv.CommittedLag(t, kc, group, in)
		var behind int64
		for _, l := range lag {
			behind += l
		}
		return c == len(goods) && q == wantPoison && behind == 0, fmt.Sprintf("coupons=%d/%d quarantined=%d/%d committed lag=%v", c, len(goods), q, wantPoison, lag)
	})
	for _, id := range goods {
		if n := count(t, db, "SELECT COUNT(*) FROM user_coupon WHERE order_id = ?", id); n != 1 {
			t.Errorf("order %s: %d coupons", id, n)
		}
	}
	if n := count(t, db, "SELECT COUNT(*) FROM inbox WHERE status = 'failed' AND reason <> 'poison'"); n != 0 {
		t.Errorf("%d rows quarantined for another reason than poison", n)
	}
	if n := count(t, db, "SELECT COUNT(*) FROM inbox WHERE tombstone"); n != parts {
		t.Errorf("%d tombstone rows, want %d", n, parts)
	}
	if n := count(t, db, "SELECT COUNT(*) FROM inbox WHERE payload_size > LENGTH(payload)"); n != parts {
		t.Errorf("%d rows with a stored prefix, want %d (the 2 MiB values)", n, parts)
	}
	// The subscriber hands the record's Kafka key to the inbox, which notes it on the row.
	for _, r := range poison {
		if n := count(t, db, "SELECT COUNT(*) FROM inbox WHERE status = 'failed' AND last_error LIKE ?", `kafka key "`+string(r.key)+`"; %`); n != parts {
			t.Errorf("%d poison rows note the Kafka key %q, want %d", n, r.key, parts)
		}
	}
}
