// Command burn takes a steady share of the CPU, to try the pipeline on a slower machine
// without waiting for one: each of -n goroutines is busy for -busy out of every -period.
// Run it beside a measurement (docs/BENCHMARKS.md, "Method"), e.g.
//
//	go run -C tools ./burn -n 2 -busy 4.5ms -period 10ms &
//	./bin/bench -only e2e -rounds 1 -e2e-batch-orders 0 -batch-loads 2000 -load-seconds 20
//	kill %1
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"time"
)

func main() {
	n := flag.Int("n", 2, "busy goroutines (each can take up to one core)")
	busy := flag.Duration("busy", 4500*time.Microsecond, "busy time per period")
	period := flag.Duration("period", 10*time.Millisecond, "period")
	flag.Parse()
	if *n < 1 || *busy <= 0 || *busy > *period {
		fmt.Fprintln(os.Stderr, "burn: want -n ≥ 1 and 0 < -busy ≤ -period")
		os.Exit(2)
	}
	runtime.GOMAXPROCS(*n)
	fmt.Fprintf(os.Stderr, "burn: %d goroutines busy %s of every %s (≈%.2f cores)\n", *n, *busy, *period, float64(*n)*busy.Seconds()/period.Seconds())
	share := busy.Seconds() / period.Seconds()
	for range *n {
		go func() {
			// Spin in pieces of -busy and sleep in between, keeping the time spun at share of
			// the time elapsed: a sleep overshoots (by a millisecond or more on a loaded
			// machine), and without the account the share taken falls well below the one asked.
			begin := time.Now()
			var spun time.Duration
			for {
				if spun.Seconds() >= share*time.Since(begin).Seconds() {
					time.Sleep(*period - *busy)
					continue
				}
				start := time.Now()
				for time.Since(start) < *busy {
				}
				spun += time.Since(start)
			}
		}()
	}
	select {}
}
