package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/IBM/sarama"
)

const (
	quietBefore   = 5 * time.Minute  // longest wait for no alert active before an incident
	settleMin     = 2 * time.Minute  // watched after a fix even when all is quiet sooner
	settleMax     = 16 * time.Minute // all alerts must have ended by then: longer than a 15-minute for
	lateReporting = time.Minute      // a page later than its target is still waited for this long, to report it
)

// incident is one incident: what to do, which alert must page, and the fix.
type incident struct {
	name   string
	page   string                 // the alert that must page
	target time.Duration          // within this long from the start
	match  func(e episode) bool   // which episodes of page count; nil: all
	inject func() error           // starts the incident
	onPage func(e *episode) error // checks the page as it fires (nil: none)
	// fixAfter: the fix comes this long after the start whether or not it paged (the
	// incident lasts that long); 0: the fix starts at the page.
	fixAfter time.Duration
	fix      func() (string, error) // the fix; its note for the table
}

// result is what an incident measured.
type result struct {
	inc        incident
	t0, fixed  time.Time
	paged      *episode
	fixNote    string
	also       []episode // other alerts that fired during the incident
	after      []episode // alerts that fired after the fix began
	quietAfter time.Duration
	fails      []string
}

func (r *result) failf(format string, args ...any) {
	r.fails = append(r.fails, fmt.Sprintf(format, args...))
}

