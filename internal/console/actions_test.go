package console

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/inbox/inboxops"
	"github.com/onceflow/onceflow/internal/metrics"
	"github.com/onceflow/onceflow/internal/testenv"
)

func count(t *testing.T, d testenv.Database, q string, args ...any) int {
	t.Helper()
	var n int
	if err := d.DB.QueryRow(testenv.Dialect().Rebind(q), args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

func rowID(t *testing.T, d testenv.Database, biz, key string) int64 {
	t.Helper()
	var id int64
	if err := d.DB.QueryRow(testenv.Dialect().Rebind("SELECT id FROM inbox WHERE biz_type = ? AND dedup_key = ?"), biz, key).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// TestRetryRow checks that Retry runs one failed row through the handler as
// `router inbox retry` does. The replay table records it, and the page shows the row done.
// A second press finds the row done and changes nothing.
func TestRetryRow(t *testing.T) {
	d := testenv.DB(t, 4)
	ib := failingInbox(t, d.DB, "rt")
	quarantine(t, ib, "k-1", "one", nil)
	quarantine(t, ib, "k-2", "two", nil)
	_, base := testConsole(t, Config{DB: d.DB, BizTypes: []BizType{{Name: "rt"}}, Replay: replayWith(ib)})
	c := browser(t)
	id := rowID(t, d, "rt", "k-1")
	tok := csrf(t, c, base, fmt.Sprintf("/inbox/%d", id))
	ib.broken.Store(false) // the cause fixed
	code, _, h := post(t, c, base, fmt.Sprintf("/inbox/%d/retry", id), url.Values{"csrf": {tok}})
	if code != http.StatusSeeOther || !strings.HasPrefix(h.Get("Location"), fmt.Sprintf("/inbox/%d?replay=", id)) {
		t.Fatalf("retry: %d → %q, want 303 to the row with its replay", code, h.Get("Location"))
	}
	_, body, _ := get(t, c, base+h.Get("Location"))
	if !strings.Contains(body, `id="status">done<`) || !strings.Contains(body, "1 selected, 1 processed") {
		t.Fatalf("row page after the retry: not done, or no replay summary:\n%s", body)
	}
	if n := count(t, d, "SELECT COUNT(*) FROM inbox WHERE biz_type = 'rt' AND status = 'failed'"); n != 1 {
		t.Fatalf("%d failed rows after retrying one of two, want 1 (k-2 untouched)", n)
	}
	var filter string
	if err := d.DB.QueryRow("SELECT filter FROM replay WHERE NOT dry_run AND selected = 1 AND processed = 1 AND outcome = 'ok'").Scan(&filter); err != nil {
		t.Fatalf("the retry is not in the replay table: %v", err)
	}
	var f inboxops.Filter
	if err := json.Unmarshal([]byte(filter), &f); err != nil || f.BizType != "rt" || len(f.Keys) != 1 || f.Keys[0] != "k-1" || len(f.Statuses) != 1 || f.Statuses[0] != engine.StatusFailed {
		t.Fatalf("replay filter %s (%v): want biz rt, status failed, key k-1", filter, err)
	}
	if code, body, _ := post(t, c, base, fmt.Sprintf("/inbox/%d/retry", id), url.Values{"csrf": {tok}}); code != http.StatusConflict || !strings.Contains(body, "is done") {
		t.Fatalf("retry of a done row: %d, want 409 saying it is done:\n%s", code, body)
	}
	if n := count(t, d, "SELECT COUNT(*) FROM replay"); n != 1 {
		t.Fatalf("%d replays after retrying a done row, want still 1", n)
	}
	if code, _, _ := post(t, c, base, "/inbox/999999/retry", url.Values{"csrf": {tok}}); code != http.StatusNotFound {
		t.Fatalf("retry of a missing row: %d, want 404", code)
	}
}

// TestRetryRefusesCutRow checks a row that holds less than the delivered message, with
// headers over max_metadata_bytes or a value over max_payload_bytes. Its page offers no
// Retry and says why. A forged retry is refused and changes nothing. The dry run of a
// replay says the replay refuses the row. A failed row that holds its message offers Retry
// and shows its held deliveries.
func TestRetryRefusesCutRow(t *testing.T) {
	d := testenv.DB(t, 4)
	ib := failingInbox(t, d.DB, "cut")
	deliver := func(payload string, meta map[string]string, offset int64, want engine.Outcome) int64 {
		t.Helper()
		msg := message.NewMessage(watermill.NewUUID(), []byte(payload))
		for k, v := range meta {
			msg.Metadata.Set(k, v)
		}
		r, err := ib.Process(context.Background(), msg, inbox.Source{Topic: "t", Partition: 0, Offset: offset}, engine.ProcessOptions{})
		if err != nil || r.Outcome != want {
			t.Fatalf("offset %d: %+v %v, want %s", offset, r, err, want)
		}
		return r.InboxID
	}
	headers := map[string]string{}
	for i := range 70 {
		headers[fmt.Sprintf("h%02d", i)] = strings.Repeat("v", 600)
	}
	cut := map[int64]string{
		deliver("k-headers|x", headers, 1, engine.OutcomeQuarantined):                   "headers are stored cut to inbox.max_metadata_bytes",
		deliver("k-big|"+strings.Repeat("x", 2<<20), nil, 2, engine.OutcomeQuarantined): "prefix of its",
	}
	ok := deliver("k-ok|x", nil, 3, engine.OutcomeQuarantined)
	deliver("k-ok|x", nil, 4, engine.OutcomeHeld)
	ib.broken.Store(false) // every cause is fixed, so a row that ran now would be done
	_, base := testConsole(t, Config{DB: d.DB, BizTypes: []BizType{{Name: "cut"}}, Replay: replayWith(ib)})
	c := browser(t)
	snapshot := func() string {
		var b strings.Builder
		rows, err := d.DB.Query("SELECT id, status, COALESCE(replay_id, 0), attempts, duplicates, updated_at FROM inbox ORDER BY id")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var id, replay, attempts, dups int64
			var status string
			var updated time.Time
			if err := rows.Scan(&id, &status, &replay, &attempts, &dups, &updated); err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&b, "%d %s %d %d %d %s\n", id, status, replay, attempts, dups, updated.Format(time.RFC3339Nano))
		}
		return b.String()
	}
	before := snapshot()

	_, page, _ := get(t, c, fmt.Sprintf("%s/inbox/%d", base, ok))
	if !strings.Contains(page, `id="retry"`) || strings.Contains(page, `id="not-replayable"`) || !strings.Contains(page, `id="held">1 `) {
		t.Errorf("row %d (holds its message, one delivery held): no Retry, or no held count:\n%s", ok, page)
	}
	tok := csrf(t, c, base, fmt.Sprintf("/inbox/%d", ok))
	for id, why := range cut {
		// A cut row cannot be retried, but it can be resolved.
		_, page, _ := get(t, c, fmt.Sprintf("%s/inbox/%d", base, id))
		if strings.Contains(page, `id="retry"`) || strings.Contains(page, fmt.Sprintf(`action="/inbox/%d/retry"`, id)) || !strings.Contains(page, `id="not-replayable"`) || !strings.Contains(page, why) {
			t.Errorf("row %d: the page offers Retry or does not say why not (%s):\n%s", id, why, page)
		}
		if !strings.Contains(page, fmt.Sprintf(`action="/inbox/%d/resolve"`, id)) {
			t.Errorf("row %d: a quarantined row the page cannot retry offers no Resolve", id)
		}
		code, body, _ := post(t, c, base, fmt.Sprintf("/inbox/%d/retry", id), url.Values{"csrf": {tok}})
		if code != http.StatusConflict || !strings.Contains(body, "cannot be replayed") || !strings.Contains(body, why) {
			t.Errorf("forged retry of row %d: %d, want 409 saying why:\n%s", id, code, body)
		}
	}
	if n := count(t, d, "SELECT COUNT(*) FROM replay"); n != 0 {
		t.Fatalf("%d replays after the refused retries, want 0", n)
	}
	if after := snapshot(); after != before {
		t.Fatalf("the refused retries changed rows:\n%s\nwant\n%s", after, before)
	}
	// The dry run of a replay of every failed row says the replay refuses them.
	_, list, _ := get(t, c, base+"/inbox?biz=cut&status=failed")
	code, page, _ := post(t, c, base, "/replay", formOf(t, list, "/replay"))
	if code != http.StatusOK || strings.Count(page, "refused, left quarantined") != 2 || !strings.Contains(page, "2 hold less than the delivered message") {
		t.Fatalf("dry run: %d, want the 2 cut rows refused:\n%s", code, page)
	}
	// The replay runs the row that holds its message and refuses the two others, as its dry
	// run said. The replays page counts them.
	code, page, _ = post(t, c, base, "/replay", formOf(t, page, "/replay"))
	if code != http.StatusOK || !strings.Contains(page, "1 processed, 0 duplicates, 0 quarantined, 0 conflicts, 2 refused — outcome <strong>partial</strong>") {
		t.Fatalf("the replay: %d:\n%s", code, page)
	}
	for id := range cut {
		if n := count(t, d, "SELECT COUNT(*) FROM inbox WHERE id = ? AND status = 'failed' AND replay_id IS NULL", id); n != 1 {
			t.Errorf("row %d was touched by the replay", id)
		}
	}
	if _, replays, _ := get(t, c, base+"/replays"); !strings.Contains(replays, `<td class="n">2</td><td>partial`) {
		t.Errorf("the replays page does not count the 2 refused rows:\n%s", replays)
	}
}

var hiddenRE = regexp.MustCompile(`<input type="hidden" name="([a-z_]+)" value="([^"]*)">`)

// formOf returns the hidden fields of the form posting to action in page.
func formOf(t *testing.T, page, action string) url.Values {
	t.Helper()
	i := strings.Index(page, `action="`+action+`"`)
	if i < 0 {
		t.Fatalf("no form to %s in:\n%s", action, page)
	}
	end := strings.Index(page[i:], "</form>")
	v := url.Values{}
	for _, m := range hiddenRE.FindAllStringSubmatch(page[i:i+end], -1) {
		v.Set(m[1], html.UnescapeString(m[2]))
	}
	return v
}

// TestReplayAfterItsDryRun checks that a replay of a filtered set runs only after its dry
// run, with the dry run's selection. The dry run changes nothing and is recorded with
// dry_run = 1. A run without a dry run is refused. So is a run with another selection, or
// one that names a replay that was not a dry run. The run leaves out rows received after
// the preview.
func TestReplayAfterItsDryRun(t *testing.T) {
	d := testenv.DB(t, 4)
	ib := failingInbox(t, d.DB, "rp")
	for _, k := range []string{"a", "b", "c"} {
		quarantine(t, ib, k, k, nil)
	}
	other := failingInbox(t, d.DB, "other")
	quarantine(t, other, "a", "a", nil)
	_, base := testConsole(t, Config{DB: d.DB, BizTypes: []BizType{{Name: "rp"}, {Name: "other"}}, Replay: replayWith(ib)})
	c := browser(t)

	_, list, _ := get(t, c, base+"/inbox?biz=rp&status=failed")
	preview := formOf(t, list, "/replay")
	code, page, _ := post(t, c, base, "/replay", preview)
	if code != http.StatusOK || !strings.Contains(page, "Dry run") || !strings.Contains(page, "would run again") {
		t.Fatalf("dry run: %d:\n%s", code, page)
	}
	if n := count(t, d, "SELECT COUNT(*) FROM replay WHERE dry_run AND outcome = 'dry_run' AND selected = 3"); n != 1 {
		t.Fatalf("the dry run is not recorded with its 3 rows")
	}
	if n := count(t, d, "SELECT COUNT(*) FROM inbox WHERE biz_type = 'rp' AND status = 'failed'"); n != 3 {
		t.Fatalf("the dry run changed rows: %d failed, want 3", n)
	}
	run := formOf(t, page, "/replay")
	if run.Get("run") != "1" || run.Get("preview") == "" || run.Get("until") == "" {
		t.Fatalf("the dry run's page offers no run of its selection: %v", run)
	}

	// A row received after the preview is not part of the replay it offers.
	time.Sleep(5 * time.Millisecond)
	quarantine(t, ib, "late", "late", nil)
	ib.broken.Store(false)

	refused := map[string]url.Values{}
	noPreview := url.Values{}
	for k, v := range run {
		noPreview[k] = v
	}
	noPreview.Del("preview")
	refused["without its dry run"] = noPreview
	otherSel := url.Values{}
	for k, v := range run {
		otherSel[k] = v
	}
	otherSel.Set("key", "a")
	refused["with another selection"] = otherSel
	processing := url.Values{}
	for k, v := range run {
		processing[k] = v
	}
	processing.Set("status", "processing")
	refused["of processing rows without an older-than"] = processing
	for name, form := range refused {
		if code, body, _ := post(t, c, base, "/replay", form); code != http.StatusBadRequest {
			t.Errorf("a replay %s: %d, want 400:\n%s", name, code, body)
		}
	}
	code, page, _ = post(t, c, base, "/replay", run)
	if code != http.StatusOK || !strings.Contains(page, "outcome <strong>ok</strong>") {
		t.Fatalf("the replay: %d:\n%s", code, page)
	}
	if n := count(t, d, "SELECT COUNT(*) FROM replay WHERE NOT dry_run AND outcome = 'ok' AND selected = 3 AND processed = 3"); n != 1 {
		t.Fatalf("the replay is not recorded with its 3 rows processed")
	}
	for key, want := range map[string]string{"a": "done", "b": "done", "c": "done", "late": "failed"} {
		var got string
		if err := d.DB.QueryRow(testenv.Dialect().Rebind("SELECT status FROM inbox WHERE biz_type = 'rp' AND dedup_key = ?"), key).Scan(&got); err != nil || got != want {
			t.Errorf("row %s: %q (%v), want %s", key, got, err, want)
		}
	}
	if n := count(t, d, "SELECT COUNT(*) FROM inbox WHERE biz_type = 'other' AND status = 'failed'"); n != 1 {
		t.Errorf("the other biz type's failed row was touched")
	}
	// A real replay's id, given as the preview of a run, is refused.
	var realID int64
	if err := d.DB.QueryRow("SELECT id FROM replay WHERE NOT dry_run").Scan(&realID); err != nil {
		t.Fatal(err)
	}
	run.Set("preview", fmt.Sprint(realID))
	if code, _, _ := post(t, c, base, "/replay", run); code != http.StatusBadRequest {
		t.Errorf("a run naming a replay that is not a dry run: %d, want 400", code)
	}
	_, replays, _ := get(t, c, base+"/replays")
	if !strings.Contains(replays, "dry run") || !strings.Contains(replays, "--biz-type rp --status failed") {
		t.Errorf("the replays page lacks the runs:\n%s", replays)
	}
}

// TestParkedActions checks the actions on parked events. Retry puts the event and those
// held behind it back in the outbox, as `router outbox retry` does. Drop asks for a
// confirmation. The page lists both events, with actions only on the refused one.
func TestParkedActions(t *testing.T) {
	d := testenv.DB(t, 4)
	d.AdminExec(t, `INSERT INTO outbox_parked (id, event_id, event_type, topic, msg_key, payload, created_at, reason, error, held_behind) VALUES
 (41, 'ev-41', 'CouponGranted', 'missing-topic', 'o-1', '{}', CURRENT_TIMESTAMP(6), 'unknown_topic', 'kafka: topic missing-topic <b>does not exist</b>', NULL),
 (42, 'ev-42', 'CouponGranted', 'missing-topic', 'o-1', '{}', CURRENT_TIMESTAMP(6), 'held', 'held behind ev-41', 'ev-41'),
 (43, 'ev-43', 'CouponGranted', 'missing-topic', 'o-2', '{}', CURRENT_TIMESTAMP(6), 'unknown_topic', 'kafka: topic missing', NULL)`)
	_, base := testConsole(t, Config{DB: d.DB})
	c := browser(t)
	_, page, _ := get(t, c, base+"/outbox")
	if !strings.Contains(page, "ev-42") || !strings.Contains(page, `action="/outbox/41/retry"`) || strings.Contains(page, `action="/outbox/42/retry"`) ||
		!strings.Contains(page, "&lt;b&gt;does not exist&lt;/b&gt;") {
		t.Fatalf("parked page: want ev-41 with actions, ev-42 listed without, the error escaped:\n%s", page)
	}
	tok := csrf(t, c, base, "/outbox")
	if code, _, _ := post(t, c, base, "/outbox/43/drop", url.Values{"csrf": {tok}}); code != http.StatusBadRequest {
		t.Fatalf("drop without the confirmation: %d, want 400", code)
	}
	if code, _, _ := post(t, c, base, "/outbox/42/retry", url.Values{"csrf": {tok}}); code != http.StatusConflict {
		t.Fatalf("retry of a held event: %d, want 409", code)
	}
	code, body, _ := post(t, c, base, "/outbox/41/retry", url.Values{"csrf": {tok}})
	if code != http.StatusOK || !strings.Contains(body, "2 events back in the outbox") {
		t.Fatalf("retry: %d:\n%s", code, body)
	}
	if n := count(t, d, "SELECT COUNT(*) FROM outbox WHERE id IN (41, 42) AND published_at IS NULL"); n != 2 {
		t.Fatalf("%d of the retried event and its held one back in the outbox, want 2", n)
	}
	if code, _, _ := post(t, c, base, "/outbox/41/retry", url.Values{"csrf": {tok}}); code != http.StatusConflict {
		t.Fatalf("retry of an event no longer parked: %d, want 409", code)
	}
	if code, body, _ := post(t, c, base, "/outbox/43/drop", url.Values{"csrf": {tok}, "confirm": {"yes"}}); code != http.StatusOK || !strings.Contains(body, "Dropped event ev-43") {
		t.Fatalf("drop: %d:\n%s", code, body)
	}
	if n := count(t, d, "SELECT COUNT(*) FROM outbox_parked"); n != 0 {
		t.Fatalf("%d parked events left, want 0", n)
	}
}

// TestOverview checks that the overview shows the rows by biz type and status, with the
// failed ones by reason. These are the metrics' cached figures. The overview also shows the
// relay's lease and the recent replays.
func TestOverview(t *testing.T) {
	d := testenv.DB(t, 4)
	ib := failingInbox(t, d.DB, "ov")
	quarantine(t, ib, "k-1", "one", nil)
	quarantine(t, ib, "k-2", "two", nil)
	d.AdminExec(t, testenv.Dialect().Rebind(`INSERT INTO relay_lease (shard, owner, expires_at) VALUES ('default', 'relay-host-1', ?)`), time.Now().Add(10*time.Second).UTC())
	m := metrics.New(d.DB)
	m.Observe("ov", "duplicate", time.Millisecond)
	m.Observe("ov", "processed", time.Millisecond)
	m.Observe("ov", "held", time.Millisecond)
	m.Observe("ov", "held", time.Millisecond)
	_, base := testConsole(t, Config{DB: d.DB, Metrics: m, BizTypes: []BizType{{Name: "ov", Plugins: []string{"ov-plugin"}}}})
	_, page, _ := get(t, browser(t), base+"/")
	for _, want := range []string{"ov-plugin", "retries_exhausted 2", "relay-host-1", "held,", `id="dups-total">1<`, `id="held-total">2<`, `class="bad">2</strong> held`, "No replay yet", "<svg"} {
		if !strings.Contains(page, want) {
			t.Errorf("overview lacks %q", want)
		}
	}
	if t.Failed() {
		t.Log(page)
	}
}

// TestInboxPages checks that the inbox page pages by key. Its "older" links walk every row
// once, newest first.
func TestInboxPages(t *testing.T) {
	d := testenv.DB(t, 4)
	rows := `INSERT INTO inbox (dedup_key, biz_type, status, reason, message_uuid, topic, kafka_partition, kafka_offset, payload, fingerprint, created_at, expire_at)
		SELECT CONCAT('k-', seq), 'pg', ELT(1 + seq % 3, 'done', 'failed', 'processing'), IF(seq % 3 = 1, 'permanent', NULL), 'x', 't', 0, seq, '', '',
		       NOW(6) - INTERVAL (seq DIV 4) SECOND, NOW(6) + INTERVAL 1 DAY FROM seq_1_to_130`
	if testenv.Dialect().IsPostgres() {
		rows = `INSERT INTO inbox (dedup_key, biz_type, status, reason, message_uuid, topic, kafka_partition, kafka_offset, payload, fingerprint, created_at, expire_at)
		SELECT 'k-' || seq, 'pg', (ARRAY['done', 'failed', 'processing'])[1 + seq % 3], CASE WHEN seq % 3 = 1 THEN 'permanent' END, 'x', 't', 0, seq, '', '',
		       LOCALTIMESTAMP - (seq / 4) * INTERVAL '1 second', LOCALTIMESTAMP + INTERVAL '1 day' FROM generate_series(1, 130) AS seq`
	}
	d.AdminExec(t, rows)
	_, base := testConsole(t, Config{DB: d.DB, BizTypes: []BizType{{Name: "pg"}}})
	c := browser(t)
	linkRE := regexp.MustCompile(`<a href="/inbox/(\d+)">\d+</a>`)
	olderRE := regexp.MustCompile(`<a href="([^"]+)" id="older">`)
	seen := map[string]bool{}
	next, pages := "/inbox?biz=pg", 0
	for next != "" {
		pages++
		code, page, _ := get(t, c, base+html.UnescapeString(next))
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d", next, code)
		}
		for _, m := range linkRE.FindAllStringSubmatch(page, -1) {
			if seen[m[1]] {
				t.Fatalf("row %s on two pages", m[1])
			}
			seen[m[1]] = true
		}
		next = ""
		if m := olderRE.FindStringSubmatch(page); m != nil {
			next = m[1]
		}
	}
	if len(seen) != 130 || pages != 3 {
		t.Fatalf("%d rows on %d pages, want 130 on 3", len(seen), pages)
	}
	_, page, _ := get(t, c, base+"/inbox?biz=pg&status=failed&reason=permanent")
	if n := len(linkRE.FindAllStringSubmatch(page, -1)); n != 44 {
		t.Fatalf("failed, permanent: %d rows, want 44", n)
	}
}

