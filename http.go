package onceflow

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/httpcmd"
	"github.com/onceflow/onceflow/internal/loopback"
)

// commandKeyField names a command's business key (its client token) in log lines.
const commandKeyField = "idempotency_key"

// commandPlugins returns the plugins' HTTP commands as plugins of their own biz type. Each
// gives the handler that a command's rows run through. `router run`, `router replay` and
// `router inbox retry` use them alike.
func commandPlugins(ps []Plugin) []Plugin {
	var out []Plugin
	for _, p := range ps {
		for _, c := range p.Commands {
			cp := p
			cp.Plugin = inbox.Plugin{Name: p.Name, Topics: p.Topics, ConsumerGroup: p.ConsumerGroup, BizType: c.BizType,
				KeyLogField: commandKeyField, Build: c.Build, Tables: p.Tables}
			cp.command = &c
			out = append(out, cp)
		}
	}
	return out
}

// http serves the plugins' commands on http.listen. It serves nothing when http.listen is
// empty. Without http.token, it answers only requests addressed to a loopback name, as
// tokenless does. Each command has its own inbox. It also has its own group commit when
// inbox.batch_size is above 1. Stopping the part lets running requests finish first. It
// then closes the group commits and the handlers.
func (p *pipeline) http() part {
	a := p.s
	cmds := commandPlugins(p.plugins)
	if a.Config.HTTP.Listen == "" {
		return part{name: "http",
			start: func(context.Context) error {
				if p.m != nil {
					p.m.SetHTTPEnabled(false)
				}
				if len(cmds) > 0 {
					a.logger.Info("HTTP commands off (http.listen is empty)", watermill.LogFields{"commands": len(cmds)})
				}
				return nil
			}}
	}
	var (
		closers  []func()
		srv      *http.Server
		ln       net.Listener
		answerBy = a.Config.HTTP.RequestTimeout + a.Config.HTTP.OutcomeWait + 5*time.Second // a request's longest run, plus a margin
	)
	closeAll := func() {
		for _, c := range closers {
			c()
		}
	}
	return part{name: "http",
		start: func(ctx context.Context) error {
			if len(cmds) == 0 {
				return BadInput(fmt.Errorf("http.listen %s is set, but no plugin declares an HTTP command", a.Config.HTTP.Listen))
			}
			token, err := a.Config.HTTP.token()
			if err != nil {
				return BadInput(err)
			}
			var routes []httpcmd.Route
			for _, pl := range cmds {
				ib, closeHandler, err := a.buildInbox(ctx, p.db, pl, p.observer())
				if err != nil {
					closeAll()
					return err
				}
				closers = append(closers, closeHandler)
				var runner httpcmd.Runner = ib
				if bc := a.Config.Inbox.Batch; bc.MaxSize > 1 {
					// Group commit works as for the plugin's Kafka deliveries. Requests
					// that arrive together share a transaction.
					b, err := ib.NewBatcher(bc)
					if err != nil {
						closeAll()
						return BadInput(fmt.Errorf("plugin %s: group commit: %w", pl.Name, err))
					}
					runner = b
					closers = append([]func(){func() { _ = b.Close() }}, closers...) // before its handler
				}
				routes = append(routes, httpcmd.Route{Method: pl.command.Method, Path: pl.command.Path, Runner: runner})
				a.logger.Info("HTTP command", watermill.LogFields{"plugin": pl.Name, "method": pl.command.Method, "path": pl.command.Path, "biz_type": pl.BizType})
			}
			hc := a.Config.HTTP.Config
			hc.Observe = p.m.ObserveHTTP
			h, err := httpcmd.New(routes, hc, a.logger)
			if err != nil {
				closeAll()
				return BadInput(err)
			}
			ln, err = net.Listen("tcp", a.Config.HTTP.Listen)
			if err != nil {
				closeAll()
				return BadInput(fmt.Errorf("http.listen %s: %w (set http.listen to a free port, or empty to disable)", a.Config.HTTP.Listen, err))
			}
			srv = &http.Server{Handler: tokenless(token, requireBearer(token, h), misdirected), ReadHeaderTimeout: adminReadHeaderTimeout, ReadTimeout: adminReadTimeout,
				WriteTimeout: answerBy, IdleTimeout: adminIdleTimeout, MaxHeaderBytes: 64 << 10,
				BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) }}
			a.logger.Info("HTTP listener", watermill.LogFields{"addr": ln.Addr().String(), "idempotency_ttl": a.Config.HTTP.IdempotencyTTL})
			if p.m != nil {
				p.m.SetHTTPEnabled(true)
			}
			return nil
		},
		run: func(ctx context.Context) error { return serve(ctx, srv, ln, answerBy) }, // running requests finish, and none starts
		stop: func() {
			_ = ln.Close() // serve closed it already, unless it never ran
			closeAll()
		},
	}
}

// requireBearer serves h only to requests that carry "Authorization: Bearer <token>", where
// token is http.token. It answers the others 401 with a JSON error. An empty token serves
// every request.
func requireBearer(token string, h http.Handler) http.Handler {
	return withBearer(token, h, func(w http.ResponseWriter) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="onceflow commands"`)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprintln(w, `{"error":"unauthorized: send Authorization: Bearer <http.token>"}`)
	})
}

// misdirected answers a command on a listener without http.token when the command is
// addressed to a name other than a loopback one. tokenless calls it. The answer is 421 with
// a fixed JSON error.
func misdirected(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(loopback.Refused)
	fmt.Fprintln(w, `{"error":"`+loopback.Message+`"}`)
}

// token returns the commands' bearer token. It is http.token, or the first line of
// http.token_file.
func (c HTTPConfig) token() (string, error) {
	return listener{"http", c.Listen, c.Token, c.TokenFile}.token()
}

// validate checks the http section by the admin listener's rules. A listener beyond
// loopback needs a token.
func (c HTTPConfig) validate() error {
	return listener{"http", c.Listen, c.Token, c.TokenFile}.validate("127.0.0.1:8080", "the commands ask")
}