func (d *drill) runIncidents(ctx context.Context) error {
	all := map[string]func() incident{
		"coupon_outage": d.couponOutage,
		"relay_frozen":  d.relayFrozen,
		"poison":        d.poison,
		"topic_deleted": d.topicDeleted,
	}
	// Warm up: two minutes of load, both routers answering, the rules evaluated.
	if err := waitFor(ctx, 3*time.Minute, "both routers scraped", func() (bool, error) {
		n, err := d.w.healthy()
		return n > 0 && d.upBoth(), err
	}); err != nil {
		return err
	}
	d.sleep(ctx, 2*time.Minute)
	var results []*result
	for _, name := range strings.Split(d.o.incidents, ",") {
		mk, ok := all[strings.TrimSpace(name)]
		if !ok {
			return fmt.Errorf("-incidents: unknown incident %q", name)
		}
		results = append(results, d.runIncident(ctx, mk()))
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	d.ld.stop()
	ledgers, err := d.ld.ledgers()
	if err != nil {
		return err
	}
	verified, verifyErr := d.verify(ctx, ledgers)
	ds, _ := runCmd(ctx, nil, d.o.downstream, "-fetch-stats", "http://"+d.downstreamAddr)
	return d.report(results, verified, verifyErr, strings.TrimSpace(ds))
}

// runIncident waits for quiet, starts the incident, waits for its page, applies the fix
// and watches until every alert has ended.
func (d *drill) runIncident(ctx context.Context, inc incident) *result {
	r := &result{inc: inc}
	d.logf("%s: waiting for no alert pending or firing", inc.name)
	if err := waitFor(ctx, quietBefore, "no alert active", func() (bool, error) { return len(d.w.active()) == 0, nil }); err != nil {
		r.failf("not quiet before the incident: %s", names(d.w.active()))
	}
	d.logf("%s: start (page expected: %s within %s)", inc.name, inc.page, inc.target)
	r.t0 = time.Now()
	if err := inc.inject(); err != nil {
		r.failf("start: %v", err)
		return r
	}
	// The page: until the target, then a little longer to report a late one.
	deadline := r.t0.Add(inc.target)
	if inc.fixAfter > 0 {
		deadline = r.t0.Add(inc.fixAfter)
	}
	checked := false
	for time.Now().Before(deadline.Add(lateReporting)) && ctx.Err() == nil {
		if r.paged = d.w.firstFiring(inc.page, r.t0, inc.match); r.paged != nil {
			if !checked && inc.onPage != nil {
				checked = true
				if err := inc.onPage(r.paged); err != nil {
					r.failf("page: %v", err)
				}
			}
			if inc.fixAfter == 0 || !time.Now().Before(deadline) {
				break
			}
		} else if inc.fixAfter > 0 && !time.Now().Before(deadline) {
			break
		}
		d.sleep(ctx, 500*time.Millisecond)
	}
	if r.paged == nil {
		r.failf("%s did not page within %s", inc.page, time.Since(r.t0).Round(time.Second))
	} else if after := r.paged.Firing.Sub(r.t0); after > inc.target {
		r.failf("%s paged after %s, later than %s", inc.page, after.Round(time.Second), inc.target)
	} else {
		d.logf("%s: %s fired after %s", inc.name, r.paged, after.Round(time.Second))
	}
	if inc.fixAfter > 0 {
		d.sleep(ctx, time.Until(r.t0.Add(inc.fixAfter)))
	}
	r.fixed = time.Now()
	note, err := inc.fix()
	r.fixNote = note
	if err != nil {
		r.failf("fix: %v", err)
	}
	d.logf("%s: fix: %s", inc.name, note)
	for _, e := range d.w.firedBetween(r.t0, r.fixed) {
		if r.paged == nil || e.key() != r.paged.key() {
			r.also = append(r.also, e)
		}
	}
	// After the fix: no alert may start firing, and all must end.
	for {
		d.sleep(ctx, time.Second)
		since := time.Since(r.fixed)
		active := d.w.active()
		if len(active) == 0 && r.quietAfter == 0 {
			r.quietAfter = since
		}
		if len(active) > 0 {
			r.quietAfter = 0
		}
		if (len(active) == 0 && since >= settleMin) || since >= settleMax || ctx.Err() != nil {
			if len(active) > 0 {
				r.failf("still active %s after the fix: %s", settleMax, names(active))
			}
			break
		}
	}
	r.after = d.w.firedBetween(r.fixed, time.Now().Add(time.Second))
	if len(r.after) > 0 {
		r.failf("fired after the fix: %s", names(r.after))
	}
	return r
}

func (d *drill) sleep(ctx context.Context, dur time.Duration) {
	if dur <= 0 {
		return
	}
	select {
	case <-ctx.Done():
	case <-time.After(dur):
	}
}

// upBoth reports whether Prometheus's last scrape of both routers succeeded.
func (d *drill) upBoth() bool {
	var resp struct {
		Data struct {
			Result []struct {
				Value []any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	r, err := client.Get("http://" + d.promAddr + "/api/v1/query?query=" + `sum(up%7Bjob%3D%22onceflow%22%7D)`)
	if err != nil {
		return false
	}
	defer r.Body.Close()
	if json.NewDecoder(r.Body).Decode(&resp) != nil || len(resp.Data.Result) != 1 || len(resp.Data.Result[0].Value) != 2 {
		return false
	}
	return resp.Data.Result[0].Value[1] == "2"
}

// ---- the incidents

// couponOutage: the coupon service answers every call 503 for 3 minutes.
func (d *drill) couponOutage() incident {
	const outage = 3 * time.Minute
	return incident{
		name: "coupon_outage", page: "OnceflowBreakerOpen", target: outage, fixAfter: outage,
		inject: func() error {
			_, err := runCmd(context.Background(), nil, d.o.downstream, "-start-outage", "http://"+d.downstreamAddr, "-outage-for", outage.String())
			return err
		},
		fix: func() (string, error) { return "the service answers again after 3m", nil },
	}
}

// relayFrozen: the router holding the relay lease is frozen (SIGSTOP) for 2 minutes, then
// resumed (SIGCONT). The page's console link must answer while it is frozen.
func (d *drill) relayFrozen() incident {
	const frozen = 2 * time.Minute
	var held *routerProc
	return incident{
		name: "relay_frozen", page: "OnceflowRouterDown", target: frozen, fixAfter: frozen,
		match: func(e episode) bool { return held != nil && e.Labels["instance"] == held.admin },
		inject: func() error {
			for _, r := range d.routers {
				if owned, err := d.shardsOwned(r); err == nil && owned > 0 {
					held = r
				}
			}
			if held == nil {
				return errors.New("no router owns a relay shard (onceflow_relay_shards_owned)")
			}
			d.logf("relay_frozen: SIGSTOP %s (%s), the relay lease holder", held.name, held.admin)
			return held.p.signal(syscall.SIGSTOP)
		},
		onPage: func(e *episode) error {
			link := e.Annotations["console_url"]
			if link == "" || strings.Contains(link, held.admin) {
				return fmt.Errorf("console_url %q is empty or the frozen router's", link)
			}
			code, err := get(link)
			if err != nil || code != 200 {
				return fmt.Errorf("console_url %s: status %d, %v", link, code, err)
			}
			d.logf("relay_frozen: console_url %s answers 200 while %s is frozen", link, held.name)
			return nil
		},
		fix: func() (string, error) {
			return "SIGCONT after 2m", held.p.signal(syscall.SIGCONT)
		},
	}
}

var shardsLine = regexp.MustCompile(`(?m)^onceflow_relay_shards_owned(?:\{[^}]*\})? (\S+)$`)

// shardsOwned reads onceflow_relay_shards_owned from the router's /metrics.
func (d *drill) shardsOwned(r *routerProc) (float64, error) {
	resp, err := client.Get("http://" + r.admin + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	m := shardsLine.FindStringSubmatch(b.String())
	if m == nil {
		return 0, errors.New("no onceflow_relay_shards_owned")
	}
	var v float64
	_, err = fmt.Sscan(m[1], &v)
	return v, err
}

// poison: 600 poison records; the fix resolves every poison row.
func (d *drill) poison() incident {
	const n = 600
	return incident{
		name: "poison", page: "OnceflowInboxPoison", target: 5 * time.Minute,
		inject: func() error {
			_, err := runCmd(context.Background(), d.env(), d.router, "produce", "--orders", "0", "--poison", fmt.Sprint(n),
				"--prefix", d.prefix+"-poison", "--seed", "99")
			return err
		},
		fix: func() (string, error) {
			start := time.Now()
			ids, err := d.failedIDs("poison")
			if err != nil {
				return "", err
			}
			var (
				mu    sync.Mutex
				first error
				wg    sync.WaitGroup
			)
			work := make(chan string)
			for range 4 {
				wg.Go(func() {
					for id := range work {
						if _, err := runCmd(context.Background(), d.env(), d.router, "inbox", "resolve", id,
							"--reason", "poison: the producer was fixed and its corrected order processed"); err != nil {
							mu.Lock()
							first = cmpOr(first, err)
							mu.Unlock()
						}
					}
				})
			}
			for _, id := range ids {
				work <- id
			}
			close(work)
			wg.Wait()
			left, err := d.failedIDs("poison")
			if err == nil && len(left) > 0 {
				err = fmt.Errorf("%d poison rows left after resolving", len(left))
			}
			return fmt.Sprintf("%d poison rows resolved in %s", len(ids), time.Since(start).Round(time.Second)), cmpOr(first, err)
		},
	}
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// failedIDs lists the ids of the failed inbox rows of reason.
func (d *drill) failedIDs(reason string) ([]string, error) {
	out, err := runCmd(context.Background(), d.env(), d.router, "inbox", "ls", "--status", "failed", "--reason", reason, "--limit", "0", "--output", "json")
	if err != nil {
		return nil, err
	}
	var rows []struct {
		ID json.Number `json:"id"`
	}
	if err := json.Unmarshal([]byte(out[strings.IndexAny(out, "[{"):]), &rows); err != nil {
		return nil, fmt.Errorf("router inbox ls --output json: %w", err)
	}
	ids := make([]string, 0, len(rows))
	for _, r := range rows {
		ids = append(ids, r.ID.String())
	}
	return ids, nil
}

// topicDeleted: the relay's output topic (CouponGranted) is deleted under load; the fix
// recreates it and retries the parked events of that topic.
func (d *drill) topicDeleted() incident {
	return incident{
		name: "topic_deleted", page: "OnceflowOutboxParked", target: 2 * time.Minute,
		inject: func() error {
			admin, err := sarama.NewClusterAdmin(d.o.brokers, sarama.NewConfig())
			if err != nil {
				return err
			}
			defer admin.Close()
			if err := admin.DeleteTopic(d.grantedTopic); err != nil {
				return err
			}
			return waitFor(context.Background(), time.Minute, "the topic gone", func() (bool, error) {
				n, err := d.topicParts(d.grantedTopic)
				return n == 0 && err == nil, err
			})
		},
		fix: func() (string, error) {
			admin, err := sarama.NewClusterAdmin(d.o.brokers, sarama.NewConfig())
			if err != nil {
				return "", err
			}
			defer admin.Close()
			if err := waitFor(context.Background(), 2*time.Minute, "the topic recreated", func() (bool, error) {
				err := admin.CreateTopic(d.grantedTopic, &sarama.TopicDetail{NumPartitions: 3, ReplicationFactor: 1}, false)
				if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
					return false, err
				}
				n, err := d.topicParts(d.grantedTopic)
				return n == 3, err
			}); err != nil {
				return "", err
			}
			dry, err := runCmd(context.Background(), d.env(), d.router, "outbox", "retry", "--topic", d.grantedTopic, "--dry-run")
			if err != nil {
				return "", err
			}
			out, err := runCmd(context.Background(), d.env(), d.router, "outbox", "retry", "--topic", d.grantedTopic)
			if err != nil {
				return "", err
			}
			note := fmt.Sprintf("topic recreated, %s parked events retried", count(out, "retried"))
			if !strings.Contains(dry, "dry run") {
				return note, fmt.Errorf("outbox retry --dry-run printed no dry run: %s", lastLine(dry))
			}
			// The events the topic held before it was deleted went with it: send them again
			// from the outbox's published rows, under their event ids.
			since := d.started.UTC().Format(time.RFC3339)
			if _, err := runCmd(context.Background(), d.env(), d.router, "outbox", "republish", "--topic", d.grantedTopic, "--since", since, "--dry-run"); err != nil {
				return note, err
			}
			rep, err := runCmd(context.Background(), d.env(), d.router, "outbox", "republish", "--topic", d.grantedTopic, "--since", since)
			return note + ", " + count(rep, "republished") + " republished", err
		},
	}
}

// count is the number after word in a command's output ("retried 12 events"), or "?".
func count(out, word string) string {
	if m := regexp.MustCompile(regexp.QuoteMeta(word) + ` (\d+) `).FindStringSubmatch(out); m != nil {
		return m[1]
	}
	return "?"
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// verify runs `router verify --kafka` over the ledgers' orders: exit 0 is exactly-once.
// It returns verify's summary line.
func (d *drill) verify(ctx context.Context, ledgers []string) (string, error) {
	if len(ledgers) == 0 {
		return "", errors.New("verify: no load ledger")
	}
	args := []string{"verify", "--kafka", "--wait", "5m"}
	for _, l := range ledgers {
		args = append(args, "--ledger", l)
	}
	out, err := runCmd(ctx, d.env(), d.router, args...)
	_ = os.WriteFile(filepath.Join(d.dir, "verify.txt"), []byte(out), 0o644)
	if err != nil {
		return "", err
	}
	d.logf("verify --kafka (%d ledgers): %s", len(ledgers), lastLine(out))
	return fmt.Sprintf("ok (%d ledgers)", len(ledgers)), nil
}

// report prints the table and the DRILL line; it returns an error when something failed.
func (d *drill) report(results []*result, verified string, verifyErr error, downstream string) error {
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "INCIDENT\tPAGE\tTARGET\tPAGED_AFTER\tALSO_FIRED\tFIX\tQUIET_AFTER_FIX\tFIRED_AFTER_FIX")
	var fails, times []string
	for _, r := range results {
		paged := "-"
		if r.paged != nil {
			paged = r.paged.Firing.Sub(r.t0).Round(time.Second).String()
			times = append(times, r.inc.name+"="+paged)
		} else {
			times = append(times, r.inc.name+"=none")
		}
		quiet := "-"
		if r.quietAfter > 0 {
			quiet = r.quietAfter.Round(time.Second).String()
		}
		page := r.inc.page
		if r.paged != nil {
			page = r.paged.String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.inc.name, page, r.inc.target, paged, names(r.also), r.fixNote, quiet, names(r.after))
		for _, f := range r.fails {
			fails = append(fails, r.inc.name+": "+f)
		}
	}
	tw.Flush()
	if verifyErr == nil {
		fmt.Printf("verify --kafka: %s\n", verified)
	}
	if downstream != "" {
		fmt.Println(downstream)
	}
	if verifyErr != nil {
		fails = append(fails, "verify: "+oneLine(verifyErr.Error()))
	}
	if len(fails) > 0 {
		for _, f := range fails {
			fmt.Printf("FAIL %s\n", f)
		}
		fmt.Printf("DRILL FAIL incidents=%d %s: %s\n", len(results), strings.Join(times, " "), oneLine(strings.Join(fails, "; ")))
		return errReported
	}
	fmt.Printf("DRILL ok incidents=%d %s scrape=%s eval=%s verify=ok\n", len(results), strings.Join(times, " "), d.scrapeEvery, d.evalEvery)
	return nil
}
