package kafkax

import (
	"slices"
	"testing"
)

// TestSubscriberRebalancesEagerly checks that watermill-kafka's subscriber offers the
// configured strategies with range after them, so that Sarama runs the eager protocol for it
// and it still joins a cooperative-sticky group.
func TestSubscriberRebalancesEagerly(t *testing.T) {
	for _, tc := range []struct{ names, want []string }{
		{[]string{"cooperative-sticky"}, []string{"cooperative-sticky", "range"}},
		{[]string{"cooperative-sticky", "range"}, []string{"cooperative-sticky", "range"}},
		{[]string{"range"}, []string{"range"}},
	} {
		names := slices.Clone(tc.names)
		if got := eager(names); !slices.Equal(got, tc.want) {
			t.Errorf("eager(%q) = %q, want %q", tc.names, got, tc.want)
		}
		if !slices.Equal(names, tc.names) {
			t.Errorf("eager changed its argument to %q", names)
		}
		sc := Config{Brokers: []string{"127.0.0.1:9092"}, BalanceStrategies: tc.names}.WithDefaults().ConsumerConfig()
		sc.Consumer.Group.Rebalance.GroupStrategies = balanceStrategies(eager(tc.names))
		if err := sc.Validate(); err != nil {
			t.Errorf("%q: Sarama refuses the subscriber's config: %v", tc.names, err)
		}
	}
}
