package main

// The checker is deliberately independent of the router: it reads the producer's ledger
// files with its own parser, the database with its own SQL (database/sql with go-sql-driver
// or pgx's driver; of the framework only pkg/dbx's dialect and placeholders, none of the
// inbox/outbox/coupon packages) and Kafka with its own read_committed consumer
// (IBM/sarama directly, not pkg/kafkax). What it knows about the schema and the wire format
// is written out here, so a bug in the router's code paths cannot hide itself from it. The
// one thing it shares with the router is internal/chaosplan, the plan of the misbehaving test
// plugin: which orders it must have panicked or blocked on (misbehaver.go).

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/IBM/sarama"
	_ "github.com/go-sql-driver/mysql"
)

// CheckConfig says what to check and where.
type CheckConfig struct {
	DSN          string   // database (application user is enough: the checker only reads)
	Brokers      []string // Kafka bootstrap brokers
	GrantedTopic string   // CouponGranted events (coupon-granted)
	OrderTopic   string   // order-paid; "" skips counting the deliveries on Kafka
	// StartOffsets: topic → partition → first offset to read (recorded before the run; the
	// shared topics hold earlier runs too). A missing topic or partition reads from the oldest.
	StartOffsets map[string]map[int32]int64
	Prefix       string   // the run's order-id prefix: every check is scoped to it
	Ledgers      []string // producer ledger files (router produce --ledger)
	BizType      string   // inbox biz type of the coupon plugin (default "coupon")
	// Misbehaver is the inbox biz type of the misbehaving plugin (chaos-misbehaver); "" skips
	// its checks.
	Misbehaver string
	// Groups are the consumer groups of the run and their topics: each must have committed
	// the end of every partition (within LagWait, default 30 s; offsets are committed
	// asynchronously).
	Groups  []GroupTopic
	LagWait time.Duration
	Idle    time.Duration
}

// Violation is one kind of broken invariant with a count and a few examples.
type Violation struct {
	Kind     string
	Count    int
	Examples []string
}

// Report is what the checker found.
type Report struct {
	Orders            int            // distinct orders in the ledgers
	LedgerDeliveries  int            // deliveries the ledgers declare (successful produce runs)
	LedgerPoison      int            // poison messages the ledgers declare
	KafkaDeliveries   int            // order-paid messages with the run's prefix actually on Kafka (all attempts)
	Granted           int            // ledger orders GRANTED with a coupon
	Failed            int            // ledger orders FAILED with a reason
	Quarantined       int            // ledger orders quarantined (inbox failed with a reason)
	QuarantineReasons map[string]int // reason → count
	Lost              int
	DupCoupons        int
	DupEvents         int
	GrantEvents       int            // distinct CouponGranted event ids on Kafka for the ledger's orders
	DuplicatesBlocked int            // SUM(inbox.duplicates) of the ledger's orders
	PoisonQuarantined int            // inbox rows of BizType quarantined as poison (whole database)
	PoisonOnKafka     int            // records of the run on order-paid that are not orders
	PoisonKinds       map[string]int // those by kind (poisonKindOf)
	Transitions       int            // coupon_grant_log rows of the ledger's orders
	// The misbehaving plugin: ledger orders by predicted outcome (done, panic, timeout), and
	// those whose inbox row has that outcome.
	MisbehaverWant, MisbehaverGot map[string]int
	MisbehaverPoison              int // its inbox rows quarantined as poison (whole database)
	// Committed offsets of Groups: every partition, and the total lag.
	Lags       []PartitionLag
	LagTotal   int64
	LagChecked bool
	Violations []Violation
}

// Duplicates is every duplicated effect the checker saw.
func (r Report) Duplicates() int { return r.DupCoupons + r.DupEvents }

// Redeliveries estimates the deliveries of an already seen Kafka message (rebalance, kill
// before the offset commit): duplicates blocked minus the duplicates the producer sent.
func (r Report) Redeliveries() int { return r.DuplicatesBlocked - (r.KafkaDeliveries - r.Orders) }

// Has reports whether a violation of kind was found.
func (r Report) Has(kind string) bool {
	for _, v := range r.Violations {
		if v.Kind == kind {
			return true
		}
	}
	return false
}

