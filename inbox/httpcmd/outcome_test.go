package httpcmd_test

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/inbox/httpcmd"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// untilAnswered is the documented client. It sends the claim again with the same key and
// body while the answer is 409, 503 or 504, as each of them says.
func untilAnswered(t *testing.T, c *http.Client, url, key, body string) answer {
	t.Helper()
	for range 120 {
		a := claim(t, c, url, key, body)
		switch a.status {
		case http.StatusConflict, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
			time.Sleep(500 * time.Millisecond)
		default:
			return a
		}
	}
	t.Fatalf("claim %s: no answer but 409, 503 or 504 in 120 tries", key)
	return answer{}
}

// settled waits until no transaction is open in database d. The timed-out request's
// transaction has then committed or rolled back.
func settled(t *testing.T, d testenv.Database) {
	t.Helper()
	for range 600 {
		if testenv.OpenTransactions(t, d.Name) == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal("a transaction is still open a minute after the lock was released")
}

// unknownAnswer checks a 504. It has Retry-After, and the text that says the outcome is
// unknown and only the same key may be retried.
func unknownAnswer(t *testing.T, a answer) {
	t.Helper()
	if a.status != http.StatusGatewayTimeout || a.retry == "" || !strings.Contains(a.body, "outcome of the command is unknown") ||
		!strings.Contains(a.body, "same Idempotency-Key") || !strings.Contains(a.body, "never with a new key") || strings.Contains(a.body, "nothing of it") {
		t.Fatalf("answer %d %s (Retry-After %q), want 504 saying the outcome is unknown", a.status, a.body, a.retry)
	}
}

// TestClaimTimesOutBehindALock checks a claim whose request times out, at
// http.request_timeout, while another session holds the campaign's stock rows.
//
// With group commit the claim is in a batch, whose transaction is not the request's to
// cancel. It commits once the lock is gone, so the answer must not say that nothing was
// committed. It says the outcome is unknown, with 504. The client that retries with the
// same key, as told, gets the one coupon. The timed-out claim did commit. A client that
// took the answer for "nothing committed" and sent a new key would hold two coupons, as
// the end of the test shows.
//
// With a transaction per request, the request's transaction dies with it. The answer is
// 503, nothing is committed, and the retry grants the coupon.
func TestClaimTimesOutBehindALock(t *testing.T) {
	for _, batch := range []bool{true, false} {
		t.Run(mode(batch), func(t *testing.T) { testClaimBehindLock(t, batch) })
	}
}

func testClaimBehindLock(t *testing.T, batch bool) {
	srv, d := claimServer(t, batch, httpcmd.Config{RequestTimeout: time.Second})
	ctx := context.Background()
	c := srv.Client()
	user, key := "u-locked", "locked-1"
	lock, err := d.Admin.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var shards int
	if err := lock.QueryRowContext(ctx, testenv.Rebind("SELECT COUNT(*) FROM (SELECT shard FROM coupon_stock WHERE campaign_id = ? FOR UPDATE) s"),
		coupon.DefaultConfig().CampaignID).Scan(&shards); err != nil || shards == 0 {
		t.Fatalf("lock the stock rows: %d %v", shards, err)
	}
	first := claim(t, c, srv.URL, key, claimBody(user))
	if err := lock.Rollback(); err != nil {
		t.Fatal(err)
	}
	settled(t, d)
	done := count(t, d.DB, "SELECT COUNT(*) FROM inbox WHERE biz_type = ? AND dedup_key = ? AND status = 'done'", coupon.ClaimBizType, key)
	granted := coupons(t, d.DB, user)
	t.Logf("first answer %d %s; then %d done rows, %d coupons", first.status, first.body, done, granted)
	if first.status == http.StatusServiceUnavailable && (done != 0 || granted != 0) {
		t.Fatalf("the answer said nothing was committed (503 %s), yet the claim committed after it: %d done rows, %d coupons", first.body, done, granted)
	}
	if batch {
		unknownAnswer(t, first)
		if done != 1 || granted != 1 {
			t.Fatalf("the batch's claim after the lock: %d done rows, %d coupons, want 1 and 1", done, granted)
		}
	} else if first.status != http.StatusServiceUnavailable || first.retry == "" || !strings.Contains(first.body, "nothing of it was committed") {
		t.Fatalf("a transaction per request: answer %d %s, want 503 saying nothing was committed", first.status, first.body)
	}

	again := untilAnswered(t, c, srv.URL, key, claimBody(user))
	if again.status != http.StatusCreated || again.replayed != batch {
		t.Fatalf("retry with the same key: %d %s replayed=%v, want 201 (replayed: %v)", again.status, again.body, again.replayed, batch)
	}
	if n, e := coupons(t, d.DB, user), events(t, d.DB, user); n != 1 || e != 1 {
		t.Fatalf("after the retry with the same key: %d coupons, %d events, want 1 and 1", n, e)
	}
	if batch {
		// This client believed "nothing committed" and sent the claim under a new key.
		if a := claim(t, c, srv.URL, "locked-1-new", claimBody(user)); a.status != http.StatusCreated {
			t.Fatalf("new key: %d %s", a.status, a.body)
		}
		if n := coupons(t, d.DB, user); n != 2 {
			t.Fatalf("coupons after a retry under a new key: %d, want 2 (the duplicate a 'nothing committed' answer would cause)", n)
		}
	}
}

// commitCutter is a TCP proxy to MariaDB. Once armed, it passes a COMMIT on to the server
// and then cuts the connection instead of passing the server's answer back. So the commit
// happens, and the client cannot know it.
type commitCutter struct {
	ln    net.Listener
	to    string
	armed atomic.Bool
	cut   atomic.Int32 // commits cut so far
	wg    sync.WaitGroup
}

func startCommitCutter(t *testing.T, to string) *commitCutter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &commitCutter{ln: ln, to: to}
	p.wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Go(func() { p.serve(conn) })
		}
	})
	t.Cleanup(func() { ln.Close(); p.wg.Wait() })
	return p
}

