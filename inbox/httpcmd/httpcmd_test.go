package httpcmd_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/inbox/httpcmd"
	"github.com/onceflow/onceflow/inbox/inboxops"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/migrations"
)

// claimServer serves the coupon plugin's claim command on a fresh database.
func claimServer(t *testing.T, batch bool, cfg httpcmd.Config) (*httptest.Server, testenv.Database) {
	t.Helper()
	d := testenv.DB(t, 32, migrations.Set{Name: coupon.PluginName, FS: coupon.Migrations})
	if err := coupon.EnsureCampaign(context.Background(), d.DB, coupon.DefaultConfig()); err != nil {
		t.Fatal(err)
	}
	return serveClaims(t, d, nil, batch, cfg), d
}

// serveClaims serves the claim command on d, as one router's HTTP listener. Its outside
// calls go to svc, or nowhere when svc is nil. With batch set it uses group commit, the
// router's default, and otherwise a transaction per request.
func serveClaims(t *testing.T, d testenv.Database, svc coupon.ExternalService, batch bool, cfg httpcmd.Config) *httptest.Server {
	t.Helper()
	return serveClaimsOn(t, d.DB, engine.Config{MaxAttempts: 2, BackoffInitial: time.Millisecond}, svc, batch, cfg)
}

// serveClaimsOn is serveClaims on pool db, with its inbox configured by icfg. It sets the
// biz type itself.
func serveClaimsOn(t *testing.T, db *sql.DB, icfg engine.Config, svc coupon.ExternalService, batch bool, cfg httpcmd.Config) *httptest.Server {
	t.Helper()
	g, err := coupon.NewGranter(coupon.DefaultConfig(), svc, nil)
	if err != nil {
		t.Fatal(err)
	}
	icfg.BizType = coupon.ClaimBizType
	claims, err := g.ClaimHandler(db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = claims.(io.Closer).Close() })
	ib, err := engine.NewCommand(db, claims, icfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var runner httpcmd.Runner = ib
	if batch {
		b, err := ib.NewBatcher(engine.BatchConfig{MaxSize: 64})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		runner = b
	}
	h, err := httpcmd.New([]httpcmd.Route{{Method: http.MethodPost, Path: coupon.ClaimPath, Runner: runner}}, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

type answer struct {
	status   int
	body     string
	replayed bool
	retry    string
}

func claim(t *testing.T, c *http.Client, url, key, body string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+coupon.ClaimPath, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(httpcmd.HeaderKey, key)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Error(err)
		return answer{}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, body: string(b), replayed: resp.Header.Get(httpcmd.HeaderReplayed) == "true", retry: resp.Header.Get("Retry-After")}
}

func count(t *testing.T, db *sql.DB, q string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(testenv.Rebind(q), args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// coupons and events count what a claim by user left. coupons counts the coupons in the
// wallet, and events the coupon-granted events in the outbox.
func coupons(t *testing.T, db *sql.DB, user string) int {
	return count(t, db, "SELECT COUNT(*) FROM user_coupon WHERE user_id = ?", user)
}

func events(t *testing.T, db *sql.DB, user string) int {
	return count(t, db, testenv.SQL("SELECT COUNT(*) FROM outbox WHERE event_type = ? AND JSON_VALUE(payload, '$.userId') = ?",
		"SELECT COUNT(*) FROM outbox WHERE event_type = ? AND convert_from(payload, 'UTF8')::json->>'userId' = ?"), coupon.EventGranted, user)
}

func claimBody(user string) string {
	return fmt.Sprintf(`{"userId": %q, "campaignId": %q}`, user, coupon.DefaultConfig().CampaignID)
}

// TestClaimOneKeyConcurrently sends 200 concurrent requests with one key at the entrance,
// as a double click and client retries do. They grant exactly one coupon and one event.
// Every answer is the first request's 201 with the same body, or 409 while it runs. The
// same clicks without the key's dedup grant 200. Each is then a new key, as a server that
// ignores the header treats them. So the check below does see duplicates when there are
// any.
func TestClaimOneKeyConcurrently(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(mode(batch), func(t *testing.T) { testClaimOneKey(t, batch) })
	}
}

func mode(batch bool) string {
	if batch {
		return "group commit"
	}
	return "transaction per request"
}

func testClaimOneKey(t *testing.T, batch bool) {
	srv, d := claimServer(t, batch, httpcmd.Config{})
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 200}}
	const n = 200
	answers := make([]answer, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() { defer wg.Done(); answers[i] = claim(t, c, srv.URL, "click-1", claimBody("u-one")) }()
	}
	wg.Wait()
	var first string
	created, busy := 0, 0
	for _, a := range answers {
		switch a.status {
		case http.StatusCreated:
			created++
			if first == "" {
				first = a.body
			}
			if a.body != first {
				t.Fatalf("two different 201 bodies for one key:\n%s\n%s", first, a.body)
			}
		case http.StatusConflict:
			busy++
			if a.retry == "" {
				t.Fatalf("409 without Retry-After: %s", a.body)
			}
		default:
			t.Fatalf("answer %d %s, want 201 or 409", a.status, a.body)
		}
	}
	if created == 0 {
		t.Fatal("no 201 among the answers")
	}
	if got := coupons(t, d.DB, "u-one"); got != 1 {
		t.Fatalf("coupons for one key: %d, want 1", got)
	}
	if got := events(t, d.DB, "u-one"); got != 1 {
		t.Fatalf("coupon-granted events for one key: %d, want 1", got)
	}
	t.Logf("200 concurrent requests, one key: %d × 201 (one body), %d × 409; 1 coupon, 1 event", created, busy)

	// A later retry gets the same answer, marked as replayed.
	again := claim(t, c, srv.URL, "click-1", claimBody("u-one"))
	if again.status != http.StatusCreated || again.body != first || !again.replayed {
		t.Fatalf("retry: %d %q replayed=%v, want 201 %q replayed", again.status, again.body, again.replayed, first)
	}
	var resp coupon.ClaimResponse
	if err := json.Unmarshal([]byte(first), &resp); err != nil || resp.CouponID == "" || resp.State != coupon.StateGranted {
		t.Fatalf("201 body %s: %+v %v", first, resp, err)
	}

	// The same double clicks, each under a key of its own, grant 20 coupons.
	for i := range 20 {
		wg.Add(1)
		go func() { defer wg.Done(); claim(t, c, srv.URL, fmt.Sprintf("naive-%d", i), claimBody("u-naive")) }()
	}
	wg.Wait()
	if got := coupons(t, d.DB, "u-naive"); got != 20 {
		t.Fatalf("coupons without the key's dedup: %d, want 20 (the check must see duplicates)", got)
	}
}

