package coupon

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/inbox"
)

// decodeReference is DecodeOrderPaid without its fast path.
func decodeReference(b []byte) (OrderPaid, error) {
	if err := inbox.CheckJSONText(b); err != nil {
		return OrderPaid{}, fmt.Errorf("%w: %w", ErrBadOrderPaid, err)
	}
	return decodeOrderPaidReference(b)
}

// fingerprintReference and encodeReference are Fingerprint and Encode written the plain
// way. The outputs of both versions must stay byte-identical.
func fingerprintReference(o OrderPaid) string {
	s := sha256.Sum256([]byte(o.OrderID + "\x00" + o.UserID + "\x00" + strconv.FormatInt(o.AmountCents, 10) + "\x00" + o.PaidAt.UTC().Format(time.RFC3339Nano)))
	return hex.EncodeToString(s[:])
}

func encodeReference(o OrderPaid) []byte {
	b, _ := json.Marshal(struct {
		OrderID     string `json:"orderId"`
		UserID      string `json:"userId"`
		AmountCents int64  `json:"amountCents"`
		PaidAt      string `json:"paidAt"`
	}{o.OrderID, o.UserID, o.AmountCents, o.PaidAt.UTC().Format(time.RFC3339Nano)})
	return b
}

// CheckOrderPaidAgainstReference is used by FuzzDecodeOrderPaid. DecodeOrderPaid(b) must
// return what the reference decoder makes of b, the same OrderPaid or the same error. A
// decoded OrderPaid must fingerprint and encode as the reference code does.
func CheckOrderPaidAgainstReference(b []byte) error {
	got, err := DecodeOrderPaid(b)
	want, wantErr := decodeReference(b)
	switch {
	case (err == nil) != (wantErr == nil):
		return fmt.Errorf("DecodeOrderPaid(%q) = %+v, %v; the reference: %+v, %v", b, got, err, want, wantErr)
	case err != nil && (!errors.Is(err, ErrBadOrderPaid) || err.Error() != wantErr.Error()):
		return fmt.Errorf("DecodeOrderPaid(%q) error %q, the reference's %q", b, err, wantErr)
	case err == nil && got != want:
		return fmt.Errorf("DecodeOrderPaid(%q) = %+v, the reference: %+v", b, got, want)
	case err != nil:
		return nil
	}
	if fp, wfp := got.Fingerprint(), fingerprintReference(got); fp != wfp {
		return fmt.Errorf("fingerprint of %+v: %s, the reference: %s", got, fp, wfp)
	}
	if enc, wenc := got.Encode(), encodeReference(got); string(enc) != string(wenc) {
		return fmt.Errorf("encoding of %+v: %s, the reference: %s", got, enc, wenc)
	}
	return nil
}

var fastOrder = OrderPaid{OrderID: "o-123456789", UserID: "u-42", AmountCents: 12345, PaidAt: time.Date(2024, 11, 11, 0, 0, 1, 500_000_000, time.UTC)}

