package kafkax

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/internal/chanx"
	"github.com/onceflow/onceflow/internal/msgsource"
	"github.com/onceflow/onceflow/internal/settings"
)

// ParallelConfig tunes a ParallelSubscriber. The tags declare the stock router's
// kafka.window and kafka.max_in_flight_bytes, as internal/settings reads them.
type ParallelConfig struct {
	// Window is the most messages of one partition handed out beyond the partition's
	// marked offset, the offset that may be committed. It is the span from the oldest
	// un-acked message to the newest message handed out. It bounds the un-acked messages
	// per partition. It also bounds how many messages a crash can redeliver, beyond those
	// acked within the last auto-commit interval: the messages acked past the marked
	// offset are committed with it, in its metadata (acked.go). Handlers that wait on slow
	// calls inside the window need a large one. See docs/BENCHMARKS.md, section
	// "kafka.window 1024, kafka.max_in_flight_bytes 64 MiB and runtime.gogc 100".
	Window int `key:"window" default:"1024" range:"1..100000" help:"most un-acked messages handed out per partition at once (per-key order kept; offsets committed only past acked messages, with those acked beyond in the commit's metadata, so a rebalance or a crash redelivers only those un-acked at the last commit, at most this many per partition); 1: watermill-kafka's one-at-a-time subscriber"`
	// NackResendSleep is how long a nacked message waits before it is handed out again. The
	// default is 100ms, as in watermill-kafka. A negative value means no wait.
	NackResendSleep time.Duration
	// MaxInFlightBytes bounds the bytes of the records read from Kafka and not yet acked. A
	// record counts its value, key and headers plus RecordOverhead. It counts from the
	// moment Sarama puts the record in its channel of the partition. So many small records
	// may wait on slow calls while few big ones do. MaxInFlightBytes is ignored when Budget
	// is set.
	MaxInFlightBytes int64 `key:"max_in_flight_bytes" default:"67108864" range:"1..1099511627776" help:"one budget for the router: bytes of the records read from Kafka and not acked, read ahead or handed out (value, key, headers and 8 KiB each), so many small records wait on slow calls while few big ones do; a value over inbox.max_payload_bytes waits cut to its quarantine form"`
	// Budget, when set, is a byte budget shared with other subscribers, one for a router.
	// It replaces a budget of MaxInFlightBytes for this subscriber alone.
	Budget *Budget
	// IdleAfter is how long every claim of a subscription must have read and held nothing
	// before the subscription stops fetching. IdlePoll is how long the fetch that watches an
	// idle subscription's partitions waits at the broker for a record. See idle.go.
	IdleAfter time.Duration `key:"idle_after" default:"1s" range:"0..1h" zero:"-1ns" help:"a subscription whose partitions read and held nothing this long stops fetching; one fetch per broker then watches them, answered at their first record; 0 always fetches"`
	IdlePoll  time.Duration `key:"idle_poll" default:"1s" range:"10ms..10s" help:"how long the fetch watching an idle subscription's partitions waits at the broker for a record before it is sent again"`
	// MaxValueBytes cuts a record value longer than this as soon as it is read, before it
	// waits in the window. The message's payload is then a copy of its first bytes, at most
	// msgsource.CutPrefixBytes. Its context carries the value's size and sha256, which
	// msgsource.CutFrom reads, so that the inbox can quarantine it. 0 never cuts.
	MaxValueBytes int
}

const (
	defaultNackResendSleep = 100 * time.Millisecond
	reconnectRetrySleep    = time.Second
)

// WithDefaults returns pc with its zero settings set to their defaults, as
// NewParallelSubscriber uses it. The stock router's kafka.window default is its Window.
func (pc ParallelConfig) WithDefaults() ParallelConfig {
	pc.setDefaults()
	return pc
}

func (pc *ParallelConfig) setDefaults() {
	settings.SetDefaults(pc)
	if pc.NackResendSleep == 0 {
		pc.NackResendSleep = defaultNackResendSleep
	}
}

// Validate reports a setting outside its range. It only checks, so call WithDefaults first.
func (pc ParallelConfig) Validate() error {
	if err := settings.Check(pc); err != nil {
		return fmt.Errorf("kafka: %w", err)
	}
	if pc.MaxValueBytes < 0 {
		return fmt.Errorf("kafka: max value bytes %d is negative", pc.MaxValueBytes)
	}
	return nil
}

