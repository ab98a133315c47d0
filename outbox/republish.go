package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/IBM/sarama"

	"github.com/onceflow/onceflow/pkg/dbx"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// RepublishConfig chooses the published outbox events that Republish sends again. The
// relay keeps published rows for RelayConfig.Retention, so only those can be chosen.
type RepublishConfig struct {
	Table string    // the outbox table, "outbox" by default
	Topic string    // the topic whose events are sent again; required
	Since time.Time // events published at or after this; required
	Until time.Time // and before this; the zero time: up to now

	// BatchSize is the most events per Kafka transaction, 2000 by default, at most 10,000.
	BatchSize int
	// BatchBytes bounds a transaction's events by bytes as RelayConfig.BatchBytes does, 16 MiB
	// by default, at least 1 KiB.
	BatchBytes int
	// TransactionalID is the Kafka transactional.id of the republishing producer. The
	// default is "onceflow-republish-<database>-<topic>". So a second Republish of the same
	// topic fences the first, and never the relay, whose id differs.
	TransactionalID string
	TxnTimeout      time.Duration // Kafka transaction timeout, 30 s by default
	// Tune, when set, adjusts the producer's Sarama config. Tests use it.
	Tune func(*sarama.Config)
}

func (c *RepublishConfig) setDefaults() {
	if c.Table == "" {
		c.Table = "outbox"
	}
	if c.BatchSize == 0 {
		c.BatchSize = 2000
	}
	if c.BatchBytes == 0 {
		c.BatchBytes = 16 << 20
	}
	if c.TxnTimeout == 0 {
		c.TxnTimeout = 30 * time.Second
	}
}

func (c RepublishConfig) validate() error {
	if err := dbx.CheckIdent("outbox table", c.Table); err != nil {
		return fmt.Errorf("republish: %w", err)
	}
	if err := kafkax.CheckTopicName(c.Topic); err != nil {
		return fmt.Errorf("republish: %w", err)
	}
	if c.Since.IsZero() {
		return errors.New("republish: the time to republish from is required")
	}
	if !c.Until.IsZero() && !c.Until.After(c.Since) {
		return fmt.Errorf("republish: until %s is not after since %s", c.Until.Format(time.RFC3339Nano), c.Since.Format(time.RFC3339Nano))
	}
	if c.BatchSize < 1 || c.BatchSize > 10000 {
		return fmt.Errorf("republish: batch size %d outside 1..10000", c.BatchSize)
	}
	if c.BatchBytes < 1024 {
		return fmt.Errorf("republish: batch bytes %d below 1024", c.BatchBytes)
	}
	if c.TxnTimeout < time.Second {
		return fmt.Errorf("republish: transaction timeout %s below 1s", c.TxnTimeout)
	}
	return nil
}

// RepublishPlan is what Republish would send, and what it cannot.
type RepublishPlan struct {
	Events      int64     // published events of the topic in the time range
	First, Last time.Time // when the first and the last of them were published
	// Oldest is when the oldest published event of the topic still kept was published, the
	// zero time without one. Events published before it were deleted after the relay's
	// retention, and no Republish can send them.
	Oldest time.Time
	// Unpublished is how many events of the topic are not published yet. The relay sends
	// them, and Republish does not.
	Unpublished int64
}

// RepublishResult is what Republish sent.
type RepublishResult struct {
	Events  int64 // events sent and committed in Kafka
	Batches int   // Kafka transactions committed
	// Last is when the last event committed had been published first, and LastID its
	// outbox id. A Republish that failed goes on from there.
	Last   time.Time
	LastID int64
}

