// Package kafkax builds Sarama and watermill-kafka clients with the settings onceflow's
// guarantees depend on, and checks the cluster before anything is consumed or produced.
package kafkax

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"

	"github.com/onceflow/onceflow/internal/settings"
)

// Version is the protocol version spoken to the broker. Kafka 4.x has no request versions
// older than 2.1, so nothing lower works.
var Version = sarama.V3_6_0_0

// Config is the Kafka part of the router configuration. The tags declare the stock
// router's kafka.* settings with their key, default, range and help, as internal/settings
// reads them.
type Config struct {
	Brokers          []string      `key:"brokers" default:"127.0.0.1:9092" help:"bootstrap brokers"`
	TLS              TLS           `key:"tls"`  // TLS to the brokers, off by default
	SASL             SASL          `key:"sasl"` // SASL authentication, none by default
	ClientID         string        // default "onceflow"
	SessionTimeout   time.Duration `key:"session_timeout" default:"10s" range:"1s..30m" help:"consumer group session timeout"`
	RebalanceTimeout time.Duration `key:"rebalance_timeout" default:"30s" range:"1s..30m" help:"time a member has to rejoin during a rebalance"`
	HeartbeatEvery   time.Duration `key:"heartbeat" default:"1s" range:"100ms..1m" help:"consumer heartbeat interval; a member learns of a rebalance at its next heartbeat, so the partitions that move wait about this long"`
	// BalanceStrategies are the consumer groups' partition assignment strategies, the most
	// preferred first: "cooperative-sticky", "range" or both. With cooperative-sticky alone the
	// group rebalances incrementally (KIP-429). A member joining or leaving then stops only
	// the partitions that move, and every other partition is consumed on without a pause.
	// A list with range rebalances eagerly. Every rebalance then stops every partition of
	// every member until the group has a new assignment.
	//
	// A cooperative rebalance takes two joins of the group. The partitions that move are
	// revoked in the first and assigned to their new owner in the second, which the other
	// members learn of at their next heartbeat. So a moving partition waits up to about
	// HeartbeatEvery, and the others do not wait. See docs/BENCHMARKS.md, section
	// "kafka.balance_strategies cooperative-sticky".
	//
	// A live group changes from range to cooperative-sticky in two rolling restarts, as
	// with Kafka's Java client. Members that list cooperative-sticky alone have no strategy
	// in common with members that list range alone, and the broker refuses their join
	// while one of the others is in the group. So first every member is restarted with
	// "cooperative-sticky,range". The group stays eager and takes cooperative-sticky once
	// every member offers it. Then every member is restarted with "cooperative-sticky"
	// alone. Going back to range takes the same two steps, the second with "range".
	// NewSubscriber's member, the subscriber of kafka.window 1, rebalances eagerly with any
	// of them.
	BalanceStrategies []string `key:"balance_strategies" default:"cooperative-sticky" help:"consumer groups' partition assignment, most preferred first: cooperative-sticky (incremental: a router joining or leaving stops only the partitions that move) or range (eager: every rebalance stops every partition); a live group changes from one to the other in two rolling restarts, first cooperative-sticky,range on every router, then the new one alone; kafka.window 1 rebalances eagerly with either"`
	// MaxPollWait and FetchMinBytes are Kafka's fetch.max.wait.ms and fetch.min.bytes for the
	// subscribers. A fetch is answered once FetchMinBytes are there or MaxPollWait has
	// passed. At moderate load, a fetch answered at the first record carries a few records.
	// Every batch downstream is then as small, such as the inbox's transactions and the
	// relay's Kafka transactions. Waiting for more bytes costs some latency and saves CPU per
	// order. At full load fetches fill at once. See docs/BENCHMARKS.md, section
	// "kafka.fetch_min_bytes 64 KiB and kafka.max_poll_wait 20 ms".
	MaxPollWait   time.Duration `key:"max_poll_wait" default:"20ms" range:"1ms..30s" help:"fetch max wait: how long a fetch waits for kafka.fetch_min_bytes (and, with nothing to read, for anything)"`
	FetchMinBytes int           `key:"fetch_min_bytes" default:"65536" range:"1..67108864" help:"bytes a subscriber's fetch waits for, up to kafka.max_poll_wait, before the broker answers (Kafka's fetch.min.bytes); 1 answers at the first record: lower latency, smaller batches, more CPU per order"`
	DialTimeout   time.Duration // default 5s
}

// WithDefaults returns c with its zero fields set to their defaults. Validate then checks
// it. outbox.RelayConfig follows the same convention.
func (c Config) WithDefaults() Config {
	c.setDefaults()
	return c
}

func (c *Config) setDefaults() {
	settings.SetDefaults(c)
	if c.ClientID == "" {
		c.ClientID = "onceflow"
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = 5 * time.Second
	}
}

