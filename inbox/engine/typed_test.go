package engine_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/internal/testenv"
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

// TestTypedGroupCommitted checks that a typed handler is a plain handler. It is
// group-committed, and its function gets the decoded value. A payload it refuses is
// quarantined as poison.
func TestTypedGroupCommitted(t *testing.T) {
	h := inbox.Typed(inbox.JSON[shipped]{Key: shippedKey}, func(ctx context.Context, tx *sql.Tx, d *inbox.Delivery, s shipped) (inbox.Progress, error) {
		_, err := tx.ExecContext(ctx, testenv.Rebind("INSERT INTO grouped_effect (k, step) VALUES (?, ?)"), s.OrderID, s.Points)
		return inbox.Done, err
	})
	g := newGrouped(t, h, engine.Config{}, engine.BatchConfig{Linger: 50 * time.Millisecond})
	rs := g.send(t, []string{`{"orderId":"t-1","points":5}`, `{"orderId":"t-2","points":6,"new":true}`, `{"orderId":"t-1","points":5}`, `{"points":1}`})
	if o := outcomes(rs); o["processed"] != 2 || o["duplicate"] != 1 || o["quarantined/poison"] != 1 {
		t.Fatalf("outcomes %v", o)
	}
	if n := count(t, g.db.DB, "SELECT SUM(step) FROM grouped_effect"); n != 11 {
		t.Fatalf("points %d, want 11", n)
	}
	if st := g.b.Stats(); st.Batched != 3 {
		t.Fatalf("stats %+v: want the three good deliveries batched", st)
	}
}

// TestTypedInvalidUTF8IsPoison checks that two orders whose keys differ only in a byte
// that is not UTF-8 are two poison messages. They are quarantined with the reason, and
// nothing is handled. encoding/json alone, a codec without CheckJSONText, would decode
// both to one key, with one processed and one duplicate.
func TestTypedInvalidUTF8IsPoison(t *testing.T) {
	payloads := []string{"{\"orderId\":\"u8-\xff\",\"points\":5}", "{\"orderId\":\"u8-\xfe\",\"points\":5}"}
	var a, b shipped
	if json.Unmarshal([]byte(payloads[0]), &a) != nil || json.Unmarshal([]byte(payloads[1]), &b) != nil || a != b {
		t.Fatalf("encoding/json decodes the two orders as %+v and %+v, want one value (what the codec must not do)", a, b)
	}
	h := inbox.Typed(inbox.JSON[shipped]{Key: shippedKey, Fingerprint: func(s shipped) string { return fmt.Sprintf("%s/%d", s.OrderID, s.Points) }},
		func(ctx context.Context, tx *sql.Tx, d *inbox.Delivery, s shipped) (inbox.Progress, error) {
			_, err := tx.ExecContext(ctx, testenv.Rebind("INSERT INTO grouped_effect (k, step) VALUES (?, ?)"), s.OrderID, s.Points)
			return inbox.Done, err
		})
	g := newGrouped(t, h, engine.Config{}, engine.BatchConfig{Linger: 50 * time.Millisecond})
	if o := outcomes(g.send(t, payloads)); o["quarantined/poison"] != 2 || len(o) != 1 {
		t.Fatalf("outcomes %v, want 2 quarantined as poison", o)
	}
	if n := count(t, g.db.DB, "SELECT COUNT(*) FROM grouped_effect"); n != 0 {
		t.Fatalf("%d effects, want 0", n)
	}
	if n := count(t, g.db.DB, "SELECT COUNT(*) FROM inbox WHERE status = 'failed' AND reason = 'poison' AND dedup_key LIKE 'poison:grouped/%' AND last_error LIKE '%payload is not valid UTF-8 at byte 15%'"); n != 2 {
		t.Fatalf("%d poison rows naming the byte, want 2", n)
	}
	if n := count(t, g.db.DB, "SELECT COUNT(*) FROM inbox"); n != 2 {
		t.Fatalf("%d inbox rows, want the 2 poison ones", n)
	}
}

// TestTypedFieldNamesExact checks that orders whose field names differ from the type's in
// case, or that give a field twice, are poison. They are quarantined with the reason, and
// nothing is handled. encoding/json alone would decode each to an order, with the last
// orderId or the one spelt in capitals, and the order would be processed.
func TestTypedFieldNamesExact(t *testing.T) {
	payloads := []string{`{"orderId":"ci-2","orderid":"ci-3","points":1}`, `{"ORDERID":"ci-1","points":1}`, `{"orderId":"ci-4","orderId":"ci-5","points":1}`}
	for i, want := range []string{"ci-3", "ci-1", "ci-5"} {
		if s, err := shippedOf(payloads[i]); err != nil || s.OrderID != want {
			t.Fatalf("encoding/json decodes %s as %+v %v, want order %s (what the codec must not do)", payloads[i], s, err, want)
		}
	}
	h := inbox.Typed(inbox.JSON[shipped]{Key: shippedKey}, func(ctx context.Context, tx *sql.Tx, d *inbox.Delivery, s shipped) (inbox.Progress, error) {
		_, err := tx.ExecContext(ctx, testenv.Rebind("INSERT INTO grouped_effect (k, step) VALUES (?, ?)"), s.OrderID, s.Points)
		return inbox.Done, err
	})
	g := newGrouped(t, h, engine.Config{}, engine.BatchConfig{Linger: 50 * time.Millisecond})
	if o := outcomes(g.send(t, append(payloads, `{"orderId":"ci-6","points":2}`))); o["quarantined/poison"] != 3 || o["processed"] != 1 || len(o) != 2 {
		t.Fatalf("outcomes %v, want 3 quarantined as poison and 1 processed", o)
	}
	if n := count(t, g.db.DB, "SELECT COUNT(*) FROM grouped_effect WHERE k = 'ci-6'"); n != 1 {
		t.Fatalf("%d effects of the good order, want 1", n)
	}
	if n := count(t, g.db.DB, "SELECT COUNT(*) FROM grouped_effect"); n != 1 {
		t.Fatalf("%d effects, want only the good order's", n)
	}
	for _, reason := range []string{`%field name in another case: "orderid" at byte 18%`, `%field name in another case: "ORDERID" at byte 1%`, `%key given twice: "orderId" at byte 18%`} {
		if n := count(t, g.db.DB, "SELECT COUNT(*) FROM inbox WHERE status = 'failed' AND reason = 'poison' AND last_error LIKE ?", reason); n != 1 {
			t.Errorf("%d poison rows saying %s, want 1", n, reason)
		}
	}
}

func shippedOf(payload string) (s shipped, err error) {
	err = json.Unmarshal([]byte(payload), &s)
	return s, err
}
