package onceflow

import (
	"context"
	"crypto/subtle"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/internal/console"
	"github.com/onceflow/onceflow/internal/health"
	"github.com/onceflow/onceflow/internal/loopback"
)

// readiness paces the background checks of /readyz. Each check runs every Interval, with at
// most one call at a time. Timeout bounds each call.
var readiness = health.Config{Interval: 5 * time.Second, Timeout: 3 * time.Second}

// admin serves /healthz, /readyz, /metrics and the operator console on a dedicated mux. The
// console, package internal/console, serves every other path. admin serves nothing when
// admin.listen is empty. /readyz answers from the latest results of health.Checker's
// background checks of the database and Kafka. It never runs a check of its own. So a
// request costs no connection, and it cannot hang on a broker that accepts connections and
// never answers. Without admin.token the listener is a loopback one. tokenless then makes
// every path, /healthz included, answer only requests addressed to a loopback name.
// Stopping the part stops the server, the checks and the console's replays.
func (p *pipeline) admin() part {
	a := p.s
	if a.Config.Admin.Listen == "" {
		return part{name: "admin"}
	}
	var (
		ready *health.Checker
		con   *console.Console
		srv   *http.Server
		ln    net.Listener
	)
	return part{name: "admin",
		start: func(ctx context.Context) error {
			var err error
			ready, err = health.New(readiness, a.logger,
				health.Check{Name: "database", Func: p.db.PingContext},
				health.Check{Name: "kafka", Func: p.kc.Probe})
			if err != nil {
				return err
			}
			p.m.AddReadiness(func() []health.Status { sts, _ := ready.Statuses(); return sts })
			token, err := a.Config.Admin.token()
			if err != nil {
				return BadInput(err)
			}
			mux := http.NewServeMux()
			mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
			mux.Handle("/readyz", requireToken(token, ready))
			mux.Handle("/metrics", requireToken(token, p.m.Handler()))
			if a.Config.Admin.Pprof {
				mux.Handle("/debug/pprof/", requireToken(token, http.HandlerFunc(pprof.Index)))
				mux.Handle("/debug/pprof/profile", requireToken(token, http.HandlerFunc(pprof.Profile)))
				mux.Handle("/debug/pprof/trace", requireToken(token, http.HandlerFunc(pprof.Trace)))
			}
			con, err = a.newConsole(ctx, p.db, p.m, token)
			if err != nil {
				return err
			}
			mux.Handle("/", con)
			ln, err = net.Listen("tcp", a.Config.Admin.Listen)
			if err != nil {
				con.Close()
				return BadInput(fmt.Errorf("admin.listen %s: %w (set admin.listen to a free port, or empty to disable)", a.Config.Admin.Listen, err))
			}
			srv = newAdminServer(tokenless(token, mux, nil))
			a.logger.Info("admin listener", watermill.LogFields{"addr": ln.Addr().String()})
			return nil
		},
		run: func(ctx context.Context) error {
			checks, stopChecks := context.WithCancel(ctx)
			checksDone := make(chan struct{})
			go func() { defer close(checksDone); ready.Run(checks) }()
			defer func() { stopChecks(); <-checksDone }()
			return serve(ctx, srv, ln, 5*time.Second)
		},
		stop: func() {
			_ = ln.Close() // serve closed it already, unless it never ran
			con.Close()
		},
	}
}

// serve serves srv on ln until ctx ends, then shuts it down. Running requests have grace to
// finish. When Serve fails before ctx ends, serve returns Serve's error.
func serve(ctx context.Context, srv *http.Server, ln net.Listener, grace time.Duration) error {
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	_ = srv.Shutdown(sctx)
	<-served
	return nil
}

// The admin server's timeouts bound how long a slow client holds a goroutine and a socket.
// Such a client sends its request slowly, reads its answer slowly or keeps an idle
// connection open. /metrics is the longest answer, at a few hundred KB.
const (
	adminReadHeaderTimeout = 5 * time.Second
	adminReadTimeout       = 10 * time.Second
	adminWriteTimeout      = 30 * time.Second
	adminIdleTimeout       = 60 * time.Second
)

func newAdminServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: adminReadHeaderTimeout, ReadTimeout: adminReadTimeout,
		WriteTimeout: adminWriteTimeout, IdleTimeout: adminIdleTimeout, MaxHeaderBytes: 64 << 10}
}

