// Package httpcmd serves plugins' HTTP commands, declared as inbox.Command. A request
// carries a client token in the Idempotency-Key header. It runs through the inbox, so the
// token is claimed in the transaction of the command's effect.
//
// A retry with the same token gets the first request's status and body back. A retry
// while the first request is still running gets 409 with Retry-After. The same token with
// another body gets 422. So does a request whose values the database refuses, with
// engine.ReasonData. Nothing is ever run twice.
//
// A request that could not finish answers 503 only when nothing of it committed. It
// answers 504 when its outcome is unknown, because it may have committed, or may still.
// After either, the client retries with the same token until it gets another answer,
// never with a new token. Every error answer's text is fixed, so no Go, network or
// database error reaches a client.
package httpcmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/internal/settings"
)

// Runner runs a command's requests. It is the command's inbox, made by engine.NewCommand,
// which runs a transaction per request. Or it is that inbox's Batcher, where requests that
// arrive together share a transaction.
type Runner interface {
	RunCommand(ctx context.Context, req engine.CommandRequest) (engine.CommandResult, error)
	BizType() string
}

// Route is one command as served, with its method and path and what runs it.
type Route struct {
	Method string
	Path   string
	Runner Runner
}

// Config configures the handler. The tags declare the stock router's http.* settings of
// the handler, with their key, default, range and help. Package internal/settings reads
// them.
type Config struct {
	// MaxBodyBytes bounds a request body. A larger one is refused with 413.
	MaxBodyBytes int64 `key:"max_body_bytes" default:"65536" range:"1..16777216" help:"a larger request body is refused (413)"`
	// RetryAfter is the Retry-After of three answers. 409 says a request with the token is
	// running. 503 says nothing committed. 504 says the outcome is unknown. RetryAfter is
	// 1s by default.
	RetryAfter time.Duration
	// RequestTimeout bounds one request's run through the inbox.
	RequestTimeout time.Duration `key:"request_timeout" default:"10s" range:"100ms..10m" help:"bound of one command request; a slower one answers 503 when nothing of it committed, else waits up to http.outcome_wait for its transaction"`
	// OutcomeWait is how much longer a request whose RequestTimeout passed while its
	// transaction was running waits for that transaction's outcome, before answering 504.
	// Under group commit the batch's transaction is not the request's to cancel.
	OutcomeWait time.Duration `key:"outcome_wait" default:"5s" range:"1ms..10m" help:"how much longer a request past http.request_timeout waits for the transaction it is part of (group commit); then it answers 504: outcome unknown, retry with the same Idempotency-Key"`
	// Observe, when set, is called once per answered request, such as for metrics. path
	// and method are a route's, or "unmatched" and "-".
	Observe func(method, path string, status int, elapsed time.Duration)
}

// WithDefaults returns c with its zero settings set to their defaults, as New uses it. The
// stock router's http.* defaults are these values.
func (c Config) WithDefaults() Config {
	c.setDefaults()
	return c
}

func (c *Config) setDefaults() {
	settings.SetDefaults(c)
	if c.RetryAfter == 0 {
		c.RetryAfter = time.Second
	}
}

// Validate reports the first invalid setting. It only checks, so call WithDefaults first.
func (c Config) Validate() error {
	if err := settings.Check(c); err != nil {
		return fmt.Errorf("httpcmd: %w", err)
	}
	if c.RetryAfter < time.Second {
		return fmt.Errorf("httpcmd: retry after %s: at least 1s", c.RetryAfter)
	}
	return nil
}

// The header names httpcmd reads and writes.
const (
	HeaderKey      = "Idempotency-Key"
	HeaderReplayed = "Idempotent-Replayed" // "true" on a response returned again to a retry
)

// Handler serves the routes.
type Handler struct {
	cfg    Config
	routes map[string]map[string]Runner // path → method → inbox
	logger watermill.LoggerAdapter

	mu      sync.Mutex
	running map[string]struct{} // biz type + "\x00" + token of the requests running here
}