type violations struct {
	order []string
	m     map[string]*Violation
}

func (v *violations) add(kind, format string, args ...any) {
	if v.m == nil {
		v.m = map[string]*Violation{}
	}
	x, ok := v.m[kind]
	if !ok {
		x = &Violation{Kind: kind}
		v.m[kind] = x
		v.order = append(v.order, kind)
	}
	x.Count++
	if len(x.Examples) < 3 {
		x.Examples = append(x.Examples, fmt.Sprintf(format, args...))
	}
}

func (v *violations) list() []Violation {
	out := make([]Violation, 0, len(v.order))
	for _, k := range v.order {
		out = append(out, *v.m[k])
	}
	return out
}

// ledgerFile is what one `router produce --ledger` file says.
type ledgerFile struct {
	prefix                   string
	orders                   []string
	deliveries, poison, decl int
}

// readLedger parses a ledger: a header "# prefix=P orders=N deliveries=D poison=X", then
// one order id a line.
func readLedger(path string) (ledgerFile, error) {
	var l ledgerFile
	f, err := os.Open(path)
	if err != nil {
		return l, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	header := false
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "":
		case strings.HasPrefix(line, "#"):
			if _, err := fmt.Sscanf(line, "# prefix=%s orders=%d deliveries=%d poison=%d", &l.prefix, &l.decl, &l.deliveries, &l.poison); err != nil {
				return l, fmt.Errorf("ledger %s: bad header %q: %v", path, line, err)
			}
			header = true
		default:
			l.orders = append(l.orders, line)
		}
	}
	if err := sc.Err(); err != nil {
		return l, fmt.Errorf("ledger %s: %w", path, err)
	}
	if !header {
		return l, fmt.Errorf("ledger %s: no header line", path)
	}
	if l.decl != len(l.orders) {
		return l, fmt.Errorf("ledger %s: header says %d orders, file lists %d", path, l.decl, len(l.orders))
	}
	return l, nil
}

type grantRow struct {
	campaign, state, reason, couponID string
}

type inboxRow struct {
	status, reason, lastError string
	duplicates, attempts      int
}

type outboxRow struct {
	eventID, eventType string
	published          bool
}

type transition struct{ from, to string }

// legal is the coupon state machine, written out independently of coupon's state.go:
// one step forward on the happy path, or any non-terminal state to FAILED — and INIT →
// GRANTED, the whole happy path committed in one transaction (a grant written GRANTED at
// once logs the one transition it committed).
var legal = map[transition]bool{
	{"INIT", "LOCKED"}: true, {"LOCKED", "BUDGET_DEDUCTED"}: true, {"BUDGET_DEDUCTED", "GRANTED"}: true, {"INIT", "GRANTED"}: true,
	{"INIT", "FAILED"}: true, {"LOCKED", "FAILED"}: true, {"BUDGET_DEDUCTED", "FAILED"}: true,
}

func terminal(state string) bool { return state == "GRANTED" || state == "FAILED" }