// Validate checks the settings' ranges, the broker list and the security settings. It only
// checks, so call WithDefaults first.
func (c *Config) Validate() error {
	if err := settings.Check(c); err != nil {
		return fmt.Errorf("kafka: %w", err)
	}
	for _, b := range c.Brokers {
		if !strings.Contains(b, ":") {
			return fmt.Errorf("kafka broker %q: expected host:port", b)
		}
	}
	if c.HeartbeatEvery >= c.SessionTimeout {
		return fmt.Errorf("kafka heartbeat (%s) must be shorter than the session timeout (%s)", c.HeartbeatEvery, c.SessionTimeout)
	}
	if err := checkBalanceStrategies(c.BalanceStrategies); err != nil {
		return err
	}
	return c.CheckSecurity()
}

// The balance strategies a Config accepts in kafka.balance_strategies.
const (
	// cooperativeSticky is Kafka's cooperative-sticky assignor. It rebalances
	// incrementally, and a partition that keeps its owner is never revoked.
	cooperativeSticky = sarama.CooperativeStickyBalanceStrategyName
	// rangeStrategy is Sarama's range assignor, which rebalances eagerly.
	rangeStrategy = sarama.RangeBalanceStrategyName
)

func checkBalanceStrategies(names []string) error {
	if len(names) == 0 {
		return errors.New("kafka.balance_strategies is empty: want cooperative-sticky, range, or cooperative-sticky,range")
	}
	for i, n := range names {
		if n != cooperativeSticky && n != rangeStrategy {
			return fmt.Errorf("kafka.balance_strategies: %q is none of cooperative-sticky and range", n)
		}
		if slices.Contains(names[:i], n) {
			return fmt.Errorf("kafka.balance_strategies: %q is listed twice", n)
		}
	}
	return nil
}

// Cooperative reports whether c's consumer groups rebalance incrementally. That is when
// cooperative-sticky is the only strategy.
func (c Config) Cooperative() bool {
	return len(c.BalanceStrategies) == 1 && c.BalanceStrategies[0] == cooperativeSticky
}

// eager is names with range after them when they lack it, which makes Sarama rebalance
// eagerly while the member still joins a group of names.
func eager(names []string) []string {
	if slices.Contains(names, rangeStrategy) {
		return names
	}
	return append(slices.Clone(names), rangeStrategy)
}

// balanceStrategies returns new instances of the strategies named. The cooperative-sticky
// strategy keeps state of its group, so each consumer group gets its own instance.
func balanceStrategies(names []string) []sarama.BalanceStrategy {
	out := make([]sarama.BalanceStrategy, 0, len(names))
	for _, n := range names {
		switch n {
		case cooperativeSticky:
			out = append(out, sarama.NewBalanceStrategyCooperativeSticky())
		case rangeStrategy:
			out = append(out, sarama.NewBalanceStrategyRange())
		}
	}
	return out
}

func (c Config) base() *sarama.Config {
	sc := sarama.NewConfig()
	sc.Version = Version
	sc.ClientID = c.ClientID
	sc.Net.DialTimeout = c.DialTimeout
	sc.Net.ReadTimeout = 30 * time.Second
	sc.Net.WriteTimeout = 30 * time.Second
	sc.Metadata.Retry.Max = 3
	sc.Metadata.Retry.Backoff = 250 * time.Millisecond
	sc.MetricRegistry = NoMetrics
	if err := c.applySecurity(sc); err != nil {
		sc.Net.Proxy.Enable = true
		sc.Net.Proxy.Dialer = failDialer{err}
	}
	return sc
}

// SaramaConfig is the base Sarama config of c, for a client of a kind this package does
// not build. It holds the version, client id, timeouts, TLS and SASL.
func (c Config) SaramaConfig() *sarama.Config { return c.base() }

