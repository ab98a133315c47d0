package onceflow

import (
	"context"
	"database/sql"
	"testing"

	"github.com/IBM/sarama"

	"github.com/onceflow/onceflow/internal/metrics"
	"github.com/onceflow/onceflow/outbox"
)

type nopProducer struct{}

func (nopProducer) SendMessages([]*sarama.ProducerMessage) error { return nil }

// onceflow_relay_parked_total has one series per reason the relay parks an event for,
// each there from the start.
func TestRelayParkedMetricByReason(t *testing.T) {
	db, err := sql.Open("mysql", "u:p@tcp(127.0.0.1:1)/none") // never connected
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	relay, err := outbox.NewRelay(db, nopProducer{}, outbox.RelayConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New(nil)
	stop := relayMetrics(context.Background(), m, relay)
	defer stop()
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, f := range families {
		if f.GetName() != "onceflow_relay_parked_total" {
			continue
		}
		for _, s := range f.GetMetric() {
			got[s.GetLabel()[0].GetValue()] = true
		}
	}
	for _, reason := range []string{outbox.ReasonUnknownTopic, outbox.ReasonTooLarge, outbox.ReasonInvalidRecord, outbox.ReasonUnauthorized, outbox.ReasonHeld} {
		if !got[reason] {
			t.Errorf("onceflow_relay_parked_total has no series with reason %s (got %v)", reason, got)
		}
	}
}