// ParallelSubscriber is a Watermill subscriber for a Kafka consumer group that hands out
// many un-acked messages per partition at once. watermill-kafka's subscriber hands out one
// at a time. So a handler can collect concurrent deliveries into one database transaction.
//
// It guarantees the following for each claimed partition.
//   - At most ParallelConfig.Window messages are handed out beyond the marked offset.
//   - A message may have the same record key as an earlier message of the partition that is
//     still un-acked. It is then not handed out until that one is acked. It waits in its
//     place in the window while the read loop goes on with other keys. So the first
//     deliveries of one key's messages are in offset order and never concurrent. One slow
//     key holds back only its own later messages. Messages with an empty key have no
//     ordering constraint.
//   - The offset marked for commit is always just past the highest contiguous run of acked
//     messages, and never past an un-acked one. Sarama commits marked offsets in the
//     background, and once more when a session ends.
//   - A nacked message is handed out again after NackResendSleep, as a fresh
//     *message.Message with the same UUID, payload, metadata and context. It keeps its
//     place in the window and its key.
//
// Every record read counts against the byte budget, Budget, from the moment Sarama puts it
// in its channel of the partition. The feed does that accounting. Once the budget is spent,
// Sarama's goroutine of the partition waits there. Its broker consumer then sends no further
// fetch, and nothing more is read until an ack frees bytes. Outside the budget, the client
// holds at most one fetch response per broker, because Sarama hands it to the partitions
// before it fetches again. A claim with a full window may not take its channel's records for
// Sarama's MaxProcessingTime. The client then also holds the rest of one response for that
// partition. A response is at most responseBytes of the budget, or one record batch when a
// batch alone is bigger.
//
// A subscription whose claims read and held nothing for ParallelConfig.IdleAfter pauses
// them and watches their partitions with one fetch per broker of its own. Their next record
// resumes them.
//
// Each message's context carries its topic, partition and offset, set by msgsource.With and
// read by engine.SourceOf. The context derives from the Subscribe context. It is cancelled
// when the partition's claim is over or the subscriber closes. The watermill-kafka context
// values, such as kafka.MessagePartitionFromCtx, are not set.
//
// How a rebalance ends claims depends on Config.BalanceStrategies. With cooperative-sticky
// alone, a rebalance revokes only the partitions that move to another member. The claims of
// the others run on, with their windows, their messages in flight and their marked offsets.
// Sarama tells a revoked claim by closing its channel of records, and the claim learns it
// when its read loop next takes from that channel. The records Sarama had put in the
// channel before, at most ConsumerChannelBuffer, are handed out first. A read loop waiting
// for room in the window or in the budget learns it once an ack makes room. When no ack
// comes within the rebalance timeout, as while the handlers wait for an open breaker,
// Sarama ends the session, and every claim with it. With an eager strategy, every rebalance
// ends the session and every claim with it, and each read loop learns it at once from the
// session's context.
//
// When a claim ends because of a rebalance, nothing more is handed out. The claim waits up
// to half the rebalance timeout for the messages in flight to be acked or nacked, and marks
// their offsets. Sarama commits the marks before the partition moves: for a revoked
// partition once its claim returns, and at the end of an eager session. So the next owner
// starts after every message acked in time. Messages still un-acked after that are
// abandoned, and so are those on Close, which does not wait. Acks arriving later are
// ignored. Those messages and everything after them in the partition are redelivered to the
// next owner, possibly while the old handler is still running them. That is at-least-once
// delivery with possible reordering across owners. The inbox absorbs the duplicates.
type ParallelSubscriber struct {
	brokers    []string
	group      string
	sarama     *sarama.Config // each subscription's consumer uses a copy with its feed and strategies
	strategies []string       // Config.BalanceStrategies, instantiated for each consumer group
	pc         ParallelConfig
	budget     *Budget
	grace      time.Duration
	logger     watermill.LoggerAdapter

	mu      sync.Mutex
	closed  bool
	closing chan struct{}
	wg      sync.WaitGroup

	claimsMu sync.Mutex
	claims   map[*claimRun]struct{} // the partitions claimed now, for PartitionStats

	sweeps     atomic.Int64 // sweeps of the claims' windows (sweepOnce), which the tests count
	idlePauses atomic.Int64 // claims the idler paused, which the tests count

	skippedAcked    atomic.Int64 // messages not handed out again, acked by an earlier claim
	noAckedMetadata bool         // write and read no acked messages past the offsets (tests)
	ackedRefused    atomic.Bool  // the broker refused their metadata: none written any more
}

var _ message.Subscriber = (*ParallelSubscriber)(nil)

