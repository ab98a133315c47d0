package onceflow

import (
	"reflect"
	"testing"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/httpcmd"
	"github.com/onceflow/onceflow/internal/gcx"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/dbx"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// TestRouterDefaultsAreTheLibraries: each section of the router's default configuration,
// given to its library, is what the library fills in for a zero config — a program wired by
// hand and the router start from the same settings.
func TestRouterDefaultsAreTheLibraries(t *testing.T) {
	c := DefaultConfig()
	same := func(name string, got, want any) {
		t.Helper()
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s\n got %+v\nwant %+v", name, got, want)
		}
	}
	same("db.*", c.DB.Config.WithDefaults(), dbx.Config{}.WithDefaults())
	kc := c.kafkaConfig()
	kc.ClientID = "" // the router names its clients
	same("kafka.*", kc.WithDefaults(), kafkax.Config{}.WithDefaults())
	same("kafka.window, kafka.max_in_flight_bytes", c.Kafka.Parallel.WithDefaults(), kafkax.ParallelConfig{}.WithDefaults())
	same("inbox.*", c.inboxConfig("x", "", false).WithDefaults(), inbox.Config{BizType: "x"}.WithDefaults())
	same("inbox.batch_*", c.Inbox.Batch.WithDefaults(), inbox.BatchConfig{}.WithDefaults())
	same("inbox.cleanup_*", c.Inbox.Cleaner.WithDefaults(), inbox.CleanerConfig{}.WithDefaults())
	same("http.* (the handler's)", c.HTTP.Config.WithDefaults(), httpcmd.Config{}.WithDefaults())
	rc, lib := c.Relay.RelayConfig.WithDefaults(), outbox.RelayConfig{}.WithDefaults()
	rc.Owner, lib.Owner = "", "" // host-pid-random
	same("relay.*", rc, lib)
	if c.HTTP.IdempotencyTTL != inbox.DefaultCommandRetention || c.Runtime.GOGC != gcx.DefaultPercent {
		t.Errorf("http.idempotency_ttl %s (inbox.DefaultCommandRetention %s), runtime.gogc %d (gcx.DefaultPercent %d)",
			c.HTTP.IdempotencyTTL, inbox.DefaultCommandRetention, c.Runtime.GOGC, gcx.DefaultPercent)
	}
}
