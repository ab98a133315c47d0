// Package console is the operator console that the runtime's admin listener serves at /. It
// has an overview of the inbox, the consumers and the relay. It lists the inbox's rows,
// filtered and paged by key. It shows one row in full with what its plugin recorded for it.
// It offers the operator's actions. An operator can retry a row, resolve a quarantined row
// with a reason, replay a filtered set after its dry run, and retry or drop a parked outbox
// event. It retries or drops the parked events of a topic and reason in bulk after counting
// them. Its pages are internal/consoleui's. It reads and changes the inbox and the outbox.
// It imports no runtime. The runtime passes it a Config with the pool, the metrics, the biz
// types and consumer groups of its plugins, and the func that runs a replay.
//
// The server renders the pages with html/template, from embedded templates and a
// stylesheet. The pages hold no JavaScript. Actions are POST forms protected against
// cross-site requests. A form carries a token in a hidden field, bound to a SameSite=Strict
// cookie. The console checks the Origin too. With an admin token, a browser logs in once
// with the token, in a form. It then gets an HttpOnly, SameSite=Strict session cookie that
// holds an HMAC keyed by the token. Scripts keep sending the token in an Authorization
// header as a Bearer token. Without a token the listener is loopback only. The console then
// answers only requests addressed to a loopback name. So a page of another site cannot
// reach it by rebinding its DNS name.
package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/inboxops"
	"github.com/onceflow/onceflow/internal/consoleui"
	"github.com/onceflow/onceflow/internal/loopback"
	"github.com/onceflow/onceflow/internal/metrics"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// BizType is a biz type of the inbox as the console shows it.
type BizType struct {
	Name    string
	Plugins []string          // the plugins whose handler runs its rows
	History inbox.HistoryFunc // reads the plugin's record of a key, from Plugin.History, or is nil
}

// ReplayFunc runs a replay or its dry run through the handler of the filter's biz type. It
// records the replay in the replay table. It takes the path of `router replay` and
// `router inbox retry`.
type ReplayFunc func(ctx context.Context, opts inboxops.ReplayOptions) (inboxops.ReplayReport, error)

// Config configures a console.
type Config struct {
	// DB is the application's pool. The console reads and changes the inbox, the replay
	// table and the outbox through it. DB is required.
	DB *sql.DB
	// Metrics feeds the overview with the cached database figures, the partitions this
	// process consumes and the deliveries per minute. With a nil Metrics the overview shows
	// none of them.
	Metrics *metrics.Metrics
	// Token is admin.token. An empty Token means no login, and the listener is loopback
	// only.
	Token string
	// BizTypes are the biz types the filters offer and the replays run.
	BizTypes []BizType
	// Replay runs the replays. A nil Replay makes the console read-only for the inbox.
	Replay ReplayFunc
	// Groups are the consumer groups of the plugins and their topics. Lags reads their lag
	// from Kafka. With a nil Lags the console shows no lag.
	Groups []Group
	Lags   GroupLagReader
	// Logger logs the logins and the actions. A nil Logger logs nothing.
	Logger watermill.LoggerAdapter
}

// Group is a consumer group and the topics it consumes.
type Group struct {
	Name   string
	Topics []string
}

// GroupLagReader reads a consumer group's committed offsets, ends and lag without
// transaction markers. kafkax.LagReader is one.
type GroupLagReader interface {
	GroupLag(group string, topics []string) ([]kafkax.PartitionLag, error)
}

// Console is the console's http.Handler. Close it when the server stops. Close cancels the
// replays still running in the background and waits for them.
type Console struct {
	cfg     Config
	store   *inboxops.Store
	parked  *outbox.Parked
	mux     *http.ServeMux
	handler http.Handler // mux, behind the loopback-name check without a token
	pages   map[string]*template.Template
	csrfKey []byte // per process, so a form token is good until the process restarts
	biz     map[string]BizType

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	busy   chan struct{} // one replay at a time

	lagMu sync.Mutex
	lag   groupLagSnapshot // the latest read of the groups' lag
}

// Timings of the console.
const (
	// replayWait is how long an action waits for its replay before it answers that the
	// replay goes on in the background. It is within the admin server's write timeout.
	replayWait = 20 * time.Second
	// sessionTTL is how long a login lasts.
	sessionTTL = 12 * time.Hour
	// previewTTL is how long after its dry run a replay may run.
	previewTTL = time.Hour
	// queryTimeout bounds the queries of one page.
	queryTimeout = 10 * time.Second
)

const (
	sessionCookie = "onceflow_console"
	csrfCookie    = "onceflow_csrf"
	csrfField     = "csrf"
)

