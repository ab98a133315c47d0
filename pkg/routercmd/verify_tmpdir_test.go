package routercmd

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testenv"
)

// TestVerifyRunsAgainAfterLosingTempTable checks that `router verify` runs an audit query
// again when the server lost the file of one of its temporary tables meanwhile. The coupon
// plugin's check of one outbox event per terminal grant groups every grant and event. With
// 60,000 of each, MariaDB writes that query's temporary tables to its tmpdir. The test
// deletes the first such file of the database's sessions while the query runs, as a cleaner
// of /tmp would. The query then fails with error 6, "Error on delete of
// '/tmp/#sql-temptable-…' (Errcode: 2)", or error 1017, "Can't find file", by the step it
// was in. verify notes it and runs it again, and the audit passes.
func TestVerifyRunsAgainAfterLosingTempTable(t *testing.T) {
	d := testenv.DB(t, 4, registeredMigrations()...)
	if testenv.Dialect().IsPostgres() {
		t.Skip("the MySQL family's internal temporary tables only: PostgreSQL keeps its temporary files in its data directory")
	}
	var tmpdir string
	if err := d.DB.QueryRow("SELECT @@tmpdir").Scan(&tmpdir); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(tmpdir); err != nil || !st.IsDir() || os.Geteuid() != 0 {
		t.Skipf("needs the server's tmpdir %s on this host and root to delete its files (%v, euid %d)", tmpdir, err, os.Geteuid())
	}
	const n = 60000
	d.AdminExec(t, fmt.Sprintf(`INSERT INTO coupon_grant (order_id, campaign_id, user_id, state, value_cents)
 SELECT CONCAT('o-', seq), 'double11-5yuan', 'u', 'FAILED', 500 FROM seq_1_to_%d`, n))
	d.AdminExec(t, fmt.Sprintf(`INSERT INTO outbox (event_id, event_type, topic, msg_key, payload, published_at)
 SELECT CONCAT('e-', seq), 'CouponGrantFailed', 'coupon-grant-failed', CONCAT('o-', seq), 'x', NOW(6) FROM seq_1_to_%d`, n))

	monitor, err := sql.Open("mysql", testenv.MonitorDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer monitor.Close()
	var removed atomic.Value
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil && removed.Load() == nil {
			rows, err := monitor.QueryContext(ctx, "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = ?", d.Name)
			if err != nil {
				continue
			}
			var ids []int64
			for rows.Next() {
				var id int64
				if rows.Scan(&id) == nil {
					ids = append(ids, id)
				}
			}
			rows.Close()
			for _, id := range ids {
				files, _ := filepath.Glob(filepath.Join(tmpdir, fmt.Sprintf("#sql-temptable-*-%x-*", id)))
				for _, f := range files {
					if os.Remove(f) == nil {
						removed.Store(filepath.Base(f))
					}
				}
			}
			time.Sleep(time.Millisecond)
		}
	}()
	out, err := capture(t, "--dsn", d.DSN, "verify")
	cancel()
	<-done
	t.Logf("removed %v\n%s", removed.Load(), out)
	if removed.Load() == nil {
		t.Fatalf("no temporary table file of the audit's sessions was seen in %s: the test checked nothing", tmpdir)
	}
	if err != nil {
		t.Fatalf("verify after a temporary table's file was removed: %v (exit %d), want it to run the query again and pass\n%s", err, ExitCode(err), out)
	}
	mustContain(t, out, "NOTE the plugins' audit failed on a temporary table of the database server", "running it once more")
	// The server reports the lost file as error 6 or 1017, by the step of the query it was in.
	if !strings.Contains(out, "Error on delete of") && !strings.Contains(out, "Error 1017 (HY000): Can't find file") {
		t.Errorf("output names neither error 6 nor error 1017 as the cause:\n%s", out)
	}
	if strings.Contains(out, "VIOLATION") {
		t.Errorf("verify reports a violation:\n%s", out)
	}
}