// NewParallelSubscriber builds a ParallelSubscriber in consumer group group. It has the
// Sarama settings of NewSubscriber, from subscriberConfig, and rebalances with
// Config.BalanceStrategies as they are. It reads committed records, starts a new group at
// the oldest offset and commits marked offsets in the background. Its fetches wait for
// kafka.fetch_min_bytes. Its fetch responses carry at most responseBytes of its budget. A
// nil logger logs nothing.
func (c Config) NewParallelSubscriber(group string, pc ParallelConfig, logger watermill.LoggerAdapter) (*ParallelSubscriber, error) {
	if group == "" {
		return nil, errors.New("kafkax: parallel subscriber needs a consumer group")
	}
	c = c.WithDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	pc.setDefaults()
	if err := pc.Validate(); err != nil {
		return nil, err
	}
	budget := pc.Budget
	if budget == nil {
		budget = NewBudget(pc.MaxInFlightBytes)
	}
	sc := c.subscriberConfig()
	sc.Consumer.Fetch.MaxBytes = responseBytes(budget.Limit())
	if err := sc.Validate(); err != nil {
		return nil, fmt.Errorf("kafkax: consumer config: %w", err)
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	return &ParallelSubscriber{
		brokers:    c.Brokers,
		group:      group,
		sarama:     sc,
		strategies: c.BalanceStrategies,
		pc:         pc,
		budget:     budget,
		grace:      sc.Consumer.Group.Rebalance.Timeout / 2,
		logger:     logger.With(watermill.LogFields{"subscriber_uuid": watermill.NewShortUUID()}),
		closing:    make(chan struct{}),
		claims:     map[*claimRun]struct{}{},
	}, nil
}

// Subscribe joins the consumer group for topic and returns the channel messages are handed
// out on. The channel is closed when ctx is done or the subscriber is closed. Connection
// and consume errors after the first connection are logged and followed by a reconnect.
func (s *ParallelSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if err := CheckTopicName(topic); err != nil {
		return nil, err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, errors.New("kafkax: parallel subscriber closed")
	}
	s.wg.Add(2) // the consumer and its idler
	s.mu.Unlock()

	logFields := watermill.LogFields{
		"provider":            "kafka",
		"topic":               topic,
		"consumer_group":      s.group,
		"kafka_consumer_uuid": watermill.NewShortUUID(),
	}
	s.logger.Info("Subscribing to Kafka topic (parallel)", logFields.Add(watermill.LogFields{"balance_strategies": strings.Join(s.strategies, ",")}))
	f := newFeed(s, topic)
	sc := *s.sarama
	sc.Consumer.Interceptors = []sarama.ConsumerInterceptor{f}
	group, err := s.newGroup(&sc)
	if err != nil {
		s.wg.Add(-2)
		return nil, Unreachable(s.brokers, err)
	}
	// The channel is unbuffered, as in watermill-kafka. So nothing is taken from Kafka that
	// nobody receives.
	output := make(chan *message.Message)
	go func() {
		defer s.wg.Done()
		defer close(output)
		s.run(ctx, f, &sc, output, group, logFields)
	}()
	go func() {
		defer s.wg.Done()
		s.runIdler(ctx, f)
	}()
	return output, nil
}

// newGroup makes a subscription's consumer group client, a new member of the group, with
// new instances of the balance strategies. It coordinates the group (joins, syncs,
// heartbeats and offset commits) over connections of its own, apart from its fetches. A
// broker answers the requests of one connection one at a time, in order. A join waits there
// until every member has rejoined, which takes up to a heartbeat interval, twice in a
// cooperative rebalance. Fetches queued behind it would wait as long, and the partitions a
// cooperative rebalance keeps would stop with the others.
func (s *ParallelSubscriber) newGroup(sc *sarama.Config) (sarama.ConsumerGroup, error) {
	sc.Consumer.Group.Rebalance.GroupStrategies = balanceStrategies(s.strategies)
	fetch, err := sarama.NewClient(s.brokers, sc)
	if err != nil {
		return nil, err
	}
	coord, err := sarama.NewClient(s.brokers, sc)
	if err != nil {
		_ = fetch.Close()
		return nil, err
	}
	g, err := sarama.NewConsumerGroupFromClient(s.group, coordinatedClient{Client: fetch, coord: coord})
	if err != nil {
		_ = coord.Close()
		_ = fetch.Close()
		return nil, err
	}
	return &ownGroup{ConsumerGroup: g, clients: []sarama.Client{fetch, coord}}, nil
}

// coordinatedClient is the client of a consumer group, which fetches through Client and
// reaches the group's coordinator through coord.
type coordinatedClient struct {
	sarama.Client
	coord sarama.Client
}

func (c coordinatedClient) Coordinator(group string) (*sarama.Broker, error) {
	return c.coord.Coordinator(group)
}

func (c coordinatedClient) RefreshCoordinator(group string) error {
	return c.coord.RefreshCoordinator(group)
}

// ownGroup is a consumer group made from clients of its own, which Close closes after it
// left the group.
type ownGroup struct {
	sarama.ConsumerGroup
	clients []sarama.Client
}

func (g *ownGroup) Close() error {
	err := g.ConsumerGroup.Close()
	for _, c := range g.clients {
		if e := c.Close(); err == nil && !errors.Is(e, sarama.ErrClosedClient) {
			err = e
		}
	}
	return err
}

// responseBytes is the most a fetch response may carry for a budget of limit bytes. It sets
// Sarama's Consumer.Fetch.MaxBytes, Kafka's fetch.max.bytes. It is a sixteenth of limit, at
// least one partition's fetch of ConsumerFetchBytes, and at most Sarama's default of 50 MiB.
// A record batch bigger than that alone still comes whole.
func responseBytes(limit int64) int32 {
	return int32(min(max(limit/16, ConsumerFetchBytes), 50<<20))
}

// Close stops every subscription, closes their channels and returns once every goroutine
// is done. Offsets of messages acked before Close are committed. Messages still un-acked
// are abandoned and redelivered to the group's next consumer.
func (s *ParallelSubscriber) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.closing)
	s.mu.Unlock()
	s.wg.Wait()
	s.logger.Debug("Parallel Kafka subscriber closed", nil)
	return nil
}

func (s *ParallelSubscriber) done(ctx context.Context) bool {
	select {
	case <-s.closing:
		return true
	case <-ctx.Done():
		return true
	default:
		return false
	}
}

// run consumes with group until ctx is done or the subscriber closes, reconnecting with
// a new consumer group client after an error. The new client is a new member of the group,
// with new strategy instances.
func (s *ParallelSubscriber) run(ctx context.Context, f *feed, sc *sarama.Config, output chan<- *message.Message, group sarama.ConsumerGroup, logFields watermill.LogFields) {
	for {
		s.consume(ctx, f, output, group, logFields)
		if s.done(ctx) {
			return
		}
		s.logger.Info("Reconnecting consumer", logFields)
		for {
			select {
			case <-s.closing:
				return
			case <-ctx.Done():
				return
			case <-time.After(reconnectRetrySleep):
			}
			var err error
			if group, err = s.newGroup(sc); err == nil {
				break
			}
			s.logger.Error("Cannot reconnect messages consumer", err, logFields)
		}
	}
}

