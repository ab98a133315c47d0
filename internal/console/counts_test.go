package console

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/internal/metrics"
	"github.com/onceflow/onceflow/internal/msgsource"
	"github.com/onceflow/onceflow/internal/testenv"
)

// TestOverviewReplayByReasonAndFreshCounts follows the drill. The overview shows failed
// rows by reason. The "replay these (dry run)" button beside a count runs the dry run of
// exactly that reason's rows. The replay it offers keeps the reason. The overview after it
// counts the rows as they are now. Its figures are cached for 15 s, so without the refresh
// after the action it would still say 3 failed.
func TestOverviewReplayByReasonAndFreshCounts(t *testing.T) {
	d := testenv.DB(t, 4)
	ib := failingInbox(t, d.DB, "rr")
	for _, k := range []string{"ord-a", "ord-b", "ord-c"} {
		quarantine(t, ib, k, k, nil)
	}
	d.AdminExec(t, "UPDATE inbox SET reason = 'panic' WHERE dedup_key = 'ord-c'")
	m := metrics.New(d.DB)
	_, base := testConsole(t, Config{DB: d.DB, Metrics: m, BizTypes: []BizType{{Name: "rr"}}, Replay: replayWith(ib)})
	c := browser(t)

	_, page, _ := get(t, c, base+"/")
	for _, want := range []string{`status=failed">3</a>`, "retries_exhausted 2", "panic 1", `data-reason="retries_exhausted">replay these (dry run)`,
		"<strong>3 ×</strong>"} {
		if !strings.Contains(page, want) {
			t.Errorf("overview lacks %q", want)
		}
	}
	if t.Failed() {
		t.Fatal(page)
	}
	form := formOf(t, page, "/replay") // the first form, for retries_exhausted, the larger count
	if form.Get("reason") != "retries_exhausted" || form.Get("status") != "failed" || form.Get("biz") != "rr" {
		t.Fatalf("the overview's replay form: %v", form)
	}
	code, page, _ := post(t, c, base, "/replay", form)
	if code != http.StatusOK || !strings.Contains(page, "--reason retries_exhausted") || !strings.Contains(page, "<strong>2</strong> rows would run") {
		t.Fatalf("dry run by reason: %d:\n%s", code, page)
	}
	if i, j := strings.Index(page, `id="run"`), strings.Index(page, `id="replayed"`); i < 0 || i > j {
		t.Errorf("the run button is not above the rows")
	}
	run := formOf(t, page, "/replay")
	if run.Get("reason") != "retries_exhausted" || run.Get("run") != "1" {
		t.Fatalf("the run form: %v", run)
	}
	ib.broken.Store(false)
	if code, page, _ = post(t, c, base, "/replay", run); code != http.StatusOK || !strings.Contains(page, "outcome <strong>ok</strong>") {
		t.Fatalf("the replay: %d:\n%s", code, page)
	}
	if n := count(t, d, "SELECT COUNT(*) FROM inbox WHERE biz_type = 'rr' AND status = 'failed' AND reason = 'panic'"); n != 1 {
		t.Fatalf("the panic row was replayed too")
	}
	_, page, _ = get(t, c, base+"/")
	if !strings.Contains(page, `status=failed">1</a>`) || strings.Contains(page, "retries_exhausted 2") {
		t.Fatalf("the overview after the replay does not count 1 failed row:\n%s", page)
	}
}

// TestInboxListByReason checks that the inbox list filtered by reason says how many rows
// match. It offers their replay at the top, above the rows. An unknown reason is refused.
func TestInboxListByReason(t *testing.T) {
	d := testenv.DB(t, 4)
	ib := failingInbox(t, d.DB, "lr")
	for _, k := range []string{"a", "b", "a-key-long-enough-to-be-cut-by-the-column-" + strings.Repeat("x", 80)} {
		quarantine(t, ib, k, k, nil)
	}
	_, base := testConsole(t, Config{DB: d.DB, BizTypes: []BizType{{Name: "lr"}}, Replay: replayWith(ib)})
	c := browser(t)
	code, page, _ := get(t, c, base+"/inbox?biz=lr&status=failed&reason=retries_exhausted")
	if code != http.StatusOK || !strings.Contains(page, `<span class="match">3 match</span>`) {
		t.Fatalf("list by reason: %d:\n%s", code, page)
	}
	if i, j := strings.Index(page, `id="preview"`), strings.Index(page, `id="rows"`); i < 0 || i > j {
		t.Fatalf("no replay offered above the rows:\n%s", page)
	}
	if form := formOf(t, page, "/replay"); form.Get("reason") != "retries_exhausted" {
		t.Fatalf("the replay form drops the reason: %v", form)
	}
	if !strings.Contains(page, `title="a-key-long-enough`) {
		t.Errorf("a key has no title holding it whole")
	}
	if _, page, _ = get(t, c, base+"/inbox?biz=lr&status=failed&reason=panic"); !strings.Contains(page, `<span class="match">0 match</span>`) {
		t.Errorf("no row of reason panic, page:\n%s", page)
	}
	if code, _, _ = get(t, c, base+"/inbox?biz=lr&status=failed&reason=bogus"); code != http.StatusBadRequest {
		t.Errorf("an unknown reason: %d, want 400", code)
	}
}

