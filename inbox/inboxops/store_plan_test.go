package inboxops_test

import (
	"strings"
	"testing"
	"time"

	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/inbox/inboxops"
	"github.com/onceflow/onceflow/internal/testenv"
)

// TestTimeRangeReadsTheIndex checks that a time range reads a range of the inbox's one
// secondary index, on biz_type, status and created_at, with statuses or without. Without
// them, the filter names all three. The test shows that the same range without them named
// is not a range of the index.
func TestTimeRangeReadsTheIndex(t *testing.T) {
	d := testenv.DB(t, 2)
	d.AdminExec(t, `INSERT INTO inbox (dedup_key, biz_type, status, message_uuid, topic, kafka_partition, kafka_offset, payload, fingerprint, created_at, expire_at)
		SELECT CONCAT('k-', seq), ELT(1 + seq % 2, 'coupon', 'notify'), ELT(1 + seq % 3, 'done', 'failed', 'processing'), 'x', 't', 0, 0, '', '',
		       NOW(6) - INTERVAL seq MINUTE, NOW(6) + INTERVAL 1 DAY FROM seq_1_to_20000`)
	d.AdminExec(t, "ANALYZE TABLE inbox")
	now := time.Now()
	plan := func(where []string, args []any) (typ, key string) {
		t.Helper()
		typ, key, _ = explainPlan(t, d.DB, "SELECT * FROM inbox WHERE "+strings.Join(where, " AND ")+" ORDER BY id", args...)
		return typ, key
	}
	for _, f := range []inboxops.Filter{
		{BizType: "coupon", Since: now.Add(-30 * time.Minute)},
		{BizType: "coupon", Since: now.Add(-3 * time.Hour), Until: now.Add(-2 * time.Hour)},
		{BizType: "coupon", Statuses: []engine.Status{engine.StatusFailed}, Until: now.Add(-330 * time.Hour)},
	} {
		where, args := inboxops.WhereOf(f, now)
		if typ, key := plan(where, args); typ != "range" || key != "idx_biz_status_created" {
			t.Errorf("%+v: %v → type=%s key=%s, want a range of idx_biz_status_created", f, where, typ, key)
		}
	}
	// Without the statuses named, the created_at bound cannot narrow the index.
	if typ, key := plan([]string{"biz_type = ?", "created_at >= ?"}, []any{"coupon", now.Add(-30 * time.Minute).UTC()}); typ == "range" && key == "idx_biz_status_created" {
		t.Errorf("biz_type and created_at alone: a range of %s; the test no longer shows why the statuses are named", key)
	}
}
