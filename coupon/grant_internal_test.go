package coupon

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// TestCASRejectsStaleState exercises the optimistic-lock guard on its own. Through Step it
// is never reached in practice. The upsert in loadOrCreate locks the grant's row, so the
// steps of one order run one after another. So the test drives it with a deliberately
// stale "from" state.
func TestCASRejectsStaleState(t *testing.T) {
	d := testenv.DB(t, 2, migrations.Set{Name: PluginName, FS: Migrations})
	ctx := context.Background()
	if _, err := d.DB.Exec(`INSERT INTO coupon_grant (order_id, campaign_id, user_id, state, value_cents) VALUES ('o', 'c', 'u', 'LOCKED', 500)`); err != nil {
		t.Fatal(err)
	}
	g := grantRow{OrderID: "o", CampaignID: "c", UserID: "u", State: StateInit, ValueCents: 500}
	err := dbx.InTx(ctx, d.DB, func(tx *sql.Tx) error {
		return sqlRepo{tx: tx, q: textFor(dbx.DialectOf(d.DB))}.cas(ctx, g, StateInit, StateLocked, "", "")
	})
	if !errors.Is(err, errStaleState) {
		t.Fatalf("cas from a stale INIT: %v, want ErrStaleState", err)
	}
	// An illegal transition is refused before any SQL.
	err = dbx.InTx(ctx, d.DB, func(tx *sql.Tx) error {
		return sqlRepo{tx: tx, q: textFor(dbx.DialectOf(d.DB))}.cas(ctx, g, StateLocked, StateGranted, "", "")
	})
	if !errors.Is(err, errIllegalTransition) {
		t.Fatalf("cas LOCKED → GRANTED: %v, want ErrIllegalTransition", err)
	}
	// The matching state moves on and is logged.
	err = dbx.InTx(ctx, d.DB, func(tx *sql.Tx) error {
		return sqlRepo{tx: tx, q: textFor(dbx.DialectOf(d.DB))}.cas(ctx, g, StateLocked, StateBudgetDeducted, "", "")
	})
	if err != nil {
		t.Fatalf("cas LOCKED → BUDGET_DEDUCTED: %v", err)
	}
	var state string
	var version, logged int
	if err := d.DB.QueryRow(`SELECT state, version, (SELECT COUNT(*) FROM coupon_grant_log) FROM coupon_grant`).Scan(&state, &version, &logged); err != nil {
		t.Fatal(err)
	}
	if state != string(StateBudgetDeducted) || version != 1 || logged != 1 {
		t.Fatalf("state %s version %d log rows %d, want BUDGET_DEDUCTED 1 1", state, version, logged)
	}
}

// TestNameIDIsUUIDv5 checks that the ids hashed on the stack are uuid.NewSHA1's. So coupons
// and events keep the ids uuid.NewSHA1 gives them.
func TestNameIDIsUUIDv5(t *testing.T) {
	long := strings.Repeat("x", 300) // past the stack buffer
	for _, c := range [][3]string{{"coupon", "c1", "o1"}, {EventGranted, "summer", "order-42"}, {"coupon", long, long}, {"", "", ""}} {
		want := uuid.NewSHA1(namespace, []byte(c[0]+"\x00"+c[1]+"\x00"+c[2])).String()
		if got := nameID(c[0], c[1], c[2]); got != want {
			t.Errorf("nameID%q = %s, want %s", c, got, want)
		}
	}
	if got := CouponID("o1", "c1"); got != uuid.NewSHA1(namespace, []byte("coupon\x00c1\x00o1")).String() {
		t.Errorf("CouponID changed: %s", got)
	}
	if n := testing.AllocsPerRun(100, func() { _ = CouponID("order-123456", "campaign") }); n > 1 {
		t.Errorf("CouponID allocates %.0f times, want 1 (its text)", n)
	}
}