// New builds the handler of routes. A nil logger logs nothing.
func New(routes []Route, cfg Config, logger watermill.LoggerAdapter) (*Handler, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	h := &Handler{cfg: cfg, routes: map[string]map[string]Runner{}, logger: logger, running: map[string]struct{}{}}
	for _, r := range routes {
		if r.Runner == nil {
			return nil, fmt.Errorf("httpcmd: %s %s: no runner", r.Method, r.Path)
		}
		if h.routes[r.Path] == nil {
			h.routes[r.Path] = map[string]Runner{}
		}
		if _, dup := h.routes[r.Path][r.Method]; dup {
			return nil, fmt.Errorf("httpcmd: %s %s declared twice", r.Method, r.Path)
		}
		h.routes[r.Path][r.Method] = r.Runner
	}
	return h, nil
}

// The texts of the answers that end a request without its outcome. Each says whether
// anything committed, and what the client does next.
const (
	textNotCommitted = "the command could not be recorded and nothing of it was committed: retry with the same Idempotency-Key"
	textUnknown      = "the outcome of the command is unknown: it may have been committed, or may still be. Retry with the same Idempotency-Key and body until another answer comes; never with a new key, which could run the command twice"
	textFailed       = "the command failed and was not completed; it is kept for the operator (router inbox show). A retry with the same Idempotency-Key runs it again; a new key could run what it had done twice"
	textData         = "the database refused a value of this request (too long, out of range, not valid text, or against a constraint): the command was not completed and is kept for the operator (router inbox show). The same request is refused the same way every time: change it, and send the changed request under a new Idempotency-Key"
)

// errorBody is every error answer, {"error": "..."}.
type errorBody struct {
	Error   string `json:"error"`
	Reason  string `json:"reason,omitempty"`
	InboxID int64  `json:"inboxId,omitempty"`
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	status := h.serve(w, r)
	if h.cfg.Observe != nil {
		path, method := r.URL.Path, r.Method
		if methods, ok := h.routes[path]; !ok {
			path, method = "unmatched", "-" // no label per client-chosen path
		} else if _, ok := methods[method]; !ok {
			method = "-"
		}
		h.cfg.Observe(method, path, status, time.Since(start))
	}
}