// TestClaimManyKeys checks that 200 concurrent requests with 200 keys grant 200 coupons
// and 200 events.
func TestClaimManyKeys(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(mode(batch), func(t *testing.T) { testClaimManyKeys(t, batch) })
	}
}

func testClaimManyKeys(t *testing.T, batch bool) {
	srv, d := claimServer(t, batch, httpcmd.Config{})
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 200}}
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[int]int{}
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := claim(t, c, srv.URL, fmt.Sprintf("key-%03d", i), claimBody("u-many"))
			mu.Lock()
			statuses[a.status]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	if statuses[http.StatusCreated] != 200 {
		t.Fatalf("answers %v, want 200 × 201", statuses)
	}
	if got, ev := coupons(t, d.DB, "u-many"), events(t, d.DB, "u-many"); got != 200 || ev != 200 {
		t.Fatalf("coupons %d events %d, want 200 and 200", got, ev)
	}
}

// TestClaimBadRequests checks that what the client gets wrong is answered 4xx, and writes
// nothing. The same key with another body is 422, never a second effect.
func TestClaimBadRequests(t *testing.T) {
	srv, d := claimServer(t, true, httpcmd.Config{MaxBodyBytes: 1024})
	c := srv.Client()
	ok := claim(t, c, srv.URL, "k-1", claimBody("u-bad"))
	if ok.status != http.StatusCreated {
		t.Fatalf("first claim: %d %s", ok.status, ok.body)
	}
	for _, tc := range []struct {
		name, key, body, ctype string
		status                 int
		want                   string
	}{
		{"no key", "", claimBody("u-bad"), "", 400, "Idempotency-Key header is required"},
		{"key too long", strings.Repeat("k", 256), claimBody("u-bad"), "", 400, "longer than 255"},
		{"key not ASCII", "k\u00e9", claimBody("u-bad"), "", 400, "printable"},
		{"not JSON", "k-2", `{"userId":`, "", 400, "body:"},
		{"no user", "k-3", `{"campaignId": "double11-5yuan"}`, "", 400, "userId"},
		{"unknown campaign", "k-4", `{"userId": "u", "campaignId": "nope"}`, "", 400, "unknown campaign"},
		{"too large", "k-5", `{"userId": "` + strings.Repeat("u", 2000) + `"}`, "", 413, "exceeds 1024 bytes"},
		{"not JSON content", "k-6", claimBody("u-bad"), "text/plain", 415, "application/json"},
		{"same key, another body", "k-1", claimBody("u-other"), "", 422, "different request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, srv.URL+coupon.ClaimPath, strings.NewReader(tc.body))
			if tc.key != "" {
				req.Header[httpcmd.HeaderKey] = []string{tc.key}
			}
			if tc.ctype != "" {
				req.Header.Set("Content-Type", tc.ctype)
			}
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var e struct{ Error string }
			if resp.StatusCode != tc.status || json.Unmarshal(b, &e) != nil || !strings.Contains(e.Error, tc.want) {
				t.Fatalf("%d %s, want %d with an error containing %q", resp.StatusCode, b, tc.status, tc.want)
			}
		})
	}
	if got := count(t, d.DB, "SELECT COUNT(*) FROM inbox WHERE biz_type = ?", coupon.ClaimBizType); got != 1 {
		t.Fatalf("inbox rows of claims: %d, want 1 (refused requests write nothing)", got)
	}
	if got := coupons(t, d.DB, "u-other") + coupons(t, d.DB, "u-bad"); got != 1 {
		t.Fatalf("coupons: %d, want 1", got)
	}
	// Wrong method and path.
	resp, err := c.Get(srv.URL + coupon.ClaimPath)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "POST" {
		t.Fatalf("GET: %d Allow=%q", resp.StatusCode, resp.Header.Get("Allow"))
	}
	resp, err = c.Post(srv.URL+"/v1/nothing", "application/json", bytes.NewReader(nil))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("unknown path: %d", resp.StatusCode)
	}
}