// Payloads in the fast path's form, and payloads it leaves to encoding/json.
var (
	fastPayloads = []struct{ name, payload string }{
		{"the encoder's output", string(fastOrder.Encode())},
		{"max values", string(OrderPaid{OrderID: strings.Repeat("o", MaxIDLen), UserID: strings.Repeat("u", MaxIDLen), AmountCents: 1<<63 - 1,
			PaidAt: time.Date(9999, 12, 31, 23, 59, 59, 999_999_999, time.UTC)}.Encode())},
		{"any member order", `{"paidAt":"2024-11-11T00:00:01.5Z","amountCents":12345,"userId":"u-42","orderId":"o-123456789"}`},
		{"JSON whitespace", " \t\r\n{ \"orderId\" :\t\"o-1\"\n,\r\"userId\" : \"u-1\" , \"amountCents\" : 0 , \"paidAt\" : \"2024-11-11T08:00:01.5+08:00\" }\n\t "},
		{"ids only", `{"orderId":"o","userId":"u"}`},
		{"UTF-8 ids, U+FFFD and DEL as sent", "{\"orderId\":\"o-é😀\uFFFD\x7f\",\"userId\":\"<&>'/\"}"},
		{"long paidAt", `{"orderId":"o","userId":"u","paidAt":"2024-11-11T00:00:01.123456789-23:59"}`},
	}
	fallbackPayloads = []struct{ name, payload string }{
		{"escape in an id", `{"orderId":"o-\u00e9","userId":"u"}`},
		{"escaped quote", `{"orderId":"o\"","userId":"u"}`},
		{"escape in a key", `{"order\u0049d":"o","userId":"u"}`},
		{"escape in paidAt", `{"orderId":"o","userId":"u","paidAt":"2024-11-11T00:00:01\u005a"}`},
		{"unknown key", `{"orderId":"o","userId":"u","channel":"app"}`},
		{"key in other case", `{"orderid":"o","userId":"u"}`},
		{"key in other case, exact key also", `{"orderId":"o","OrderId":"p","userId":"u"}`},
		{"key with the Kelvin sign", "{\"orderId\":\"o\",\"userId\":\"u\",\"amountCents\":1,\"amountCents\u212a\":2}"},
		{"repeated key", `{"orderId":"o","orderId":"p","userId":"u"}`},
		{"repeated amount", `{"orderId":"o","userId":"u","amountCents":1,"amountCents":2}`},
		{"null amount", `{"orderId":"o","userId":"u","amountCents":null}`},
		{"null paidAt", `{"orderId":"o","userId":"u","paidAt":null}`},
		{"null id", `{"orderId":null,"userId":"u"}`},
		{"nested value", `{"orderId":"o","userId":{"id":"u"}}`},
		{"amount with fraction", `{"orderId":"o","userId":"u","amountCents":1.0}`},
		{"amount with exponent", `{"orderId":"o","userId":"u","amountCents":1e2}`},
		{"amount with capital exponent", `{"orderId":"o","userId":"u","amountCents":1E2}`},
		{"amount minus zero", `{"orderId":"o","userId":"u","amountCents":-0}`},
		{"amount negative", `{"orderId":"o","userId":"u","amountCents":-1}`},
		{"amount with plus", `{"orderId":"o","userId":"u","amountCents":+1}`},
		{"amount with leading zero", `{"orderId":"o","userId":"u","amountCents":01}`},
		{"amount over int64", `{"orderId":"o","userId":"u","amountCents":9223372036854775808}`},
		{"amount far over int64", `{"orderId":"o","userId":"u","amountCents":99999999999999999999999}`},
		{"amount string", `{"orderId":"o","userId":"u","amountCents":"1"}`},
		{"amount true", `{"orderId":"o","userId":"u","amountCents":true}`},
		{"amount missing", `{"orderId":"o","userId":"u","amountCents":}`},
		{"trailing data", `{"orderId":"o","userId":"u"}x`},
		{"second object", `{"orderId":"o","userId":"u"}{}`},
		{"trailing comma", `{"orderId":"o","userId":"u",}`},
		{"missing comma", `{"orderId":"o" "userId":"u"}`},
		{"missing colon", `{"orderId" "o","userId":"u"}`},
		{"unclosed", `{"orderId":"o","userId":"u"`},
		{"unterminated string", `{"orderId":"o","userId":"u`},
		{"control byte in an id", "{\"orderId\":\"o\x01\",\"userId\":\"u\"}"},
		{"tab in an id", "{\"orderId\":\"o\t\",\"userId\":\"u\"}"},
		{"non-JSON space", "{\"orderId\":\"o\",\v\"userId\":\"u\"}"},
		{"byte order mark", "\uFEFF{\"orderId\":\"o\",\"userId\":\"u\"}"},
		{"empty object", `{}`},
		{"empty id", `{"orderId":"","userId":"u"}`},
		{"missing userId", `{"orderId":"o"}`},
		{"id over 64 bytes", `{"orderId":"` + strings.Repeat("x", MaxIDLen+1) + `","userId":"u"}`},
		{"paidAt not RFC3339", `{"orderId":"o","userId":"u","paidAt":"2024-11-11"}`},
		{"paidAt UTC year above 9999", `{"orderId":"o","userId":"u","paidAt":"9999-12-31T23:59:59-01:00"}`},
		{"not UTF-8", "{\"orderId\":\"o\xff\",\"userId\":\"u\"}"},
		{"array", `[{"orderId":"o","userId":"u"}]`},
		{"empty", ``},
	}
)

// OrderPaidDecodeSeeds seeds FuzzDecodeOrderPaid with the payloads above.
func OrderPaidDecodeSeeds() []string {
	var s []string
	for _, c := range append(fastPayloads, fallbackPayloads...) {
		s = append(s, c.payload)
	}
	return s
}

