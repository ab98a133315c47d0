# onceflow — the two commands of a fresh machine are `make demo` and `make test`.
SHELL := /bin/bash
GO    ?= go
PKGS  := ./...
# doc generator of the tools module, run from the repository root
DOCTABLE := $(GO) build -C tools -o ../bin/doctable ./doctable && bin/doctable

.PHONY: ops-test ops-drill image-test examples all build infra infra-down demo test test-postgres test-mysql8 test-galera test-tools test-short fuzz bench bench-targets bench-stream vet clean chaos chaos-broken

all: build

build:
	$(GO) build -buildvcs=auto -o bin/router ./cmd/router

## infra: install (if missing) and start MariaDB, PostgreSQL and Kafka on 127.0.0.1 (idempotent)
infra:
	bash scripts/infra.sh up

infra-down:
	bash scripts/infra.sh down

## demo: the seed incident replayed end to end; ends with one RESULT line
demo:
	bash scripts/demo.sh

## test: start the services, then vet, unit + integration tests (-race) of this module (on
## PostgreSQL, MySQL 8's SQL and the Galera cluster too), of the tools module and of the
## examples, short fuzzing, the container image, and the alert rules and dashboard (ops-test:
## before test-tools, which runs tools/opscheck again, as it installs Prometheus)
test: infra
	$(GO) vet $(PKGS)
	$(GO) test -race -count=1 -v -timeout 30m $(PKGS)
	$(MAKE) test-postgres
	$(MAKE) test-mysql8
	$(MAKE) test-galera
	$(MAKE) ops-test
	$(MAKE) test-tools
	$(MAKE) examples
	$(MAKE) fuzz FUZZTIME=30000x
	$(MAKE) image-test

## ops-test: the alert rules (promtool check + test rules) and the dashboard: every panel's
## query answered by Debian's Prometheus scraping a router (tools/opscheck); installs the
## prometheus package when missing (scripts/ops-test.sh). OFTEST_OPSCHECK_EXPECT_MISSING
## (environment, comma-separated) names metrics whose panels may return nothing.
ops-test:
	bash scripts/ops-test.sh

## ops-drill: four incidents (a downstream down, the relay lease holder frozen, poison, the
## relay's output topic deleted) against two routers and Debian's Prometheus with the shipped
## rules; prints each page's time and one DRILL line (tools/opsdrill, scripts/ops-drill.sh).
## About half an hour; not part of test.
ops-drill: infra
	bash scripts/ops-drill.sh

## image-test: the container image (deploy/Dockerfile: the static router on scratch, CA
## certificates, user 65532) built offline with podman and `router version` and
## `router run --help` run in it; installs podman and runc when missing (scripts/image-test.sh)
image-test:
	bash scripts/image-test.sh

## test-postgres: the integration suite of this module again, on PostgreSQL
## (OFTEST_DB=postgres). PG_ONLY_MARIADB names the tests of what only the MySQL family
## has, left out there: the MariaDB migrations' history, mysql8's refusals, a DSN without a
## database, tx_isolation and the server's statement counters, MariaDB's planner on a range
## it must not read, its TLS users, and a database the application user cannot reach before
## `router migrate` (PostgreSQL lets every role connect).
PG_ONLY_MARIADB ?= ^(TestExactKeysMigration|TestMigrationsRollBackAndReapply|TestPluginMigrationsAdoptTables|$\
  TestMySQL8RefusesMariaDBOnlySQL|TestEOSRelayDefaultTransactionalIDNeedsDatabase|$\
  TestOpenSessionIsolation|TestIsolationRefused|TestIsolationCheckedOncePerPool|$\
  TestMultiRowPreparesItself|TestBatchPreparedStatements|TestTimeRangeReadsTheIndex|TestFailedErrorsPlan|$\
  TestPipelineOverSASLSSL|TestMigrateGrantsLeastPrivilege|TestTLSConnection)$$
## The packages that touch the database (the others do not read OFTEST_DB).
DB_PKGS := . ./pkg/routercmd/... ./internal/console/... ./coupon/... ./inbox/... ./outbox/... ./migrations/... ./pkg/dbx/... ./internal/metrics/... ./internal/testenv/...
test-postgres: infra
	OFTEST_DB=postgres $(GO) test -race -count=1 -v -timeout 30m -skip '$(PG_ONLY_MARIADB)' $(DB_PKGS)