// TestParkedBulk checks the retry and drop of parked events by topic and reason. The page
// counts them first and changes nothing. Its forms carry the count, and an action refuses
// to release more events than were counted. Drop asks for its own confirmation, in its own
// form. The actions are refused without the form token or from another origin.
func TestParkedBulk(t *testing.T) {
	d := testenv.DB(t, 4)
	d.AdminExec(t, `INSERT INTO outbox_parked (id, event_id, event_type, topic, msg_key, payload, created_at, reason, error, held_behind) VALUES
 (51, 'ev-51', 'CouponGranted', 'gone', 'o-1', '{}', CURRENT_TIMESTAMP(6), 'unknown_topic', 'topic gone', NULL),
 (52, 'ev-52', 'CouponGranted', 'gone', 'o-1', '{}', CURRENT_TIMESTAMP(6), 'held', 'held behind ev-51', 'ev-51'),
 (53, 'ev-53', 'CouponGranted', 'gone', 'o-2', '{}', CURRENT_TIMESTAMP(6), 'too_large', 'too large', NULL),
 (54, 'ev-54', 'CouponGranted', 'other', 'o-3', '{}', CURRENT_TIMESTAMP(6), 'unknown_topic', 'topic other', NULL)`)
	_, base := testConsole(t, Config{DB: d.DB})
	c := browser(t)

	_, page, _ := get(t, c, base+"/outbox")
	if !strings.Contains(page, `id="bulk-count"`) || strings.Contains(page, `action="/outbox/bulk/retry"`) {
		t.Fatalf("parked page before a count: want the count form and no bulk action:\n%s", page)
	}
	code, page, _ := get(t, c, base+"/outbox?count=1&topic=gone&reason=unknown_topic")
	if code != http.StatusOK || !strings.Contains(page, "<strong>1</strong> refused events chosen (topic gone, reason unknown_topic), 1 events held behind them") {
		t.Fatalf("count: %d:\n%s", code, page)
	}
	forms := regexp.MustCompile(`(?s)<form method="post" action="/outbox/bulk/(retry|drop)".*?</form>`).FindAllStringSubmatch(page, -1)
	if len(forms) != 2 || forms[0][1] != "retry" || forms[1][1] != "drop" {
		t.Fatalf("want a retry form and a drop form after the count:\n%s", page)
	}
	if strings.Contains(forms[0][0], "confirm") || !strings.Contains(forms[1][0], `name="confirm"`) || !strings.Contains(forms[1][0], `name="counted" value="1"`) {
		t.Fatalf("the confirmation box belongs to the drop form only, and each form carries the count:\n%s\n%s", forms[0][0], forms[1][0])
	}
	if n := count(t, d, "SELECT COUNT(*) FROM outbox_parked"); n != 4 {
		t.Fatalf("the count changed the parked events: %d left, want 4", n)
	}
	if code, body, _ := get(t, c, base+"/outbox?count=1&reason=held"); code != http.StatusBadRequest || !strings.Contains(body, "released with the event they wait behind") {
		t.Fatalf("count of reason held: %d, want 400:\n%s", code, body)
	}

	tok := csrf(t, c, base, "/outbox")
	form := func(topic, reason, counted string, extra ...string) url.Values {
		v := url.Values{"csrf": {tok}, "topic": {topic}, "reason": {reason}, "counted": {counted}}
		for i := 0; i+1 < len(extra); i += 2 {
			v.Set(extra[i], extra[i+1])
		}
		return v
	}
	// The protections of every other action.
	req, _ := http.NewRequest(http.MethodPost, base+"/outbox/bulk/retry", strings.NewReader(form("gone", "", "9").Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "http://evil.example")
	if code, _, _ := do(t, c, req); code != http.StatusForbidden {
		t.Fatalf("bulk retry from another origin: %d, want 403", code)
	}
	noTok := form("gone", "", "9")
	noTok.Del("csrf")
	if code, _, _ := post(t, c, base, "/outbox/bulk/drop", noTok); code != http.StatusForbidden {
		t.Fatalf("bulk drop without the form token: %d, want 403", code)
	}
	if code, _, _ := post(t, c, base, "/outbox/bulk/retry", form("gone", "unknown_topic", "")); code != http.StatusBadRequest {
		t.Fatalf("bulk retry without a count: %d, want 400", code)
	}
	if code, _, _ := post(t, c, base, "/outbox/bulk/drop", form("gone", "too_large", "1")); code != http.StatusBadRequest {
		t.Fatalf("bulk drop without the confirmation: %d, want 400", code)
	}
	if code, body, _ := post(t, c, base, "/outbox/bulk/retry", form("gone", "", "1")); code != http.StatusConflict || !strings.Contains(body, "2 refused events are parked for topic gone now, and 1 were counted") {
		t.Fatalf("bulk retry of more events than counted: %d, want 409:\n%s", code, body)
	}
	if n := count(t, d, "SELECT COUNT(*) FROM outbox_parked"); n != 4 {
		t.Fatalf("a refused action changed the parked events: %d left, want 4", n)
	}

	code, body, _ := post(t, c, base, "/outbox/bulk/retry", form("gone", "unknown_topic", "1"))
	if code != http.StatusOK || !strings.Contains(body, "Retried 1 refused events of topic gone, reason unknown_topic: 2 events back in the outbox") {
		t.Fatalf("bulk retry: %d:\n%s", code, body)
	}
	if n := count(t, d, "SELECT COUNT(*) FROM outbox WHERE id IN (51, 52) AND published_at IS NULL"); n != 2 {
		t.Fatalf("%d of the retried event and its held one back in the outbox, want 2", n)
	}
	code, body, _ = post(t, c, base, "/outbox/bulk/drop", form("gone", "", "1", "confirm", "yes"))
	if code != http.StatusOK || !strings.Contains(body, "Dropped 1 refused events of topic gone for good") {
		t.Fatalf("bulk drop: %d:\n%s", code, body)
	}
	if n := count(t, d, "SELECT COUNT(*) FROM outbox_parked WHERE id = 54"); n != 1 || count(t, d, "SELECT COUNT(*) FROM outbox_parked") != 1 {
		t.Fatalf("want only ev-54, of another topic, still parked")
	}
	if n := count(t, d, "SELECT COUNT(*) FROM outbox WHERE id = 53"); n != 0 {
		t.Fatalf("the dropped event is in the outbox")
	}
}

// TestReplayOfPoisonNotOffered checks that a dry run whose every row would run as poison
// that the decoder still refuses offers no replay, and says why. A dry run that also selects
// a row the handler would run offers it.
func TestReplayOfPoisonNotOffered(t *testing.T) {
	d := testenv.DB(t, 4)
	ib := failingInbox(t, d.DB, "pz")
	for i, p := range []string{"!not json", "!{\"orderId\": 7"} {
		r, err := ib.Process(context.Background(), message.NewMessage(watermill.NewUUID(), []byte(p)), inbox.Source{Topic: "t", Partition: 0, Offset: int64(10 + i)}, engine.ProcessOptions{})
		if err != nil || r.Outcome != engine.OutcomeQuarantined || r.Reason != engine.ReasonPoison {
			t.Fatalf("poison delivery: %+v %v", r, err)
		}
	}
	quarantine(t, ib, "k-1", "x", nil)
	_, base := testConsole(t, Config{DB: d.DB, Replay: replayWith(ib), BizTypes: []BizType{{Name: "pz"}}})
	c := browser(t)
	tok := csrf(t, c, base, "/inbox?biz=pz&status=failed")

	code, page, _ := post(t, c, base, "/replay", url.Values{"csrf": {tok}, "biz": {"pz"}, "status": {"failed"}, "reason": {"poison"}})
	if code != http.StatusOK || !strings.Contains(page, `<strong>2</strong> rows would run`) {
		t.Fatalf("dry run of the poison rows: %d:\n%s", code, page)
	}
	if strings.Contains(page, `id="run"`) || !strings.Contains(page, `id="no-run"`) ||
		!strings.Contains(page, "each of the 2 rows it would run is poison that the plugin&#39;s decoder still refuses") {
		t.Fatalf("the dry run of poison rows only offers a replay, or does not say why not:\n%s", page)
	}

	code, page, _ = post(t, c, base, "/replay", url.Values{"csrf": {tok}, "biz": {"pz"}, "status": {"failed"}})
	if code != http.StatusOK || !strings.Contains(page, `id="run"`) || strings.Contains(page, `id="no-run"`) {
		t.Fatalf("a dry run with a row the handler would run offers no replay: %d:\n%s", code, page)
	}
}
