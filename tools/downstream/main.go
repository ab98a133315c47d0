// Command downstream is a small stand-in for the coupon plugin's outside services: it
// serves the steps' calls (POST /<step> with an Idempotency-Key), records each one (key,
// step, start, end, the status answered), and counts what a caller making each call once
// in effect never causes:
//
//	go build -C tools -o ../bin/downstream ./downstream
//	bin/downstream -listen 127.0.0.1:8490 -delay 2ms -jitter 6ms -outage-after 20s -outage-for 65s
//
// A router points at it with plugins.coupon-granter.downstream_url: http://127.0.0.1:8490.
// During an outage every call is answered 503 (-outage-hang: held until its caller gives
// up). Outages come from the flags' schedule, counted from start, or from the admin
// endpoint: POST /admin/outage?for=65s starts one now, DELETE /admin/outage ends it.
//
// GET /stats answers the counts as JSON: total_calls, successful_calls (2xx), outage_calls
// (arrived during an outage), calls_after_success (calls of a key and step arriving after
// one of them was answered 2xx), overlapping_calls (pairs of calls of one key and step
// running at once), the first such calls, and calls_per_key_step (?keys=0 leaves it out).
// On SIGINT or SIGTERM it prints the counts as one line and exits:
//
//	DOWNSTREAM calls=… successful=… outage_calls=… key_steps=… status_200=… calls_after_success=0 overlapping_calls=0
//
// Instead of serving, -fetch-stats URL prints that line for the downstream at URL (and,
// with -stats-out, saves its /stats there), and -start-outage URL puts the downstream at
// URL down now for -outage-for.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "downstream: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("downstream", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:8490", "address to serve on")
	steps := fs.String("steps", "lock_stock,deduct_budget,write_wallet", "the steps served, each at POST /<step>")
	delay := fs.Duration("delay", 0, "each call's delay")
	jitter := fs.Duration("jitter", 0, "up to this much more delay per call")
	failRate := fs.Float64("fail-rate", 0, "share of calls answered 500 outside outages")
	seed := fs.Uint64("seed", 1, "seed of the jitter and the failures")
	after := fs.Duration("outage-after", 0, "start an outage this long after start (with -outage-for)")
	length := fs.Duration("outage-for", 0, "length of the scheduled outage; 0: none")
	hang := fs.Bool("outage-hang", false, "during an outage, hold calls until their caller gives up instead of answering 503")
	logPath := fs.String("log", "", "write every call as a JSON line to this file")
	fetch := fs.String("fetch-stats", "", "print the counts of the downstream at this URL as one line, and exit")
	statsOut := fs.String("stats-out", "", "with -fetch-stats: save its /stats JSON to this file")
	startOutage := fs.String("start-outage", "", "put the downstream at this URL down now for -outage-for, and exit")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case *fetch != "":
		return fetchStats(*fetch, *statsOut, stdout)
	case *startOutage != "":
		return requestOutage(*startOutage, *length, stdout)
	}
	if *failRate < 0 || *failRate >= 1 || *delay < 0 || *jitter < 0 || *after < 0 || *length < 0 {
		return errors.New("-fail-rate in [0,1); -delay, -jitter, -outage-after and -outage-for not negative")
	}
	s := &server{steps: map[string]bool{}, delay: *delay, jitter: *jitter, failRate: *failRate, hang: *hang,
		ledger: newLedger(), outage: &outage{}, rng: rand.New(rand.NewPCG(*seed, *seed^0x9e3779b97f4a7c15))}
	for _, st := range strings.Split(*steps, ",") {
		if st = strings.TrimSpace(st); st != "" {
			s.steps[st] = true
		}
	}
	if *logPath != "" {
		f, err := os.Create(*logPath)
		if err != nil {
			return err
		}
		defer f.Close()
		s.log = bufio.NewWriterSize(f, 1<<20)
	}
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	if *length > 0 {
		s.outage.set(time.Now().Add(*after), *length)
	}
	srv := &http.Server{Handler: s.routes(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	shut, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = srv.Shutdown(shut)
	_, _ = fmt.Fprintln(stdout, s.snapshot(false).summary())
	return errors.Join(err, s.flush())
}

// requestOutage asks the downstream at url to go down now for d.
func requestOutage(url string, d time.Duration, stdout io.Writer) error {
	if d <= 0 {
		return errors.New("-start-outage needs a positive -outage-for")
	}
	c := &http.Client{Timeout: 30 * time.Second}
	resp, err := c.Post(strings.TrimRight(url, "/")+"/admin/outage?for="+d.String(), "", nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s/admin/outage answered %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	_, err = stdout.Write(body)
	return err
}

// fetchStats prints the counts of the downstream at url as one line, its /stats saved to
// out (when not empty).
func fetchStats(url, out string, stdout io.Writer) error {
	c := &http.Client{Timeout: 30 * time.Second}
	resp, err := c.Get(strings.TrimRight(url, "/") + "/stats")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s/stats answered %s", url, resp.Status)
	}
	var st stats
	if err := json.Unmarshal(body, &st); err != nil {
		return fmt.Errorf("%s/stats: %w", url, err)
	}
	if out != "" {
		if err := os.WriteFile(out, body, 0o644); err != nil {
			return err
		}
	}
	_, err = fmt.Fprintln(stdout, st.summary())
	return err
}