## test-mysql8: the inbox's and the outbox's integration tests with db.dialect=mysql8 (MySQL
## 8's SQL: no RETURNING, nothing MariaDB-only) on the MariaDB server
test-mysql8: infra
	OFTEST_DB=mysql8 $(GO) test -race -count=1 -v -timeout 30m ./inbox/... ./outbox/...

## test-galera: pkg/dbx's tests on a three-node Galera cluster (scripts/infra.sh galera-up,
## 127.0.0.1:4306-4308; it kills and desynchronises nodes): failover order, stickiness, a
## non-Synced node skipped, certification conflicts, the write node killed mid-commit; the
## cluster is stopped afterwards (its three servers would hold memory for the rest of make test)
test-galera:
	bash scripts/infra.sh galera-up
	@rc=0; $(GO) test -tags galera -race -count=1 -v -timeout 10m -run 'Galera' ./pkg/dbx/ || rc=$$?; \
	  bash scripts/infra.sh galera-down; exit $$rc

## test-tools: the tools module (tools/: bench, chaos, doc generators, the console's browser
## test; its own go.mod, a replace to this checkout) built, vetted and tested on the real services
test-tools:
	cd tools && $(GO) build ./... && $(GO) vet ./... && $(GO) test -race -count=1 -v -timeout 30m ./...

