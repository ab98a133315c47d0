package engine_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/internal/testenv"
)

// rawHandler is a careless plugin. It takes its business key and fingerprint straight
// from the record's bytes, whatever they are, and it panics on a marker.
type rawHandler struct{}

func (rawHandler) Decode(m *message.Message) (inbox.Decoded, error) {
	p := m.Payload
	if len(p) > 0 && p[0] == '!' {
		panic("raw plugin: decode marker")
	}
	k := p[:min(len(p), 40)]
	return inbox.Decoded{Key: string(k), Fingerprint: string(p[min(len(p), 40):min(len(p), 200)])}, nil
}

func (rawHandler) Handle(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
	if len(d.Message.Payload) > 1 && d.Message.Payload[1] == '!' {
		panic("raw plugin: handle marker")
	}
	return inbox.Done, nil
}

// FuzzProcess sends random value, header and message-id bytes through the whole Process
// path on the real database. It runs the coupon plugin, and a careless plugin that uses
// the bytes as its key and fingerprint. Every record ends with a recorded outcome, 'done'
// or 'failed'. It never ends with an error that would have it redelivered forever.
func FuzzProcess(f *testing.F) {
	d := testenv.DB(f, 4, couponSchema)
	coupons := newPipeline(f, pipelineOpts{shared: &d, inboxCfg: engine.Config{MaxAttempts: 2, MaxMetadataBytes: 512}})
	raw, err := engine.New(d.DB, rawHandler{}, engine.Config{BizType: "raw", MaxAttempts: 2, BackoffInitial: time.Millisecond, BackoffMax: time.Millisecond,
		MaxPayloadBytes: 4096, MaxMetadataBytes: 512}, watermill.NopLogger{}, nil)
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range []struct {
		value             []byte
		hk, hv, uuid      string
		tombstone, useRaw bool
	}{
		{[]byte(orderJSON("f-1", "u")), "trace", "abc", "id-1", false, false},
		{nil, "", "", "", true, false},
		{[]byte(`{"orderId":"f-2","userId":"u","amountCents":"` + "\xff" + `"}`), "h\xff", "\xfe", "\xff\xfe", false, false},
		{[]byte("\xff\xfe-raw-key"), "k", "v", "u", false, true},
		{[]byte("!panics in decode"), "", "", "", false, true},
		{[]byte("x!panics in handle"), "", "", "", false, true},
	} {
		f.Add(seed.value, seed.hk, seed.hv, seed.uuid, seed.tombstone, seed.useRaw)
	}
	var n int64
	f.Fuzz(func(t *testing.T, value []byte, hk, hv, uuid string, tombstone, useRaw bool) {
		if tombstone {
			value = nil
		} else if value == nil {
			value = []byte{}
		}
		m := message.NewMessage(uuid, value)
		if hk != "" || hv != "" {
			m.Metadata.Set(hk, hv)
		}
		ib := coupons.inbox
		if useRaw {
			ib = raw
		}
		n++
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		r, err := ib.Process(ctx, m, inbox.Source{Topic: "fuzz", Partition: 0, Offset: n}, engine.ProcessOptions{})
		if err != nil {
			t.Fatalf("Process returned an error (the record would be redelivered forever): %v", err)
		}
		var status string
		if err := d.DB.QueryRow(testenv.Rebind("SELECT status FROM inbox WHERE id = ?"), r.InboxID).Scan(&status); err != nil {
			t.Fatalf("outcome %s: inbox row %d: %v", r.Outcome, r.InboxID, err)
		}
		if status != "done" && status != "failed" {
			t.Fatalf("outcome %s left the row %q", r.Outcome, status)
		}
	})
}
