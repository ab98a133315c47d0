package coupon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/onceflow/onceflow/inbox"
)

// httpConfig is the downstream an httpService calls.
type httpConfig struct {
	// URL is the service's base URL. A step's call is a POST to URL/<step>.
	URL string
	// Timeout bounds each call, from connecting and sending to waiting for the answer and
	// reading it.
	Timeout time.Duration
	// MaxConns bounds the connections to the service. A call beyond it waits for a
	// connection within its Timeout.
	MaxConns int
}

// idempotencyKeyHeader carries a call's idempotency key, made of the order id and the step.
const idempotencyKeyHeader = "Idempotency-Key"

// httpBodyLimit is how much of an answer's body a call reads. The rest is not read, and
// its connection is not reused.
const httpBodyLimit = 64 << 10

// httpErrorText is how much of an error answer's body its error quotes.
const httpErrorText = 256

// httpService calls the steps' downstream over HTTP. Each call is a POST to <url>/<step>
// with the call's idempotency key in the Idempotency-Key header and no body. A 2xx answer
// is success. A 4xx answer is a permanent error that wraps inbox.ErrPermanent, except 408,
// 409, 425 and 429, which say to try again later. Any other answer, a connection error and
// a call past its timeout are errors the inbox retries. Its calls are never instant, so
// the plugin makes them in Prepare, outside any transaction.
type httpService struct {
	base    string
	timeout time.Duration
	client  *http.Client
}

// httpStatusError is the error of a call the downstream answered with a status other than
// 2xx.
type httpStatusError struct {
	Step, Key string
	Status    int
	Body      string // the answer's first bytes, as valid UTF-8
}

func (e *httpStatusError) Error() string {
	msg := fmt.Sprintf("coupon: downstream answered %d to %s (key %s)", e.Status, e.Step, e.Key)
	if e.Body != "" {
		msg += ": " + e.Body
	}
	return msg
}

// newHTTPService builds the service of cfg, with a client and connection pool of its own.
func newHTTPService(cfg httpConfig) (*httpService, error) {
	if err := checkDownstreamURL(cfg.URL); err != nil {
		return nil, err
	}
	if cfg.Timeout <= 0 {
		return nil, fmt.Errorf("coupon: downstream timeout %v must be positive", cfg.Timeout)
	}
	if cfg.MaxConns < 1 {
		return nil, fmt.Errorf("coupon: downstream max conns %d must be at least 1", cfg.MaxConns)
	}
	tr := &http.Transport{
		Proxy:                  http.ProxyFromEnvironment,
		DialContext:            (&net.Dialer{Timeout: cfg.Timeout, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:      true,
		MaxIdleConns:           cfg.MaxConns,
		MaxIdleConnsPerHost:    cfg.MaxConns,
		MaxConnsPerHost:        cfg.MaxConns,
		IdleConnTimeout:        90 * time.Second,
		MaxResponseHeaderBytes: 64 << 10,
	}
	// Call bounds each call with its context, so the client has no timeout of its own.
	client := &http.Client{
		Transport: tr,
		// A redirect is the answer, so a step's call is never sent somewhere else.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return &httpService{base: strings.TrimRight(cfg.URL, "/"), timeout: cfg.Timeout, client: client}, nil
}

// checkDownstreamURL accepts an absolute http or https URL with a host, without query or
// fragment.
func checkDownstreamURL(raw string) error {
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return fmt.Errorf("coupon: downstream_url: %w", err)
	case u.Scheme != "http" && u.Scheme != "https", u.Host == "":
		return fmt.Errorf("coupon: downstream_url %q: want http:// or https:// and a host", raw)
	case u.RawQuery != "" || u.Fragment != "" || u.User != nil:
		return fmt.Errorf("coupon: downstream_url %q: no query, fragment or user info", raw)
	}
	return nil
}

// Call implements ExternalService.
func (s *httpService) Call(parent context.Context, step, key string) error {
	ctx, cancel := context.WithTimeout(parent, s.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.base+"/"+url.PathEscape(step), http.NoBody)
	if err != nil {
		return fmt.Errorf("coupon: downstream call %s: %w", step, err)
	}
	req.Header.Set(idempotencyKeyHeader, key)
	resp, err := s.client.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && parent.Err() == nil {
			return fmt.Errorf("coupon: downstream call %s (key %s) timed out after %v: %w", step, key, s.timeout, err)
		}
		return fmt.Errorf("coupon: downstream call %s (key %s): %w", step, key, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, httpBodyLimit))
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil // the answer counts, read or not
	}
	if err != nil && len(body) == 0 {
		return fmt.Errorf("coupon: downstream answered %d to %s (key %s), its body unread: %w", resp.StatusCode, step, key, err)
	}
	serr := &httpStatusError{Step: step, Key: key, Status: resp.StatusCode, Body: errorText(body)}
	if permanentStatus(resp.StatusCode) {
		return inbox.Permanent(serr)
	}
	return serr
}

// permanentStatus reports whether status refuses the call for good. Every 4xx does, except
// 408 Request Timeout, 425 Too Early and 429 Too Many Requests. 409 Conflict does not
// either, because it says the key's first call is still running.
func permanentStatus(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return status >= 400 && status < 500
}

// errorText is the first bytes of an error answer's body, on one line and valid UTF-8.
func errorText(b []byte) string {
	if len(b) > httpErrorText {
		b = b[:httpErrorText]
	}
	return strings.Join(strings.Fields(strings.ToValidUTF8(string(b), "\uFFFD")), " ")
}
