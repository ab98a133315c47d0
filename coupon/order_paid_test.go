package coupon_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/onceflow/onceflow/coupon"
)

var paidAt = time.Date(2024, 11, 11, 0, 0, 1, 500_000_000, time.UTC)

type decodeCase struct {
	name    string
	payload string
	want    coupon.OrderPaid // ignored when bad
	bad     bool
}

var (
	id64 = strings.Repeat("x", coupon.MaxIDLen)
	id65 = strings.Repeat("x", coupon.MaxIDLen+1)
)

var decodeCases = []decodeCase{
	// valid
	{name: "full", payload: `{"orderId":"o-1","userId":"u-1","amountCents":12345,"paidAt":"2024-11-11T00:00:01.5Z"}`,
		want: coupon.OrderPaid{OrderID: "o-1", UserID: "u-1", AmountCents: 12345, PaidAt: paidAt}},
	{name: "extra unknown fields", payload: `{"orderId":"o-1","channel":"app","userId":"u-1","items":[{"sku":1}],"amountCents":12345,"meta":null,"paidAt":"2024-11-11T00:00:01.5Z"}`,
		want: coupon.OrderPaid{OrderID: "o-1", UserID: "u-1", AmountCents: 12345, PaidAt: paidAt}},
	{name: "no paidAt", payload: `{"orderId":"o-1","userId":"u-1","amountCents":1}`,
		want: coupon.OrderPaid{OrderID: "o-1", UserID: "u-1", AmountCents: 1}},
	{name: "no amountCents", payload: `{"orderId":"o-1","userId":"u-1","paidAt":"2024-11-11T00:00:01.5Z"}`,
		want: coupon.OrderPaid{OrderID: "o-1", UserID: "u-1", PaidAt: paidAt}},
	{name: "paidAt with offset is normalised to UTC", payload: `{"orderId":"o-1","userId":"u-1","amountCents":0,"paidAt":"2024-11-11T08:00:01.5+08:00"}`,
		want: coupon.OrderPaid{OrderID: "o-1", UserID: "u-1", PaidAt: paidAt}},
	{name: "whitespace around", payload: " \n\t{ \"orderId\" : \"o-1\" , \"userId\" : \"u-1\" }\n ",
		want: coupon.OrderPaid{OrderID: "o-1", UserID: "u-1"}},
	{name: "ids of exactly 64 bytes", payload: `{"orderId":"` + id64 + `","userId":"` + id64 + `"}`,
		want: coupon.OrderPaid{OrderID: id64, UserID: id64}},
	{name: "max int64 amount", payload: `{"orderId":"o","userId":"u","amountCents":9223372036854775807}`,
		want: coupon.OrderPaid{OrderID: "o", UserID: "u", AmountCents: 1<<63 - 1}},
	{name: "null amount and paidAt mean absent", payload: `{"orderId":"o","userId":"u","amountCents":null,"paidAt":null}`,
		want: coupon.OrderPaid{OrderID: "o", UserID: "u"}},
	{name: "ids with escapes that decode as sent", payload: `{"orderId":"o-\u00e9\ud83d\ude00","userId":"u-\ufffd"}`,
		want: coupon.OrderPaid{OrderID: "o-é😀", UserID: "u-\uFFFD"}},

	// poison
	{name: "invalid JSON", payload: `{orderId: o-1}`, bad: true},
	{name: "empty", payload: ``, bad: true},
	{name: "truncated", payload: `{"orderId":"o-1","userId":"u-1","amountCe`, bad: true},
	{name: "trailing object", payload: `{"orderId":"o-1","userId":"u-1"} {}`, bad: true},
	{name: "trailing garbage", payload: `{"orderId":"o-1","userId":"u-1"}x`, bad: true},
	{name: "trailing brace", payload: `{"orderId":"o-1","userId":"u-1"}}`, bad: true},
	{name: "trailing bracket", payload: `{"orderId":"o-1","userId":"u-1"}]`, bad: true},
	{name: "missing orderId", payload: `{"userId":"u-1","amountCents":1}`, bad: true},
	{name: "empty orderId", payload: `{"orderId":"","userId":"u-1"}`, bad: true},
	{name: "null orderId", payload: `{"orderId":null,"userId":"u-1"}`, bad: true},
	{name: "missing userId", payload: `{"orderId":"o-1","amountCents":1}`, bad: true},
	{name: "empty userId", payload: `{"orderId":"o-1","userId":""}`, bad: true},
	{name: "orderId number", payload: `{"orderId":123,"userId":"u-1"}`, bad: true},
	{name: "userId object", payload: `{"orderId":"o-1","userId":{"id":1}}`, bad: true},
	{name: "amountCents string", payload: `{"orderId":"o-1","userId":"u-1","amountCents":"500"}`, bad: true},
	{name: "amountCents non-numeric string", payload: `{"orderId":"o-1","userId":"u-1","amountCents":"five"}`, bad: true},
	{name: "amountCents float", payload: `{"orderId":"o-1","userId":"u-1","amountCents":1.5}`, bad: true},
	{name: "amountCents exponent", payload: `{"orderId":"o-1","userId":"u-1","amountCents":1e3}`, bad: true},
	{name: "amountCents bool", payload: `{"orderId":"o-1","userId":"u-1","amountCents":true}`, bad: true},
	{name: "amountCents negative", payload: `{"orderId":"o-1","userId":"u-1","amountCents":-1}`, bad: true},
	{name: "amountCents overflow", payload: `{"orderId":"o-1","userId":"u-1","amountCents":9223372036854775808}`, bad: true},
	{name: "paidAt not RFC3339", payload: `{"orderId":"o-1","userId":"u-1","paidAt":"2024-11-11 00:00:00"}`, bad: true},
	{name: "paidAt date only", payload: `{"orderId":"o-1","userId":"u-1","paidAt":"2024-11-11"}`, bad: true},
	{name: "paidAt empty", payload: `{"orderId":"o-1","userId":"u-1","paidAt":""}`, bad: true},
	{name: "paidAt number", payload: `{"orderId":"o-1","userId":"u-1","paidAt":1731283200}`, bad: true},
	{name: "paidAt UTC year above 9999", payload: `{"orderId":"o-1","userId":"u-1","paidAt":"9999-12-31T23:59:59-01:00"}`, bad: true},
	{name: "paidAt UTC year below 0", payload: `{"orderId":"o-1","userId":"u-1","paidAt":"0000-01-01T00:00:00+01:00"}`, bad: true},
	{name: "orderId over 64 bytes", payload: `{"orderId":"` + id65 + `","userId":"u-1"}`, bad: true},
	{name: "userId over 64 bytes", payload: `{"orderId":"o-1","userId":"` + id65 + `"}`, bad: true},
	{name: "orderId of 33 runes but 66 bytes", payload: `{"orderId":"` + strings.Repeat("é", 33) + `","userId":"u-1"}`, bad: true},
	{name: "orderId not UTF-8", payload: "{\"orderId\":\"u8-\xff\",\"userId\":\"u-1\",\"amountCents\":100}", bad: true},
	{name: "userId not UTF-8", payload: "{\"orderId\":\"o-1\",\"userId\":\"u-\xfe\"}", bad: true},
	{name: "unknown field not UTF-8", payload: "{\"orderId\":\"o-1\",\"userId\":\"u-1\",\"note\":\"\xc3\"}", bad: true},
	{name: "orderId with a lone surrogate", payload: `{"orderId":"u8-\ud800","userId":"u-1"}`, bad: true},
	{name: "userId with a lone low surrogate", payload: `{"orderId":"o-1","userId":"u-\udfff"}`, bad: true},
	{name: "JSON null", payload: `null`, bad: true},
	{name: "JSON array", payload: `[{"orderId":"o-1","userId":"u-1"}]`, bad: true},
	{name: "JSON string", payload: `"o-1"`, bad: true},
	{name: "JSON number", payload: `42`, bad: true},
	{name: "orderId in capitals", payload: `{"ORDERID":"ci-1","userId":"u-1"}`, bad: true},
	{name: "orderId, then in lower case", payload: `{"orderId":"ci-2","orderid":"ci-3","userId":"u-1"}`, bad: true},
	{name: "userId in another case", payload: `{"orderId":"o-1","UserId":"u-1"}`, bad: true},
	{name: "amountCents in another case", payload: `{"orderId":"o-1","userId":"u-1","amountcents":5}`, bad: true},
	{name: "amountCents with a long s", payload: "{\"orderId\":\"o-1\",\"userId\":\"u-1\",\"amountCent\u017f\":5}", bad: true},
	{name: "orderId given twice", payload: `{"orderId":"ci-4","userId":"u-1","orderId":"ci-5"}`, bad: true},
	{name: "orderId twice, once escaped", payload: `{"orderId":"ci-4","userId":"u-1","order\u0049d":"ci-5"}`, bad: true},
	{name: "paidAt given twice", payload: `{"orderId":"o-1","userId":"u-1","paidAt":"2024-11-11T00:00:01.5Z","paidAt":null}`, bad: true},
	{name: "unknown field given twice", payload: `{"orderId":"o-1","userId":"u-1","channel":"app","channel":"web"}`, bad: true},
}