// TestClaimBodyNotUTF8 checks that a body that is not UTF-8 is refused with 400 and writes
// nothing. encoding/json alone would decode the two bodies below as one user, because each
// byte becomes U+FFFD. That would grant a coupon to a user id no client sent, and make the
// second request a replay of the first.
func TestClaimBodyNotUTF8(t *testing.T) {
	campaign := coupon.DefaultConfig().CampaignID
	bodies := []struct{ body, answer string }{
		{"{\"userId\": \"u8-\xff\", \"campaignId\": \"" + campaign + "\"}", "body: payload is not valid UTF-8 at byte 15"},
		{"{\"userId\": \"u8-\xfe\", \"campaignId\": \"" + campaign + "\"}", "body: payload is not valid UTF-8 at byte 15"},
		{`{"userId": "u8-\ud800", "campaignId": "` + campaign + `"}`, "body: payload is not valid UTF-8 at byte 15: a \\u escape of a lone surrogate"},
	}
	var a, b coupon.ClaimRequest
	if json.Unmarshal([]byte(bodies[0].body), &a) != nil || json.Unmarshal([]byte(bodies[1].body), &b) != nil || a != b {
		t.Fatalf("json.Unmarshal decodes the bodies as %+v and %+v: want one request (what the command must not do)", a, b)
	}
	for _, batch := range []bool{false, true} {
		t.Run(mode(batch), func(t *testing.T) {
			srv, d := claimServer(t, batch, httpcmd.Config{})
			for i, tc := range bodies {
				got := claim(t, srv.Client(), srv.URL, fmt.Sprintf("u8-key-%d", i), tc.body)
				var e struct{ Error string }
				if got.status != http.StatusBadRequest || json.Unmarshal([]byte(got.body), &e) != nil || e.Error != tc.answer {
					t.Fatalf("body %q: %d %s, want 400 %q", tc.body, got.status, got.body, tc.answer)
				}
			}
			if n := count(t, d.DB, "SELECT COUNT(*) FROM inbox"); n != 0 {
				t.Fatalf("%d inbox rows, want none", n)
			}
			if n := count(t, d.DB, "SELECT (SELECT COUNT(*) FROM user_coupon) + (SELECT COUNT(*) FROM coupon_grant) + (SELECT COUNT(*) FROM outbox)"); n != 0 {
				t.Fatalf("%d coupons, grants and events, want none", n)
			}
		})
	}
}