// PlanRepublish counts the events Republish would send with cfg.
func PlanRepublish(ctx context.Context, db *sql.DB, cfg RepublishConfig) (RepublishPlan, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return RepublishPlan{}, err
	}
	dl := sqlText{dbx.DialectOf(db)}
	until := cfg.Until
	if until.IsZero() {
		until = farFuture
	}
	var p RepublishPlan
	var first, last, oldest sql.NullTime
	q := dl.Rebind(`SELECT COUNT(*), MIN(published_at), MAX(published_at) FROM ` + cfg.Table + ` WHERE published_at >= ? AND published_at < ? AND topic = ?`)
	if err := db.QueryRowContext(ctx, q, cfg.Since.UTC(), until.UTC(), cfg.Topic).Scan(&p.Events, &first, &last); err != nil {
		return p, fmt.Errorf("count published outbox events of topic %s: %w", cfg.Topic, err)
	}
	q = dl.Rebind(`SELECT MIN(published_at) FROM ` + cfg.Table + ` WHERE published_at IS NOT NULL AND topic = ?`)
	if err := db.QueryRowContext(ctx, q, cfg.Topic).Scan(&oldest); err != nil {
		return p, fmt.Errorf("oldest published outbox event of topic %s: %w", cfg.Topic, err)
	}
	q = dl.Rebind(`SELECT COUNT(*) FROM ` + cfg.Table + ` WHERE published_at IS NULL AND topic = ?`)
	if err := db.QueryRowContext(ctx, q, cfg.Topic).Scan(&p.Unpublished); err != nil {
		return p, fmt.Errorf("count unpublished outbox events of topic %s: %w", cfg.Topic, err)
	}
	p.First, p.Last, p.Oldest = first.Time.UTC(), last.Time.UTC(), oldest.Time.UTC()
	return p, nil
}

// farFuture stands for an open end of a time range.
var farFuture = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)

// Republish sends the published outbox events of cfg.Topic that were published in
// [cfg.Since, cfg.Until) to that topic again. It serves a topic that lost its records, for
// example one deleted and created again. Each record is the one the relay sent: the same
// key, value and headers, the event_id header included. The events go in the order the relay
// published them, by published_at and then id, so each key's events keep their order, and
// with the relay's partitioner, so each key's events go to the partition of its later ones.
// They go in Kafka transactions of BatchSize events, through a transactional producer of
// its own. A read_committed consumer sees a transaction's events all or none.
//
// Every consumer of the topic gets the events again. Those that dedupe, by the event_id
// header or, as onceflow's inbox does, by a business key, skip the ones they had.
// Republish never changes the outbox, and the relay goes on publishing new events
// meanwhile. progress, when not nil, is called after each committed transaction with the
// totals so far. On an error the transactions before it stay committed, and the result
// says up to which event.
func Republish(ctx context.Context, db *sql.DB, k kafkax.Config, cfg RepublishConfig, progress func(RepublishResult)) (RepublishResult, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return RepublishResult{}, err
	}
	dl := sqlText{dbx.DialectOf(db)}
	if cfg.TransactionalID == "" {
		var name sql.NullString
		if err := db.QueryRowContext(ctx, dl.currentDatabase()).Scan(&name); err != nil {
			return RepublishResult{}, fmt.Errorf("republish: read the database's name: %w", err)
		}
		if !name.Valid || name.String == "" {
			return RepublishResult{}, fmt.Errorf("republish: %w: set a transactional id", ErrNoDatabase)
		}
		cfg.TransactionalID = "onceflow-republish-" + name.String + "-" + cfg.Topic
	}
	until := cfg.Until
	if until.IsZero() {
		until = farFuture
	}
	// A missing topic would make the producer wait out its retries per batch, or have the
	// broker create it with its defaults.
	if _, err := k.CheckTopics(cfg.Topic); err != nil {
		return RepublishResult{}, fmt.Errorf("republish: %w", err)
	}
	p, closeProducer, err := republishProducer(k, cfg)
	if err != nil {
		return RepublishResult{}, err
	}
	defer closeProducer()

	// Keyset pages in the order of idx_unpublished, (published_at, id): a range of the index
	// per page, each row read by its id.
	first := dl.Rebind(`SELECT id, event_id, event_type, topic, msg_key, payload, headers, trace_parent, published_at FROM ` + cfg.Table +
		` WHERE published_at >= ? AND published_at < ? AND topic = ? ORDER BY published_at, id LIMIT ` + strconv.Itoa(cfg.BatchSize))
	next := dl.Rebind(`SELECT id, event_id, event_type, topic, msg_key, payload, headers, trace_parent, published_at FROM ` + cfg.Table +
		` WHERE (published_at > ? OR (published_at = ? AND id > ?)) AND published_at < ? AND topic = ? ORDER BY published_at, id LIMIT ` +
		strconv.Itoa(cfg.BatchSize))
	var (
		res RepublishResult
		rd  rowReader
	)
	for {
		var rows *sql.Rows
		if res.Events == 0 {
			rows, err = db.QueryContext(ctx, first, cfg.Since.UTC(), until.UTC(), cfg.Topic)
		} else {
			rows, err = db.QueryContext(ctx, next, res.Last, res.Last, res.LastID, until.UTC(), cfg.Topic)
		}
		if err != nil {
			return res, fmt.Errorf("read published outbox events: %w", err)
		}
		b, lastAt, err := readRepublished(&rd, rows, cfg.BatchBytes)
		if err != nil {
			return res, err
		}
		out := rd.rows(b)
		if len(out) == 0 {
			return res, nil
		}
		msgs := make([]*sarama.ProducerMessage, len(out))
		for i := range out {
			msgs[i] = out[i].msg
		}
		if err := sendInTxn(p, msgs); err != nil {
			return res, fmt.Errorf("republish %d events from %s (outbox id %d): %w", len(out), out[0].eventID, out[0].id, err)
		}
		rd.recycle()
		res.Events += int64(len(out))
		res.Batches++
		res.Last, res.LastID = lastAt, out[len(out)-1].id
		if progress != nil {
			progress(res)
		}
		if err := ctx.Err(); err != nil {
			return res, err
		}
	}
}

