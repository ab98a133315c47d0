package httpcmd_test

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/inbox/httpcmd"
)

// countingRunner counts the requests that reached it. The tests below must stop them
// before.
type countingRunner struct{ n atomic.Int32 }

func (r *countingRunner) RunCommand(context.Context, engine.CommandRequest) (engine.CommandResult, error) {
	r.n.Add(1)
	return engine.CommandResult{Outcome: engine.OutcomeProcessed, Reply: engine.Reply{Status: 204}}, nil
}

func (r *countingRunner) BizType() string { return "test-command" }

// leaks are what an error answer must never hold, such as an address, or Go's or the
// network's words.
var leaks = []string{"127.0.0.1", "tcp", "i/o timeout", "read tcp", "connection", "EOF", "chunk", "goroutine", "panic", "json:", "Go struct", "ClaimRequest"}

// errorText is the "error" of a JSON error answer. It fails on any leak in the whole body.
func errorText(t *testing.T, body []byte) string {
	t.Helper()
	for _, l := range leaks {
		if strings.Contains(string(body), l) {
			t.Errorf("error answer %s holds %q", body, l)
		}
	}
	var e struct{ Error string }
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("error answer %q: %v", body, err)
	}
	return e.Error
}

// TestBodyErrorsAreFixedTexts checks a client whose body does not arrive, because it is
// slow, stalled, cut off or malformed. Over a real listener with a short read timeout, the
// client gets a fixed text, and nothing runs. It never gets the read's error, which names
// both ends' addresses.
func TestBodyErrorsAreFixedTexts(t *testing.T) {
	runner := &countingRunner{}
	h, err := httpcmd.New([]httpcmd.Route{{Method: http.MethodPost, Path: "/v1/things", Runner: runner}}, httpcmd.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ReadTimeout = 500 * time.Millisecond
	srv.Start()
	t.Cleanup(srv.Close)
	head := "POST /v1/things HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nIdempotency-Key: slow-1\r\n"
	for _, tc := range []struct {
		name   string
		send   func(c *net.TCPConn)
		status int
		want   string
	}{
		{"stalls after part of the body", func(c *net.TCPConn) {
			fmt.Fprint(c, head+"Content-Length: 100\r\n\r\n{\"userId\"")
		}, http.StatusRequestTimeout, "the request body did not arrive in time: nothing was run"},
		{"dribbles past the read timeout", func(c *net.TCPConn) {
			fmt.Fprint(c, head+"Content-Length: 100\r\n\r\n")
			for range 100 {
				if _, err := c.Write([]byte(" ")); err != nil {
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
		}, http.StatusRequestTimeout, "the request body did not arrive in time: nothing was run"},
		{"closes before the declared length", func(c *net.TCPConn) {
			fmt.Fprint(c, head+"Content-Length: 100\r\n\r\n{\"userId\"")
			c.CloseWrite()
		}, http.StatusBadRequest, "the request body ended before its declared length: nothing was run"},
		{"malformed chunked body", func(c *net.TCPConn) {
			fmt.Fprint(c, head+"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n")
		}, http.StatusBadRequest, "the request body could not be read: nothing was run"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			c := conn.(*net.TCPConn)
			go tc.send(c)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if got := errorText(t, body); resp.StatusCode != tc.status || got != tc.want {
				t.Fatalf("answer %d %s, want %d %q", resp.StatusCode, body, tc.status, tc.want)
			}
		})
	}
	if n := runner.n.Load(); n != 0 {
		t.Fatalf("%d requests ran", n)
	}
}

// panicky is a command handler whose Decode panics.
type panicky struct{}

func (panicky) Decode(*message.Message) (inbox.Decoded, error) {
	panic("index out of range [3] with length 3")
}
func (panicky) Handle(context.Context, *sql.Tx, *inbox.Delivery) (inbox.Progress, error) {
	return inbox.Done, nil
}

// TestCommandErrorsAreFixedTexts checks the answers of the routes and of the commands'
// own refusals. A plugin's Decode that panics answers a fixed text, not its panic value
// and stack. The coupon claim's body errors are its fixed texts, not the JSON decoder's.
// An unknown path or method is not echoed.
func TestCommandErrorsAreFixedTexts(t *testing.T) {
	srv, d := claimServer(t, true, httpcmd.Config{})
	ib, err := engine.NewCommand(d.DB, panicky{}, engine.Config{BizType: "panicky"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	h, err := httpcmd.New([]httpcmd.Route{{Method: http.MethodPost, Path: "/v1/panics", Runner: ib}}, httpcmd.Config{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	psrv := httptest.NewServer(h)
	t.Cleanup(psrv.Close)
	for _, tc := range []struct {
		name, url, method, body string
		status                  int
		want                    string
	}{
		{"Decode panics", psrv.URL + "/v1/panics", http.MethodPost, `{}`, 400, "the request body could not be decoded"},
		{"claim body of wrong types", srv.URL + coupon.ClaimPath, http.MethodPost, `{"userId": 5, "campaignId": []}`, 400,
			`body: not a JSON object {"userId": "...", "campaignId": "..."} of strings`},
		{"claim body cut short", srv.URL + coupon.ClaimPath, http.MethodPost, `{"userId": "u`, 400,
			`body: not a JSON object {"userId": "...", "campaignId": "..."} of strings`},
		{"claim of another campaign", srv.URL + coupon.ClaimPath, http.MethodPost, `{"userId": "u", "campaignId": "<script>"}`, 400,
			`campaignId: unknown campaign (this router grants "double11-5yuan")`},
		{"unknown path", srv.URL + "/v1/%3Cscript%3E", http.MethodPost, `{}`, 404, "no command at this path"},
		{"unknown method", srv.URL + coupon.ClaimPath, "PURGE", `{}`, 405, "method not allowed here: see the Allow header"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, tc.url, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set(httpcmd.HeaderKey, "fixed-1")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if got := errorText(t, body); resp.StatusCode != tc.status || got != tc.want || strings.Contains(string(body), "script") {
				t.Fatalf("answer %d %s, want %d %q", resp.StatusCode, body, tc.status, tc.want)
			}
		})
	}
	if n := count(t, d.DB, "SELECT COUNT(*) FROM inbox"); n != 0 {
		t.Fatalf("inbox rows: %d, want 0 (refused requests write nothing)", n)
	}
}