// New returns the console of cfg. ctx bounds the replays it runs in the background.
func New(ctx context.Context, cfg Config) (*Console, error) {
	if cfg.DB == nil {
		return nil, errors.New("console: DB is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = watermill.NopLogger{}
	}
	store, err := inboxops.NewStore(cfg.DB, "inbox")
	if err != nil {
		return nil, err
	}
	parked, err := outbox.NewParked(cfg.DB, "")
	if err != nil {
		return nil, err
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	c := &Console{cfg: cfg, store: store, parked: parked, csrfKey: key, biz: map[string]BizType{}, busy: make(chan struct{}, 1)}
	for _, b := range cfg.BizTypes {
		c.biz[b.Name] = b
	}
	c.ctx, c.cancel = context.WithCancel(ctx)
	if c.pages, err = consoleui.Pages(); err != nil {
		return nil, err
	}
	c.routes()
	return c, nil
}

// Close cancels the replays running in the background and waits for them to record how
// far they got.
func (c *Console) Close() {
	c.cancel()
	c.wg.Wait()
}

func (c *Console) routes() {
	m := http.NewServeMux()
	static, _ := fs.Sub(consoleui.Assets, "static")
	m.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	m.HandleFunc("GET /login", c.loginPage)
	m.HandleFunc("POST /login", c.login)
	m.HandleFunc("POST /logout", c.logout)
	m.Handle("GET /{$}", c.auth(c.overview))
	m.Handle("GET /inbox", c.auth(c.inboxList))
	m.Handle("GET /inbox/{id}", c.auth(c.inboxRow))
	m.Handle("POST /inbox/{id}/retry", c.auth(c.retryRow))
	m.Handle("POST /inbox/{id}/resolve", c.auth(c.resolveRow))
	m.Handle("POST /replay", c.auth(c.replay))
	m.Handle("GET /replays", c.auth(c.replays))
	m.Handle("GET /outbox", c.auth(c.parkedList))
	m.Handle("POST /outbox/{id}/retry", c.auth(c.parkedAction))
	m.Handle("POST /outbox/{id}/drop", c.auth(c.parkedAction))
	m.Handle("POST /outbox/bulk/retry", c.auth(c.parkedBulk))
	m.Handle("POST /outbox/bulk/drop", c.auth(c.parkedBulk))
	c.mux = m
	c.handler = m
	if c.cfg.Token == "" {
		c.handler = loopback.Only(m, nil) // 421 to a request for another name
	}
}

// ServeHTTP serves the console. Every answer forbids framing, sniffing and caching, and
// allows no script at all.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
	c.handler.ServeHTTP(w, r)
}

// ---------------------------------------------------------------- authentication

// who is how a request was authenticated.
type who int

const (
	nobody  who = iota
	open        // no admin.token, so loopback only
	bearer      // the Bearer token, from a script with no cookie and so no cross-site risk
	session     // the login's cookie, from a browser whose forms need the CSRF token
)

func (c *Console) authenticate(r *http.Request) who {
	if c.cfg.Token == "" {
		return open
	}
	if a := r.Header.Get("Authorization"); a != "" {
		if subtle.ConstantTimeCompare([]byte(a), []byte("Bearer "+c.cfg.Token)) == 1 {
			return bearer
		}
		return nobody
	}
	if ck, err := r.Cookie(sessionCookie); err == nil && c.validSession(ck.Value, time.Now()) {
		return session
	}
	return nobody
}

// sessionValue is the login cookie's value. It holds its expiry and an HMAC of the expiry
// keyed by the token. So it proves the token was given without holding the token, and it
// ends by itself. Every login ends when the token changes.
func (c *Console) sessionValue(expires time.Time) string {
	exp := strconv.FormatInt(expires.Unix(), 10)
	return exp + "." + c.sessionMAC(exp)
}

func (c *Console) sessionMAC(exp string) string {
	m := hmac.New(sha256.New, []byte(c.cfg.Token))
	m.Write([]byte("onceflow console session\x00" + exp))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

func (c *Console) validSession(v string, now time.Time) bool {
	exp, mac, ok := strings.Cut(v, ".")
	if !ok {
		return false
	}
	n, err := strconv.ParseInt(exp, 10, 64)
	if err != nil || now.Unix() >= n || n > now.Add(sessionTTL+time.Minute).Unix() {
		return false
	}
	return hmac.Equal([]byte(mac), []byte(c.sessionMAC(exp)))
}

// handler is a console page or action. It gets how the request was authenticated.
type handler func(w http.ResponseWriter, r *http.Request, by who)

// auth serves h to authenticated requests. A POST also needs a valid CSRF token and a
// same-origin Origin, unless it came with the bearer token. A browser without a login is
// sent to the login form. Any other request without a login gets 401.
func (c *Console) auth(h handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		by := c.authenticate(r)
		if by == nobody {
			if r.Method == http.MethodGet && r.Header.Get("Authorization") == "" {
				http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				return
			}
			w.Header().Set("WWW-Authenticate", `Bearer realm="onceflow admin"`)
			http.Error(w, "unauthorized: log in at /login, or send Authorization: Bearer <admin.token>", http.StatusUnauthorized)
			return
		}
		if r.Method == http.MethodPost && by != bearer {
			if err := c.checkForm(r); err != nil {
				http.Error(w, "forbidden: "+err.Error(), http.StatusForbidden)
				return
			}
		}
		h(w, r, by)
	})
}

