// Command bench measures onceflow on the real MariaDB and Kafka started by
// scripts/infra.sh, and prints one machine-readable BENCH line per measurement (plus a CSV
// under tools/bench/results/). Speed is measured here, never asserted in a test.
//
//	go build -C tools -o ../bin/bench ./bench && bin/bench [-orders 20000] [-workers 16]
//
// The command line is config.go; the measurements are methods of suite (suite.go), one
// file per group: batch.go, plain.go, single.go, storm.go, relay.go and forwarder.go,
// kclient.go (the Kafka client alone, Sarama against franz-go),
// e2e.go and latency.go, seedload.go, httpclaims.go, peer.go, router.go (the router binary
// as a child process), lean.go (the batch-native floor beside it), idle.go (the router binary idle), scaleout.go (router binaries joining and leaving), databases.go (MariaDB against PostgreSQL); targets.go runs last. report.go prints the BENCH lines and writes the CSV.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/onceflow/onceflow/internal/gcx"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(1)
	}
}

// group is a measurement group: what -only names, and what runs it.
type group struct {
	name string
	run  func(context.Context) error
}

// groups are the measurement groups in the order they run.
func (s *suite) groups() []group {
	return []group{
		{"batch", s.batchGroup},
		{"plain", s.plainGroup},
		{"single", s.singleGroup},
		{"storm", s.stormGroup},
		{"relay", s.relayGroup},
		{"relay_db", s.relayDBGroup}, // the relay's database work per event, without Kafka
		{"rows", s.rowsGroup},        // the coupon plugin's rows per order, one table at a time
		{"kclient", s.kclientGroup},  // the Kafka client alone: Sarama against kgo
		{"e2e", s.e2eGroup},
		{"tracing", s.traceGroup},
		{"seed", s.seedGroup},
		{"http", s.httpGroup},
		{"peer", s.peerGroup},
		{"router", s.routerGroup},
		{"lean", s.leanGroup},           // the batch-native floor on the router's input
		{"idle", s.idleGroup},           // the router binary with nothing to do
		{"scaleout", s.scaleoutGroup},   // a third router joining and leaving: cooperative-sticky against range
		{"databases", s.databasesGroup}, // MariaDB and PostgreSQL in the same run
		{"targets", s.targetsGroup},     // last: it reads the figures of the groups before it
	}
}

func run() error {
	cfg, err := parseConfig(os.Args[1:])
	if err != nil {
		return err
	}
	if cfg.leanChild != "" {
		stop, err := cfg.startProfile()
		if err != nil {
			return err
		}
		defer stop()
		return runLeanChild(cfg)
	}
	// The router's collector setting (runtime.gogc), for the unsafe baseline and the
	// inbox alike; GOGC in the environment wins, as in the router.
	fmt.Printf("bench: %s\n", gcx.Apply(cfg.gogc, 0))
	ctx := context.Background()
	s := newSuite(cfg)
	s.services = findServices(cfg)
	fmt.Printf("bench: CPU of MariaDB pid %s, Kafka pid %s (listening on -dsn's and -brokers' ports)\n", s.services["db"], s.services["kafka"])
	fmt.Printf("bench: %d workers, GOMAXPROCS=%d; MariaDB and Kafka share this machine\n", cfg.workers, runtimeProcs())
	stopProfile, err := cfg.startProfile()
	if err != nil {
		return err
	}
	defer stopProfile()

	if err := s.openDB(ctx); err != nil {
		return err
	}
	defer s.db.Close()

	s.calibrate("start")
	for _, g := range s.groups() {
		if !cfg.want(g.name) {
			continue
		}
		if err := g.run(ctx); err != nil {
			return err
		}
	}
	s.calibrate("end")
	return s.writeCSV()
}