func (p *commitCutter) serve(client net.Conn) {
	server, err := net.Dial("tcp", p.to)
	if err != nil {
		client.Close()
		return
	}
	var cutting atomic.Bool
	stop := func() { client.Close(); server.Close() }
	go func() {
		defer stop()
		buf := make([]byte, 64<<10)
		for {
			n, err := server.Read(buf)
			if n > 0 && cutting.Load() {
				p.cut.Add(1) // the COMMIT's answer: dropped, and the connection with it
				return
			}
			if n > 0 {
				if _, werr := client.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	defer stop()
	if testenv.Dialect().IsPostgres() {
		p.servePostgres(client, server, &cutting)
		return
	}
	head := make([]byte, 4)
	for {
		if _, err := io.ReadFull(client, head); err != nil {
			return
		}
		body := make([]byte, int(head[0])|int(head[1])<<8|int(head[2])<<16)
		if _, err := io.ReadFull(client, body); err != nil {
			return
		}
		if len(body) > 0 && body[0] == 0x03 && strings.EqualFold(string(body[1:]), "COMMIT") && p.armed.CompareAndSwap(true, false) {
			cutting.Store(true)
		}
		if _, err := server.Write(append(head, body...)); err != nil {
			return
		}
	}
}

// TestClaimCommitWithoutAnswer checks a commit that gets no answer, because the connection
// to MariaDB breaks while COMMIT runs. The outcome is unknown, so the request must not
// answer that nothing was committed. Here the commit did happen. The request's retries of
// the database wait past its timeout, so it answers 504. The client that retries with the
// same key gets the claim's 201, one coupon and one event. A new key would have granted a
// second.
func TestClaimCommitWithoutAnswer(t *testing.T) {
	d := testenv.DB(t, 8, migrations.Set{Name: coupon.PluginName, FS: coupon.Migrations})
	ctx := context.Background()
	if err := coupon.EnsureCampaign(ctx, d.DB, coupon.DefaultConfig()); err != nil {
		t.Fatal(err)
	}
	addr, viaProxy := dsnAddr(t, d.DSN)
	proxy := startCommitCutter(t, addr)
	db, err := dbx.Open(ctx, testenv.Config(viaProxy(proxy.ln.Addr().String()), 8))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	// The inbox waits a minute before it tries an unreachable database again. That is
	// longer than the request's timeout, so the request ends with the commit's outcome open.
	srv := serveClaimsOn(t, db, engine.Config{MaxAttempts: 2, BackoffInitial: time.Millisecond, BackoffMax: time.Minute}, nil, false,
		httpcmd.Config{RequestTimeout: 2 * time.Second})
	c := srv.Client()
	user, key := "u-cut", "cut-1"

	proxy.armed.Store(true)
	first := claim(t, c, srv.URL, key, claimBody(user))
	if proxy.cut.Load() != 1 {
		t.Fatalf("commits cut: %d, want 1 (answer %d %s)", proxy.cut.Load(), first.status, first.body)
	}
	done := count(t, d.DB, "SELECT COUNT(*) FROM inbox WHERE biz_type = ? AND dedup_key = ? AND status = 'done'", coupon.ClaimBizType, key)
	granted := coupons(t, d.DB, user)
	if done != 1 || granted != 1 {
		t.Fatalf("the cut commit: %d done rows, %d coupons, want 1 and 1 (it reached the server)", done, granted)
	}
	if first.status == http.StatusServiceUnavailable {
		t.Fatalf("the answer said nothing was committed (503 %s), yet the claim is committed", first.body)
	}
	unknownAnswer(t, first)

	again := untilAnswered(t, c, srv.URL, key, claimBody(user))
	if again.status != http.StatusCreated || !again.replayed {
		t.Fatalf("retry with the same key: %d %s replayed=%v, want 201 replayed", again.status, again.body, again.replayed)
	}
	if n, e := coupons(t, d.DB, user), events(t, d.DB, user); n != 1 || e != 1 {
		t.Fatalf("after the retry with the same key: %d coupons, %d events, want 1 and 1", n, e)
	}
}

// servePostgres forwards the client's messages of PostgreSQL's protocol. First come the
// untyped startup ones, an SSL or GSS request answered with one byte, then the startup
// message. Then come typed messages. A simple query "commit" arms the cut of its answer.
func (p *commitCutter) servePostgres(client, server net.Conn, cutting *atomic.Bool) {
	const sslRequest, gssRequest = 80877103, 80877104
	for {
		head := make([]byte, 4)
		if _, err := io.ReadFull(client, head); err != nil {
			return
		}
		body := make([]byte, int(binary.BigEndian.Uint32(head))-4)
		if _, err := io.ReadFull(client, body); err != nil {
			return
		}
		if _, err := server.Write(append(head, body...)); err != nil {
			return
		}
		if len(body) < 4 {
			return
		}
		if code := binary.BigEndian.Uint32(body); code != sslRequest && code != gssRequest {
			break // the startup message
		}
	}
	for {
		head := make([]byte, 5)
		if _, err := io.ReadFull(client, head); err != nil {
			return
		}
		body := make([]byte, int(binary.BigEndian.Uint32(head[1:]))-4)
		if _, err := io.ReadFull(client, body); err != nil {
			return
		}
		if head[0] == 'Q' && strings.EqualFold(strings.TrimRight(string(body), "\x00"), "COMMIT") && p.armed.CompareAndSwap(true, false) {
			cutting.Store(true)
		}
		if _, err := server.Write(append(head, body...)); err != nil {
			return
		}
	}
}

// dsnAddr returns the server address of dsn and a function giving dsn with another address.
func dsnAddr(t *testing.T, dsn string) (string, func(addr string) string) {
	t.Helper()
	if testenv.Dialect().IsPostgres() {
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		return u.Host, func(addr string) string { v := *u; v.Host = addr; return v.String() }
	}
	mc, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return mc.Addr, func(addr string) string { c := mc.Clone(); c.Addr = addr; return c.FormatDSN() }
}