// TestClaimLongKey checks that a key longer than the inbox key column is stored as its
// sha256. The same long key is still one claim.
func TestClaimLongKey(t *testing.T) {
	srv, d := claimServer(t, true, httpcmd.Config{})
	key := strings.Repeat("x", 200) + "-" + strings.Repeat("y", 54)
	a := claim(t, srv.Client(), srv.URL, key, claimBody("u-long"))
	b := claim(t, srv.Client(), srv.URL, key, claimBody("u-long"))
	if a.status != 201 || b.status != 201 || a.body != b.body || !b.replayed {
		t.Fatalf("long key: %d %s / %d %s replayed=%v", a.status, a.body, b.status, b.body, b.replayed)
	}
	if got := count(t, d.DB, "SELECT COUNT(*) FROM inbox WHERE biz_type = ? AND dedup_key = ?", coupon.ClaimBizType, engine.CommandKey(key)); got != 1 {
		t.Fatalf("rows under the key's digest: %d", got)
	}
	if got := coupons(t, d.DB, "u-long"); got != 1 {
		t.Fatalf("coupons: %d", got)
	}
}

// TestClaimOneKeyTwoRouters runs two routers on one database, as two listeners behind a
// load balancer, one with group commit and one without. A key's requests spread over both
// still grant one coupon. Every answer is 201 with one body, or 409. Across routers the
// second request waits on the first one's row lock, then answers its response.
func TestClaimOneKeyTwoRouters(t *testing.T) {
	a, d := claimServer(t, false, httpcmd.Config{})
	b := serveClaims(t, d, nil, true, httpcmd.Config{})
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 100}}
	var wg sync.WaitGroup
	var mu sync.Mutex
	bodies := map[string]int{}
	statuses := map[int]int{}
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			url := a.URL
			if i%2 == 1 {
				url = b.URL
			}
			ans := claim(t, c, url, "two-routers", claimBody("u-two"))
			mu.Lock()
			defer mu.Unlock()
			statuses[ans.status]++
			if ans.status == http.StatusCreated {
				bodies[ans.body]++
			}
		}()
	}
	wg.Wait()
	if len(bodies) != 1 || statuses[http.StatusCreated]+statuses[http.StatusConflict] != 100 {
		t.Fatalf("answers %v, %d distinct 201 bodies; want only 201 (one body) and 409", statuses, len(bodies))
	}
	if n, e := coupons(t, d.DB, "u-two"), events(t, d.DB, "u-two"); n != 1 || e != 1 {
		t.Fatalf("coupons %d events %d, want 1 and 1", n, e)
	}
}

// switchable fails every call while broken is set.
type switchable struct{ broken atomic.Bool }

func (s *switchable) Call(context.Context, string, string) error {
	if s.broken.Load() {
		return errors.New("wallet service down")
	}
	return nil
}