// consume runs group.Consume sessions until an error, ctx or Close. It then closes group,
// which leaves the consumer group after the last session committed its offsets.
func (s *ParallelSubscriber) consume(ctx context.Context, f *feed, output chan<- *message.Message, group sarama.ConsumerGroup, logFields watermill.LogFields) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.closing:
			cancel()
		case <-ctx.Done():
		}
	}()

	errCtx, stopErrs := context.WithCancel(context.Background())
	errsDone := make(chan struct{})
	go func() {
		defer close(errsDone)
		errs := group.Errors()
		for {
			select {
			case err, ok := <-errs:
				if !ok {
					return
				}
				if errors.Is(err, sarama.ErrOffsetMetadataTooLarge) {
					s.refuseAcked(logFields)
					continue
				}
				if err != nil {
					s.logger.Error("Sarama consumer group error", err, logFields)
				}
			case <-errCtx.Done():
				return
			}
		}
	}()

	h := &parallelHandler{s: s, feed: f, ctx: ctx, output: output, logFields: logFields}
	if og, ok := group.(*ownGroup); ok {
		h.coord = og.clients[1]
	}
	for ctx.Err() == nil {
		// With an eager strategy Consume returns after every rebalance and is called again, as
		// in watermill-kafka. With cooperative-sticky one session goes on across rebalances,
		// and Consume returns only when it ends.
		if err := group.Consume(ctx, []string{f.topic}, h); err != nil {
			if ctx.Err() == nil {
				s.logger.Error("Group consume error", err, logFields)
			}
			break
		}
	}

	stopErrs()
	<-errsDone
	if err := group.Close(); err != nil {
		s.logger.Info("Group close with error", logFields.Add(watermill.LogFields{"err": err.Error()}))
	}
	s.logger.Info("Consuming done", logFields)
}

// parallelHandler is the sarama.ConsumerGroupHandler of one subscription.
type parallelHandler struct {
	s         *ParallelSubscriber
	feed      *feed
	ctx       context.Context // cancelled on Close or when the Subscribe context ends
	output    chan<- *message.Message
	logFields watermill.LogFields
	coord     sarama.Client // the group's coordinating client, for the metadata committed with its offsets; nil: none read
}

// Setup opens the read-ahead of every partition of the session before Sarama starts
// consuming any of them, so that their first records are charged too. A cooperative session
// calls Setup once, at its first assignment. A partition it gains later opens its
// read-ahead as its claim starts. Records Sarama put in the channel before that are charged
// by the claim as it takes them.
func (h *parallelHandler) Setup(sess sarama.ConsumerGroupSession) error {
	for _, p := range sess.Claims()[h.feed.topic] {
		h.feed.open(p, sess.Context())
	}
	return nil
}

// Cleanup closes the read-ahead of partitions whose claim never started. It runs once the
// session's last claim returned. A claim closes its own read-ahead when it stops reading,
// whether its session ended or its partition alone was revoked.
func (h *parallelHandler) Cleanup(sarama.ConsumerGroupSession) error {
	h.feed.closeAll()
	return nil
}

func (h *parallelHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	ctx, cancel := context.WithCancel(h.ctx)
	r := &claimRun{
		h:         h,
		sess:      sess,
		claim:     claim,
		ahead:     h.feed.open(claim.Partition(), sess.Context()),
		topic:     claim.Topic(),
		partition: claim.Partition(),
		window:    h.s.pc.Window,
		logFields: h.logFields.Copy().Add(watermill.LogFields{
			"kafka_partition":      claim.Partition(),
			"kafka_initial_offset": claim.InitialOffset(),
		}),
		ctx:       ctx,
		cancel:    cancel,
		stop:      sess.Context().Done(),
		ending:    make(chan struct{}),
		abandon:   make(chan struct{}),
		busyKeys:  map[string]*slot{},
		waiting:   map[string][]waitingMsg{},
		changed:   make(chan struct{}, 1),
		sweepWake: make(chan struct{}, 1),
		marked:    max(claim.InitialOffset(), -1), // Sarama's OffsetOldest or OffsetNewest, below 0, is not known yet
	}
	r.idle.lastMark = r.marked
	if r.skip = h.committedAcked(r.topic, r.partition, claim.InitialOffset(), r.logFields); len(r.skip) > 0 {
		var acked int64
		for _, a := range r.skip {
			acked += a.last - a.first + 1
		}
		h.s.logger.Info("Partition claimed with messages acked past its committed offset; they are not handed out again",
			r.logFields.Add(watermill.LogFields{"acked_offsets": acked, "acked_runs": len(r.skip), "acked_from": r.skip[0].first, "acked_to": r.skip[len(r.skip)-1].last}))
	}
	h.s.track(r)
	defer h.s.untrack(r)
	return r.run(claim.Messages())
}

// slot is one message of a claimed partition that is handed out, or about to be.
type slot struct {
	r       *claimRun
	offset  int64
	cost    int64 // charged to the budget until settled
	key     string
	keyed   bool
	since   time.Time        // when it took its place in the window, just before it was handed out
	msg     *message.Message // as handed out, its latest copy after a nack, nil once acked
	out     bool             // handed out, so its ack is looked for
	watched bool             // a goroutine of its own watches it, and sweep leaves it alone
	acked   bool
	settled bool // acked, never handed out, or abandoned by a nack after the claim ended
	ctx     slotContext
}

// slotContext is a message's context. It is the source's context, and it answers slotKey{}
// with its slot for AckOnReturn. It answers msgsource.KeyQuery{} with the record's Kafka key,
// which the inbox notes on a poison row. So the slot needs no context node of its own.
type slotContext struct {
	context.Context
	sl *slot
}

func (c *slotContext) Value(key any) any {
	switch key {
	case slotKey{}:
		return c.sl
	case msgsource.KeyQuery{}:
		return c.sl.key
	}
	return c.Context.Value(key)
}