func likePrefix(p string) string {
	r := strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`)
	return r.Replace(p) + "%"
}

// Check runs every check and returns the report; an error means the checker itself could
// not read something (not a violation).
func Check(ctx context.Context, c CheckConfig) (Report, error) {
	var rep Report
	var v violations
	if c.BizType == "" {
		c.BizType = "coupon"
	}
	if c.Prefix == "" {
		return rep, fmt.Errorf("checker: empty prefix")
	}
	if c.Idle <= 0 {
		c.Idle = 3 * time.Second
	}

	// 1. The ledger: what was produced.
	ledger := map[string]bool{}
	for _, path := range c.Ledgers {
		l, err := readLedger(path)
		if err != nil {
			return rep, err
		}
		if !strings.HasPrefix(l.prefix, c.Prefix) {
			return rep, fmt.Errorf("ledger %s: prefix %q is outside the run's prefix %q", path, l.prefix, c.Prefix)
		}
		for _, id := range l.orders {
			ledger[id] = true
		}
		rep.LedgerDeliveries += l.deliveries
		rep.LedgerPoison += l.poison
	}
	rep.Orders = len(ledger)
	if rep.Orders == 0 {
		return rep, fmt.Errorf("checker: the ledgers list no orders")
	}

	// 2. The database, scoped to the run's prefix.
	db, err := openDB(c.DSN)
	if err != nil {
		return rep, fmt.Errorf("checker: %w", err)
	}
	defer db.Close()
	like := likePrefix(c.Prefix)
	grants := map[string][]grantRow{}
	if err := query(ctx, db, `SELECT order_id, campaign_id, state, COALESCE(reason, ''), COALESCE(coupon_id, '') FROM coupon_grant WHERE order_id LIKE ?`,
		[]any{like}, func(s scanner) error {
			var id string
			var g grantRow
			err := s.Scan(&id, &g.campaign, &g.state, &g.reason, &g.couponID)
			grants[id] = append(grants[id], g)
			return err
		}); err != nil {
		return rep, err
	}
	coupons := map[string]int{}
	couponIDs := map[string]int{}
	if err := query(ctx, db, `SELECT order_id, coupon_id FROM user_coupon WHERE order_id LIKE ?`, []any{like}, func(s scanner) error {
		var id, cid string
		err := s.Scan(&id, &cid)
		coupons[id]++
		couponIDs[cid]++
		return err
	}); err != nil {
		return rep, err
	}
	inbox := map[string]inboxRow{}
	conflicts := 0
	if err := query(ctx, db, `SELECT dedup_key, status, COALESCE(reason, ''), duplicates, attempts, COALESCE(last_error, '') FROM inbox WHERE biz_type = ? AND dedup_key LIKE ?`,
		[]any{c.BizType, like}, func(s scanner) error {
			var k string
			var r inboxRow
			if err := s.Scan(&k, &r.status, &r.reason, &r.duplicates, &r.attempts, &r.lastError); err != nil {
				return err
			}
			if strings.Contains(k, "#conflict:") {
				// The producer never sends two meanings for one order id: a conflict row means
				// the fingerprint of a redelivery changed, which is a bug.
				conflicts++
				v.add("conflict", "%s quarantined as conflict", k)
				return nil
			}
			inbox[k] = r
			return nil
		}); err != nil {
		return rep, err
	}
	outbox := map[string][]outboxRow{}
	if err := query(ctx, db, `SELECT msg_key, event_id, event_type, published_at IS NOT NULL FROM outbox WHERE msg_key LIKE ?`, []any{like}, func(s scanner) error {
		var k string
		var r outboxRow
		err := s.Scan(&k, &r.eventID, &r.eventType, &r.published)
		outbox[k] = append(outbox[k], r)
		return err
	}); err != nil {
		return rep, err
	}
	history := map[string][]transition{}
	if err := query(ctx, db, `SELECT order_id, from_state, to_state FROM coupon_grant_log WHERE order_id LIKE ? ORDER BY id`, []any{like}, func(s scanner) error {
		var id string
		var t transition
		err := s.Scan(&id, &t.from, &t.to)
		history[id] = append(history[id], t)
		rep.Transitions++
		return err
	}); err != nil {
		return rep, err
	}
	bizTypes := []string{c.BizType}
	if c.Misbehaver != "" {
		bizTypes = append(bizTypes, c.Misbehaver)
	}
	for _, biz := range bizTypes {
		n := &rep.PoisonQuarantined
		if biz == c.Misbehaver {
			n = &rep.MisbehaverPoison
		}
		if err := db.QueryRowContext(ctx, rebind(db, `SELECT COUNT(*) FROM inbox WHERE biz_type = ? AND reason = 'poison'`), biz).Scan(n); err != nil {
			return rep, fmt.Errorf("checker: poison: %w", err)
		}
		if *n < rep.LedgerPoison {
			v.add("poison-lost", "biz type %s: %d poison messages produced, %d quarantined as poison", biz, rep.LedgerPoison, *n)
		}
	}
	if err := checkCounters(ctx, db, &v); err != nil {
		return rep, err
	}
	for cid, n := range couponIDs {
		if n > 1 {
			v.add("duplicate-coupon", "coupon id %s issued %d times", cid, n)
		}
	}

	// 3. Kafka: the CouponGranted events of the run's orders (read_committed, own consumer).
	type evSeen struct {
		order string
		n     int
	}
	events := map[string]*evSeen{} // event_id → order, times seen
	orderEvents := map[string][]string{}
	err = readTopic(ctx, c.Brokers, c.GrantedTopic, c.StartOffsets[c.GrantedTopic], c.Idle, func(m *sarama.ConsumerMessage) {
		key := string(m.Key)
		if !strings.HasPrefix(key, c.Prefix) {
			return
		}
		var id, typ string
		for _, h := range m.Headers {
			switch string(h.Key) {
			case "event_id":
				id = string(h.Value)
			case "event_type":
				typ = string(h.Value)
			}
		}
		if typ != "CouponGranted" {
			return
		}
		e := events[id]
		if e == nil {
			e = &evSeen{order: key}
			events[id] = e
			orderEvents[key] = append(orderEvents[key], id)
		}
		e.n++
	})
	if err != nil {
		return rep, err
	}
	rep.PoisonKinds = map[string]int{}
	if c.OrderTopic != "" {
		onKafka := map[string]bool{}
		var poison []poisonRecord
		err = readTopic(ctx, c.Brokers, c.OrderTopic, c.StartOffsets[c.OrderTopic], c.Idle, func(m *sarama.ConsumerMessage) {
			if k := string(m.Key); strings.HasPrefix(k, c.Prefix) {
				rep.KafkaDeliveries++
				onKafka[k] = true
				return
			}
			// Not an order of the run: one of the producer's poison records.
			p := poisonRecord{partition: m.Partition, offset: m.Offset, kind: poisonKindOf(m)}
			poison = append(poison, p)
			rep.PoisonKinds[p.kind]++
		})
		if err != nil {
			return rep, err
		}
		rep.PoisonOnKafka = len(poison)
		if err := checkPoisonRecords(ctx, db, c.OrderTopic, poison, bizTypes, &v); err != nil {
			return rep, err
		}
		for id := range ledger {
			if !onKafka[id] {
				v.add("ledger", "ledger order %s is not on %s", id, c.OrderTopic)
			}
		}
	} else {
		rep.KafkaDeliveries = rep.LedgerDeliveries
	}

	// 4. Every ledger order, one by one.
	ids := make([]string, 0, len(ledger))
	for id := range ledger {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	rep.QuarantineReasons = map[string]int{}
	for _, id := range ids {
		gs := grants[id]
		in, hasInbox := inbox[id]
		rep.DuplicatesBlocked += in.duplicates
		if coupons[id] > 1 {
			rep.DupCoupons += coupons[id] - 1
			v.add("duplicate-coupon", "order %s has %d coupons", id, coupons[id])
		}
		if len(gs) > 1 {
			v.add("duplicate-grant", "order %s has %d grants (campaigns %v)", id, len(gs), gs)
		}
		var g grantRow
		if len(gs) > 0 {
			g = gs[0]
		}
		quarantined := hasInbox && in.status == "failed" && in.reason != ""
		switch {
		case g.state == "GRANTED" && coupons[id] >= 1: // more than one: duplicate-coupon above
			rep.Granted++
		case g.state == "GRANTED":
			rep.Lost++
			v.add("lost", "order %s GRANTED without a coupon", id)
		case g.state == "FAILED" && g.reason != "":
			rep.Failed++
		case g.state == "FAILED":
			rep.Lost++
			v.add("lost", "order %s FAILED without a reason", id)
		case quarantined:
			rep.Quarantined++
			rep.QuarantineReasons[in.reason]++
		default:
			rep.Lost++
			what := "no grant"
			if g.state != "" {
				what = "grant " + g.state
			}
			st := "no inbox row"
			if hasInbox {
				st = "inbox " + in.status
			}
			v.add("lost", "order %s: %s, %s, no quarantine record", id, what, st)
		}
		if g.state != "GRANTED" && coupons[id] > 0 {
			v.add("coupon-without-grant", "order %s has %d coupons, grant %q", id, coupons[id], g.state)
		}
		// inbox done ⇔ terminal grant ⇔ outbox event
		if hasInbox && in.status == "done" && !terminal(g.state) {
			v.add("inbox-grant-mismatch", "order %s: inbox done, grant %q", id, g.state)
		}
		if terminal(g.state) && (!hasInbox || in.status != "done") {
			v.add("inbox-grant-mismatch", "order %s: grant %s, inbox %q", id, g.state, in.status)
		}
		if hasInbox && in.status == "failed" && in.reason == "" {
			v.add("quarantine-without-reason", "order %s: inbox failed without a reason", id)
		}
		wantType := map[string]string{"GRANTED": "CouponGranted", "FAILED": "CouponGrantFailed"}[g.state]
		obs := outbox[id]
		matching := 0
		for _, o := range obs {
			if o.eventType == wantType {
				matching++
			} else {
				v.add("grant-outbox-mismatch", "order %s: outbox %s event with grant %q", id, o.eventType, g.state)
			}
			if !o.published {
				v.add("outbox-unpublished", "order %s: outbox event %s not published after the drain", id, o.eventID)
			}
		}
		if wantType != "" && matching != 1 {
			v.add("grant-outbox-mismatch", "order %s: grant %s with %d %s outbox rows", id, g.state, matching, wantType)
		}
		// Kafka: exactly one CouponGranted per GRANTED order, with the outbox's event id.
		var outboxID string
		for _, o := range obs {
			if o.eventType == "CouponGranted" {
				outboxID = o.eventID
			}
		}
		for _, eid := range orderEvents[id] {
			e := events[eid]
			rep.GrantEvents++
			if e.n > 1 {
				rep.DupEvents += e.n - 1
				v.add("duplicate-event", "order %s: CouponGranted event_id %s seen %d times on %s", id, eid, e.n, c.GrantedTopic)
			}
			if g.state != "GRANTED" {
				v.add("event-without-grant", "order %s: CouponGranted %s on Kafka, grant %q", id, eid, g.state)
			} else if eid != outboxID {
				v.add("event-id-mismatch", "order %s: event_id %s on Kafka, outbox has %q", id, eid, outboxID)
			}
		}
		if g.state == "GRANTED" && len(orderEvents[id]) == 0 {
			v.add("missing-event", "order %s GRANTED but no CouponGranted on %s", id, c.GrantedTopic)
		}
		// Only legal transitions, forming one chain from INIT to the grant's state.
		cur := "INIT"
		for _, t := range history[id] {
			if !legal[t] {
				v.add("illegal-transition", "order %s: %s → %s", id, t.from, t.to)
			} else if t.from != cur {
				v.add("broken-history", "order %s: %s → %s logged while the grant was %s (a step ran twice?)", id, t.from, t.to, cur)
			}
			cur = t.to
		}
		if len(gs) > 0 && cur != g.state {
			v.add("broken-history", "order %s: history ends in %s, grant is %s", id, cur, g.state)
		}
		if len(gs) == 0 && len(history[id]) > 0 {
			v.add("broken-history", "order %s: %d transitions logged, no grant", id, len(history[id]))
		}
	}

	// 5. Nothing for an order that was never produced (within the run's prefix).
	for id := range grants {
		if !ledger[id] {
			v.add("never-produced", "grant for %s, which no ledger lists", id)
		}
	}
	for id := range coupons {
		if !ledger[id] {
			v.add("never-produced", "coupon for %s, which no ledger lists", id)
		}
	}
	for id := range inbox {
		if !ledger[id] {
			v.add("never-produced", "inbox row %s, which no ledger lists", id)
		}
	}
	for id := range orderEvents {
		if !ledger[id] {
			v.add("never-produced", "CouponGranted for %s on Kafka, which no ledger lists", id)
		}
	}

	// 6. The misbehaving plugin: one row per order, with the outcome its plan predicts.
	if c.Misbehaver != "" {
		if err := checkMisbehaver(ctx, db, c.Misbehaver, like, ledger, ids, &rep, &v); err != nil {
			return rep, err
		}
	}

	// 7. Every consumer group of the run has committed the end of every partition.
	if len(c.Groups) > 0 {
		if c.LagWait <= 0 {
			c.LagWait = 30 * time.Second
		}
		lags, err := waitLag(ctx, c.Brokers, c.Groups, c.StartOffsets, c.LagWait)
		if err != nil {
			return rep, err
		}
		rep.Lags, rep.LagTotal, rep.LagChecked = lags, totalLag(lags), true
		for _, l := range lags {
			if l.Lag > 0 {
				v.add("committed-lag", "%s (after waiting up to %s)", l, c.LagWait)
			}
		}
	}
	rep.Violations = v.list()
	return rep, nil
}

// checkCounters compares the stock and budget counters with what the grants imply
// (whole database: the counters are per campaign, not per run).
func checkCounters(ctx context.Context, db *sql.DB, v *violations) error {
	type sums struct{ locked, granted, spent int64 }
	want, have := map[string]*sums{}, map[string]*sums{}
	get := func(m map[string]*sums, k string) *sums {
		if m[k] == nil {
			m[k] = &sums{}
		}
		return m[k]
	}
	if err := query(ctx, db, `SELECT campaign_id,
 COALESCE(SUM(CASE WHEN state IN ('LOCKED', 'BUDGET_DEDUCTED') THEN 1 ELSE 0 END), 0), COALESCE(SUM(CASE WHEN state = 'GRANTED' THEN 1 ELSE 0 END), 0),
 COALESCE(SUM(CASE WHEN state IN ('BUDGET_DEDUCTED', 'GRANTED') THEN value_cents ELSE 0 END), 0)
 FROM coupon_grant GROUP BY campaign_id`, nil, func(s scanner) error {
		var k string
		var x sums
		err := s.Scan(&k, &x.locked, &x.granted, &x.spent)
		*get(want, k) = x
		return err
	}); err != nil {
		return err
	}
	if err := query(ctx, db, `SELECT campaign_id, COALESCE(SUM(locked), 0), COALESCE(SUM(granted), 0) FROM coupon_stock GROUP BY campaign_id`, nil, func(s scanner) error {
		var k string
		var locked, granted int64
		if err := s.Scan(&k, &locked, &granted); err != nil {
			return err
		}
		x := get(have, k)
		x.locked, x.granted = locked, granted
		return nil
	}); err != nil {
		return err
	}
	if err := query(ctx, db, `SELECT campaign_id, COALESCE(SUM(spent_cents), 0) FROM coupon_budget GROUP BY campaign_id`, nil, func(s scanner) error {
		var k string
		var spent int64
		if err := s.Scan(&k, &spent); err != nil {
			return err
		}
		get(have, k).spent = spent
		return nil
	}); err != nil {
		return err
	}
	for k, w := range want {
		h := get(have, k)
		if *h != *w {
			v.add("counters", "campaign %s: stock locked/granted %d/%d and budget spent %d, grants imply %d/%d and %d",
				k, h.locked, h.granted, h.spent, w.locked, w.granted, w.spent)
		}
	}
	return nil
}

type scanner interface{ Scan(dest ...any) error }

// query runs q (rebound for db's dialect) and calls fn for each row.
func query(ctx context.Context, db *sql.DB, q string, args []any, fn func(scanner) error) error {
	rows, err := db.QueryContext(ctx, rebind(db, q), args...)
	if err != nil {
		return fmt.Errorf("checker: %s: %w", firstWords(q), err)
	}
	defer rows.Close()
	for rows.Next() {
		if err := fn(rows); err != nil {
			return fmt.Errorf("checker: %s: %w", firstWords(q), err)
		}
	}
	return rows.Err()
}

func firstWords(q string) string {
	f := strings.Fields(q)
	if len(f) > 6 {
		f = f[:6]
	}
	return strings.Join(f, " ")
}

// saramaConfig is the checker's own client configuration: read_committed, no group.
func saramaConfig() *sarama.Config {
	sc := sarama.NewConfig()
	sc.Version = sarama.V3_6_0_0 // Kafka 4.x dropped the older request versions
	sc.ClientID = "onceflow-chaos-checker"
	sc.Consumer.IsolationLevel = sarama.ReadCommitted
	sc.Consumer.Return.Errors = true
	sc.Consumer.MaxWaitTime = 100 * time.Millisecond
	sc.Net.DialTimeout = 5 * time.Second
	return sc
}

// readTopic reads every committed record of topic from start (partition → offset; missing =
// oldest) up to the high-water mark seen at the start, all partitions in parallel, and calls
// fn for each (serialised). A partition whose remaining offsets are only transaction markers
// or aborted records ends after idle without a message.
func readTopic(ctx context.Context, brokers []string, topic string, start map[int32]int64, idle time.Duration, fn func(*sarama.ConsumerMessage)) error {
	client, err := sarama.NewClient(brokers, saramaConfig())
	if err != nil {
		return fmt.Errorf("checker: kafka %v: %w", brokers, err)
	}
	defer client.Close()
	parts, err := client.Partitions(topic)
	if err != nil {
		return fmt.Errorf("checker: topic %s: %w", topic, err)
	}
	consumer, err := sarama.NewConsumerFromClient(client)
	if err != nil {
		return fmt.Errorf("checker: %w", err)
	}
	defer consumer.Close()
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		errs []error
	)
	for _, p := range parts {
		hwm, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			return fmt.Errorf("checker: offsets of %s/%d: %w", topic, p, err)
		}
		from, err := client.GetOffset(topic, p, sarama.OffsetOldest)
		if err != nil {
			return fmt.Errorf("checker: offsets of %s/%d: %w", topic, p, err)
		}
		if s, ok := start[p]; ok && s > from {
			from = s
		}
		if from >= hwm {
			continue
		}
		pc, err := consumer.ConsumePartition(topic, p, from)
		if err != nil {
			return fmt.Errorf("checker: consume %s/%d: %w", topic, p, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer pc.Close()
			timer := time.NewTimer(idle)
			defer timer.Stop()
			for {
				select {
				case m := <-pc.Messages():
					mu.Lock()
					fn(m)
					mu.Unlock()
					if m.Offset+1 >= hwm {
						return
					}
					timer.Reset(idle)
				case err := <-pc.Errors():
					mu.Lock()
					errs = append(errs, fmt.Errorf("checker: consume %s/%d: %w", topic, p, err))
					mu.Unlock()
					return
				case <-timer.C:
					return
				case <-ctx.Done():
					mu.Lock()
					errs = append(errs, ctx.Err())
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return errs[0]
	}
	return nil
}

// TopicEnds returns the high-water mark of every partition of each topic: recorded before a
// run, they bound what the checker reads from the shared topics.
func TopicEnds(brokers []string, topics ...string) (map[string]map[int32]int64, error) {
	client, err := sarama.NewClient(brokers, saramaConfig())
	if err != nil {
		return nil, err
	}
	defer client.Close()
	out := map[string]map[int32]int64{}
	for _, t := range topics {
		parts, err := client.Partitions(t)
		if err != nil {
			return nil, fmt.Errorf("topic %s: %w", t, err)
		}
		out[t] = map[int32]int64{}
		for _, p := range parts {
			off, err := client.GetOffset(t, p, sarama.OffsetNewest)
			if err != nil {
				return nil, fmt.Errorf("offsets of %s/%d: %w", t, p, err)
			}
			out[t][p] = off
		}
	}
	return out, nil
}

// summary is the one CHAOS line (lag=: the total committed lag of the run's consumer
// groups, when they were checked).
func summary(rep Report, kills, brokerRestarts, dbRestarts int, extra []string) string {
	lag := ""
	if rep.LagChecked {
		lag = fmt.Sprintf(" lag=%d", rep.LagTotal)
	}
	if len(rep.Violations) == 0 && len(extra) == 0 {
		return fmt.Sprintf("CHAOS ok orders=%d kills=%d broker_restarts=%d db_restarts=%d lost=%d duplicates=%d%s",
			rep.Orders, kills, brokerRestarts, dbRestarts, rep.Lost, rep.Duplicates(), lag)
	}
	var parts []string
	for _, v := range rep.Violations {
		parts = append(parts, fmt.Sprintf("%s=%d", v.Kind, v.Count))
	}
	parts = append(parts, extra...)
	return fmt.Sprintf("CHAOS FAIL orders=%d kills=%d broker_restarts=%d db_restarts=%d lost=%d duplicates=%d%s violations: %s",
		rep.Orders, kills, brokerRestarts, dbRestarts, rep.Lost, rep.Duplicates(), lag, strings.Join(parts, " "))
}
