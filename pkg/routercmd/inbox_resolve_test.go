package routercmd

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/inbox/inboxops"
	"github.com/onceflow/onceflow/internal/console"
	"github.com/onceflow/onceflow/internal/testenv"
)

// TestResolveQuarantinedRows has an operator resolve the two quarantined rows of
// quarantinedDB, each with a reason. `router inbox resolve` resolves the poison row, and
// the console's Resolve button resolves the order's row. verify fails before and passes
// after. Each resolution is in the replay table with its reason. The rows are done with
// reason resolved, and `inbox ls --reason resolved` lists them. A later copy of the order
// is a duplicate, and its handler, still failing, is not run. A later copy of the poison
// record leaves its row resolved. Resolving again, an unknown row, no reason or a bad id
// are refused and change nothing. The command line exits with code 2 for them, and the
// console answers with a 4xx status.
func TestResolveQuarantinedRows(t *testing.T) {
	d := quarantinedDB(t) // o-cli failed with retries_exhausted, and one poison message at order-paid/1/6
	ctx := context.Background()
	dsn := []string{"--dsn", d.DSN}
	run := func(args ...string) (string, int) {
		t.Helper()
		out, err := capture(t, append(dsn, args...)...)
		t.Logf("router %s: %v\n%s", strings.Join(args, " "), err, out)
		if err != nil && !strings.Contains(out, err.Error()) {
			out += err.Error()
		}
		return out, ExitCode(err)
	}
	if out, code := run("verify"); code != 1 || !strings.Contains(out, "FAILED inbox rows: 2") {
		t.Fatalf("verify before: exit %d, want 1 with 2 failed rows:\n%s", code, out)
	}
	poison := rowID(t, d, coupon.BizType, "poison:order-paid/1/6")
	order := rowID(t, d, coupon.BizType, "o-cli")
	snapshot := func() string {
		return fmt.Sprint(count(t, d, "SELECT COUNT(*) FROM inbox WHERE status = 'failed'"), count(t, d, "SELECT COUNT(*) FROM replay"))
	}

	before := snapshot()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"inbox", "resolve", fmt.Sprint(poison)}, "--reason: bad reason: empty"},
		{[]string{"inbox", "resolve", fmt.Sprint(poison), "--reason", "  "}, "--reason: bad reason: empty"},
		{[]string{"inbox", "resolve", fmt.Sprint(poison), "--reason", "line\nbreak"}, "control character"},
		{[]string{"inbox", "resolve", "o-cli", "--reason", "x"}, `"o-cli" is not a row id`},
		{[]string{"inbox", "resolve", "999999", "--reason", "x"}, "inbox row 999999: no such inbox row"},
	} {
		if out, code := run(tc.args...); code != 2 || !strings.Contains(out, tc.want) {
			t.Errorf("router %s: exit %d, want 2 saying %q:\n%s", strings.Join(tc.args, " "), code, tc.want, out)
		}
	}
	if after := snapshot(); after != before {
		t.Fatalf("refused resolutions changed the tables: %s -> %s", before, after)
	}

	// The CLI resolves the poison row.
	const why = "corrected record processed as o-fixed"
	out, code := run("inbox", "resolve", fmt.Sprint(poison), "--reason", why)
	if code != 0 || !strings.Contains(out, fmt.Sprintf("resolved inbox row %d (biz type coupon, key poison:order-paid/1/6, quarantined as poison)", poison)) {
		t.Fatalf("inbox resolve: exit %d:\n%s", code, out)
	}
	if out, code := run("inbox", "resolve", fmt.Sprint(poison), "--reason", why); code != 2 || !strings.Contains(out, "is done: not quarantined") {
		t.Fatalf("inbox resolve of a resolved row: exit %d, want 2 saying it is done:\n%s", code, out)
	}
	if out, code := run("verify"); code != 1 || !strings.Contains(out, "FAILED inbox rows: 1 (retries_exhausted 1)") {
		t.Fatalf("verify with one row left: exit %d, want 1 with the order's row only:\n%s", code, out)
	}

	// The console resolves the order's row, with the form beside Retry.
	base := testConsole(t, console.Config{DB: d.DB, BizTypes: []console.BizType{{Name: coupon.BizType}},
		Replay: func(context.Context, inboxops.ReplayOptions) (inboxops.ReplayReport, error) {
			return inboxops.ReplayReport{}, fmt.Errorf("not run by this test")
		}})
	c := browser(t)
	page := fmt.Sprintf("/inbox/%d", order)
	tok := csrf(t, c, base, page)
	if _, body, _ := get(t, c, base+page); !strings.Contains(body, `id="resolve"`) || !strings.Contains(body, `id="retry"`) {
		t.Fatalf("row page of a failed row: no Resolve beside Retry:\n%s", body)
	}
	if code, _, _ := post(t, c, base, page+"/resolve", url.Values{"reason": {"no form token"}}); code != http.StatusForbidden {
		t.Fatalf("console resolve without its CSRF token: %d, want 403", code)
	}
	if code, body, _ := post(t, c, base, page+"/resolve", url.Values{"csrf": {tok}}); code != http.StatusBadRequest || !strings.Contains(body, "bad reason") {
		t.Fatalf("console resolve without a reason: %d, want 400:\n%s", code, body)
	}
	const byHand = "coupon granted by hand, ticket OPS-42"
	code, _, h := post(t, c, base, page+"/resolve", url.Values{"csrf": {tok}, "reason": {byHand}})
	if code != http.StatusSeeOther || !strings.HasPrefix(h.Get("Location"), page+"?replay=") {
		t.Fatalf("console resolve: %d → %q, want 303 to the row with its record", code, h.Get("Location"))
	}
	if _, body, _ := get(t, c, base+h.Get("Location")); !strings.Contains(body, `id="status">done<`) || !strings.Contains(body, "Resolved, recorded as replay") ||
		!strings.Contains(body, byHand) || strings.Contains(body, `id="resolve"`) || strings.Contains(body, `id="retry"`) {
		t.Fatalf("row page after the resolution: not done, no record, or still offering actions:\n%s", body)
	}
	if code, body, _ := post(t, c, base, page+"/resolve", url.Values{"csrf": {tok}, "reason": {byHand}}); code != http.StatusConflict || !strings.Contains(body, "not quarantined") {
		t.Fatalf("console resolve of a resolved row: %d, want 409:\n%s", code, body)
	}
	if _, body, _ := get(t, c, base+"/replays"); strings.Count(body, "<td>resolve</td>") != 2 || !strings.Contains(body, why) {
		t.Fatalf("replays page: want both resolutions with their reasons:\n%s", body)
	}

	// Both resolutions are recorded as the CLI records them, and the rows are done with
	// reason resolved.
	for id, reason := range map[int64]string{poison: why, order: byHand} {
		var status, rowReason, lastErr, filter, outcome, stored string
		if err := d.DB.QueryRow(testenv.Rebind(`SELECT i.status, i.reason, i.last_error, r.filter, r.outcome, r.error FROM inbox i
 JOIN replay r ON r.id = i.replay_id JOIN replay_row rr ON rr.replay_id = r.id AND rr.inbox_id = i.id WHERE i.id = ?`), id).
			Scan(&status, &rowReason, &lastErr, &filter, &outcome, &stored); err != nil {
			t.Fatalf("row %d: %v", id, err)
		}
		if status != "done" || rowReason != "resolved" || outcome != inboxops.ReplayResolved || stored != reason ||
			!strings.HasPrefix(lastErr, "resolved (replay ") || !strings.Contains(lastErr, reason+"; quarantined as ") ||
			!strings.Contains(filter, fmt.Sprintf(`"refs":["%d"]`, id)) {
			t.Errorf("row %d: status %s reason %s last_error %q; replay %s %q filter %s", id, status, rowReason, lastErr, outcome, stored, filter)
		}
	}
	if out, _ := run("inbox", "ls", "--reason", "resolved"); !strings.Contains(out, "2 rows") {
		t.Errorf("inbox ls --reason resolved: want both rows:\n%s", out)
	}
	if out, code := run("verify"); code != 0 || strings.Contains(out, "FAILED") || strings.Contains(out, "VIOLATION") {
		t.Fatalf("verify after both resolutions: exit %d, want 0:\n%s", code, out)
	}

	// A later copy of the order is a duplicate, and its handler, still failing, is not run.
	// The poison record, delivered again from its offset, leaves its row resolved.
	g, err := coupon.NewGranter(coupon.DefaultConfig(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var broken atomic.Bool
	broken.Store(true)
	ib, err := engine.New(d.DB, failingGranter{g, &broken}, engine.Config{BizType: coupon.BizType, MaxAttempts: 1, DelayedRetries: -1}, watermill.NopLogger{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	o := coupon.OrderPaid{OrderID: "o-cli", UserID: "u1", AmountCents: 990, PaidAt: time.Date(2026, 11, 11, 0, 0, 0, 0, time.UTC)}
	r, err := ib.Process(ctx, message.NewMessage(watermill.NewUUID(), o.Encode()), inbox.Source{Topic: "order-paid", Partition: 2, Offset: 9}, engine.ProcessOptions{})
	if err != nil || r.Outcome != engine.OutcomeDuplicate || r.InboxID != order {
		t.Fatalf("a later copy of o-cli: %+v %v, want a duplicate of row %d", r, err, order)
	}
	if _, err := ib.Process(ctx, message.NewMessage(watermill.NewUUID(), []byte("{oops")), inbox.Source{Topic: "order-paid", Partition: 1, Offset: 6}, engine.ProcessOptions{}); err != nil {
		t.Fatal(err)
	}
	if n := count(t, d, "SELECT COUNT(*) FROM coupon_grant WHERE order_id = 'o-cli'"); n != 0 {
		t.Errorf("%d grants of o-cli: the later copy ran", n)
	}
	if n := count(t, d, "SELECT COUNT(*) FROM inbox WHERE status = 'done' AND reason = 'resolved' AND duplicates >= 1 AND id = ?", order); n != 1 {
		t.Errorf("row %d: not resolved with the copy counted as a duplicate", order)
	}
	if out, code := run("verify"); code != 0 || strings.Contains(out, "FAILED") {
		t.Fatalf("verify after the later copies: exit %d, want 0:\n%s", code, out)
	}
}