// sweepEvery and sweepIdleEvery set how a claim learns of acks and nacks. A goroutine per
// message waiting on its ack would cost more memory, with its stack, than the message
// itself. A handler wrapped in AckOnReturn tells the claim itself. Otherwise a sweep of the
// window finds them every sweepEvery. Once handlers have been telling the claim, the sweep
// runs only every sweepIdleEvery, as a safety net, because a sweep costs CPU for every
// message in flight. A message that was nacked, or whose key holds later ones back, gets a
// goroutine of its own. So its ack frees the key at once, or its resend comes at once.
// With no message handed out and unwatched, the sweep sleeps until one is handed out, so an
// idle claim wakes no goroutine.
const (
	sweepEvery     = 20 * time.Millisecond
	sweepIdleEvery = time.Second
)

type slotKey struct{}

// AckOnReturn is Watermill router middleware for the handlers of a ParallelSubscriber's
// messages. When the handler returns with nothing to publish, AckOnReturn acks the message,
// or nacks it on an error, as the router would right after. It tells the claim of the
// message's partition at once. Without it the subscriber finds acks by sweeping its window
// every 20 ms.
func AckOnReturn(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		if sl, ok := msg.Context().Value(slotKey{}).(*slot); ok && len(out) == 0 {
			settleSlot(msg, sl, err)
		}
		return out, err
	}
}

// Settle acks msg when err is nil, and nacks it otherwise. A consumer loop that reads a
// subscriber's channel without Watermill's router calls it once per message, once its
// handler is done. For a ParallelSubscriber's message it tells the claim at once, as
// AckOnReturn does; any other subscriber's message is only acked or nacked.
func Settle(msg *message.Message, err error) {
	if sl, ok := msg.Context().Value(slotKey{}).(*slot); ok {
		settleSlot(msg, sl, err)
		return
	}
	if err != nil {
		msg.Nack()
	} else {
		msg.Ack()
	}
}

func settleSlot(msg *message.Message, sl *slot, err error) {
	if err != nil {
		msg.Nack()
	} else {
		msg.Ack()
	}
	sl.r.returned(sl, err == nil)
}

// waitingMsg is a message in the window whose key is busy. It is handed out when the key
// is freed.
type waitingMsg struct {
	sl  *slot
	msg *message.Message
}

// claimRun is the state of one claimed partition for the lifetime of its claim.
type claimRun struct {
	h         *parallelHandler
	sess      sarama.ConsumerGroupSession
	claim     sarama.ConsumerGroupClaim
	ahead     *readAhead   // the records Sarama holds for the claim, charged to the budget
	admitting atomic.Int64 // the charge of the record read waits with for room in the window
	topic     string
	partition int32
	window    int
	logFields watermill.LogFields

	ctx     context.Context // parent of the messages' contexts
	cancel  context.CancelFunc
	stop    <-chan struct{} // closed when the session is over; a revoked claim learns it from its closed channel of records
	ending  chan struct{}   // closed when nothing more is handed out
	abandon chan struct{}   // closed when the claim stops waiting for acks

	mu        sync.Mutex
	queue     []*slot                 // handed out and not yet covered by the marked offset, in offset order
	marked    int64                   // the offset marked for commit, all before it acked, or -1 while not known
	busyKeys  map[string]*slot        // the slot of each key handed out and not acked yet
	waiting   map[string][]waitingMsg // keyed messages in the window behind a busy key, in offset order
	unsettled int
	changed   chan struct{} // a slot was acked or settled, with capacity 1 to coalesce

	watchers sync.WaitGroup // the sweep and the slots' own watchers
	told     atomic.Bool    // AckOnReturn has told of an ack or nack
	// sweepAsleep, under mu, is set when the sweep found nothing to look for and sleeps
	// until handOut sends on sweepWake (capacity 1).
	sweepAsleep bool
	sweepWake   chan struct{}

	idleMu sync.Mutex
	idle   idleState

	// The acked messages past the marked offset, written with it (acked.go). Under mu.
	ackedTimer *time.Timer  // marks them within ackedEvery, nil when not due
	ackedMD    string       // the metadata marked last with the marked offset
	ackedDone  bool         // the claim ended: nothing is marked any more
	skip       []ackedRange // acked by an earlier claim: not handed out again (read's alone)
}

func (r *claimRun) run(msgs <-chan *sarama.ConsumerMessage) error {
	defer r.cancel()
	r.h.s.logger.Debug("Partition claimed", r.logFields)
	r.watchers.Add(1)
	go r.sweep()
	err := r.read(msgs)
	r.stopReading()
	close(r.ending)
	r.drain() // messages waiting behind a key are still handed out as their keys free up
	r.settleWaiting()
	r.mu.Lock() // returned checks abandon and adds to the watchers under r.mu
	close(r.abandon)
	r.mu.Unlock()
	r.watchers.Wait()
	r.releaseAbandoned()
	r.stopAcked()
	r.h.s.logger.Debug("Partition claim done", r.logFields)
	return err
}

// read hands out the claim's messages until the claim or the session ends.
func (r *claimRun) read(msgs <-chan *sarama.ConsumerMessage) error {
	for {
		var km *sarama.ConsumerMessage
		select {
		case m, ok := <-msgs:
			if !ok {
				return nil
			}
			km = m
		case <-r.stop:
			return nil
		}
		if len(r.skip) > 0 && r.skipAcked(km.Offset) {
			if ch, charged := r.ahead.take(km); charged {
				r.h.s.budget.release(ch.cost)
			}
			if !r.admitAcked(&slot{r: r, offset: km.Offset}) {
				return nil
			}
			continue
		}
		ch, charged := r.ahead.take(km)
		if !charged {
			// The record was read before the feed met it, so it is charged here, once made a
			// message.
			ch = r.h.s.prepare(km)
			if ch.cost = r.h.s.budget.acquire(r.sess.Context(), ch.cost); ch.cost == 0 {
				return nil // the session ended while the record waited for the budget
			}
		}
		msg := ch.msg
		sl := &slot{r: r, offset: km.Offset, key: ch.key, keyed: ch.key != "", cost: ch.cost}
		ctx := msgsource.With(r.ctx, msgsource.Source{Topic: km.Topic, Partition: km.Partition, Offset: km.Offset})
		if ch.cut != nil {
			ctx = msgsource.WithCut(ctx, *ch.cut)
		}
		sl.ctx = slotContext{Context: ctx, sl: sl}
		msg.SetContext(&sl.ctx) // for AckOnReturn
		km = nil
		r.admitting.Store(sl.cost)
		out, ok := r.admit(sl, msg)
		r.admitting.Store(0)
		if !ok {
			r.h.s.budget.release(sl.cost)
			return nil
		}
		if out && !r.handOut(sl, msg, r.stop) {
			return nil
		}
	}
}

