// Command claimburst double-clicks coupon claims at a router's HTTP listener, as impatient
// users and retrying clients do, and checks what came back:
//
//	go run -C tools ./claimburst -url http://127.0.0.1:8080 -claims 200 -clicks 3
//
// Each claim is one Idempotency-Key sent -clicks times at once; a click answered 409 (the
// key's first request still running), 503 (nothing committed) or 504 (outcome unknown) is
// retried with the same key after its Retry-After, as a client must, until it gets the
// claim's answer. Every click of a claim must get the same 201 body, and
// no two claims the same coupon. It prints one line,
//
//	CLAIMS claims=200 claim_requests=… claim_created=200 claim_duplicates_blocked=… claim_coupons=200 claim_errors=0
//
// where claim_duplicates_blocked counts the clicks that did not create a coupon (answered
// 409, or 201 replayed), and exits 1 when a check fails. The demo (`make demo`) runs it.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

func main() {
	url := flag.String("url", "http://127.0.0.1:8080", "the router's http.listen")
	claims := flag.Int("claims", 200, "distinct claims (Idempotency-Keys)")
	clicks := flag.Int("clicks", 3, "requests per claim, sent at once")
	campaign := flag.String("campaign", "double11-5yuan", "campaignId of the claims")
	prefix := flag.String("prefix", fmt.Sprintf("burst-%d", time.Now().Unix()), "key and user prefix")
	flag.Parse()
	if *claims < 1 || *clicks < 1 {
		fmt.Fprintln(os.Stderr, "claimburst: -claims and -clicks must be at least 1")
		os.Exit(2)
	}
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	var (
		mu                         sync.Mutex
		requests, created, blocked int
		errs                       []string
		coupons                    = map[string]string{} // coupon id → key
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(errs) < 5 {
			errs = append(errs, fmt.Sprintf(format, args...))
		} else {
			errs = append(errs, "")
		}
	}
	sem := make(chan struct{}, 64) // claims in flight
	var wg sync.WaitGroup
	for i := range *claims {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			key := fmt.Sprintf("%s-%05d", *prefix, i)
			body := fmt.Sprintf(`{"userId": %q, "campaignId": %q}`, key, *campaign)
			bodies := make([]string, *clicks)
			var cw sync.WaitGroup
			for j := range *clicks {
				cw.Add(1)
				go func() {
					defer cw.Done()
					for try := 0; try < 100; try++ {
						status, replayed, got, retry, err := post(c, *url, key, body)
						mu.Lock()
						requests++
						if status == http.StatusConflict || (status == http.StatusCreated && replayed) {
							blocked++
						} else if status == http.StatusCreated {
							created++
						}
						mu.Unlock()
						switch {
						case err != nil:
							fail("%s: %v", key, err)
							return
						case status == http.StatusConflict || status == http.StatusServiceUnavailable || status == http.StatusGatewayTimeout:
							// Retried with the same key, as the answer says (never a new key).
							time.Sleep(retry)
							continue
						case status != http.StatusCreated:
							fail("%s: %d %s", key, status, got)
							return
						}
						bodies[j] = got
						return
					}
					fail("%s: still 409 after 100 tries", key)
				}()
			}
			cw.Wait()
			for _, b := range bodies[1:] {
				if b != bodies[0] {
					fail("%s: two different answers: %s / %s", key, bodies[0], b)
					return
				}
			}
			var ans struct {
				CouponID string `json:"couponId"`
			}
			if err := json.Unmarshal([]byte(bodies[0]), &ans); err != nil || ans.CouponID == "" {
				fail("%s: answer without a coupon: %s", key, bodies[0])
				return
			}
			mu.Lock()
			other, dup := coupons[ans.CouponID]
			coupons[ans.CouponID] = key
			mu.Unlock()
			if dup {
				fail("coupon %s granted to claims %s and %s", ans.CouponID, other, key)
			}
		}()
	}
	wg.Wait()
	if created != *claims {
		fail("%d coupons created for %d claims", created, *claims)
	}
	fmt.Printf("CLAIMS claims=%d claim_requests=%d claim_created=%d claim_duplicates_blocked=%d claim_coupons=%d claim_errors=%d\n",
		*claims, requests, created, blocked, len(coupons), len(errs))
	for _, e := range errs {
		if e != "" {
			fmt.Fprintln(os.Stderr, "claimburst:", e)
		}
	}
	if len(errs) > 0 {
		os.Exit(1)
	}
}

// post sends one claim; retry is the answer's Retry-After (at least 50 ms).
func post(c *http.Client, url, key, body string) (status int, replayed bool, got string, retry time.Duration, err error) {
	req, err := http.NewRequest(http.MethodPost, url+"/v1/claims", strings.NewReader(body))
	if err != nil {
		return 0, false, "", 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	resp, err := c.Do(req)
	if err != nil {
		return 0, false, "", 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	retry = 50 * time.Millisecond
	if s, perr := strconv.Atoi(resp.Header.Get("Retry-After")); perr == nil && s > 0 {
		retry = time.Duration(s) * time.Second
	}
	return resp.StatusCode, resp.Header.Get("Idempotent-Replayed") == "true", strings.TrimSpace(string(b)), retry, err
}
