package coupon

import (
	"math"
	"unicode/utf8"
)

// Members of the order-paid object the fast path reads, as bits of its seen set.
const (
	fieldOrderID = 1 << iota
	fieldUserID
	fieldAmountCents
	fieldPaidAt
)

// decodeOrderPaidFast decodes the common wire form without encoding/json. That form is one
// object whose members are the four known keys, each at most once and spelt exactly. Its
// string values hold no backslash and no control byte. Its amountCents is a JSON integer
// without sign. Only JSON whitespace lies between its tokens. decodeOrderPaidFast reports
// false for anything else, and for every payload DecodeOrderPaid refuses. The caller then
// decodes with encoding/json. So the fast path is never more permissive, and never words
// an error. b has passed inbox.CheckJSONText.
func decodeOrderPaidFast(b []byte) (OrderPaid, bool) {
	var (
		seen                    int
		orderID, userID, paidAt []byte
		amount                  int64
	)
	i := skipJSONSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return OrderPaid{}, false
	}
	for {
		i = skipJSONSpace(b, i+1)
		key, next, ok := plainJSONString(b, i)
		if !ok {
			return OrderPaid{}, false
		}
		var field int
		switch string(key) {
		case "orderId":
			field = fieldOrderID
		case "userId":
			field = fieldUserID
		case "amountCents":
			field = fieldAmountCents
		case "paidAt":
			field = fieldPaidAt
		default:
			// The key is unknown, or known in another case. encoding/json matches keys
			// case-insensitively.
			return OrderPaid{}, false
		}
		if seen&field != 0 {
			return OrderPaid{}, false
		}
		seen |= field
		i = skipJSONSpace(b, next)
		if i >= len(b) || b[i] != ':' {
			return OrderPaid{}, false
		}
		i = skipJSONSpace(b, i+1)
		if field == fieldAmountCents {
			amount, next, ok = plainJSONInt(b, i)
		} else {
			var v []byte
			v, next, ok = plainJSONString(b, i)
			switch field {
			case fieldOrderID:
				orderID = v
			case fieldUserID:
				userID = v
			default:
				paidAt = v
			}
		}
		if !ok {
			return OrderPaid{}, false
		}
		i = skipJSONSpace(b, next)
		if i >= len(b) {
			return OrderPaid{}, false
		}
		if b[i] == '}' {
			break
		}
		if b[i] != ',' {
			return OrderPaid{}, false
		}
	}
	if skipJSONSpace(b, i+1) != len(b) {
		return OrderPaid{}, false
	}
	for _, id := range [2][]byte{orderID, userID} {
		if len(id) == 0 || len(id) > MaxIDLen || !utf8.Valid(id) {
			return OrderPaid{}, false
		}
	}
	// One string holds both ids, and paidAt while it is parsed, so there is one allocation.
	var buf [2*MaxIDLen + len("2006-01-02T15:04:05.999999999+07:00")]byte
	s := string(append(append(append(buf[:0], orderID...), userID...), paidAt...))
	o := OrderPaid{OrderID: s[:len(orderID)], UserID: s[len(orderID) : len(orderID)+len(userID)], AmountCents: amount}
	if seen&fieldPaidAt != 0 {
		t, ok := parsePaidAt(s[len(orderID)+len(userID):])
		if !ok {
			return OrderPaid{}, false
		}
		o.PaidAt = t
	}
	return o, true
}

// skipJSONSpace returns the index of the first byte at or after i that is not JSON
// whitespace.
func skipJSONSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// plainJSONString reads the string starting at b[i] if it has no escape and no control
// byte. Its bytes are then its value. plainJSONString returns its contents and the index
// after it.
func plainJSONString(b []byte, i int) (v []byte, next int, ok bool) {
	if i >= len(b) || b[i] != '"' {
		return nil, 0, false
	}
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return b[i+1 : j], j + 1, true
		case c == '\\' || c < 0x20:
			return nil, 0, false
		}
	}
	return nil, 0, false
}

// plainJSONInt reads the non-negative JSON integer starting at b[i] if it fits an int64.
// The integer has no sign, fraction or exponent, and no leading zero, which JSON forbids.
// plainJSONInt returns the integer and the index after it.
func plainJSONInt(b []byte, i int) (n int64, next int, ok bool) {
	j := i
	for ; j < len(b) && b[j] >= '0' && b[j] <= '9'; j++ {
		d := int64(b[j] - '0')
		if n > (math.MaxInt64-d)/10 {
			return 0, 0, false
		}
		n = n*10 + d
	}
	if j == i || (b[i] == '0' && j > i+1) {
		return 0, 0, false
	}
	// A fraction or exponent would follow here. The caller accepts only ',', '}' or space.
	return n, j, true
}