// requireToken serves h only to requests that carry "Authorization: Bearer <token>". With
// an empty token it serves every request. AdminConfig.validate allows an empty token only
// on a loopback listener.
func requireToken(token string, h http.Handler) http.Handler {
	return withBearer(token, h, func(w http.ResponseWriter) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="onceflow admin"`)
		http.Error(w, "unauthorized: send Authorization: Bearer <admin.token>", http.StatusUnauthorized)
	})
}

// withBearer serves h to requests that carry "Authorization: Bearer <token>", compared in
// constant time. It answers the others with deny. An empty token serves every request.
func withBearer(token string, h http.Handler, deny func(http.ResponseWriter)) http.Handler {
	if token == "" {
		return h
	}
	want := []byte("Bearer " + token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			deny(w)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// tokenless guards a listener without a token, which listener.validate binds to loopback.
// It serves h only to requests addressed to a loopback name. So a page whose DNS name is
// re-pointed to 127.0.0.1 cannot use a browser on this machine to reach the listener.
// refuse answers the other requests. A nil refuse answers 421 with a fixed text. With a
// token, the bearer check guards the listener instead.
func tokenless(token string, h http.Handler, refuse func(http.ResponseWriter)) http.Handler {
	if token != "" {
		return h
	}
	return loopback.Only(h, refuse)
}

// isLoopback reports whether listen, a host:port, accepts connections from this machine
// only. That holds for a loopback IP and for "localhost". An empty host, 0.0.0.0 and ::
// listen on every interface.
func isLoopback(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	return err == nil && loopback.Name(host)
}

// token returns the admin bearer token. It is admin.token, or the first line of
// admin.token_file.
func (c AdminConfig) token() (string, error) {
	return listener{"admin", c.Listen, c.Token, c.TokenFile}.token()
}

// validate checks the admin section. A listener beyond loopback needs a token.
func (c AdminConfig) validate() error {
	return listener{"admin", c.Listen, c.Token, c.TokenFile}.validate("127.0.0.1:9464", "/metrics and /readyz ask")
}

// minAdminToken is the shortest listener token accepted, because a guessable token protects
// nothing.
const minAdminToken = 16

// listener is the part of a listener's section, admin or http, that its access rules need.
type listener struct {
	section, listen, tok, tokenFile string
}

// token returns <section>.token, or the first line of <section>.token_file.
func (l listener) token() (string, error) {
	if l.tokenFile == "" {
		return l.tok, nil
	}
	b, err := os.ReadFile(l.tokenFile)
	if err != nil {
		return "", fmt.Errorf("%s.token_file: %w", l.section, err)
	}
	t, _, _ := strings.Cut(string(b), "\n")
	return strings.TrimSpace(t), nil
}

// validate checks a listener's section. The address must be a host:port. The token may have
// one source at most. A token must have at least minAdminToken printable characters. An
// address reachable beyond this machine needs a token. example is a loopback address for
// the message. asks says what the token protects.
func (l listener) validate(example, asks string) error {
	if l.tok != "" && l.tokenFile != "" {
		return fmt.Errorf("%[1]s.token and %[1]s.token_file: set one, not both", l.section)
	}
	if l.listen == "" {
		return nil
	}
	if _, _, err := net.SplitHostPort(l.listen); err != nil {
		return fmt.Errorf("%s.listen %q: want host:port (e.g. %s): %v", l.section, l.listen, example, err)
	}
	tok, err := l.token()
	if err != nil {
		return err
	}
	switch {
	case tok != "" && (len(tok) < minAdminToken || strings.ContainsFunc(tok, func(r rune) bool { return r <= ' ' || r == 0x7f })):
		return fmt.Errorf("%s.token: want at least %d printable characters without spaces (got %d)", l.section, minAdminToken, len(tok))
	case tok == "" && !isLoopback(l.listen):
		return fmt.Errorf("%[1]s.listen %[2]q is reachable beyond this machine: set %[1]s.token (or %[1]s.token_file, or ONCEFLOW_%[3]s_TOKEN) so %[4]s for it, or listen on 127.0.0.1",
			l.section, l.listen, strings.ToUpper(l.section), asks)
	}
	return nil
}