// TestClaimFailsThenRetries checks that a claim whose handler fails on every attempt
// answers 500, commits no effect and keeps the row for the operator. A retry with the same
// key once the cause is gone runs it again and grants the one coupon.
func TestClaimFailsThenRetries(t *testing.T) {
	d := testenv.DB(t, 8, migrations.Set{Name: coupon.PluginName, FS: coupon.Migrations})
	if err := coupon.EnsureCampaign(context.Background(), d.DB, coupon.DefaultConfig()); err != nil {
		t.Fatal(err)
	}
	svc := &switchable{}
	svc.broken.Store(true)
	srv := serveClaims(t, d, svc, true, httpcmd.Config{})
	a := claim(t, srv.Client(), srv.URL, "flaky-1", claimBody("u-flaky"))
	if a.status != http.StatusInternalServerError || !strings.Contains(a.body, `"reason":"retries_exhausted"`) {
		t.Fatalf("failing claim: %d %s, want 500 with reason retries_exhausted", a.status, a.body)
	}
	if n := coupons(t, d.DB, "u-flaky"); n != 0 {
		t.Fatalf("coupons after a failed claim: %d", n)
	}
	if st := count(t, d.DB, "SELECT COUNT(*) FROM inbox WHERE biz_type = ? AND status = 'failed'", coupon.ClaimBizType); st != 1 {
		t.Fatalf("failed rows: %d, want 1", st)
	}
	svc.broken.Store(false)
	a = claim(t, srv.Client(), srv.URL, "flaky-1", claimBody("u-flaky"))
	b := claim(t, srv.Client(), srv.URL, "flaky-1", claimBody("u-flaky"))
	if a.status != http.StatusCreated || b.status != http.StatusCreated || a.body != b.body || a.replayed || !b.replayed {
		t.Fatalf("after the fix: %d %s replayed=%v / %d %s replayed=%v", a.status, a.body, a.replayed, b.status, b.body, b.replayed)
	}
	if n, e := coupons(t, d.DB, "u-flaky"), events(t, d.DB, "u-flaky"); n != 1 || e != 1 {
		t.Fatalf("coupons %d events %d, want 1 and 1", n, e)
	}
}

// TestClaimKeysExpire checks that a client token lives for the command's retention,
// http.idempotency_ttl. The inbox cleaner deletes the row and its stored response
// together, and the same key is then a new claim. Without CleanerConfig.Replies the
// response would be left behind, and the check sees that.
func TestClaimKeysExpire(t *testing.T) {
	srv, d := claimServer(t, true, httpcmd.Config{})
	first := claim(t, srv.Client(), srv.URL, "old-key", claimBody("u-old"))
	if first.status != http.StatusCreated {
		t.Fatalf("claim: %d %s", first.status, first.body)
	}
	ctx := context.Background()
	if _, err := d.DB.ExecContext(ctx, testenv.Rebind("UPDATE inbox SET expire_at = CURRENT_TIMESTAMP(6) - INTERVAL '1' MINUTE WHERE biz_type = ?"), coupon.ClaimBizType); err != nil {
		t.Fatal(err)
	}
	responses := func() int { return count(t, d.DB, "SELECT COUNT(*) FROM inbox_response") }
	if responses() != 1 {
		t.Fatalf("stored responses: %d, want 1", responses())
	}
	for _, replies := range []bool{false, true} {
		c, err := inboxops.NewCleaner(d.DB, engine.CleanerConfig{Replies: replies, Interval: time.Second}, nil)
		if err != nil {
			t.Fatal(err)
		}
		n, err := c.RunOnce(ctx, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case !replies && (n != 1 || responses() != 1):
			t.Fatalf("without Replies: %d rows deleted, %d responses left; want 1 and 1 (left behind)", n, responses())
		case !replies:
			// Put the row back, so the cleaner with Replies has it to delete.
			if _, err := d.Admin.ExecContext(ctx, "DELETE FROM inbox_response"); err != nil {
				t.Fatal(err)
			}
			claim(t, srv.Client(), srv.URL, "old-key", claimBody("u-old"))
			if _, err := d.DB.ExecContext(ctx, testenv.Rebind("UPDATE inbox SET expire_at = CURRENT_TIMESTAMP(6) - INTERVAL '1' MINUTE WHERE biz_type = ?"), coupon.ClaimBizType); err != nil {
				t.Fatal(err)
			}
		case n != 1 || responses() != 0:
			t.Fatalf("with Replies: %d rows deleted, %d responses left; want 1 and 0", n, responses())
		}
	}
	// The key is free again for a new claim under it. The grant's id is the key's, so the
	// coupon it already granted answers.
	again := claim(t, srv.Client(), srv.URL, "old-key", claimBody("u-old"))
	if again.status != http.StatusCreated || again.replayed {
		t.Fatalf("after expiry: %d %s replayed=%v", again.status, again.body, again.replayed)
	}
}

