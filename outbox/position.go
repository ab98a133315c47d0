package outbox

import (
	"crypto/sha256"
	"encoding/hex"
	"time"

	"github.com/IBM/sarama"
)

// DefaultPositionsTopic is the compacted topic where exactly-once relays record, in the
// same Kafka transaction as the events, which outbox ids each batch covered.
const DefaultPositionsTopic = "onceflow-relay-positions"

// Position is one record of the positions topic.
//
// A record of kind "batch" has the transactional id as its key. It is written in the same
// Kafka transaction as the batch's events. It lists the outbox ids the batch covered as
// inclusive ranges, because the ids are not contiguous.
//
// A record of kind "init" has the transactional id plus "/init" as its key. Every new
// session writes one after its producer fenced the session before it. Reading the topic up
// to it proves that every earlier committed batch has been seen.
type Position struct {
	V       int        `json:"v"`
	Kind    string     `json:"kind"`
	TxnID   string     `json:"txn_id"`
	Shard   string     `json:"shard"`
	Owner   string     `json:"owner"`
	Session string     `json:"session"`
	Seq     int64      `json:"seq,omitempty"`
	Events  int        `json:"events,omitempty"`
	IDs     [][2]int64 `json:"ids,omitempty"`
	// Digest is sha256 over the batch's event ids in id order. Reconcile marks rows only when
	// the table's rows with those ids carry exactly these events. So a position that another
	// database left in Kafka never marks rows that were not published. That database may
	// have been reset or restored, or may share the transactional id.
	Digest string    `json:"digest,omitempty"`
	At     time.Time `json:"at"`
}

// eventDigest is Position.Digest of event ids in id order.
func eventDigest(eventIDs []string) string {
	h := sha256.New()
	for _, id := range eventIDs {
		h.Write([]byte(id))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// positionsPartitioner puts every position record of one transactional id on one
// partition, although batch and init records have different keys. So reading up to the
// init record sees all earlier batch records.
type positionsPartitioner struct {
	hash sarama.Partitioner
	key  string
}

func (p positionsPartitioner) Partition(_ *sarama.ProducerMessage, n int32) (int32, error) {
	return p.hash.Partition(&sarama.ProducerMessage{Key: sarama.StringEncoder(p.key)}, n)
}
func (p positionsPartitioner) RequiresConsistency() bool { return true }