// TestOverviewMarksStaleFigures checks that a figure older than its refresh interval says
// how old it is.
func TestOverviewMarksStaleFigures(t *testing.T) {
	c, _ := testConsole(t, Config{DB: offlineDB(t)})
	for _, tc := range []struct {
		age   time.Duration
		stale bool
		want  string
	}{
		{5 * time.Second, false, "read 5s ago"},
		{40 * time.Second, true, `<span class="stale">as of 40s ago</span>`},
	} {
		d := overviewData{Stats: metrics.DBStats{At: time.Now().Add(-tc.age)}, StatsAge: tc.age, StatsStale: tc.stale}
		w := httptest.NewRecorder()
		c.render(w, httptest.NewRequest("GET", "/", nil), http.StatusOK, "overview", "Overview", open, d)
		if !strings.Contains(w.Body.String(), tc.want) {
			t.Errorf("figures %s old: the page lacks %q", tc.age, tc.want)
		}
	}
}

// refusingHandler decodes nothing: every message is poison.
type refusingHandler struct{ testHandler }

func (refusingHandler) Decode(*message.Message) (inbox.Decoded, error) {
	return inbox.Decoded{}, inbox.PoisonError("no decoder for this test")
}

// TestInboxSearchFindsPoisonRow checks that the inbox's key filter finds a poison row by
// what an operator has. Its dedup key names the record's place in Kafka. It is found by the
// record's Kafka key and by the payload's id, which its last error notes. A Kafka key that
// is not UTF-8 shows escaped, and the escapes typed find it. An unrelated id finds nothing.
func TestInboxSearchFindsPoisonRow(t *testing.T) {
	d := testenv.DB(t, 4)
	ib, err := engine.New(d.DB, refusingHandler{}, engine.Config{BizType: "pz", KeyLogField: "order_id", MaxAttempts: 1, DelayedRetries: -1}, watermill.NopLogger{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]int64{}
	for i, c := range []struct{ key, payload string }{
		{"k-0093", `{"orderId":"oc-pz-0093","amountCents":"x"}`},
		{"\xff\x1bk", "not json"},
	} {
		msg := message.NewMessage(watermill.NewUUID(), []byte(c.payload))
		msg.SetContext(msgsource.WithKey(context.Background(), c.key))
		r, err := ib.Process(context.Background(), msg, inbox.Source{Topic: "t", Partition: 0, Offset: int64(20 + i)}, engine.ProcessOptions{})
		if err != nil || r.Outcome != engine.OutcomeQuarantined || r.Reason != engine.ReasonPoison {
			t.Fatalf("poison delivery: %+v %v", r, err)
		}
		ids[c.key] = r.InboxID
	}
	_, base := testConsole(t, Config{DB: d.DB, BizTypes: []BizType{{Name: "pz"}}})
	c := browser(t)
	for typed, want := range map[string]int64{
		"oc-pz-0093":   ids["k-0093"], // the payload's id
		"k-0093":       ids["k-0093"], // the Kafka key
		`\xff\x1bk`:    ids["\xff\x1bk"],
		"oc-pz-0094":   0,
		"oc-pz-009":    0,
		"poison:t/0/2": 0,
	} {
		code, page, _ := get(t, c, base+"/inbox?"+url.Values{"biz": {"pz"}, "key": {typed}}.Encode())
		found := regexp.MustCompile(`<a href="/inbox/(\d+)">\d+</a>`).FindAllStringSubmatch(page, -1)
		switch {
		case code != http.StatusOK:
			t.Errorf("search %q: %d:\n%s", typed, code, page)
		case want == 0 && (len(found) != 0 || !strings.Contains(page, `<span class="match">0 match</span>`)):
			t.Errorf("search %q: found %v, want nothing", typed, found)
		case want != 0 && (len(found) != 1 || found[0][1] != fmt.Sprint(want) || !strings.Contains(page, `<span class="match">1 match</span>`)):
			t.Errorf("search %q: found %v, want row %d alone", typed, found, want)
		}
	}
	_, page, _ := get(t, c, base+fmt.Sprintf("/inbox/%d", ids["\xff\x1bk"]))
	if !strings.Contains(page, `kafka key &#34;\xff\x1bk&#34;`) {
		t.Errorf("the row's page does not show its Kafka key escaped:\n%s", page)
	}
}