// unmarshal is watermill-kafka's DefaultMarshaler.Unmarshal, which takes the message id from
// its header and the other headers as metadata. unmarshal fills the metadata map that
// NewMessage makes, where Unmarshal makes a second one and drops the first. payload is the
// record's value as own returned it.
func unmarshal(km *sarama.ConsumerMessage, payload []byte) *message.Message {
	var id string
	for _, h := range km.Headers {
		if string(h.Key) == wkafka.UUIDHeaderKey {
			id = string(h.Value)
		}
	}
	msg := message.NewMessage(id, payload)
	for _, h := range km.Headers {
		if string(h.Key) != wkafka.UUIDHeaderKey {
			msg.Metadata.Set(string(h.Key), string(h.Value))
		}
	}
	return msg
}

// own returns the payload a record's value is handed out with. It is a copy, so that no
// message pins the fetch response its value was decoded from. For a value over
// MaxValueBytes, it is a copy of the first bytes, and own also returns the value's size and
// sha256.
func (s *ParallelSubscriber) own(v []byte) ([]byte, *msgsource.Cut) {
	if n := s.ownedLen(len(v)); n < len(v) {
		return bytes.Clone(v[:n]), &msgsource.Cut{Size: len(v), SHA256: sha256.Sum256(v)}
	}
	return bytes.Clone(v), nil // a nil tombstone stays nil
}

// ownedLen is the length own gives a value of n bytes.
func (s *ParallelSubscriber) ownedLen(n int) int {
	if limit := s.pc.MaxValueBytes; limit > 0 && n > limit {
		return min(limit, msgsource.CutPrefixBytes)
	}
	return n
}

// recordCost is what a record with a value of valueLen bytes costs the budget. It counts
// the value, the key and headers, and RecordOverhead.
func recordCost(valueLen int, km *sarama.ConsumerMessage) int64 {
	n := valueLen + len(km.Key) + RecordOverhead
	for _, h := range km.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return int64(n)
}

// releaseAbandoned gives back the budget of the messages that no ack settled before the
// claim stopped watching them. Their handlers may still be running, but the messages are
// redelivered to the next owner anyway.
func (r *claimRun) releaseAbandoned() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, sl := range r.queue {
		if !sl.settled {
			sl.settled = true
			r.unsettled--
			r.h.s.budget.release(sl.cost)
		}
	}
}

// admit waits until sl fits in the window and takes its place. Its first result reports
// whether sl is to be handed out now, because its key was free and is now taken. Otherwise
// sl waits behind its key. ok is false when the session ends first.
func (r *claimRun) admit(sl *slot, msg *message.Message) (handOut, ok bool) {
	for {
		r.mu.Lock()
		if len(r.queue) < r.window {
			sl.since = time.Now()
			if r.marked < 0 {
				// This is a new group's first message, and nothing before it is to be consumed.
				r.marked = sl.offset
			}
			r.queue = append(r.queue, sl)
			r.unsettled++
			busy := r.busyKeys[sl.key]
			switch {
			case !sl.keyed:
			case busy != nil:
				r.waiting[sl.key] = append(r.waiting[sl.key], waitingMsg{sl: sl, msg: msg})
				r.watchLocked(busy) // its ack frees sl, so notice it at once and not at the next sweep
			default:
				r.busyKeys[sl.key] = sl
			}
			r.mu.Unlock()
			return !(sl.keyed && busy != nil), true
		}
		r.mu.Unlock()
		select {
		case <-r.changed:
		case <-r.stop:
			return false, false
		}
	}
}

// handOut sends msg to the router. The sweep looks for its ack, or a goroutine of its own
// does while later messages of its key wait. When stop closes first, handOut returns false
// and leaves sl un-acked, so nothing past it is marked.
func (r *claimRun) handOut(sl *slot, msg *message.Message, stop <-chan struct{}) bool {
	r.mu.Lock()
	sl.msg, sl.out = msg, true
	if sl.keyed && len(r.waiting[sl.key]) > 0 {
		r.watchLocked(sl)
	}
	wake := r.sweepAsleep && !sl.watched
	if wake {
		r.sweepAsleep = false
	}
	r.mu.Unlock()
	if wake {
		select {
		case r.sweepWake <- struct{}{}:
		default:
		}
	}
	if chanx.TrySend(r.h.output, msg, stop) { // a send alone first, since a select locks both channels
		return true
	}
	select {
	case r.h.output <- msg:
		return true
	case <-stop:
		r.settle(sl) // never handed out, so it stays un-acked and nothing past it is marked
		return false
	}
}

// watchLocked gives sl, handed out and not acked, a goroutine of its own watching it. The
// caller holds r.mu.
func (r *claimRun) watchLocked(sl *slot) {
	if sl.out && !sl.watched && !sl.acked {
		sl.watched = true
		r.watchers.Add(1)
		go r.watch(sl, sl.msg)
	}
}

