package console

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	_ "github.com/go-sql-driver/mysql"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/inbox/inboxops"
	"github.com/onceflow/onceflow/internal/consoleui"
	"github.com/onceflow/onceflow/internal/testenv"
)

const testToken = "console-unit-token-0123456789"

// offlineDB is a pool that never connected. With it, the tests of what the console refuses
// before it reads anything run without services.
func offlineDB(t *testing.T) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", "nobody:nothing@tcp(127.0.0.1:1)/none?timeout=100ms")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// testConsole serves a console on a loopback test server and returns its base URL.
func testConsole(t *testing.T, cfg Config) (*Console, string) {
	t.Helper()
	c, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c)
	t.Cleanup(func() { srv.Close(); c.Close() })
	return c, srv.URL
}

// browser is an HTTP client with a cookie jar that follows no redirect, as a test reads
// each answer.
func browser(t *testing.T) *http.Client {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func do(t *testing.T, c *http.Client, req *http.Request) (int, string, http.Header) {
	t.Helper()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header
}

func get(t *testing.T, c *http.Client, u string) (int, string, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	return do(t, c, req)
}

// post sends a form as a browser on the console's page does, with the console's own Origin.
func post(t *testing.T, c *http.Client, base, path string, form url.Values) (int, string, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", base)
	return do(t, c, req)
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf opens path and returns the form token of its page. The jar keeps the cookie.
func csrf(t *testing.T, c *http.Client, base, path string) string {
	t.Helper()
	code, body, _ := get(t, c, base+path)
	m := csrfRE.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("GET %s (%d): no CSRF field in the page:\n%s", path, code, body)
	}
	return m[1]
}

// TestActionsArePostOnly checks that actions are POST only, so a GET of an action's path
// gets 405. A page is GET only.
func TestActionsArePostOnly(t *testing.T) {
	_, base := testConsole(t, Config{DB: offlineDB(t)})
	c := browser(t)
	for _, path := range []string{"/inbox/1/retry", "/inbox/1/resolve", "/replay", "/outbox/1/retry", "/outbox/1/drop", "/outbox/bulk/retry", "/outbox/bulk/drop", "/logout"} {
		if code, _, h := get(t, c, base+path); code != http.StatusMethodNotAllowed || !strings.Contains(h.Get("Allow"), "POST") {
			t.Errorf("GET %s: %d (Allow %q), want 405 allowing POST", path, code, h.Get("Allow"))
		}
	}
	if code, _, _ := post(t, c, base, "/inbox", url.Values{}); code != http.StatusMethodNotAllowed {
		t.Errorf("POST /inbox: %d, want 405", code)
	}
}

// TestCSRFRefused checks that a form POST without the token of its CSRF cookie is refused
// before anything is read or changed. So is one with a wrong token, with another cookie's
// token, or from another origin.
func TestCSRFRefused(t *testing.T) {
	var replays atomic.Int64
	replay := func(context.Context, inboxops.ReplayOptions) (inboxops.ReplayReport, error) {
		replays.Add(1)
		return inboxops.ReplayReport{}, errors.New("not in this test")
	}
	_, base := testConsole(t, Config{DB: offlineDB(t), Replay: replay, BizTypes: []BizType{{Name: "coupon"}}})
	c := browser(t)
	other := browser(t)
	otherTok := csrf(t, other, base, "/inbox?biz=coupon&status=failed")
	mine := csrf(t, c, base, "/inbox?biz=coupon&status=failed")
	form := func(token string) url.Values {
		return url.Values{"csrf": {token}, "biz": {"coupon"}, "status": {"failed"}}
	}
	for _, tc := range []struct {
		name   string
		form   url.Values
		origin string
		client *http.Client
	}{
		{"no token", form(""), base, c},
		{"wrong token", form("AAAA"), base, c},
		{"another browser's token", form(otherTok), base, c},
		{"no cookie", form(mine), base, &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}},
		{"another origin", form(mine), "http://evil.example", c},
		{"a null origin", form(mine), "null", c},
	} {
		req, _ := http.NewRequest(http.MethodPost, base+"/replay", strings.NewReader(tc.form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", tc.origin)
		if code, body, _ := do(t, tc.client, req); code != http.StatusForbidden {
			t.Errorf("%s: %d, want 403:\n%s", tc.name, code, body)
		}
	}
	req, _ := http.NewRequest(http.MethodPost, base+"/replay", strings.NewReader(form(mine).Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	if code, _, _ := do(t, c, req); code != http.StatusForbidden {
		t.Errorf("Sec-Fetch-Site cross-site: %d, want 403", code)
	}
	if n := replays.Load(); n != 0 {
		t.Fatalf("%d replays ran from refused forms", n)
	}
	// The same form with its token and the console's origin gets through to the replay.
	if code, body, _ := post(t, c, base, "/replay", form(mine)); code == http.StatusForbidden || replays.Load() != 1 {
		t.Fatalf("a valid form: %d, %d replays, want it to reach the replay:\n%s", code, replays.Load(), body)
	}
}

// TestNoTokenLoopbackHostOnly checks that without admin.token the console answers only
// requests addressed to a loopback name. A page that rebinds its DNS name to 127.0.0.1 gets
// 421 and the console's headers.
func TestNoTokenLoopbackHostOnly(t *testing.T) {
	_, base := testConsole(t, Config{DB: offlineDB(t)})
	c := browser(t)
	for host, want := range map[string]int{"attacker.example:80": http.StatusMisdirectedRequest, "attacker.example": http.StatusMisdirectedRequest,
		"10.0.0.5:9464": http.StatusMisdirectedRequest, "localhost:9464": http.StatusOK, "[::1]:9464": http.StatusOK, "127.0.0.1": http.StatusOK} {
		req, _ := http.NewRequest(http.MethodGet, base+"/static/console.css", nil)
		req.Host = host
		if code, _, h := do(t, c, req); code != want || h.Get("X-Frame-Options") != "DENY" {
			t.Errorf("Host %s: %d (X-Frame-Options %q), want %d and the console's headers", host, code, h.Get("X-Frame-Options"), want)
		}
	}
}

// loginNexts are next= values of the login. The hostile ones must land on "/", the others
// where they say. Browsers drop tabs and newlines and read "\\" as "/". So "/\t/evil" and
// "/\\evil" would be "//evil", another host.
var loginNexts = []struct{ next, want string }{
	{"//evil.example/x", "/"},
	{"///evil.example", "/"},
	{"//evil", "/"},
	{"/\\evil", "/"},
	{"\\\\evil", "/"},
	{"/\t/evil", "/"},
	{"/\t/127.0.0.1:19998/pwned", "/"},
	{"/\n/evil", "/"},
	{"/\r\n/evil", "/"},
	{"\t//evil", "/"},
	{"/\x00/evil", "/"},
	{"/\x7f/evil", "/"},
	{"/\u0085/evil", "/"},
	{"/%09/evil", "/"},
	{"/%0a/evil", "/"},
	{"/%2F%2Fevil", "/"},
	{"/%2f/evil", "/"},
	{"/%5Cevil", "/"},
	{"/%zz", "/"},
	{"/\xff", "/"},
	{"https://evil", "/"},
	{"HTTPS://evil", "/"},
	{"http:evil", "/"},
	{"javascript:alert(1)", "/"},
	{"JavaScript:alert(document.cookie)", "/"},
	{"data:text/html,<script>alert(1)</script>", "/"},
	{"evil", "/"},
	{" /outbox", "/"},
	{"", "/"},
	{"/", "/"},
	{"/outbox", "/outbox"},
	{"/outbox?x=1", "/outbox?x=1"},
	{"/inbox/42", "/inbox/42"},
	{"/inbox?biz_type=coupon&status=failed&key=a%2Fb", "/inbox?biz_type=coupon&status=failed&key=a%2Fb"},
	{"/inbox?key=%2F%2Fevil", "/inbox?key=%2F%2Fevil"},
	{"/replays", "/replays"},
}

// TestLocalPath checks that localPath keeps a plain local path and turns everything else
// into "/".
func TestLocalPath(t *testing.T) {
	for _, tc := range loginNexts {
		if got := localPath(tc.next); got != tc.want {
			t.Errorf("localPath(%q) = %q, want %q", tc.next, got, tc.want)
		}
	}
}

// TestLoginRedirectStaysLocal checks that the login sends the browser where next= says only
// when it is a plain local path. The hostile ones, posted as a browser posts the form, get
// a Location of /.
func TestLoginRedirectStaysLocal(t *testing.T) {
	_, base := testConsole(t, Config{DB: offlineDB(t), Token: testToken})
	c := browser(t)
	tok := csrf(t, c, base, "/login")
	for _, tc := range loginNexts {
		code, _, h := post(t, c, base, "/login", url.Values{"csrf": {tok}, "token": {testToken}, "next": {tc.next}})
		if code != http.StatusSeeOther || h.Get("Location") != tc.want {
			t.Errorf("login with next=%q: %d → %q, want 303 to %q", tc.next, code, h.Get("Location"), tc.want)
		}
	}
}

// TestLogin checks the console with a token. A page sends a browser to the login form. The
// form takes the token once and sets an HttpOnly, SameSite=Strict cookie that is not the
// token. A wrong token, a forged cookie and an expired cookie get nothing. Bearer works for
// scripts, without CSRF. Logout ends the session.
func TestLogin(t *testing.T) {
	var replays atomic.Int64
	replay := func(context.Context, inboxops.ReplayOptions) (inboxops.ReplayReport, error) {
		replays.Add(1)
		return inboxops.ReplayReport{}, errors.New("not in this test")
	}
	con, base := testConsole(t, Config{DB: offlineDB(t), Token: testToken, Replay: replay, BizTypes: []BizType{{Name: "coupon"}}})
	c := browser(t)
	code, _, h := get(t, c, base+"/outbox?x=1")
	if code != http.StatusSeeOther || h.Get("Location") != "/login?next="+url.QueryEscape("/outbox?x=1") {
		t.Fatalf("GET /outbox without a login: %d → %q, want 303 to the login form", code, h.Get("Location"))
	}
	tok := csrf(t, c, base, "/login")
	code, body, _ := post(t, c, base, "/login", url.Values{"csrf": {tok}, "token": {"wrong-token-0123456789"}, "next": {"/outbox?x=1"}})
	if code != http.StatusUnauthorized || !strings.Contains(body, "not the admin token") {
		t.Fatalf("login with a wrong token: %d, want 401 and the form again", code)
	}
	if code, _, _ := post(t, c, base, "/login", url.Values{"token": {testToken}}); code != http.StatusForbidden {
		t.Fatalf("login without the CSRF token: %d, want 403", code)
	}
	resp, err := c.Do(func() *http.Request {
		req, _ := http.NewRequest(http.MethodPost, base+"/login", strings.NewReader(url.Values{"csrf": {tok}, "token": {testToken}, "next": {"//evil.example/x"}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", base)
		return req
	}())
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/" {
		t.Fatalf("login with next=//evil.example: %d → %q, want 303 to / (never elsewhere)", resp.StatusCode, resp.Header.Get("Location"))
	}
	var session *http.Cookie
	for _, ck := range resp.Cookies() {
		if ck.Name == sessionCookie {
			session = ck
		}
	}
	if session == nil || !session.HttpOnly || session.SameSite != http.SameSiteStrictMode || strings.Contains(session.Value, testToken) || session.MaxAge <= 0 {
		t.Fatalf("session cookie %+v: want HttpOnly, SameSite=Strict, a lifetime, and not the token", session)
	}
	if code, _, _ := get(t, c, base+"/outbox"); code != http.StatusOK {
		t.Fatalf("GET /outbox after the login: %d, want 200", code)
	}

	// Forged and expired cookies.
	for name, v := range map[string]string{
		"forged":           fmt.Sprintf("%d.%s", time.Now().Add(time.Hour).Unix(), "AAAA"),
		"expired":          con.sessionValue(time.Now().Add(-time.Minute)),
		"too far ahead":    con.sessionValue(time.Now().Add(30 * 24 * time.Hour)),
		"the token itself": testToken,
	} {
		req, _ := http.NewRequest(http.MethodGet, base+"/outbox", nil)
		req.AddCookie(&http.Cookie{Name: sessionCookie, Value: v})
		if code, _, _ := do(t, &http.Client{CheckRedirect: c.CheckRedirect}, req); code != http.StatusSeeOther {
			t.Errorf("%s session cookie: %d, want 303 to the login", name, code)
		}
	}

	// Scripts send Bearer with no cookie and no CSRF token. A wrong bearer gets 401 even
	// with a cookie.
	script := &http.Client{CheckRedirect: c.CheckRedirect}
	req, _ := http.NewRequest(http.MethodPost, base+"/replay", strings.NewReader("biz=coupon&status=failed"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "Bearer "+testToken)
	if code, _, _ := do(t, script, req); code == http.StatusForbidden || code == http.StatusUnauthorized || replays.Load() != 1 {
		t.Fatalf("POST with the bearer token: %d, %d replays; want it to reach the replay", code, replays.Load())
	}
	req, _ = http.NewRequest(http.MethodGet, base+"/outbox", nil)
	req.Header.Set("Authorization", "Bearer wrong-token-0123456789")
	if code, _, _ := do(t, c, req); code != http.StatusUnauthorized {
		t.Errorf("a wrong bearer token with a valid session: %d, want 401", code)
	}

	// Logout ends it. Logout is a form, so it needs the CSRF token too.
	tok = csrf(t, c, base, "/outbox")
	if code, _, _ := post(t, c, base, "/logout", url.Values{"csrf": {tok}}); code != http.StatusSeeOther {
		t.Fatalf("logout: %d", code)
	}
	if code, _, _ := get(t, c, base+"/outbox"); code != http.StatusSeeOther {
		t.Fatalf("GET /outbox after logout: %d, want 303 to the login", code)
	}
}

// TestEscaping checks that keys, errors, payloads and headers are written as text. HTML is
// escaped. Terminal escapes, bidi overrides and bytes that are not UTF-8 show as Go
// escapes. That holds on the list, on the row page, in the filter form and in the replay
// preview.
func TestEscaping(t *testing.T) {
	d := testenv.DB(t, 4)
	ib := failingInbox(t, d.DB, "esc")
	key := "<script>alert(1)</script>\x1b[31mred\u202egnp.exe\"'&"
	quarantine(t, ib, key, `{"note":"</pre><script>x</script>","esc":"\u001b[2J"}`, map[string]string{"h<b>": "v\x1b]0;title\x07"})
	_, base := testConsole(t, Config{DB: d.DB, BizTypes: []BizType{{Name: "esc"}}, Replay: replayWith(ib)})
	cl := browser(t)
	var id int64
	if err := d.DB.QueryRow("SELECT id FROM inbox WHERE biz_type = 'esc'").Scan(&id); err != nil {
		t.Fatal(err)
	}
	check := func(what, body string) {
		t.Helper()
		for _, bad := range []string{"<script>", "\x1b", "\u202e", "<b>", "</pre><script>"} {
			if strings.Contains(body, bad) {
				t.Errorf("%s: the page holds %q raw", what, bad)
			}
		}
	}
	code, body, _ := get(t, cl, base+"/inbox?biz=esc&status=failed")
	if code != http.StatusOK || !strings.Contains(body, `&lt;script&gt;alert(1)&lt;/script&gt;\x1b[31mred\u202egnp.exe&#34;&#39;&amp;`) {
		t.Errorf("list: %d, the key not shown escaped:\n%s", code, body)
	}
	check("list", body)
	code, body, _ = get(t, cl, base+fmt.Sprintf("/inbox/%d", id))
	if code != http.StatusOK || !strings.Contains(body, `&lt;script&gt;alert(1)&lt;/script&gt;\x1b[31mred\u202egnp.exe`) ||
		!strings.Contains(body, `&lt;/pre&gt;&lt;script&gt;x&lt;/script&gt;`) || !strings.Contains(body, `h&lt;b&gt;`) || !strings.Contains(body, `v\x1b]0;title\x07`) {
		t.Errorf("row page: %d, key, payload or header not shown escaped:\n%s", code, body)
	}
	check("row page", body)
	code, body, _ = get(t, cl, base+"/inbox?biz=esc&key="+url.QueryEscape(key))
	if code != http.StatusOK || !strings.Contains(body, fmt.Sprintf(`href="/inbox/%d"`, id)) {
		t.Errorf("filter by the key: %d, the row not found:\n%s", code, body)
	}
	check("filtered list", body)
	if !strings.Contains(body, `value="&lt;script&gt;alert(1)&lt;/script&gt;\x1b[31mred\u202egnp.exe&#34;&#39;&amp;"`) {
		t.Errorf("the filter form does not show the key as the list does:\n%s", body)
	}
	// The key as the page shows it, with its escapes typed as text, finds the row too.
	code, body, _ = get(t, cl, base+"/inbox?biz=esc&key="+url.QueryEscape(consoleui.Visible(key)))
	if code != http.StatusOK || !strings.Contains(body, fmt.Sprintf(`href="/inbox/%d"`, id)) {
		t.Errorf("filter by the key as shown: %d, the row not found:\n%s", code, body)
	}
	tok := csrf(t, cl, base, "/inbox?biz=esc&status=failed")
	code, body, _ = post(t, cl, base, "/replay", url.Values{"csrf": {tok}, "biz": {"esc"}, "status": {"failed"}, "key": {key}})
	if code != http.StatusOK || !strings.Contains(body, "Dry run") {
		t.Errorf("dry run by the key: %d:\n%s", code, body)
	}
	check("dry run", body)
}

// testHandler decodes "key|anything" with the key before the bar, and fails while broken.
// A payload that starts with "!" is poison: it does not decode.
type testHandler struct{ broken *atomic.Bool }

func (h testHandler) Decode(msg *message.Message) (inbox.Decoded, error) {
	if strings.HasPrefix(string(msg.Payload), "!") {
		return inbox.Decoded{}, inbox.PoisonError("not a test message")
	}
	k, _, _ := strings.Cut(string(msg.Payload), "|")
	if strings.HasPrefix(string(msg.Payload), "{") {
		k = msg.Metadata.Get("key")
	}
	return inbox.Decoded{Key: k, Fingerprint: string(msg.Payload)}, nil
}

func (h testHandler) Handle(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
	if h.broken.Load() {
		return inbox.Continue, errors.New("downstream \x1b[31mdown\x1b[0m <b>")
	}
	return inbox.Done, nil
}

type brokenInbox struct {
	*engine.Inbox
	broken *atomic.Bool
}

func failingInbox(t *testing.T, db *sql.DB, biz string) brokenInbox {
	t.Helper()
	var broken atomic.Bool
	broken.Store(true)
	ib, err := engine.New(db, testHandler{&broken}, engine.Config{BizType: biz, MaxAttempts: 1, DelayedRetries: -1}, watermill.NopLogger{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return brokenInbox{ib, &broken}
}

// quarantine delivers payload for key through the broken handler, which leaves a failed
// row.
func quarantine(t *testing.T, ib brokenInbox, key, payload string, meta map[string]string) {
	t.Helper()
	msg := message.NewMessage(watermill.NewUUID(), []byte(payload))
	if !strings.HasPrefix(payload, "{") {
		msg = message.NewMessage(watermill.NewUUID(), []byte(key+"|"+payload))
	}
	msg.Metadata.Set("key", key)
	for k, v := range meta {
		msg.Metadata.Set(k, v)
	}
	r, err := ib.Process(context.Background(), msg, inbox.Source{Topic: "t", Partition: 0, Offset: 1}, engine.ProcessOptions{})
	if err != nil || r.Outcome != engine.OutcomeQuarantined {
		t.Fatalf("quarantine %q: %+v %v", key, r, err)
	}
}

func replayWith(ib brokenInbox) ReplayFunc {
	return func(ctx context.Context, opts inboxops.ReplayOptions) (inboxops.ReplayReport, error) {
		return inboxops.Replay(ctx, ib.Inbox, opts)
	}
}
