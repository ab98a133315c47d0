package outbox

import (
	"time"

	"github.com/IBM/sarama"
)

// producerConfig is the config of the shard's transactional producer. The producer is
// idempotent, waits for all acks, keeps one request in flight and has the shard's
// transactional id. positionsPartitioner puts every position record of that id on one
// partition of the positions topic.
func (e *eosShard) producerConfig() *sarama.Config {
	sc := e.kc.ProducerConfig()
	sc.Producer.Idempotent = true
	sc.Producer.RequiredAcks = sarama.WaitForAll
	sc.Net.MaxOpenRequests = 1
	sc.Producer.Transaction.ID = e.txnID
	sc.Producer.Transaction.Timeout = e.r.cfg.TxnTimeout
	// The transactional requests are InitProducerID, AddPartitionsToTxn and EndTxn. They
	// are retried 20 times, with a backoff from 5ms doubling to 500ms, about 7s of waiting
	// in all. That is long enough for InitProducerID to wait out a predecessor's
	// CONCURRENT_TRANSACTIONS. The AddPartitionsToTxn that follows a commit retries after
	// 5ms instead of Sarama's 20ms, a wait every small transaction would pay. When a broker
	// stops, a batch fails well within a minute and later relay sessions fail at once. The
	// relay's own backoff, log and metrics then take over. Many more retries, each with
	// metadata retries of its own, would keep a batch inside Sarama for minutes. The relay
	// would log nothing and fail no batch while its lease expired.
	sc.Producer.Transaction.Retry.Max = 20
	sc.Producer.Transaction.Retry.BackoffFunc = txnRetryBackoff
	sc.Metadata.Retry.Max = 1 // each transactional retry looks the coordinator up again
	// A request's messages have no cap. With ProducerConfig's flush wait, a batch goes out
	// as one produce request. Split into several, each request would wait for an
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

// txnRetryBackoff is the backoff of the transactional requests' retries. It starts at 5ms
// and doubles up to 500ms.
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
