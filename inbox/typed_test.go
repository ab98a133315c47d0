package inbox_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
)

type shipped struct {
	OrderID string `json:"orderId"`
	Points  int64  `json:"points"`
}

func shippedKey(s shipped) (string, error) {
	if s.OrderID == "" {
		return "", errors.New("orderId is required")
	}
	return s.OrderID, nil
}

// TestJSONCodec checks the JSON codec. It allows unknown fields and refuses anything after
// the value. It takes the plugin's key, and its refusal, and the plugin's fingerprint.
// Every refusal is poison.
func TestJSONCodec(t *testing.T) {
	h := inbox.Typed(inbox.JSON[shipped]{Key: shippedKey, Fingerprint: func(s shipped) string { return s.OrderID + "/" + string(rune('0'+s.Points%10)) }},
		func(context.Context, *sql.Tx, *inbox.Delivery, shipped) (inbox.Progress, error) {
			return inbox.Done, nil
		})
	for _, tc := range []struct {
		name, payload string
		key, fp       string // want, when valid
		err           string // want a poison error containing this
	}{
		{name: "plain", payload: `{"orderId":"o-1","points":7}`, key: "o-1", fp: "o-1/7"},
		{name: "unknown fields", payload: `{"orderId":"o-2","points":3,"carrier":{"name":"x"},"extra":[1,2]}`, key: "o-2", fp: "o-2/3"},
		{name: "white space after", payload: "{\"orderId\":\"o-3\"}\n\t ", key: "o-3", fp: "o-3/0"},
		{name: "second value", payload: `{"orderId":"o-4"} {"orderId":"o-5"}`, err: "data after the value"},
		{name: "garbage after", payload: `{"orderId":"o-4"}x`, err: "data after the value"},
		{name: "closing brace after", payload: `{"orderId":"o-4"}}`, err: "data after the value"},
		{name: "not JSON", payload: `order o-6`, err: "json"},
		{name: "empty", payload: ``, err: "json"},
		{name: "wrong type", payload: `{"orderId":7}`, err: "json"},
		{name: "key refused", payload: `{"points":1}`, err: "orderId is required"},
		{name: "key not UTF-8", payload: "{\"orderId\":\"u8-\xff\"}", err: "payload is not valid UTF-8 at byte 15"},
		{name: "key with a lone surrogate", payload: `{"orderId":"u8-\ud800"}`, err: "payload is not valid UTF-8 at byte 15"},
		{name: "unknown field not UTF-8", payload: "{\"orderId\":\"o-7\",\"note\":\"\xfe\"}", err: "payload is not valid UTF-8 at byte 25"},
		{name: "key with a surrogate pair", payload: `{"orderId":"o-\ud83d\ude00"}`, key: "o-\U0001F600", fp: "o-\U0001F600/0"},
		{name: "escaped key, exact once decoded", payload: `{"order\u0049d":"o-8","points":1}`, key: "o-8", fp: "o-8/1"},
		{name: "field in another case", payload: `{"ORDERID":"ci-1"}`, err: `json: field name in another case: "ORDERID" at byte 1 is field "orderId"`},
		{name: "field, then in another case", payload: `{"orderId":"ci-2","orderid":"ci-3"}`, err: `field name in another case: "orderid" at byte 18`},
		{name: "field given twice", payload: `{"orderId":"ci-4","points":1,"orderId":"ci-5"}`, err: `json: key given twice: "orderId" at byte 29`},
		{name: "unknown field given twice", payload: `{"orderId":"ci-6","note":"a","note":"b"}`, err: `key given twice: "note"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := h.Decode(message.NewMessage("m", []byte(tc.payload)))
			if tc.err != "" {
				if !errors.Is(err, inbox.ErrPoison) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want poison containing %q", err, tc.err)
				}
				return
			}
			if err != nil || d.Key != tc.key || d.Fingerprint != tc.fp {
				t.Fatalf("decoded %+v %v, want key %q fingerprint %q", d, err, tc.key, tc.fp)
			}
			if _, ok := d.Value.(shipped); !ok {
				t.Fatalf("value %T, want shipped", d.Value)
			}
		})
	}
}

// TestTypedMisuse checks that a delivery whose value is not the handler's type is a
// permanent failure, not a panic. Nil codecs, nil functions and a JSON without Key panic
// at construction.
func TestTypedMisuse(t *testing.T) {
	h := inbox.Typed(inbox.JSON[shipped]{Key: shippedKey}, func(context.Context, *sql.Tx, *inbox.Delivery, shipped) (inbox.Progress, error) {
		t.Fatal("called with a value of another type")
		return inbox.Done, nil
	})
	if _, err := h.Handle(context.Background(), nil, &inbox.Delivery{Key: "k", Value: "a string"}); !errors.Is(err, inbox.ErrPermanent) {
		t.Fatalf("error %v, want permanent", err)
	}
	handle := func(context.Context, *sql.Tx, *inbox.Delivery, shipped) (inbox.Progress, error) {
		return inbox.Done, nil
	}
	for name, build := range map[string]func(){
		"nil codec":    func() { inbox.Typed[shipped](nil, handle) },
		"JSON no Key":  func() { inbox.Typed(inbox.JSON[shipped]{}, handle) },
		"*JSON no Key": func() { inbox.Typed[shipped](&inbox.JSON[shipped]{}, handle) },
		"nil handle":   func() { inbox.Typed[shipped](inbox.JSON[shipped]{Key: shippedKey}, nil) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			build()
		}()
	}
}

// BenchmarkJSONCodec decodes a small order with the JSON codec, as a typed handler does.
func BenchmarkJSONCodec(b *testing.B) {
	c := inbox.JSON[shipped]{Key: shippedKey}
	msg := message.NewMessage("m", []byte(`{"orderId":"o-123456789","points":40,"carrier":{"name":"post","tracking":["a","b"]}}`))
	b.ReportAllocs()
	for b.Loop() {
		if _, _, _, err := c.Decode(msg); err != nil {
			b.Fatal(err)
		}
	}
}
