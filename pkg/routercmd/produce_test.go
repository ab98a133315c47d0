package routercmd

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/internal/testenv"
)

// TestPoisonKinds checks that the oversized kind is produced only when a value 1 KiB over
// the inbox limit fits the producer's max message size. Then every kind is there once.
// Otherwise poisonKinds says why not. The kinds built on a value that the plugin refuses
// need its Sampler to be a Poisoner.
func TestPoisonKinds(t *testing.T) {
	const producerMax = 1_000_000 // Sarama's default Producer.MaxMessageBytes
	names := func(ks []poisonKind) string {
		var n []string
		for _, k := range ks {
			n = append(n, k.name)
		}
		return strings.Join(n, ",")
	}
	granter, _ := registered().Get(coupon.PluginName)
	all := "bad-value,tombstone,empty,utf8-value,utf8-key,utf8-headers,utf8-string,big-headers,oversized"
	ks, skipped := poisonKinds(granter, 256<<10, producerMax)
	if names(ks) != all || skipped != "" {
		t.Fatalf("256 KiB limit: kinds %s, skipped %q; want %s", names(ks), skipped, all)
	}
	if r := ks[len(ks)-1].record("p", 7); len(r.value) != 257<<10 {
		t.Fatalf("oversized value of %d bytes, want %d", len(r.value), 257<<10)
	}
	ks, skipped = poisonKinds(granter, 1<<20, producerMax) // the router's default limit
	if names(ks) != strings.TrimSuffix(all, ",oversized") || !strings.Contains(skipped, "oversized=skipped") {
		t.Fatalf("1 MiB limit: kinds %s, skipped %q", names(ks), skipped)
	}
	// For a Sampler that is no Poisoner, the kinds built on a refused value are left out.
	noPoison := granter
	noPoison.Sampler = greedySampler{}
	if ks, skipped := poisonKinds(noPoison, 256<<10, producerMax); names(ks) != "tombstone,empty,big-headers,oversized" || !strings.Contains(skipped, "has_no_Poisoner") {
		t.Fatalf("a Sampler without Poison: kinds %s, skipped %q", names(ks), skipped)
	}
	for _, k := range ks {
		r := k.record("p", 3)
		size := len(r.key) + len(r.value)
		for _, h := range r.headers {
			size += len(h.Key) + len(h.Value)
		}
		if size > producerMax-1<<10 {
			t.Errorf("%s: %d bytes do not fit the producer", k.name, size)
		}
		switch k.name {
		case "tombstone":
			if r.value != nil {
				t.Errorf("tombstone with a value")
			}
		case "empty":
			if r.value == nil || len(r.value) != 0 {
				t.Errorf("empty value %q", r.value)
			}
		case "utf8-key":
			if utf8.Valid(r.key) {
				t.Errorf("utf8-key: key %q is valid UTF-8", r.key)
			}
		case "utf8-value":
			if utf8.Valid(r.value) {
				t.Errorf("utf8-value: value %q is valid UTF-8", r.value)
			}
		case "utf8-string":
			// JSON but for one byte, which encoding/json alone would decode as U+FFFD.
			var o coupon.OrderPaid
			if utf8.Valid(r.value) || json.Unmarshal(r.value, &o) != nil || o.OrderID != "p-poison-u8-3\uFFFD" {
				t.Errorf("utf8-string: value %q decodes with encoding/json alone as %+v, want order p-poison-u8-3\uFFFD", r.value, o)
			}
		}
	}
}

// TestPoisonKindsAreQuarantined checks that every kind of poison record ends quarantined as
// poison by the coupon granter's inbox, and nothing is granted. The router's subscriber
// turns each record into a message with watermill-kafka's DefaultMarshaler. The inbox has
// the limits of the chaos harness's configuration, 256 KiB payloads and 32 KiB of metadata.
func TestPoisonKindsAreQuarantined(t *testing.T) {
	d := testenv.DB(t, 4, registeredMigrations()...)
	ctx := context.Background()
	cfg := coupon.DefaultConfig()
	if err := coupon.EnsureCampaign(ctx, d.DB, cfg); err != nil {
		t.Fatal(err)
	}
	g, err := coupon.NewGranter(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ib, err := engine.New(d.DB, g, engine.Config{BizType: coupon.BizType, MaxAttempts: 1, MaxPayloadBytes: 256 << 10}, watermill.NopLogger{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	granter, _ := registered().Get(coupon.PluginName)
	kinds, _ := poisonKinds(granter, 256<<10, 1_000_000)
	for i := range 2 * len(kinds) { // twice round, since the bad payloads differ by i
		k := kinds[i%len(kinds)]
		r := k.record("pt", i)
		km := &sarama.ConsumerMessage{Topic: "order-paid", Partition: 2, Offset: int64(i), Key: r.key, Value: r.value}
		for _, h := range r.headers {
			km.Headers = append(km.Headers, &sarama.RecordHeader{Key: h.Key, Value: h.Value})
		}
		msg, err := wkafka.DefaultMarshaler{}.Unmarshal(km)
		if err != nil {
			t.Fatalf("%s: unmarshal: %v", k.name, err)
		}
		res, err := ib.Process(ctx, msg, inbox.Source{Topic: km.Topic, Partition: km.Partition, Offset: km.Offset}, engine.ProcessOptions{})
		if err != nil || res.Outcome != engine.OutcomeQuarantined || res.Reason != engine.ReasonPoison {
			t.Errorf("%s (#%d): %+v %v; want quarantined as poison", k.name, i, res, err)
		}
	}
	var poison, grants int
	if err := d.DB.QueryRow("SELECT COUNT(*) FROM inbox WHERE status = 'failed' AND reason = 'poison' AND dedup_key LIKE 'poison:order-paid/2/%'").Scan(&poison); err != nil {
		t.Fatal(err)
	}
	if err := d.DB.QueryRow("SELECT COUNT(*) FROM coupon_grant").Scan(&grants); err != nil {
		t.Fatal(err)
	}
	if poison != 2*len(kinds) || grants != 0 {
		t.Fatalf("%d poison rows (want %d), %d grants (want 0)", poison, 2*len(kinds), grants)
	}
}

// TestProduceStopsOnCancel checks that ending the context ends a run paced by --rate
// between its records. The error says how many were sent. A run that slept through it would
// take 1,000 s here.
func TestProduceStopsOnCancel(t *testing.T) {
	testenv.Integration(t)
	k := testenv.Kafka(t)
	topic := testenv.Topic(t, k, "produce-cancel", 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := runAsync(ctx, "--brokers", strings.Join(k.Brokers, ","), "produce", "--plugin", coupon.PluginName, "--orders", "1000",
		"--dup-rate", "0", "--rate", "1", "--batch", "1", "--topic", topic)
	cancel()
	err := waitRun(t, done, "produce --rate 1, cancelled")
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "produce: stopped") {
		t.Fatalf("cancelled produce: %v, want it stopped by the cancellation", err)
	}
	if recs := readBack(t, k, topic); len(recs) > 1 {
		t.Fatalf("%d records on the topic, want at most the one sent before the cancellation", len(recs))
	}
}
