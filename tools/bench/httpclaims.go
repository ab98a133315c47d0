package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/onceflow/onceflow/coupon"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/inbox/httpcmd"
)

// httpGroup: the coupon claim command (POST /v1/claims with an Idempotency-Key) over real
// HTTP on loopback, served in this process as the router serves it, 30 % of the requests
// repeating an earlier request's key (double clicks and client retries, some while the
// first request still runs).
func (s *suite) httpGroup(ctx context.Context) error {
	if err := s.benchHTTPClaims(ctx); err != nil {
		return fmt.Errorf("http_claims: %w", err)
	}
	return nil
}

func (s *suite) benchHTTPClaims(ctx context.Context) error {
	if err := s.truncate(ctx); err != nil {
		return err
	}
	if _, err := s.lock.ExecContext(ctx, "TRUNCATE TABLE "+engine.ReplyTable("inbox")); err != nil {
		return err
	}
	g, cfg, err := s.granter(ctx, "")
	if err != nil {
		return err
	}
	claims, err := g.ClaimHandler(s.db)
	if err != nil {
		return err
	}
	defer claims.(io.Closer).Close()
	ib, err := engine.NewCommand(s.db, claims, engine.Config{BizType: coupon.ClaimBizType}, nil, nil)
	if err != nil {
		return err
	}
	// Group commit, as the router runs commands by default (inbox.batch_size > 1).
	b, err := ib.NewBatcher(s.batchConfig())
	if err != nil {
		return err
	}
	defer b.Close()
	h, err := httpcmd.New([]httpcmd.Route{{Method: http.MethodPost, Path: coupon.ClaimPath, Runner: b}}, httpcmd.Config{}, nil)
	if err != nil {
		return err
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	defer s.withWorkers(s.cfg.httpClients)()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: s.workers}}

	// Request i's key: a new one, or (30 %) the key of an earlier request, drawn from the
	// last 200 so some repeats arrive while the first request still runs.
	n := s.cfg.httpN
	rng := rand.New(rand.NewPCG(7, 11))
	keys := make([]int, n)
	next, repeats := 0, 0
	for i := range keys {
		if i > 0 && rng.Float64() < 0.3 {
			keys[i] = keys[max(0, i-1-rng.IntN(min(i, 200)))]
			repeats++
			continue
		}
		keys[i] = next
		next++
	}
	lat := make([]float64, n)
	var created, replayed, busy, other atomic.Int64
	var firstBad atomic.Value
	el, err := s.parallel(n, func(i int) error {
		key := fmt.Sprintf("bench-claim-%07d", keys[i])
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+coupon.ClaimPath,
			strings.NewReader(fmt.Sprintf(`{"userId": "u%d", "campaignId": %q}`, keys[i]%100000, cfg.CampaignID)))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(httpcmd.HeaderKey, key)
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		lat[i] = float64(time.Since(start).Microseconds()) / 1000
		switch {
		case resp.StatusCode == http.StatusCreated && resp.Header.Get(httpcmd.HeaderReplayed) == "true":
			replayed.Add(1)
		case resp.StatusCode == http.StatusCreated:
			created.Add(1)
		case resp.StatusCode == http.StatusConflict:
			busy.Add(1)
		default:
			other.Add(1)
			firstBad.CompareAndSwap(nil, fmt.Sprintf("%d %s", resp.StatusCode, b))
		}
		return nil
	})
	if err != nil {
		return err
	}
	if bad := firstBad.Load(); bad != nil {
		return fmt.Errorf("%d unexpected answers, the first: %s", other.Load(), bad)
	}
	var coupons, dups int
	if err := s.db.QueryRowContext(ctx, "SELECT COUNT(*), COUNT(*) - COUNT(DISTINCT user_id, order_id) FROM user_coupon WHERE order_id LIKE 'claim-%'").Scan(&coupons, &dups); err != nil {
		return err
	}
	slices.Sort(lat)
	// A key's coupons beyond the first: the claims made (created) must equal the keys sent
	// and the coupons granted.
	duplicateCoupons := coupons - next + dups
	s.report("http_claims", "requests", n, "keys", next, "duplicate_keys", repeats, "seconds", el.Seconds(),
		"requests_per_s", float64(n)/el.Seconds(), "p50_ms", lat[n/2], "p99_ms", lat[min(n-1, n*99/100)],
		"created", created.Load(), "replayed", replayed.Load(), "busy_409", busy.Load(), "coupons", coupons, "duplicate_coupons", duplicateCoupons,
		"clients", s.workers)
	st := b.Stats()
	fmt.Printf("bench: http_claims batches=%d batched=%d fallbacks=%d rollbacks=%d isolated=%d max_batched=%d\n", st.Batches, st.Batched, st.Fallbacks, st.Rollbacks, st.Isolated, st.MaxBatched)
	return nil
}