// ConsumerConfig is the Sarama config of a consumer of the router's topics. It leaves out
// FetchMinBytes, so it serves a reader of a partition to its end. subscriberConfig adds it
// for the subscribers.
//
// Offsets are marked only when the handler acks, after its database commit. Sarama commits
// them in the background. So a crash re-delivers at most the last second of messages, which
// the inbox absorbs. A new group starts at the oldest offset, so nothing produced before
// the first start is skipped.
//
// Its consumer group rebalances with BalanceStrategies, instances of its own. Sarama's
// cooperative-sticky strategy must not serve two consumer groups, so a config serves one.
func (c Config) ConsumerConfig() *sarama.Config {
	sc := c.base()
	sc.Consumer.Return.Errors = true
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	sc.Consumer.Offsets.AutoCommit.Enable = true
	sc.Consumer.Offsets.AutoCommit.Interval = time.Second
	sc.Consumer.Group.Session.Timeout = c.SessionTimeout
	sc.Consumer.Group.Rebalance.Timeout = c.RebalanceTimeout
	sc.Consumer.Group.Heartbeat.Interval = c.HeartbeatEvery
	sc.Consumer.Group.Rebalance.GroupStrategies = balanceStrategies(c.WithDefaults().BalanceStrategies)
	sc.Consumer.MaxWaitTime = c.MaxPollWait
	sc.Consumer.IsolationLevel = sarama.ReadCommitted
	// What Sarama reads ahead of a partition's consumer waits in this channel, and in one
	// fetch response, whatever its size. The ParallelSubscriber's feed charges it to its
	// byte budget. For the other consumers, 32 records instead of Sarama's 256 keep it small
	// for big records.
	sc.ChannelBufferSize = ConsumerChannelBuffer
	sc.Consumer.Fetch.Default = ConsumerFetchBytes
	return sc
}

// subscriberConfig is ConsumerConfig with FetchMinBytes. The subscribers' fetches wait for
// it. A reader of a partition to its end does not, such as the relay's positions reader or
// a read-back.
func (c Config) subscriberConfig() *sarama.Config {
	sc := c.ConsumerConfig()
	sc.Consumer.Fetch.Min = int32(max(c.FetchMinBytes, 1))
	return sc
}

// ConsumerChannelBuffer is the records Sarama buffers per consumed partition.
const ConsumerChannelBuffer = 32

// ConsumerFetchBytes is how much a fetch asks of each partition, where Sarama's default is
// 1 MiB. A fetch response and the records decoded from it are held until they all went into
// their partitions' channels. A record batch larger than this still comes whole, because
// Sarama asks again for the batch's size.
const ConsumerFetchBytes = 256 << 10

// ProducerConfig is the config of an idempotent producer. It waits for all acks, keeps one
// request in flight and retries. A SendMessages call goes out as one produce request, up to
// Flush.MaxMessages. Otherwise Sarama flushes as fast as it can. With one request in
// flight, the first message of a batch would leave alone, and the rest would follow in more
// requests and round trips. Waiting up to FlushWait for the batch to be buffered costs one
// call that much at most. A caller sending one message per call should use
// PublisherConfig.
func (c Config) ProducerConfig() *sarama.Config {
	sc := c.base()
	sc.Producer.RequiredAcks = sarama.WaitForAll
	sc.Producer.Idempotent = true
	sc.Net.MaxOpenRequests = 1
	sc.Producer.Retry.Max = 10
	sc.Producer.Retry.Backoff = 200 * time.Millisecond
	sc.Producer.Return.Successes = true
	sc.Producer.Return.Errors = true
	sc.Producer.Partitioner = sarama.NewHashPartitioner
	sc.Producer.Flush.MaxMessages = 500
	sc.Producer.Flush.Frequency = FlushWait
	return sc
}

// PublisherConfig is ProducerConfig without the flush wait. It serves a caller that sends
// one message per call and waits for it, as Watermill's kafka Publisher does. For such a
// caller the wait only adds up to FlushWait per message, with nothing to batch.
func (c Config) PublisherConfig() *sarama.Config {
	sc := c.ProducerConfig()
	sc.Producer.Flush.Frequency = 0
	return sc
}

// FlushWait is how long a producer of ProducerConfig waits for the rest of a SendMessages
// batch before sending its first produce request.
const FlushWait = time.Millisecond

// NewSubscriber builds a watermill-kafka subscriber in consumer group group. It rebalances
// eagerly whatever BalanceStrategies says. It offers those strategies, and range after them
// when they lack it. So it joins a group of either strategy, and Sarama runs the eager
// protocol for it: its member gives up every partition at every rebalance, as a member of
// Kafka's Java client does while its group moves to cooperative-sticky. Under the
// cooperative protocol, watermill-kafka would learn that a partition was revoked only at the
// end of what Sarama had read for it, up to ConsumerChannelBuffer records. It would hand out
// each of those first and wait for its ack, one after another. With slow handlers that
// outlasts kafka.rebalance_timeout, and Sarama then ends the whole session. An eager
// rebalance waits for the one message in flight.
func (c Config) NewSubscriber(group string, logger watermill.LoggerAdapter) (*wkafka.Subscriber, error) {
	sc := c.subscriberConfig()
	sc.Consumer.Group.Rebalance.GroupStrategies = balanceStrategies(eager(c.WithDefaults().BalanceStrategies))
	return wkafka.NewSubscriber(wkafka.SubscriberConfig{
		Brokers:               c.Brokers,
		Unmarshaler:           wkafka.DefaultMarshaler{},
		OverwriteSaramaConfig: sc,
		ConsumerGroup:         group,
		NackResendSleep:       500 * time.Millisecond,
		ReconnectRetrySleep:   time.Second,
	}, logger)
}

