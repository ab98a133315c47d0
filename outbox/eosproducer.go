package outbox

import (
	"time"

	"github.com/IBM/sarama"
)

// producerConfig is the shard's transactional producer: idempotent, acks=all, one request
// in flight, the shard's transactional id, and every position record of that id on one
// partition of the positions topic (positionsPartitioner).
func (e *eosShard) producerConfig() *sarama.Config {
	sc := e.kc.ProducerConfig()
	sc.Producer.Idempotent = true
	sc.Producer.RequiredAcks = sarama.WaitForAll
	sc.Net.MaxOpenRequests = 1
	sc.Producer.Transaction.ID = e.txnID
	sc.Producer.Transaction.Timeout = e.r.cfg.TxnTimeout
	// Transactional requests (InitProducerID, AddPartitionsToTxn, EndTxn) are retried 20
	// times, 5ms doubling to 500ms (≈7s of waiting in all): long enough for InitProducerID
	// to wait out a predecessor's CONCURRENT_TRANSACTIONS, and the AddPartitionsToTxn that
	// follows a commit retries after 5ms instead of Sarama's 20ms, a wait every small
	// transaction would pay. A fixed 100ms backoff with many more retries, each looking the
	// coordinator up with 3 metadata retries of its own, keeps a batch inside Sarama for
	// minutes when a broker stops, silently (no failed batch, no log, the lease expiring);
	// with these settings the batch fails well within a minute, later relay sessions fail at once,
	// and the relay's own backoff, log and metrics take over.
	sc.Producer.Transaction.Retry.Max = 20
	sc.Producer.Transaction.Retry.BackoffFunc = txnRetryBackoff
	sc.Metadata.Retry.Max = 1 // each transactional retry looks the coordinator up again
	// No cap on a request's messages: with ProducerConfig's flush wait a batch goes out as
	// one produce request; split into several, each request would wait for an
	// AddPartitionsToTxn round trip of its own.
	sc.Producer.Flush.MaxMessages = 0
	positions, txnID := e.r.cfg.PositionsTopic, e.txnID
	sc.Producer.Partitioner = func(topic string) sarama.Partitioner {
		if topic == positions {
			return positionsPartitioner{hash: sarama.NewHashPartitioner(topic), key: txnID}
		}
		return sarama.NewHashPartitioner(topic)
	}
	return e.saramaConfig(sc)
}

// txnRetryBackoff is the backoff of the transactional requests' retries: 5ms doubling, at
// most 500ms.
func txnRetryBackoff(retries, _ int) time.Duration {
	return min(5*time.Millisecond<<min(retries, 7), 500*time.Millisecond)
}

// saramaConfig applies RelayConfig.Tune to a config of the shard's clients.
func (e *eosShard) saramaConfig(base *sarama.Config) *sarama.Config {
	if e.r.cfg.Tune != nil {
		e.r.cfg.Tune(base)
	}
	return base
}