// TestClaimKeysNeverShareARow checks that two client tokens never share a row, nor a
// response. A token and the stored form of a long one never share one. That stored form is
// "sha256:" and 64 hex digits, as engine.CommandKey makes it. Tokens that differ only in
// case or trailing spaces never share one either. Each claim is its own, with 201, not
// replayed, and with a claim id and coupon of its own. HTTP trims a header's trailing
// spaces, so those tokens are sent through the runner itself. If CommandKey kept a token
// that begins with "sha256:" as it is, the second token of the first pair would get the
// first's stored response. Under a PAD SPACE collation "h1-g1 " would get "h1-g1"'s.
func TestClaimKeysNeverShareARow(t *testing.T) {
	storedForm := func(token string) string {
		s := sha256.Sum256([]byte(token))
		return "sha256:" + hex.EncodeToString(s[:])
	}
	long1, long2 := strings.Repeat("L", 200), strings.Repeat("M", 129)
	for _, batch := range []bool{false, true} {
		t.Run(mode(batch), func(t *testing.T) {
			d := testenv.DB(t, 8, migrations.Set{Name: coupon.PluginName, FS: coupon.Migrations})
			ctx := context.Background()
			if err := coupon.EnsureCampaign(ctx, d.DB, coupon.DefaultConfig()); err != nil {
				t.Fatal(err)
			}
			srv := serveClaims(t, d, nil, batch, httpcmd.Config{})
			g, err := coupon.NewGranter(coupon.DefaultConfig(), nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			h, err := g.ClaimHandler(d.DB)
			if err != nil {
				t.Fatal(err)
			}
			ib, err := engine.NewCommand(d.DB, h, engine.Config{BizType: coupon.ClaimBizType}, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			var runner httpcmd.Runner = ib
			if batch {
				b, err := ib.NewBatcher(engine.BatchConfig{})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { b.Close() })
				runner = b
			}
			direct := func(key, body string) answer {
				res, err := runner.RunCommand(ctx, engine.CommandRequest{Token: key, Body: []byte(body), Source: inbox.Source{Topic: "test", Partition: -1, Offset: -1}})
				if err != nil {
					t.Fatalf("token %q: %v", key, err)
				}
				if res.Outcome == engine.OutcomeConflict {
					return answer{status: http.StatusUnprocessableEntity, body: "conflict"}
				}
				return answer{status: res.Reply.Status, body: string(res.Reply.Body), replayed: res.Outcome == engine.OutcomeDuplicate}
			}
			viaHTTP := func(key, body string) answer { return claim(t, srv.Client(), srv.URL, key, body) }
			for _, pair := range []struct {
				name string
				a, b string
				send func(key, body string) answer
			}{
				{"a long token, then its stored form", long1, storedForm(long1), viaHTTP},
				{"a long token's stored form, then the token", storedForm(long2), long2, viaHTTP},
				{"case", "K-upper", "k-upper", viaHTTP},
				{"trailing space", "h1-g1", "h1-g1 ", direct},
				{"trailing spaces", "h2-g2 ", "h2-g2  ", direct},
			} {
				user := "u-" + strings.ReplaceAll(pair.name, " ", "-")
				before := coupons(t, d.DB, user)
				a, b := pair.send(pair.a, claimBody(user)), pair.send(pair.b, claimBody(user))
				for _, x := range []answer{a, b} {
					if x.status != http.StatusCreated {
						t.Fatalf("%s: answer %d %s, want 201", pair.name, x.status, x.body)
					}
				}
				if b.replayed || a.body == b.body {
					t.Errorf("%s: the second token got the first's response (replayed=%v): %s", pair.name, b.replayed, b.body)
				}
				if n := coupons(t, d.DB, user) - before; n != 2 {
					t.Errorf("%s: %d coupons, want 2", pair.name, n)
				}
			}
		})
	}
}
