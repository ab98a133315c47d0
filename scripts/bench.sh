#!/usr/bin/env bash
# make bench: measure on the real MariaDB and Kafka (never asserted in a test).
# Prints BENCH lines and writes a CSV under tools/bench/results/. Extra flags go to tools/bench,
# e.g. BENCH_FLAGS="-orders 20000 -loads 500,1000".
set -Eeuo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/infra.sh up
go build -C tools -o ../bin/bench ./bench
# The router group measures the binary itself, as a child process: built from this tree.
go build -o bin/router ./cmd/router
# shellcheck disable=SC2086
./bin/bench -memprofile "$ROOT/.run/bench-allocs.prof" ${BENCH_FLAGS:-} | tee "$ROOT/.run/bench.log"
# Where the run's memory went: the five functions that allocated most (the whole run, every
# group but the calibration's fixed work; the pipelines under test run in this process).
echo "bench: the five sites that allocated most in this run (go tool pprof -sample_index=alloc_space):"
go tool pprof -top -nodecount=5 -sample_index=alloc_space -ignore='calibrate' bin/bench "$ROOT/.run/bench-allocs.prof" 2>/dev/null \
  | sed -n '/flat%/,$p' | tee -a "$ROOT/.run/bench.log" || true
