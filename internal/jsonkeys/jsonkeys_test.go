package jsonkeys

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

type order struct {
	OrderID string    `json:"orderId"`
	UserID  string    `json:"userId,omitempty"`
	Amount  int64     `json:"amountCents"`
	PaidAt  time.Time `json:"paidAt"`
	Note    string    `json:"-"`
	Plain   string
	Lines   []line            `json:"lines"`
	Tags    map[string]string `json:"tags"`
	Extra   any               `json:"extra"`
	Raw     json.RawMessage   `json:"raw"`
	Ship    *shipment         `json:"ship"`
	audited
	unexported string
}

type line struct {
	SKU string `json:"sku"`
	Qty int    `json:"qty"`
}

type shipment struct {
	Carrier string    `json:"carrier"`
	Next    *shipment `json:"next"`
}

type audited struct {
	Source string `json:"source"`
}

// What Check refuses, encoding/json decodes without a word: each refused case is shown to
// decode, so the check is what stands between it and a silently chosen value.
func TestCheck(t *testing.T) {
	manyKeys := func(dup bool) string {
		var b strings.Builder
		b.WriteString(`{"tags":{`)
		for i := range 40 {
			fmt.Fprintf(&b, `"t%d":"v",`, i)
		}
		if dup {
			b.WriteString(`"t7":"w",`)
		}
		b.WriteString(`"last":"v"}}`)
		return b.String()
	}
	for _, tc := range []struct {
		name, data string
		want       error
		says       string
	}{
		{"exact", `{"orderId":"o-1","userId":"u","amountCents":5,"paidAt":"2024-11-11T00:00:00Z"}`, nil, ""},
		{"unknown fields, their contents unread", `{"orderId":"o","channel":{"a":1,"a":2,"ORDERID":3},"list":[{"x":1,"x":2}]}`, nil, ""},
		{"empty object and white space", " { } ", nil, ""},
		{"escaped key, exact once decoded", `{"order\u0049d":"o"}`, nil, ""},
		{"Go name without a tag", `{"Plain":"p"}`, nil, ""},
		{"promoted field of an embedded struct", `{"source":"s"}`, nil, ""},
		{"tag \"-\" is no field", `{"Note":"n","note":"m"}`, nil, ""},
		{"raw message not looked into", `{"raw":{"a":1,"a":2}}`, nil, ""},
		{"time.Time decodes itself", `{"paidAt":"2024-11-11T00:00:00Z"}`, nil, ""},
		{"nested, exact", `{"ship":{"carrier":"c","next":{"carrier":"d"}},"lines":[{"sku":"a","qty":1},{"sku":"b"}]}`, nil, ""},
		{"map keys differing only in case", `{"tags":{"a":"1","A":"2"}}`, nil, ""},
		{"many map keys", manyKeys(false), nil, ""},
		{"numbers and literals", `{"amountCents":-15,"channel":-1.5e3,"extra":[true,false,null,{"a":[1,{"b":2}]}],"userId":null}`, nil, ""},

		{"lower case", `{"orderid":"o"}`, ErrFieldCase, `"orderid" at byte 1 is field "orderId"`},
		{"upper case", `{"ORDERID":"o"}`, ErrFieldCase, `"ORDERID" at byte 1`},
		{"exact, then another case", `{"orderId":"o-2","orderid":"o-3"}`, ErrFieldCase, `"orderid" at byte 17`},
		{"Kelvin sign for k", "{\"lines\":[{\"s\u212au\":\"a\"}]}", ErrFieldCase, `is field "sku"`},
		{"long s for s", "{\"\u017Fource\":\"s\"}", ErrFieldCase, `is field "source"`},
		{"Go name in another case", `{"plain":"p"}`, ErrFieldCase, `is field "Plain"`},
		{"promoted field in another case", `{"Source":"s"}`, ErrFieldCase, `is field "source"`},
		{"escaped key in another case", `{"order\u0069d":"o"}`, ErrFieldCase, `"orderid"`},
		{"in a nested struct", `{"ship":{"Carrier":"c"}}`, ErrFieldCase, `"Carrier" at byte 9`},
		{"through a recursive pointer", `{"ship":{"next":{"next":{"CARRIER":"c"}}}}`, ErrFieldCase, `"CARRIER"`},
		{"in a slice of structs", `{"lines":[{"sku":"a"},{"SKU":"b"}]}`, ErrFieldCase, `"SKU"`},

		{"duplicate field", `{"orderId":"o-2","orderId":"o-3"}`, ErrDuplicateKey, `"orderId" at byte 17`},
		{"duplicate, one escaped", `{"orderId":"o-2","order\u0049d":"o-3"}`, ErrDuplicateKey, `"orderId"`},
		{"duplicate unknown field", `{"channel":"a","channel":"b"}`, ErrDuplicateKey, `"channel"`},
		{"duplicate map key", `{"tags":{"a":"1","a":"2"}}`, ErrDuplicateKey, `"a" at byte 17`},
		{"duplicate among many map keys", manyKeys(true), ErrDuplicateKey, `"t7"`},
		{"duplicate deep in an interface value", `{"extra":[{"a":{"b":1,"b":2}}]}`, ErrDuplicateKey, `"b"`},
		{"long key quoted in part", `{"` + strings.Repeat("é", 40) + `":1,"` + strings.Repeat("é", 40) + `":2}`, ErrDuplicateKey, `: "` + strings.Repeat("é", 32) + `"... at byte 86`},
		{"duplicate in a nested struct", `{"ship":{"carrier":"c","carrier":"d"}}`, ErrDuplicateKey, `"carrier"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var o order
			if err := json.Unmarshal([]byte(tc.data), &o); err != nil {
				t.Fatalf("encoding/json refuses %s: %v", tc.data, err)
			}
			err := Check([]byte(tc.data), reflect.TypeFor[order]())
			switch {
			case tc.want == nil && err != nil:
				t.Fatalf("Check(%s): %v", tc.data, err)
			case tc.want != nil && (!errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.says)):
				t.Fatalf("Check(%s) = %v, want %v saying %s", tc.data, err, tc.want, tc.says)
			}
			if err := Unmarshal([]byte(tc.data), new(order)); (err == nil) != (tc.want == nil) {
				t.Fatalf("Unmarshal(%s) = %v, Check %v", tc.data, err, tc.want)
			}
		})
	}
}

// An interface target checks duplicates at every depth; a nil type is one.
func TestCheckAny(t *testing.T) {
	for _, typ := range []reflect.Type{nil, reflect.TypeFor[any](), reflect.TypeFor[map[string]any]()} {
		if err := Check([]byte(`{"a":{"b":[{"c":1,"c":2}]}}`), typ); !errors.Is(err, ErrDuplicateKey) {
			t.Errorf("%v: %v, want a duplicate", typ, err)
		}
		if err := Check([]byte(`{"a":{"b":[{"c":1,"C":2}]}}`), typ); err != nil {
			t.Errorf("%v: %v", typ, err)
		}
	}
}

// Check never panics, and JSON text is never a syntax error to it.
func FuzzCheck(f *testing.F) {
	for _, s := range []string{`{"orderId":"o","ship":{"next":{"carrier":"c"}}}`, `[1,"a\"b",{"x":null}]`, `{"tags":{"a":"\u0041"}}`, `"s"`, `12`, `{`, `{"a":}`} {
		f.Add([]byte(s))
	}
	f.Add([]byte(`{"orderId":"o","ORDERID":"p"}`))
	f.Add([]byte(`{"source":1,"source":2}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, typ := range []reflect.Type{reflect.TypeFor[order](), nil} {
			err := Check(b, typ)
			if json.Valid(b) && errors.Is(err, ErrSyntax) {
				t.Fatalf("Check(%q, %v): %v", b, typ, err)
			}
		}
		if bad := topLevelBad(b); bad != "" && Check(b, reflect.TypeFor[order]()) == nil {
			t.Fatalf("Check(%q) = nil, but %s", b, bad)
		}
	})
}

// topLevelBad reads the keys of the object b with encoding/json's tokens, apart from Check,
// and says which is given twice or names a field of order only in another case ("" when
// none is, or b is not an object).
func topLevelBad(b []byte) string {
	if !json.Valid(b) {
		return ""
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return ""
	}
	names := []string{"orderId", "userId", "amountCents", "paidAt", "Plain", "lines", "tags", "extra", "raw", "ship", "source"}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return ""
		}
		key := tok.(string)
		if seen[key] {
			return fmt.Sprintf("%q is given twice", key)
		}
		seen[key] = true
		for _, n := range names {
			if key != n && strings.EqualFold(key, n) && !slices.Contains(names, key) {
				return fmt.Sprintf("%q is %q in another case", key, n)
			}
		}
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return ""
		}
	}
	return ""
}

func BenchmarkCheck(b *testing.B) {
	data := []byte(`{"orderId":"o-123456789","userId":"u-42","amountCents":12345,"paidAt":"2024-11-11T00:00:01.5Z","lines":[{"sku":"a","qty":1}],"channel":{"name":"app"}}`)
	typ := reflect.TypeFor[order]()
	b.Run("check", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := Check(data, typ); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding/json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var o order
			if err := json.Unmarshal(data, &o); err != nil {
				b.Fatal(err)
			}
		}
	})
}