// sweep looks for acks and nacks of the messages no goroutine of their own watches, every
// sweepEvery (every sweepIdleEvery once AckOnReturn tells the claim of them), and once more
// when the claim stops waiting for acks. When a sweep leaves no message to look for, it
// sleeps until handOut hands one out.
func (r *claimRun) sweep() {
	defer r.watchers.Done()
	every := sweepEvery
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-r.abandon:
			r.sweepOnce()
			return
		}
		if r.told.Load() && every != sweepIdleEvery {
			every = sweepIdleEvery
			t.Reset(every)
		}
		if r.sweepOnce() {
			continue
		}
		t.Stop()
		select {
		case <-r.sweepWake:
		case <-r.abandon:
			r.sweepOnce()
			return
		}
		t.Reset(every)
	}
}

// sweepOnce acks the messages it finds acked and gives a nacked one a watcher. It reports
// whether a message is left to look for. When none is, it marks the sweep asleep under the
// same lock, so the next handOut wakes it.
func (r *claimRun) sweepOnce() (left bool) {
	r.h.s.sweeps.Add(1)
	var acked []*slot
	r.mu.Lock()
	for _, sl := range r.queue {
		if !sl.out || sl.watched || sl.acked {
			continue
		}
		select {
		case <-sl.msg.Acked():
			acked = append(acked, sl)
		case <-sl.msg.Nacked():
			r.watchLocked(sl) // its watcher resends it
		default:
			left = true
		}
	}
	r.sweepAsleep = !left
	r.mu.Unlock()
	for _, sl := range acked {
		r.ack(sl)
	}
	return left
}

// settleWaiting gives up the messages still waiting behind a busy key once the claim has
// drained. They stay un-acked, and the next owner reads them again.
func (r *claimRun) settleWaiting() {
	r.mu.Lock()
	var left []*slot
	for k, ws := range r.waiting {
		for _, w := range ws {
			left = append(left, w.sl)
		}
		delete(r.waiting, k)
	}
	r.mu.Unlock()
	for _, sl := range left {
		r.settle(sl)
	}
}

// returned is AckOnReturn's news that sl's message was acked or nacked. A watcher resends a
// nacked message. Once the claim stopped waiting for acks, returned changes nothing, as a
// late ack does not. An ack counts among the watchers while it runs. It may hand out the
// next message of its key, and run waits for it before the claim returns and the output
// channel may close.
func (r *claimRun) returned(sl *slot, acked bool) {
	r.told.Store(true)
	r.mu.Lock()
	select {
	case <-r.abandon: // run closes it under r.mu, so nothing is added once it waits
		r.mu.Unlock()
		return
	default:
	}
	if !acked {
		r.watchLocked(sl)
		r.mu.Unlock()
		return
	}
	r.watchers.Add(1)
	r.mu.Unlock()
	defer r.watchers.Done()
	r.ack(sl)
}

// watch waits for the message's ack or nack, resending after a nack.
func (r *claimRun) watch(sl *slot, msg *message.Message) {
	defer r.watchers.Done()
	for {
		select {
		case <-msg.Acked():
			r.ack(sl)
			return
		case <-msg.Nacked():
			var ok bool
			if msg, ok = r.resend(msg); !ok {
				r.settle(sl)
				return
			}
			r.mu.Lock()
			sl.msg = msg
			r.mu.Unlock()
		case <-r.abandon:
			select {
			case <-msg.Acked(): // acked before the claim gave up, such as just before Close
				r.ack(sl)
			default:
			}
			return
		}
	}
}

// resend hands out a copy of a nacked message after NackResendSleep, unless the claim is
// ending.
func (r *claimRun) resend(msg *message.Message) (*message.Message, bool) {
	r.h.s.logger.Trace("Message nacked, resending", r.logFields.Add(watermill.LogFields{"message_uuid": msg.UUID}))
	if d := r.h.s.pc.NackResendSleep; d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-r.ending:
			t.Stop()
			return nil, false
		}
	}
	cp := msg.Copy()
	cp.SetContext(msg.Context())
	select {
	case r.h.output <- cp:
		return cp, true
	case <-r.ending:
		return nil, false
	}
}

// ack records sl as acked and frees its key. It hands out the next message waiting for that
// key. It marks the offset after the longest acked prefix of the queue.
func (r *claimRun) ack(sl *slot) {
	r.mu.Lock()
	var next *waitingMsg
	if !sl.acked {
		sl.acked, sl.msg = true, nil
		if sl.keyed {
			delete(r.busyKeys, sl.key)
			if ws := r.waiting[sl.key]; len(ws) > 0 {
				w := ws[0]
				next = &w
				if len(ws) == 1 {
					delete(r.waiting, sl.key)
				} else {
					ws[0] = waitingMsg{}
					r.waiting[sl.key] = ws[1:]
				}
				r.busyKeys[sl.key] = next.sl
			}
		}
	}
	if !sl.settled {
		sl.settled = true
		r.unsettled--
		r.h.s.budget.release(sl.cost)
	}
	r.advanceLocked()
	if len(r.queue) > 0 && sl.offset > r.queue[0].offset {
		// sl stays in the queue, acked past an un-acked message: it is written with the
		// marked offset, so that the partition's next claim does not hand it out again.
		r.noteAckedLocked()
	}
	r.mu.Unlock()
	r.signal()
	if next != nil {
		// ack runs in the acked message's watcher, the sweep or returned, which keep the
		// watchers' count above zero. The next message is handed out while the claim drains
		// too, so that what the claim acks is contiguous.
		r.handOut(next.sl, next.msg, r.abandon)
	}
}

