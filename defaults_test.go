package onceflow

import (
	"reflect"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/httpcmd"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// TestRouterDefaultsAreTheLibraries: the stock router's default configuration, mapped onto
// the libraries' configs as `run` maps it, is what each library fills in for a zero config —
// a program wired by hand and the router start from the same settings.
func TestRouterDefaultsAreTheLibraries(t *testing.T) {
	c := DefaultConfig()
	if got, want := c.inboxConfig("x", "").WithDefaults(), (inbox.Config{BizType: "x"}).WithDefaults(); !reflect.DeepEqual(got, want) {
		t.Errorf("inbox.*\n got %+v\nwant %+v", got, want)
	}
	if got, want := c.batchConfig().WithDefaults(), (inbox.BatchConfig{}).WithDefaults(); !reflect.DeepEqual(got, want) {
		t.Errorf("inbox.batch_*\n got %+v\nwant %+v", got, want)
	}
	if c.Inbox.CleanupBatch != libCleaner.BatchSize || c.Inbox.CleanupInterval != (inbox.CleanerConfig{}).WithDefaults().Interval {
		t.Errorf("inbox.cleanup_*: %d, %s", c.Inbox.CleanupBatch, c.Inbox.CleanupInterval)
	}
	kc, want := c.kafkaConfig(), (kafkax.Config{}).WithDefaults()
	want.ClientID = kc.ClientID // the router names its clients
	if !reflect.DeepEqual(kc, want) {
		t.Errorf("kafka.*\n got %+v\nwant %+v", kc, want)
	}
	if c.HTTP.MaxBodyBytes != int((httpcmd.Config{}).WithDefaults().MaxBodyBytes) || c.HTTP.RequestTimeout != (httpcmd.Config{}).WithDefaults().RequestTimeout ||
		c.HTTP.IdempotencyTTL != inbox.DefaultCommandRetention {
		t.Errorf("http.*: %+v", c.HTTP)
	}

	c.DB.DSN = "app@tcp(127.0.0.1:3306)/shop"
	a := &app{cfg: c, logger: watermill.NopLogger{}}
	rc, err := a.relayConfig()
	if err != nil {
		t.Fatal(err)
	}
	lib := (outbox.RelayConfig{}).WithDefaults()
	if rc.TransactionalID != outbox.DefaultTransactionalID("shop", lib.Shard) {
		t.Errorf("transactional id %q", rc.TransactionalID)
	}
	rc = rc.WithDefaults()
	rc.TransactionalID, rc.Owner, rc.Hook, lib.Owner = "", "", nil, ""
	if !reflect.DeepEqual(rc, lib) {
		t.Errorf("relay.*\n got %+v\nwant %+v", rc, lib)
	}

	// The router's zero values that mean "off" reach the library as its sentinels.
	c.Relay.Retention, c.Relay.Linger = 0, 0
	a = &app{cfg: c, logger: watermill.NopLogger{}}
	if rc, err = a.relayConfig(); err != nil || rc.Retention >= 0 || rc.Linger >= 0 {
		t.Errorf("relay.retention 0 / relay.linger 0 became %s / %s (%v)", rc.Retention, rc.Linger, err)
	}
	if dur(720*time.Hour) != "720h" || dur(time.Minute) != "1m" || dur(90*time.Second) != "1m30s" || dur(100*time.Millisecond) != "100ms" {
		t.Error("dur")
	}
}