func (h *Handler) serve(w http.ResponseWriter, r *http.Request) int {
	methods, ok := h.routes[r.URL.Path]
	if !ok {
		return writeJSON(w, http.StatusNotFound, errorBody{Error: "no command at this path"})
	}
	ib, ok := methods[r.Method]
	if !ok {
		for m := range methods {
			w.Header().Add("Allow", m)
		}
		return writeJSON(w, http.StatusMethodNotAllowed, errorBody{Error: "method not allowed here: see the Allow header"})
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			return writeJSON(w, http.StatusUnsupportedMediaType, errorBody{Error: "Content-Type must be application/json"})
		}
	}
	token := r.Header.Get(HeaderKey)
	if err := engine.CheckIdempotencyKey(token); err != nil {
		return writeJSON(w, http.StatusBadRequest, errorBody{Error: err.Error()})
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.MaxBodyBytes))
	if err != nil {
		return h.bodyError(w, r, err)
	}

	// A second request with a token whose first request is still running here is told to
	// come back. It must not wait on the first one's row lock, nor run beside it. Across
	// routers, the database's row lock makes the second wait for the first and then return
	// its response.
	slot := ib.BizType() + "\x00" + token
	h.mu.Lock()
	_, busy := h.running[slot]
	if !busy {
		h.running[slot] = struct{}{}
	}
	h.mu.Unlock()
	if busy {
		w.Header().Set("Retry-After", h.retryAfter())
		return writeJSON(w, http.StatusConflict, errorBody{Error: "a request with this Idempotency-Key is still running: retry later with the same key and body"})
	}
	defer func() {
		h.mu.Lock()
		delete(h.running, slot)
		h.mu.Unlock()
	}()

	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.RequestTimeout)
	defer cancel()
	res, err := ib.RunCommand(ctx, engine.CommandRequest{Token: token, Body: body,
		Source:      inbox.Source{Topic: "http " + r.Method + " " + r.URL.Path, Partition: -1, Offset: -1},
		Metadata:    map[string]string{"remote_addr": r.RemoteAddr},
		OutcomeWait: h.cfg.OutcomeWait})
	switch {
	case errors.Is(err, engine.ErrBadRequest):
		// The command's own reason, from CheckIdempotencyKey or the plugin's Decode error
		// text.
		return writeJSON(w, http.StatusBadRequest, errorBody{Error: strings.TrimPrefix(err.Error(), engine.ErrBadRequest.Error()+": ")})
	case errors.Is(err, engine.ErrOutcomeUnknown):
		h.logger.Error("HTTP command outcome unknown", err, watermill.LogFields{"path": r.URL.Path, "biz_type": ib.BizType()})
		w.Header().Set("Retry-After", h.retryAfter())
		return writeJSON(w, http.StatusGatewayTimeout, errorBody{Error: textUnknown})
	case err != nil:
		h.logger.Error("HTTP command not recorded", err, watermill.LogFields{"path": r.URL.Path, "biz_type": ib.BizType()})
		w.Header().Set("Retry-After", h.retryAfter())
		return writeJSON(w, http.StatusServiceUnavailable, errorBody{Error: textNotCommitted})
	}
	switch res.Outcome {
	case engine.OutcomeProcessed, engine.OutcomeDuplicate:
		if res.Outcome == engine.OutcomeDuplicate {
			w.Header().Set(HeaderReplayed, "true")
		}
		return writeRaw(w, res.Reply)
	case engine.OutcomeConflict:
		return writeJSON(w, http.StatusUnprocessableEntity, errorBody{Error: "this Idempotency-Key was already used with a different request: use a new key for a new request", InboxID: res.InboxID})
	}
	// The request was quarantined. Values the database refuses are the request's own. No
	// retry differs, so the client has to change them.
	if res.Reason == engine.ReasonData {
		return writeJSON(w, http.StatusUnprocessableEntity, errorBody{Error: textData, Reason: string(res.Reason), InboxID: res.InboxID})
	}
	return writeJSON(w, http.StatusInternalServerError, errorBody{Error: textFailed, Reason: string(res.Reason), InboxID: res.InboxID})
}

// bodyError answers a request whose body could not be read, with a fixed text. The read's
// error, with its addresses and Go's wording, goes to the log only.
func (h *Handler) bodyError(w http.ResponseWriter, r *http.Request, err error) int {
	var tooLarge *http.MaxBytesError
	var ne net.Error
	switch {
	case errors.As(err, &tooLarge):
		return writeJSON(w, http.StatusRequestEntityTooLarge, errorBody{Error: fmt.Sprintf("request body exceeds %d bytes", h.cfg.MaxBodyBytes)})
	case errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout():
		h.logger.Info("HTTP command: request body not received in time", watermill.LogFields{"path": r.URL.Path, "err": err.Error()})
		return writeJSON(w, http.StatusRequestTimeout, errorBody{Error: "the request body did not arrive in time: nothing was run"})
	case errors.Is(err, io.ErrUnexpectedEOF):
		return writeJSON(w, http.StatusBadRequest, errorBody{Error: "the request body ended before its declared length: nothing was run"})
	default: // a malformed chunked body, a connection reset
		h.logger.Info("HTTP command: request body unreadable", watermill.LogFields{"path": r.URL.Path, "err": err.Error()})
		return writeJSON(w, http.StatusBadRequest, errorBody{Error: "the request body could not be read: nothing was run"})
	}
}

func (h *Handler) retryAfter() string {
	return strconv.Itoa(int((h.cfg.RetryAfter + time.Second - 1) / time.Second))
}

func writeJSON(w http.ResponseWriter, status int, v any) int {
	b, _ := json.Marshal(v)
	return writeRaw(w, engine.Reply{Status: status, Body: b})
}

func writeRaw(w http.ResponseWriter, r engine.Reply) int {
	if len(r.Body) > 0 {
		w.Header().Set("Content-Type", "application/json")
	}
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(r.Status)
	if len(r.Body) > 0 && r.Status != http.StatusNoContent {
		_, _ = w.Write(r.Body)
		_, _ = w.Write([]byte("\n"))
	}
	return r.Status
}