// readRepublished reads a page of published rows into a batch of rd, up to the row that
// brings it to limit bytes. It returns the batch and the publish time of its last row.
func readRepublished(rd *rowReader, rows *sql.Rows, limit int) (*rowBatch, time.Time, error) {
	defer rows.Close()
	b := rd.start()
	var at sql.NullTime
	dest := append(rd.dest[:len(rd.dest):len(rd.dest)], &at)
	for rows.Next() {
		if len(b.rows) > 0 && b.size() >= limit {
			break // the next page starts at the row not read
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, time.Time{}, fmt.Errorf("scan outbox row: %w", err)
		}
		id, err := strconv.ParseInt(string(rd.raw[0]), 10, 64)
		if err != nil {
			return nil, time.Time{}, fmt.Errorf("scan outbox row: id: %w", err)
		}
		if err := rd.keep(b, id); err != nil {
			return nil, time.Time{}, err
		}
	}
	if err := rows.Err(); err != nil {
		return nil, time.Time{}, fmt.Errorf("read published outbox events: %w", err)
	}
	return b, at.Time.UTC(), nil
}

// republishProducer is a transactional producer as the relay's, with cfg's id: idempotent,
// all acks, one request in flight, the relay's hash partitioner.
func republishProducer(k kafkax.Config, cfg RepublishConfig) (sarama.SyncProducer, func(), error) {
	sc := k.ProducerConfig()
	sc.Producer.Idempotent = true
	sc.Producer.RequiredAcks = sarama.WaitForAll
	sc.Net.MaxOpenRequests = 1
	sc.Producer.Transaction.ID = cfg.TransactionalID
	sc.Producer.Transaction.Timeout = cfg.TxnTimeout
	sc.Producer.Transaction.Retry.Max = 20
	sc.Producer.Transaction.Retry.BackoffFunc = txnRetryBackoff
	sc.Producer.Flush.MaxMessages = 0
	sc.Producer.Partitioner = sarama.NewHashPartitioner
	if cfg.Tune != nil {
		cfg.Tune(sc)
	}
	client, err := sarama.NewClient(k.Brokers, sc)
	if err != nil {
		return nil, nil, fmt.Errorf("republish: transactional producer %s: %w", cfg.TransactionalID, err)
	}
	p, err := sarama.NewSyncProducerFromClient(client)
	if err != nil {
		_ = client.Close()
		return nil, nil, fmt.Errorf("republish: transactional producer %s: %w", cfg.TransactionalID, err)
	}
	return p, func() {
		abortIfOpen(p)
		_ = p.Close()
		_ = client.Close()
	}, nil
}

// sendInTxn sends msgs in one Kafka transaction and commits it. It aborts the transaction
// when the send fails.
func sendInTxn(p sarama.SyncProducer, msgs []*sarama.ProducerMessage) error {
	if err := p.BeginTxn(); err != nil {
		return fmt.Errorf("begin kafka transaction: %w", err)
	}
	if err := p.SendMessages(msgs); err != nil {
		abortIfOpen(p)
		return fmt.Errorf("send: %w", err)
	}
	if err := p.CommitTxn(); err != nil {
		abortIfOpen(p)
		return fmt.Errorf("commit kafka transaction: %w", err)
	}
	return nil
}
