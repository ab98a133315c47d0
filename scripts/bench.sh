#!/usr/bin/env bash
# make bench: measure on the real MariaDB and Kafka (never asserted in a test).
# Prints BENCH lines and writes a CSV under bench/results/. Extra flags go to cmd/bench,
# e.g. BENCH_FLAGS="-orders 20000 -loads 500,1000".
set -Eeuo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/infra.sh up
go build -o bin/bench ./cmd/bench
# shellcheck disable=SC2086
./bin/bench ${BENCH_FLAGS:-} | tee "$ROOT/.run/bench.log"