// advanceLocked drops the acked prefix of the queue and marks the offset past it. The
// caller holds r.mu. Marking a new offset drops the metadata marked with the one before,
// and the acked messages still past it are noted again.
func (r *claimRun) advanceLocked() {
	last := int64(-1)
	for len(r.queue) > 0 && r.queue[0].acked {
		last = r.queue[0].offset
		r.queue[0] = nil
		r.queue = r.queue[1:]
	}
	if last >= 0 {
		r.sess.MarkOffset(r.topic, r.partition, last+1, "")
		r.marked = last + 1
		if r.ackedMD != "" {
			r.ackedMD = ""
			if len(r.queue) > 0 {
				r.noteAckedLocked()
			}
		}
	}
}

// settle records that no ack is expected for sl any more.
func (r *claimRun) settle(sl *slot) {
	r.mu.Lock()
	if !sl.settled {
		sl.settled = true
		r.unsettled--
		r.h.s.budget.release(sl.cost)
	}
	r.mu.Unlock()
	r.signal()
}

func (r *claimRun) signal() {
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

// drain waits, after the claim stopped handing out, for the messages in flight to be acked
// or nacked. It waits up to half the rebalance timeout, and not at all on Close.
func (r *claimRun) drain() {
	if r.h.s.done(r.h.ctx) {
		return
	}
	timer := time.NewTimer(r.h.s.grace)
	defer timer.Stop()
	for {
		r.mu.Lock()
		n := r.unsettled
		r.mu.Unlock()
		if n == 0 {
			return
		}
		select {
		case <-r.changed:
		case <-timer.C:
			r.h.s.logger.Info("Claim ended with messages in flight; they will be redelivered", r.logFields.Add(watermill.LogFields{"in_flight": n}))
			return
		case <-r.h.s.closing:
			return
		case <-r.h.ctx.Done():
			return
		}
	}
}

// PartitionStat is a snapshot of one partition a ParallelSubscriber has claimed.
type PartitionStat struct {
	Group     string
	Topic     string
	Partition int32
	// HighWater is the offset the broker will give the partition's next record, as of the
	// claim's latest fetch. It is 0 before the first fetch.
	HighWater int64
	// Marked is the offset marked for commit. Every message before it was acked, and Sarama
	// commits it within a second. It is -1 while not known, which is the case for a group
	// with no committed offset before the partition's first message arrives.
	Marked int64
	// InFlight is the messages handed out, or about to be, and not acked yet.
	InFlight int
	// InFlightBytes is what they cost the subscriber's Budget, in bytes and RecordOverhead.
	InFlightBytes int64
	// ReadAhead is the records read from Kafka for the claim and not yet in its window. They
	// are in Sarama's channel, or taken by the claim and waiting for room in the window.
	// ReadAheadBytes is what they cost the Budget.
	ReadAhead      int
	ReadAheadBytes int64
	// OldestUnackedAge is how long ago the oldest of them was handed out the first time.
	// Nacks and resends do not reset it. It is 0 when none is in flight.
	OldestUnackedAge time.Duration
}

// Lag is how many offsets of the partition are past the marked offset. It is HighWater -
// Marked, and at least 0. ok is false while Marked is not known. On a topic written in
// Kafka transactions, the lag stays at 1 or more after the last transaction. Its commit
// marker takes an offset that no message is delivered for.
func (p PartitionStat) Lag() (n int64, ok bool) {
	if p.Marked < 0 {
		return 0, false
	}
	return max(p.HighWater-p.Marked, 0), true
}

// PartitionStats returns a snapshot of every partition claimed now, by topic and
// partition. A partition is in it from the start of its claim to the end, which a
// rebalance, a lost connection or Close brings. A cooperative rebalance ends only the claims
// of the partitions that move. So a partition that moved to another consumer is not
// reported, and one that stayed is reported throughout.
func (s *ParallelSubscriber) PartitionStats() []PartitionStat {
	now := time.Now()
	s.claimsMu.Lock()
	runs := make([]*claimRun, 0, len(s.claims))
	for r := range s.claims {
		runs = append(runs, r)
	}
	s.claimsMu.Unlock()
	out := make([]PartitionStat, 0, len(runs))
	for _, r := range runs {
		out = append(out, r.stat(now))
	}
	slices.SortFunc(out, func(a, b PartitionStat) int {
		return cmp.Or(strings.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	return out
}

func (s *ParallelSubscriber) track(r *claimRun) {
	s.claimsMu.Lock()
	s.claims[r] = struct{}{}
	s.claimsMu.Unlock()
}

func (s *ParallelSubscriber) untrack(r *claimRun) {
	s.claimsMu.Lock()
	delete(s.claims, r)
	s.claimsMu.Unlock()
}

func (r *claimRun) stat(now time.Time) PartitionStat {
	st := PartitionStat{Group: r.h.s.group, Topic: r.topic, Partition: r.partition, HighWater: r.claim.HighWaterMarkOffset()}
	st.ReadAhead, st.ReadAheadBytes = r.ahead.held()
	if n := r.admitting.Load(); n > 0 {
		st.ReadAhead, st.ReadAheadBytes = st.ReadAhead+1, st.ReadAheadBytes+n
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	st.Marked = r.marked
	for _, sl := range r.queue {
		if !sl.acked {
			st.InFlight++
			st.InFlightBytes += sl.cost
		}
	}
	if len(r.queue) > 0 { // the acked prefix is gone, so the first is the oldest un-acked
		st.OldestUnackedAge = max(now.Sub(r.queue[0].since), 0)
	}
	return st
}
