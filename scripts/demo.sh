#!/usr/bin/env bash
# make demo: replay the seed incident end to end on the real MariaDB and Kafka.
#   5,000 paid orders, 30 % of them delivered twice as different Kafka messages, slow and
#   flaky steps, and a second router joining mid-run so partitions move while messages are
#   in flight. Then drain, verify, and print one RESULT line (the last line of output).
# Environment: DEMO_ORDERS (5000), DEMO_DUP_RATE (0.3), DEMO_RATE (1500 msg/s), DEMO_POISON (0).
set -Eeuo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
ORDERS="${DEMO_ORDERS:-5000}"
DUP_RATE="${DEMO_DUP_RATE:-0.3}"
RATE="${DEMO_RATE:-1500}"
POISON="${DEMO_POISON:-0}"
OUT="$ROOT/.run/demo"
mkdir -p "$OUT"

START=$SECONDS
say() { echo "demo: [$((SECONDS - START))s] $*"; }

bash scripts/infra.sh up
say "building bin/router"
go build -o bin/router ./cmd/router
R="$ROOT/bin/router"

export ONCEFLOW_CONFIG="$ROOT/configs/demo.yaml"
export ONCEFLOW_DB_DSN='onceflow:onceflow@tcp(127.0.0.1:3306)/onceflow_demo'
export ONCEFLOW_DB_ADMIN_DSN='onceflow_admin:onceflow_admin@tcp(127.0.0.1:3306)/onceflow_demo'

say "fresh schema in database onceflow_demo"
"$R" migrate --reset >/dev/null

pids=()
stop_routers() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
trap stop_routers EXIT

say "router A starting (admin 127.0.0.1:9464, log $OUT/router-a.log)"
ONCEFLOW_ADMIN_LISTEN=127.0.0.1:9464 "$R" run >"$OUT/router-a.log" 2>&1 &
pids+=($!)
sleep 2

say "producing $ORDERS orders, duplicate rate $DUP_RATE, $RATE msg/s"
"$R" produce --orders "$ORDERS" --dup-rate "$DUP_RATE" --poison "$POISON" --rate "$RATE" \
  --ledger "$OUT/ledger.txt" --prefix "demo-$(date +%s)" >"$OUT/produce.log" 2>&1 &
producer=$!
sleep 3
say "router B joining mid-run (partitions move while messages are in flight)"
ONCEFLOW_ADMIN_LISTEN=127.0.0.1:9465 "$R" run >"$OUT/router-b.log" 2>&1 &
pids+=($!)
wait "$producer" || { cat "$OUT/produce.log"; exit 1; }
cat "$OUT/produce.log"

say "waiting for the pipeline to drain, then verifying"
set +e
"$R" verify --ledger "$OUT/ledger.txt" --kafka --result --wait 180s >"$OUT/verify.log" 2>&1
rc=$?
set -e
stop_routers
trap - EXIT
say "metrics of router A were at http://127.0.0.1:9464/metrics; logs in $OUT"
grep -v '^RESULT' "$OUT/verify.log" || true
grep '^RESULT' "$OUT/verify.log" || { echo "RESULT missing (verify exit $rc)"; exit 1; }
exit "$rc"