## examples: each module of examples/ (its own go.mod, a replace to this checkout) built,
## vetted and tested on the real services, as a team's own router is
EXAMPLES := $(wildcard examples/*/go.mod)
examples:
	@for m in $(EXAMPLES); do d=$$(dirname $$m); echo "== $$d"; \
	  (cd $$d && $(GO) build ./... && $(GO) vet ./... && $(GO) test -race -count=1 -timeout 10m ./...) || exit 1; done

## test-short: the quick loop without services (integration tests skip under -short)
test-short:
	$(GO) test -short -count=1 $(PKGS)

## fuzz: every decoder of outside input (order-paid payload, coupon-granted record and
## header, a JSON text's keys against its type, DSN, config file, a record's traceparent),
## the coupon events' encoder against encoding/json,
## FUZZTIME each, and whole deliveries of random bytes through the inbox on the real database
## (FuzzProcess, FUZZTIME_DB). A count
## ("200000x"), not a duration: Go 1.26's fuzz coordinator can fail a clean run with
## "context deadline exceeded" when a duration runs out under CPU load (golang/go#75804,
## fixed in Go 1.27); a count has no deadline.
FUZZTIME ?= 200000x
## FuzzProcess runs every input through the real database (a few ms each): fewer inputs.
FUZZTIME_DB ?= 5000x
fuzz:
	$(GO) test -run='^$$' -fuzz='^FuzzDecodeOrderPaid$$' -fuzztime=$(FUZZTIME) ./coupon/
	$(GO) test -run='^$$' -fuzz='^FuzzGrantEventEncode$$' -fuzztime=$(FUZZTIME) ./coupon/
	$(GO) test -run='^$$' -fuzz='^FuzzDecode$$' -fuzztime=$(FUZZTIME) ./coupon/notify/
	$(GO) test -run='^$$' -fuzz='^FuzzCheckJSONText$$' -fuzztime=$(FUZZTIME) ./inbox/
	$(GO) test -run='^$$' -fuzz='^FuzzCheck$$' -fuzztime=$(FUZZTIME) ./internal/jsonkeys/
	$(GO) test -run='^$$' -fuzz='^FuzzParseDSN$$' -fuzztime=$(FUZZTIME) ./pkg/dbx/
	$(GO) test -run='^$$' -fuzz='^FuzzMaskDSN$$' -fuzztime=$(FUZZTIME) ./pkg/dbx/
	$(GO) test -run='^$$' -fuzz='^FuzzMaskPostgresDSN$$' -fuzztime=$(FUZZTIME) ./pkg/dbx/
	$(GO) test -run='^$$' -fuzz='^FuzzConfigFile$$' -fuzztime=$(FUZZTIME) .
	$(GO) test -run='^$$' -fuzz='^FuzzParseTraceParent$$' -fuzztime=$(FUZZTIME) ./internal/tracex/
	$(GO) test -run='^$$' -fuzz='^FuzzProcess$$' -fuzztime=$(FUZZTIME_DB) ./inbox/engine/

## bench: throughput measured on the real services (never asserted in a test); a full run
## (no -only in BENCH_FLAGS) regenerates docs/BENCHMARKS.md's table and README's summary
bench: infra
	bash scripts/bench.sh
	@case " $(BENCH_FLAGS) " in *" -only"*) echo "bench: an -only run: the documents are left as they are" ;; \
	  *) f=$$(ls -t tools/bench/results/bench-*.csv | head -n 1); cp "$$f" tools/bench/results/latest.csv; \
	     $(DOCTABLE) -bench "$$f" ;; esac

## bench-targets: only what the targets of the hot path read (tools/bench -targets: the
## relay, peer, router, lean, idle and scaleout groups; the peer and forwarder runs shorter, the
## router's stalled runs left out), on the real services; ends with one BENCH name=targets
## line (each target pass, fail or missing with its value, and the run's calibration) and
## how long it took. About 6 minutes; the documents are left as they are. BENCH_FLAGS are
## added (a flag given there wins).
bench-targets: infra
	@start=$$(date +%s); BENCH_FLAGS="-targets $(BENCH_FLAGS)" bash scripts/bench.sh || exit 1; \
	  echo "bench-targets: $$(( $$(date +%s) - start )) s"; grep -h '^BENCH name=targets ' .run/bench.log | tail -n 1

## bench-stream: the peak memory (max RSS) of `router produce` and `router replay` as child
## processes at 10,000 and 1,000,000 orders / inbox rows (the replay through the handler at
## 5,000 and 50,000: one transaction per row), on the real services, in a database
## (onceflow_stream) and topics of its own: BENCH name=stream_rss lines and their ratios
## (docs/BENCHMARKS.md, "Memory of produce and replay"). STREAM_FLAGS go to tools/streamrss.
bench-stream: infra
	$(GO) build -buildvcs=auto -o bin/router ./cmd/router
	$(GO) build -C tools -o ../bin/streamrss ./streamrss
	set -o pipefail; bin/streamrss $(STREAM_FLAGS) | tee .run/bench-stream.log

vet:
	$(GO) vet $(PKGS)
	cd tools && $(GO) vet ./...

## chaos: kill -9, relay crashes, rebalances, broker/database restarts, DB and Kafka network
## faults, then an independent checker; ends with one CHAOS line. Runs on a second, private
## MariaDB + Kafka (scripts/chaos.sh), never on the shared services. CHAOS_PROFILE=long for
## the long run, CHAOS_SEED=N; DB=postgres on the instance's own PostgreSQL (CHAOS_PG_PORT, 5433);
## CHAOS_PROFILE=galera on a three-node Galera cluster of its own instance, its write node killed.
## The output is kept in .run/chaos/chaos.log, and docs/RELIABILITY.md's (MariaDB) table is
## regenerated from it when the checker reported (whatever the outcome).
chaos:
	@rm -f .run/chaos/chaos.log; rc=0; bash scripts/chaos.sh || rc=$$?; \
	  if [ "$${DB:-mariadb}" = mariadb ]; then \
	    $(DOCTABLE) -chaos .run/chaos/chaos.log || echo "chaos: docs/RELIABILITY.md left as it is"; \
	  else echo "chaos: DB=$$DB: docs/RELIABILITY.md (MariaDB's run) left as it is"; fi; \
	  exit $$rc

## chaos-broken: the router built deliberately broken (the relay skips its reconcile); passes
## only if the checker reports the duplicate events (CHAOS_BROKEN=inbox for the other break)
chaos-broken:
	CHAOS_BROKEN=$${CHAOS_BROKEN:-reconcile} bash scripts/chaos.sh

## soak: CHAOS_SOAK_ORDERS (1,000,000) orders, 20 % delivered twice, over CHAOS_SOAK_MINUTES
## (30) on a three-broker cluster of the chaos instance: ≥ 20 router kill -9s, a router
## joining or leaving every 4 s, leader and transaction-coordinator kills, the routers' RSS
## sampled every 10 s (rss.csv in the run dir), then the chaos checker. Not part of make
## test; docs/RELIABILITY.md's soak table is regenerated from its output.
.PHONY: soak
soak:
	@mkdir -p .run/chaos; rm -f .run/chaos/chaos.log; rc=0; CHAOS_PROFILE=soak bash scripts/chaos.sh || rc=$$?; \
	  cp .run/chaos/chaos.log .run/chaos/soak.log 2>/dev/null; \
	  $(DOCTABLE) -chaos .run/chaos/soak.log || echo "soak: docs/RELIABILITY.md left as it is"; \
	  exit $$rc

clean:
	rm -rf bin