func TestDecodeOrderPaid(t *testing.T) {
	for _, c := range decodeCases {
		t.Run(c.name, func(t *testing.T) {
			got, err := coupon.DecodeOrderPaid([]byte(c.payload))
			if c.bad {
				if err == nil {
					t.Fatalf("DecodeOrderPaid(%s) = %+v, want an error", c.payload, got)
				}
				if !errors.Is(err, coupon.ErrBadOrderPaid) {
					t.Fatalf("DecodeOrderPaid(%s) error %v does not wrap ErrBadOrderPaid", c.payload, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("DecodeOrderPaid(%s): %v", c.payload, err)
			}
			if got != c.want {
				t.Fatalf("DecodeOrderPaid(%s) = %+v, want %+v", c.payload, got, c.want)
			}
		})
	}
}

func mustDecode(t *testing.T, payload string) coupon.OrderPaid {
	t.Helper()
	o, err := coupon.DecodeOrderPaid([]byte(payload))
	if err != nil {
		t.Fatalf("DecodeOrderPaid(%s): %v", payload, err)
	}
	return o
}

func TestOrderPaidFingerprint(t *testing.T) {
	base := `{"orderId":"o-1","userId":"u-1","amountCents":500,"paidAt":"2024-11-11T00:00:00Z"}`
	fp := mustDecode(t, base).Fingerprint()
	if len(fp) != 64 {
		t.Fatalf("fingerprint %q: want 64 hex chars", fp)
	}
	same := []struct{ name, payload string }{
		{"identical", base},
		{"field order", `{"paidAt":"2024-11-11T00:00:00Z","amountCents":500,"userId":"u-1","orderId":"o-1"}`},
		{"whitespace", "{\n  \"orderId\": \"o-1\",\n  \"userId\": \"u-1\",\n  \"amountCents\": 500,\n  \"paidAt\": \"2024-11-11T00:00:00Z\"\n}\n"},
		{"extra fields", `{"orderId":"o-1","userId":"u-1","amountCents":500,"paidAt":"2024-11-11T00:00:00Z","source":"retry","v":2}`},
		{"same instant other offset", `{"orderId":"o-1","userId":"u-1","amountCents":500,"paidAt":"2024-11-11T08:00:00+08:00"}`},
		{"re-encoded", string(mustDecode(t, base).Encode())},
	}
	for _, c := range same {
		t.Run("same/"+c.name, func(t *testing.T) {
			if got := mustDecode(t, c.payload).Fingerprint(); got != fp {
				t.Errorf("fingerprint of %s = %s, want %s", c.payload, got, fp)
			}
		})
	}
	different := []struct{ name, payload string }{
		{"userId", `{"orderId":"o-1","userId":"u-2","amountCents":500,"paidAt":"2024-11-11T00:00:00Z"}`},
		{"amountCents", `{"orderId":"o-1","userId":"u-1","amountCents":501,"paidAt":"2024-11-11T00:00:00Z"}`},
		{"amountCents absent", `{"orderId":"o-1","userId":"u-1","paidAt":"2024-11-11T00:00:00Z"}`},
		{"orderId", `{"orderId":"o-2","userId":"u-1","amountCents":500,"paidAt":"2024-11-11T00:00:00Z"}`},
		{"paidAt", `{"orderId":"o-1","userId":"u-1","amountCents":500,"paidAt":"2024-11-11T00:00:01Z"}`},
		// The separator keeps field boundaries, so moving bytes between ids changes the
		// fingerprint.
		{"shifted ids", `{"orderId":"o-1u","userId":"-1","amountCents":500,"paidAt":"2024-11-11T00:00:00Z"}`},
	}
	for _, c := range different {
		t.Run("different/"+c.name, func(t *testing.T) {
			if got := mustDecode(t, c.payload).Fingerprint(); got == fp {
				t.Errorf("fingerprint of %s equals the base one", c.payload)
			}
		})
	}
}

func TestOrderPaidRoundTrip(t *testing.T) {
	for _, o := range []coupon.OrderPaid{
		{OrderID: "o-1", UserID: "u-1", AmountCents: 12345, PaidAt: time.Date(2024, 11, 11, 0, 0, 0, 123456789, time.UTC)},
		{OrderID: "o-2", UserID: "u-2"},
		{OrderID: id64, UserID: `quote " backslash \ <html> & ünïcødé`, AmountCents: 1<<63 - 1, PaidAt: time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)},
	} {
		t.Run(o.OrderID[:3], func(t *testing.T) {
			got, err := coupon.DecodeOrderPaid(o.Encode())
			if err != nil {
				t.Fatalf("decode %s: %v", o.Encode(), err)
			}
			if got != o {
				t.Fatalf("round trip: got %+v, want %+v", got, o)
			}
			if got.Fingerprint() != o.Fingerprint() {
				t.Fatalf("fingerprint changed by the round trip")
			}
		})
	}
	// A non-UTC PaidAt is encoded as the same instant in UTC.
	o := coupon.OrderPaid{OrderID: "o", UserID: "u", PaidAt: time.Date(2024, 11, 11, 8, 0, 0, 0, time.FixedZone("CST", 8*3600))}
	got, err := coupon.DecodeOrderPaid(o.Encode())
	if err != nil || !got.PaidAt.Equal(o.PaidAt) || got.PaidAt.Location() != time.UTC || got.Fingerprint() != o.Fingerprint() {
		t.Fatalf("round trip of a non-UTC time: %+v, %v", got, err)
	}
}

func FuzzDecodeOrderPaid(f *testing.F) {
	for _, c := range decodeCases {
		f.Add([]byte(c.payload))
	}
	f.Add([]byte(`{"orderId":"o-\ud800\udc00\uDBFF","userId":"u"}`))
	// Every seed of the fast path's form and its edges is checked against the reference
	// decoder.
	for _, o := range []coupon.OrderPaid{
		{OrderID: "o-1", UserID: "u-1", AmountCents: 12345, PaidAt: paidAt},
		{OrderID: id64, UserID: "é😀<&>", AmountCents: 1<<63 - 1, PaidAt: time.Date(9999, 12, 31, 23, 59, 59, 999_999_999, time.UTC)},
		{OrderID: `q"b\`, UserID: "\x01\u2028"},
	} {
		f.Add(o.Encode())
	}
	for _, s := range append(coupon.OrderPaidDecodeSeeds(),
		`{"orderId":"o\/","userId":"u"}`, `{"ORDERID":"o","userId":"u"}`, `{"orderid":"o","orderId":"p","userId":"u"}`,
		`{"orderId":"o","userId":"u","paidAt":"2024-11-11T00:00:00Z","paidAt":null}`,
		`{"orderId":"o","userId":"u","amountCents":9223372036854775807}`, "{\"orderId\":\"o\xc3\",\"userId\":\"u\"}",
	) {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if err := coupon.CheckOrderPaidAgainstReference(b); err != nil {
			t.Fatal(err)
		}
		o, err := coupon.DecodeOrderPaid(b)
		if err != nil {
			if !errors.Is(err, coupon.ErrBadOrderPaid) {
				t.Fatalf("error %v does not wrap ErrBadOrderPaid", err)
			}
			return
		}
		for name, id := range map[string]string{"OrderID": o.OrderID, "UserID": o.UserID} {
			if id == "" || len(id) > coupon.MaxIDLen || !utf8.ValidString(id) {
				t.Fatalf("%s %q: want 1..%d bytes of UTF-8", name, id, coupon.MaxIDLen)
			}
		}
		// A decoded key is never a rewritten form of the input. encoding/json turns bytes
		// that are not UTF-8 and lone surrogates into U+FFFD. So the ids must hold no more
		// U+FFFD than were sent as such.
		if !utf8.Valid(b) {
			t.Fatalf("accepted %q, which is not UTF-8", b)
		}
		got := strings.Count(o.OrderID, "\uFFFD") + strings.Count(o.UserID, "\uFFFD")
		if sent := bytes.Count(b, []byte("\uFFFD")) + bytes.Count(bytes.ToLower(b), []byte(`\ufffd`)); got > sent {
			t.Fatalf("%q decoded to ids %q and %q: %d U+FFFD, %d sent", b, o.OrderID, o.UserID, got, sent)
		}
		if o.AmountCents < 0 {
			t.Fatalf("AmountCents %d < 0", o.AmountCents)
		}
		enc := o.Encode()
		back, err := coupon.DecodeOrderPaid(enc)
		if err != nil {
			t.Fatalf("re-decode of %s (from %q): %v", enc, b, err)
		}
		if back != o {
			t.Fatalf("round trip of %q: got %+v, want %+v", b, back, o)
		}
		if back.Fingerprint() != o.Fingerprint() {
			t.Fatalf("round trip of %q changed the fingerprint", b)
		}
	})
}