// ---------------------------------------------------------------- CSRF

// csrfToken returns the token of the browser's CSRF cookie. It sets a new cookie when the
// request has none. The token is the HMAC of the cookie's random value under the process's
// key. The cookie is SameSite=Strict, so the browser sends it only in a same-site request,
// even when a page of another site asks. Such a page cannot read the token from the
// console's pages either.
func (c *Console) csrfToken(w http.ResponseWriter, r *http.Request) string {
	v := ""
	if ck, err := r.Cookie(csrfCookie); err == nil && len(ck.Value) == 32 {
		v = ck.Value
	} else {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		v = hex.EncodeToString(b)
		http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: v, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	}
	return c.csrfFor(v)
}

func (c *Console) csrfFor(cookie string) string {
	m := hmac.New(sha256.New, c.csrfKey)
	m.Write([]byte("onceflow console csrf\x00" + cookie))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// checkForm refuses a form POST from another origin or without the token of its CSRF
// cookie.
func (c *Console) checkForm(r *http.Request) error {
	if err := sameOrigin(r); err != nil {
		return err
	}
	ck, err := r.Cookie(csrfCookie)
	if err != nil || ck.Value == "" {
		return errors.New("no CSRF cookie: open the page again and resend the form")
	}
	if err := r.ParseForm(); err != nil {
		return fmt.Errorf("form: %v", err)
	}
	got := r.PostForm.Get(csrfField)
	if got == "" || !hmac.Equal([]byte(got), []byte(c.csrfFor(ck.Value))) {
		return errors.New("missing or wrong CSRF token: open the page again and resend the form")
	}
	return nil
}

// sameOrigin refuses a request whose Origin names another origin than the one it was sent
// to. Without an Origin it reads the Referer instead. It also refuses a request that a
// browser marks in Sec-Fetch-Site as cross-site or same-site.
func sameOrigin(r *http.Request) error {
	if s := r.Header.Get("Sec-Fetch-Site"); s == "cross-site" || s == "same-site" {
		return fmt.Errorf("cross-origin request (Sec-Fetch-Site: %s)", s)
	}
	o := r.Header.Get("Origin")
	if o == "" {
		o = r.Header.Get("Referer")
		if o == "" {
			return nil // not a browser's form, since browsers send Origin with every POST
		}
	}
	u, err := url.Parse(o)
	if err != nil || u.Host == "" || !strings.EqualFold(u.Host, r.Host) || (u.Scheme != "http" && u.Scheme != "https") {
		return fmt.Errorf("cross-origin request from %q to %q", o, r.Host)
	}
	return nil
}

// ---------------------------------------------------------------- login

func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	if c.cfg.Token == "" {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	c.render(w, r, http.StatusOK, "login", "Log in", nobody, loginData{Next: localPath(r.URL.Query().Get("next"))})
}

type loginData struct {
	Next  string
	Error string
}

func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	if c.cfg.Token == "" {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	if err := c.checkForm(r); err != nil {
		http.Error(w, "forbidden: "+err.Error(), http.StatusForbidden)
		return
	}
	next := localPath(r.PostForm.Get("next"))
	if subtle.ConstantTimeCompare([]byte(r.PostForm.Get("token")), []byte(c.cfg.Token)) != 1 {
		c.cfg.Logger.Info("console login refused", watermill.LogFields{"remote": r.RemoteAddr})
		time.Sleep(500 * time.Millisecond) // a guess per half second and connection at most
		c.render(w, r, http.StatusUnauthorized, "login", "Log in", nobody, loginData{Next: next, Error: "That is not the admin token."})
		return
	}
	exp := time.Now().Add(sessionTTL)
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: c.sessionValue(exp), Path: "/", Expires: exp, MaxAge: int(sessionTTL.Seconds()),
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	c.cfg.Logger.Info("console login", watermill.LogFields{"remote": r.RemoteAddr})
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	if err := c.checkForm(r); err != nil {
		http.Error(w, "forbidden: "+err.Error(), http.StatusForbidden)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

// localPath returns p when it is a plain path of this server, else "/". So a login never
// sends the browser elsewhere. Browsers drop tabs and newlines from a Location and read a
// backslash as a slash. So "/\t/evil" and "/\\evil" are "//evil" to them, which names
// another host. p must be valid UTF-8 without control characters or backslashes, and start
// with one "/". url.Parse must find no scheme, host or user in it, and a path that is just
// as plain once decoded.
func localPath(p string) string {
	plain := func(s string) bool {
		return strings.HasPrefix(s, "/") && !strings.HasPrefix(s, "//") && utf8.ValidString(s) &&
			!strings.ContainsFunc(s, func(r rune) bool { return r == '\\' || unicode.IsControl(r) })
	}
	if !plain(p) {
		return "/"
	}
	u, err := url.Parse(p)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" || !plain(u.Path) {
		return "/"
	}
	return p
}
