package inboxops_test

import (
	"context"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/inbox/inboxops"
	"github.com/onceflow/onceflow/internal/msgsource"
)

// TestPoisonRowFoundByKey checks that a poison row, keyed by its record's place in Kafka,
// is found by what an operator has. Its last error notes the record's Kafka key and the
// payload's id, read from JSON that breaks later too. A key that is not UTF-8 is noted
// escaped, and found as it was. An unrelated id, or a prefix of the id, finds nothing. A
// filter without PoisonKeys, as a replay's, reads the dedup keys only. A replay that
// quarantines the row again notes the key again.
func TestPoisonRowFoundByKey(t *testing.T) {
	p := newPipeline(t, pipelineOpts{inboxCfg: engine.Config{KeyLogField: "order_id"}})
	ctx := context.Background()
	deliver := func(kafkaKey *string, payload string, offset int64) inboxops.Row {
		t.Helper()
		msg := message.NewMessage(watermill.NewUUID(), []byte(payload))
		if kafkaKey != nil {
			msg.SetContext(msgsource.WithKey(ctx, *kafkaKey))
		}
		r, err := p.inbox.Process(ctx, msg, inbox.Source{Topic: "order-paid", Partition: 3, Offset: offset}, engine.ProcessOptions{})
		if err != nil || r.Outcome != engine.OutcomeQuarantined || r.Reason != engine.ReasonPoison {
			t.Fatalf("poison delivery at offset %d: %+v %v", offset, r, err)
		}
		return get(t, p, r.InboxID)
	}
	key, raw := "oc-pz-0093", "\xffkey-raw"
	byKey := deliver(&key, `{"orderId":"oc-pz-0093","userId":"u","amountCents":"12"}`, 10)
	byRaw := deliver(&raw, "not json", 11)
	byID := deliver(nil, `{"orderId":"oc-pz-0100","userId":`, 12)
	if _, err := p.inbox.Process(ctx, orderMsg("oc-good-1", "u"), src, engine.ProcessOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		row  inboxops.Row
		want string
	}{
		{byKey, `kafka key "oc-pz-0093"; payload id "oc-pz-0093"; `},
		{byRaw, `kafka key "\xffkey-raw"; `},
		{byID, `payload id "oc-pz-0100"; `},
	} {
		if !strings.HasPrefix(c.row.LastError, c.want) || !strings.HasPrefix(c.row.DedupKey, "poison:order-paid/3/") {
			t.Errorf("row %s: last error %q, want it to begin with %q", c.row.DedupKey, c.row.LastError, c.want)
		}
	}

	store, err := inboxops.NewStore(p.db.DB, "")
	if err != nil {
		t.Fatal(err)
	}
	find := func(f inboxops.Filter) []string {
		t.Helper()
		f.BizType = coupon.BizType
		rows, err := store.List(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		n, err := store.Count(ctx, f)
		if err != nil || n != len(rows) {
			t.Fatalf("Count %d (%v), List %d rows", n, err, len(rows))
		}
		var keys []string
		for _, r := range rows {
			keys = append(keys, r.DedupKey)
		}
		return keys
	}
	for name, c := range map[string]struct {
		f    inboxops.Filter
		want string
	}{
		"the Kafka key":             {inboxops.Filter{Keys: []string{key}, PoisonKeys: true}, byKey.DedupKey},
		"the payload's id":          {inboxops.Filter{Keys: []string{"oc-pz-0100"}, PoisonKeys: true}, byID.DedupKey},
		"a key not UTF-8":           {inboxops.Filter{Keys: []string{raw}, PoisonKeys: true}, byRaw.DedupKey},
		"a key and an order":        {inboxops.Filter{Keys: []string{"oc-good-1", key}, PoisonKeys: true}, byKey.DedupKey + " oc-good-1"},
		"failed rows of the key":    {inboxops.Filter{Keys: []string{key}, PoisonKeys: true, Statuses: []engine.Status{engine.StatusFailed}}, byKey.DedupKey},
		"an unrelated id":           {inboxops.Filter{Keys: []string{"oc-pz-0094"}, PoisonKeys: true}, ""},
		"a prefix of the id":        {inboxops.Filter{Keys: []string{"oc-pz-009"}, PoisonKeys: true}, ""},
		"the key's escape as typed": {inboxops.Filter{Keys: []string{`\xffkey-raw`}, PoisonKeys: true}, ""},
		"done rows only":            {inboxops.Filter{Keys: []string{key}, PoisonKeys: true, Statuses: []engine.Status{engine.StatusDone}}, ""},
		"another reason":            {inboxops.Filter{Keys: []string{key}, PoisonKeys: true, Reasons: []engine.Reason{engine.ReasonConflict}}, ""},
		"without PoisonKeys":        {inboxops.Filter{Keys: []string{key}}, ""},
	} {
		if got := strings.Join(find(c.f), " "); got != c.want {
			t.Errorf("%s: found %q, want %q", name, got, c.want)
		}
	}
	capped, err := store.CountUpTo(ctx, inboxops.Filter{BizType: coupon.BizType, Keys: []string{"oc-good-1", key}, PoisonKeys: true, Limit: 1})
	if err != nil || capped != 1 {
		t.Errorf("CountUpTo with limit 1: %d %v", capped, err)
	}
	for k, want := range map[string]int{key: 1, "oc-pz-0094": 0} {
		pg, err := store.Page(ctx, inboxops.PageQuery{BizTypes: []string{coupon.BizType}, Keys: []string{k}, PoisonKeys: true, Limit: 50})
		if err != nil || len(pg.Rows) != want {
			t.Errorf("page of %q: %d rows (%v), want %d", k, len(pg.Rows), err, want)
		}
	}

	// The decoder is unchanged, so the replay quarantines the row again, with its notes.
	rep, err := inboxops.Replay(ctx, p.inbox, inboxops.ReplayOptions{Filter: inboxops.Filter{BizType: coupon.BizType, Keys: []string{byKey.DedupKey}}})
	if err != nil || rep.Quarantined != 1 {
		t.Fatalf("replay: %+v %v", rep, err)
	}
	if again := get(t, p, byKey.ID); again.ReplayID != rep.ID || !strings.HasPrefix(again.LastError, `kafka key "oc-pz-0093"; payload id "oc-pz-0093"; `) {
		t.Errorf("after the replay: replay id %d, last error %q", again.ReplayID, again.LastError)
	}
}

func get(t *testing.T, p *pipeline, id int64) inboxops.Row {
	t.Helper()
	store, err := inboxops.NewStore(p.db.DB, "")
	if err != nil {
		t.Fatal(err)
	}
	r, err := store.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
