package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/pkg/dbx"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// forwarderTopic is the watermill-sql topic the forwarder reads: the rows live in the table
// watermill_<topic>, its consumer offset in watermill_offsets_<topic>.
const forwarderTopic = "onceflow_bench_forwarder"

// benchForwarder measures what the issue compares the relay with: Watermill's forwarder
// component (components/forwarder) over watermill-sql v4's MySQL Pub/Sub. The events are
// published inside database transactions (forwarder.Publisher wrapping a watermill-sql
// Publisher on the *sql.Tx, 1,000 per transaction, as the relay bench writes its rows),
// then the forwarder — watermill-sql Subscriber (SERIALIZABLE, its default for MySQL) →
// watermill-kafka Publisher (the same idempotent producer settings as the at-least-once
// relay, hash-partitioned on the same keys) — is started and timed until all N events are
// in Kafka. Delivery is at least once; the figure is events/s, comparable with the BENCH
// name=relay lines of the same run.
func (s *suite) benchForwarder(ctx context.Context) error {
	db, kc := s.db, s.kc
	n := s.cfg.forwarderN
	if n <= 0 {
		return nil
	}
	logger := watermill.NopLogger{}
	schema := wsql.DefaultMySQLSchema{} // payload JSON (the envelope is JSON), 100 rows per SELECT
	offsets := wsql.DefaultMySQLOffsetsAdapter{}
	if err := forwarderTables(ctx, s.cfg.adminDSN, schema, offsets, logger); err != nil {
		return err
	}
	if err := s.grantOwn(ctx, schema.MessagesTable(forwarderTopic), offsets.MessagesOffsetsTable(forwarderTopic)); err != nil {
		return err
	}
	topic, cleanup, err := makeTopic(kc, "bench-forwarder", 12)
	if err != nil {
		return err
	}
	defer cleanup()

	payload := []byte(`{"eventId":"x","orderId":"o","userId":"u","campaignId":"c","couponId":"k","valueCents":500}`)
	for start := 0; start < n; start += 1000 {
		err := dbx.InTx(ctx, db, func(tx *sql.Tx) error {
			sp, err := wsql.NewPublisher(wsql.TxFromStdSQL(tx), wsql.PublisherConfig{SchemaAdapter: schema}, logger)
			if err != nil {
				return err
			}
			pub := forwarder.NewPublisher(sp, forwarder.PublisherConfig{ForwarderTopic: forwarderTopic})
			var msgs []*message.Message
			for i := start; i < min(start+1000, n); i++ {
				m := message.NewMessage(watermill.NewUUID(), payload)
				m.Metadata.Set("key", fmt.Sprintf("k%d", i%5000))
				msgs = append(msgs, m)
			}
			return pub.Publish(topic, msgs...)
		})
		if err != nil {
			return fmt.Errorf("publish through watermill-sql: %w", err)
		}
	}

	kpub, err := wkafka.NewPublisher(wkafka.PublisherConfig{
		Brokers: kc.Brokers,
		Marshaler: wkafka.NewWithPartitioningMarshaler(func(_ string, m *message.Message) (string, error) {
			return m.Metadata.Get("key"), nil
		}),
		OverwriteSaramaConfig: kc.PublisherConfig(), // it publishes one message per call
	}, logger)
	if err != nil {
		return err
	}
	defer kpub.Close()
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(db), wsql.SubscriberConfig{
		ConsumerGroup: "onceflow-bench", SchemaAdapter: schema, OffsetsAdapter: offsets,
	}, logger)
	if err != nil {
		return err
	}
	fwd, err := forwarder.NewForwarder(sub, kpub, logger, forwarder.Config{ForwarderTopic: forwarderTopic, CloseTimeout: 5 * time.Second})
	if err != nil {
		return err
	}
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	stopped := make(chan struct{})
	var runErr error
	go func() { runErr = fwd.Run(fctx); close(stopped) }()
	total, err := waitKafkaRecords(kc, topic, n, 10*time.Minute, stopped)
	el := time.Since(start)
	_ = fwd.Close()
	cancel()
	<-stopped
	if err != nil {
		return errors.Join(err, runErr)
	}
	s.report("watermill_forwarder", "events_per_s", float64(n)/el.Seconds(), "events", n, "kafka_records", total,
		"subscriber", "watermill-sql/v4 mysql serializable", "mode", "at_least_once")
	return nil
}

// forwarderTables (re)creates the forwarder's watermill-sql tables with the privileged
// user (the application user has no DDL rights).
func forwarderTables(ctx context.Context, adminDSN string, schema wsql.DefaultMySQLSchema, offsets wsql.DefaultMySQLOffsetsAdapter, logger watermill.LoggerAdapter) error {
	admin, err := dbx.Open(ctx, dbx.Config{DSN: adminDSN, MaxOpenConns: 2})
	if err != nil {
		return err
	}
	defer admin.Close()
	for _, t := range []string{schema.MessagesTable(forwarderTopic), offsets.MessagesOffsetsTable(forwarderTopic)} {
		if _, err := admin.ExecContext(ctx, "DROP TABLE IF EXISTS "+t); err != nil {
			return err
		}
	}
	sub, err := wsql.NewSubscriber(wsql.BeginnerFromStdSQL(admin), wsql.SubscriberConfig{
		SchemaAdapter: schema, OffsetsAdapter: offsets, InitializeSchema: true,
	}, logger)
	if err != nil {
		return err
	}
	defer sub.Close()
	return sub.SubscribeInitialize(forwarderTopic)
}

// waitKafkaRecords waits until topic holds at least want records (the sum of its
// partitions' end offsets) and returns that sum.
func waitKafkaRecords(kc kafkax.Config, topic string, want int, limit time.Duration, stopped <-chan struct{}) (int64, error) {
	client, err := sarama.NewClient(kc.Brokers, kc.ConsumerConfig())
	if err != nil {
		return 0, kafkax.Unreachable(kc.Brokers, err)
	}
	defer client.Close()
	parts, err := client.Partitions(topic)
	if err != nil {
		return 0, err
	}
	deadline := time.Now().Add(limit)
	for {
		var total int64
		for _, p := range parts {
			off, err := client.GetOffset(topic, p, sarama.OffsetNewest)
			if err != nil {
				return 0, err
			}
			total += off
		}
		if total >= int64(want) {
			return total, nil
		}
		select {
		case <-stopped:
			return total, fmt.Errorf("forwarder stopped after %d of %d records", total, want)
		default:
		}
		if time.Now().After(deadline) {
			return total, fmt.Errorf("timed out after %s: %d of %d records in Kafka", limit, total, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