// TestDecodeOrderPaidFastPath checks that the fast path decodes the common wire form and
// leaves everything else to encoding/json. Either way the result is the reference's.
func TestDecodeOrderPaidFastPath(t *testing.T) {
	for _, c := range fastPayloads {
		t.Run("fast/"+c.name, func(t *testing.T) {
			if inbox.CheckJSONText([]byte(c.payload)) != nil {
				t.Fatalf("%q: not JSON text", c.payload)
			}
			got, ok := decodeOrderPaidFast([]byte(c.payload))
			if !ok {
				t.Fatalf("%s: the fast path falls back", c.payload)
			}
			want, err := decodeReference([]byte(c.payload))
			if err != nil || got != want {
				t.Fatalf("%s: fast path %+v, the reference %+v %v", c.payload, got, want, err)
			}
		})
	}
	for _, c := range fallbackPayloads {
		t.Run("fallback/"+c.name, func(t *testing.T) {
			if got, ok := decodeOrderPaidFast([]byte(c.payload)); ok {
				t.Fatalf("%s: the fast path decodes %+v, want a fallback", c.payload, got)
			}
			if err := CheckOrderPaidAgainstReference([]byte(c.payload)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestOrderPaidAllocations checks that DecodeOrderPaid takes the fast path for the
// encoder's output, with one allocation for the ids' string. Fingerprint and Encode
// allocate only what they return.
func TestOrderPaidAllocations(t *testing.T) {
	p := fastOrder.Encode()
	ref := testing.AllocsPerRun(100, func() { _, _ = decodeReference(p) })
	for _, c := range []struct {
		name string
		f    func()
		want float64
	}{
		{"DecodeOrderPaid", func() { _, _ = DecodeOrderPaid(p) }, 1},
		{"Fingerprint", func() { _ = fastOrder.Fingerprint() }, 1},
		{"Encode", func() { _ = fastOrder.Encode() }, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := testing.AllocsPerRun(100, c.f); got > c.want {
				t.Errorf("%s: %v allocations, want at most %v (the reference decoder: %v)", c.name, got, c.want, ref)
			}
		})
	}
}

// TestOrderPaidFingerprintAndEncodeUnchanged checks that Fingerprint and Encode write what
// the reference code writes. That holds for the values the fast ways take and for those
// they leave to the reference code.
func TestOrderPaidFingerprintAndEncodeUnchanged(t *testing.T) {
	cst := time.FixedZone("CST", 8*3600)
	ids := []string{"", "o-1", strings.Repeat("x", MaxIDLen), strings.Repeat("y", 3*MaxIDLen), `q"uote`, `back\slash`, "<html>", "a&b",
		"nul\x00", "ctl\x1f", "del\x7f", "tab\t", "nl\n", "é😀", "\uFFFD", "\u2028\u2029", "bad\xff", "~ !#$%'()*+,-./:;=?@[]^_`{|}"}
	times := []time.Time{{}, fastOrder.PaidAt, time.Date(2024, 11, 11, 8, 0, 0, 1, cst), time.Date(9999, 12, 31, 23, 59, 59, 999_999_999, time.UTC),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC), time.Unix(1<<62, 0)}
	for c := range 256 {
		ids = append(ids, "id-"+string([]byte{byte(c)}))
	}
	amounts := []int64{0, 1, -1, 12345, 1<<63 - 1, -1 << 63}
	n := 0
	for i, id := range ids {
		for j, at := range times {
			o := OrderPaid{OrderID: id, UserID: ids[(i+j)%len(ids)], AmountCents: amounts[(i+j)%len(amounts)], PaidAt: at}
			if got, want := o.Fingerprint(), fingerprintReference(o); got != want {
				t.Errorf("fingerprint of %+v: %s, the reference: %s", o, got, want)
			}
			if got, want := o.Encode(), encodeReference(o); string(got) != string(want) {
				t.Errorf("encoding of %+v: %s, the reference: %s", o, got, want)
			}
			n++
		}
	}
	t.Logf("%d values", n)
}

func BenchmarkDecodeOrderPaid(b *testing.B) {
	p := fastOrder.Encode()
	for _, c := range []struct {
		name   string
		decode func([]byte) (OrderPaid, error)
	}{{"fast", DecodeOrderPaid}, {"reference", decodeReference}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.decode(p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkOrderPaidFingerprint(b *testing.B) {
	for _, c := range []struct {
		name string
		f    func(OrderPaid) string
	}{{"new", OrderPaid.Fingerprint}, {"reference", fingerprintReference}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = c.f(fastOrder)
			}
		})
	}
}

func BenchmarkOrderPaidEncode(b *testing.B) {
	for _, c := range []struct {
		name string
		f    func(OrderPaid) []byte
	}{{"new", OrderPaid.Encode}, {"reference", encodeReference}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = c.f(fastOrder)
			}
		})
	}
}