// NewSyncProducer builds an idempotent synchronous producer.
func (c Config) NewSyncProducer() (sarama.SyncProducer, error) {
	p, err := sarama.NewSyncProducer(c.Brokers, c.ProducerConfig())
	if err != nil {
		return nil, Unreachable(c.Brokers, err)
	}
	return p, nil
}

// Unreachable wraps a connection error with what to do about it, on one line. It names a
// refused certificate or a failed authentication as such. The broker answered then, and
// starting it changes nothing. It names anything else as the broker being unreachable.
func Unreachable(brokers []string, err error) error {
	if cause := causeOf(err); cause != "" {
		return &SecurityError{Brokers: strings.Join(brokers, ","), Cause: cause, Err: err}
	}
	return &unreachableError{brokers: strings.Join(brokers, ","), err: err}
}

type unreachableError struct {
	brokers string
	err     error
}

func (e *unreachableError) Error() string {
	return "kafka " + e.brokers + " unreachable: " + oneLine(e.err.Error()) + " (start it with `scripts/infra.sh up`)"
}
func (e *unreachableError) Unwrap() error { return e.err }

// SecurityError is a connection that the brokers answered but refused, or that this side
// refused. TLS verification or SASL authentication failed. Its message is one line naming
// the brokers and the cause.
type SecurityError struct {
	Brokers string
	Cause   string
	Err     error
}

func (e *SecurityError) Error() string { return "kafka " + e.Brokers + ": " + e.Cause }
func (e *SecurityError) Unwrap() error { return e.Err }

// CheckTopicName validates a topic name the way Kafka does. A name has 1 to 249 characters
// of [A-Za-z0-9._-], and is neither "." nor "..".
func CheckTopicName(t string) error {
	ok := len(t) >= 1 && len(t) <= 249 && t != "." && t != ".."
	for i := 0; ok && i < len(t); i++ { // a loop, not a regexp, since the outbox checks every event
		c := t[i]
		ok = 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-'
	}
	if !ok {
		return fmt.Errorf("invalid kafka topic name %q", t)
	}
	return nil
}

// ErrMissingTopic is returned by CheckTopics for a topic the cluster does not have.
var ErrMissingTopic = errors.New("kafka topic does not exist")

// CheckTopics connects to the cluster and verifies that every topic exists. Topics are not
// auto-created, so a typo cannot silently create an empty topic that nobody produces to.
func (c Config) CheckTopics(topics ...string) (map[string]int, error) {
	client, err := sarama.NewClient(c.Brokers, c.base())
	if err != nil {
		return nil, Unreachable(c.Brokers, err)
	}
	defer client.Close()
	existing, err := client.Topics()
	if err != nil {
		return nil, Unreachable(c.Brokers, err)
	}
	have := map[string]bool{}
	for _, t := range existing {
		have[t] = true
	}
	parts := map[string]int{}
	for _, t := range topics {
		if err := CheckTopicName(t); err != nil {
			return nil, err
		}
		if !have[t] {
			return nil, fmt.Errorf("%w: %q on %s (create it: `scripts/infra.sh up` creates the default topics, or kafka-topics.sh --create --topic %s)", ErrMissingTopic, t, strings.Join(c.Brokers, ","), t)
		}
		ps, err := client.Partitions(t)
		if err != nil {
			return nil, fmt.Errorf("kafka topic %q partitions: %w", t, err)
		}
		parts[t] = len(ps)
	}
	return parts, nil
}

// TopicRetention returns retention.ms of a topic. -1 means infinite.
func (c Config) TopicRetention(topic string) (time.Duration, error) {
	admin, err := sarama.NewClusterAdmin(c.Brokers, c.base())
	if err != nil {
		return 0, Unreachable(c.Brokers, err)
	}
	defer admin.Close()
	entries, err := admin.DescribeConfig(sarama.ConfigResource{Type: sarama.TopicResource, Name: topic, ConfigNames: []string{"retention.ms"}})
	if err != nil {
		return 0, fmt.Errorf("describe topic %q: %w", topic, err)
	}
	for _, e := range entries {
		if e.Name == "retention.ms" {
			var ms int64
			if _, err := fmt.Sscan(e.Value, &ms); err != nil {
				return 0, fmt.Errorf("topic %q retention.ms %q: %w", topic, e.Value, err)
			}
			if ms < 0 {
				return -1, nil
			}
			return time.Duration(ms) * time.Millisecond, nil
		}
	}
	return 0, fmt.Errorf("topic %q: retention.ms not reported", topic)
}
