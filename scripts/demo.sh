#!/usr/bin/env bash
# make demo: replay the seed incident end to end on the real MariaDB and Kafka.
#   5,000 paid orders, 30 % of them delivered twice as different Kafka messages, slow steps,
#   and a second router joining mid-run so partitions move while messages are in flight. The
#   steps call a local downstream over HTTP (tools/downstream, on 127.0.0.1:8490 as
#   configs/demo.yaml says), which goes down (503) for DEMO_OUTAGE_FOR once the claims below
#   are answered, while orders keep arriving. Then drain, verify, and print one RESULT line
#   (the last line of output), with the downstream's count of calls made again for a key
#   and step after its success (calls_after_success=) and of calls of one key and step
#   running at once (overlapping_calls=); either above 0 fails the demo.
#   Meanwhile, DEMO_CLAIMS coupon claims arrive at router A's HTTP listener (POST /v1/claims),
#   each double-clicked (3 requests at once with one Idempotency-Key); the RESULT line
#   reports them (claims=, claim_duplicates_blocked=, claim_coupons=).
# Environment: DEMO_ORDERS (5000), DEMO_DUP_RATE (0.3), DEMO_RATE (50 msg/s: orders arrive
#   before, during and after the outage), DEMO_POISON (0), DEMO_CLAIMS (500), DEMO_HTTP
#   (127.0.0.1:8480), DEMO_OUTAGE_FOR (65s), DEMO_FAIL_RATE (0.02: the share of the
#   downstream's calls answered 500 outside the outage; a grant whose later step failed
#   makes only the failed call again, not the calls that succeeded before it),
#   DB: the database, mariadb (the default), postgres, or mysql8 (MySQL 8's SQL,
#   db.dialect=mysql8, on the MariaDB server).
set -Eeuo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
ORDERS="${DEMO_ORDERS:-5000}"
DUP_RATE="${DEMO_DUP_RATE:-0.3}"
RATE="${DEMO_RATE:-50}"
POISON="${DEMO_POISON:-0}"
CLAIMS="${DEMO_CLAIMS:-500}"
HTTP="${DEMO_HTTP:-127.0.0.1:8480}"
OUTAGE_FOR="${DEMO_OUTAGE_FOR:-65s}"
FAIL_RATE="${DEMO_FAIL_RATE:-0.02}"
DOWNSTREAM=127.0.0.1:8490 # plugins.coupon-granter.downstream_url in configs/demo.yaml
OUT="$ROOT/.run/demo"
mkdir -p "$OUT"

START=$SECONDS
say() { echo "demo: [$((SECONDS - START))s] $*"; }

bash scripts/infra.sh up
say "building bin/router"
go build -o bin/router ./cmd/router
go build -C tools -o ../bin/claimburst ./claimburst
go build -C tools -o ../bin/downstream ./downstream
R="$ROOT/bin/router"

export ONCEFLOW_CONFIG="$ROOT/configs/demo.yaml"
case "${DB:-mariadb}" in
  mariadb | mysql8)
    export ONCEFLOW_DB_DSN='onceflow:onceflow@tcp(127.0.0.1:3306)/onceflow_demo'
    export ONCEFLOW_DB_ADMIN_DSN='onceflow_admin:onceflow_admin@tcp(127.0.0.1:3306)/onceflow_demo'
    if [[ "${DB:-}" == mysql8 ]]; then
      dialect=mysql8 # after the migration: its files are MariaDB's (MySQL 8 has its own DDL)
      where="MariaDB with MySQL 8's SQL (db.dialect=mysql8)"
    else
      where="MariaDB"
    fi
    ;;
  postgres)
    export ONCEFLOW_DB_DSN='postgres://onceflow:onceflow@127.0.0.1:5432/onceflow_demo'
    export ONCEFLOW_DB_ADMIN_DSN='postgres://onceflow_admin:onceflow_admin@127.0.0.1:5432/onceflow_demo'
    where="PostgreSQL"
    ;;
  *)
    echo "demo: DB=$DB: want mariadb, postgres or mysql8" >&2
    exit 2
    ;;
esac

say "database: $where; fresh schema in database onceflow_demo"
"$R" migrate --reset >/dev/null
if [[ -n "${dialect:-}" ]]; then export ONCEFLOW_DB_DIALECT="$dialect"; fi

pids=()
downstream=
producer=
stop_routers() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
stop_all() {
  if [[ -n "$producer" ]]; then kill -TERM "$producer" 2>/dev/null || true; fi # a demo that fails leaves no orders behind
  stop_routers
  if [[ -n "$downstream" ]]; then
    kill -TERM "$downstream" 2>/dev/null || true
    wait "$downstream" 2>/dev/null || true
    downstream=
  fi
}
trap stop_all EXIT

say "downstream starting on $DOWNSTREAM (2–8 ms a call, a share of $FAIL_RATE answered 500; calls in $OUT/downstream-calls.jsonl)"
"$ROOT/bin/downstream" -listen "$DOWNSTREAM" -delay 2ms -jitter 6ms -fail-rate "$FAIL_RATE" -seed "$(date +%s)" \
  -log "$OUT/downstream-calls.jsonl" >"$OUT/downstream.log" 2>&1 &
downstream=$!
until "$ROOT/bin/downstream" -fetch-stats "http://$DOWNSTREAM" >/dev/null 2>&1; do
  kill -0 "$downstream" 2>/dev/null || { echo "demo: the downstream did not start:"; cat "$OUT/downstream.log"; exit 1; }
  sleep 0.2
done

say "router A starting (admin 127.0.0.1:9464, HTTP commands $HTTP, log $OUT/router-a.log)"
ONCEFLOW_ADMIN_LISTEN=127.0.0.1:9464 ONCEFLOW_HTTP_LISTEN="$HTTP" "$R" run >"$OUT/router-a.log" 2>&1 &
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
say "$CLAIMS coupon claims, each double-clicked (3 requests with one Idempotency-Key) at http://$HTTP/v1/claims"
"$ROOT/bin/claimburst" -url "http://$HTTP" -claims "$CLAIMS" -clicks 3 -prefix "demo-claim-$(date +%s)" >"$OUT/claims.log" 2>&1 \
  || { cat "$OUT/claims.log"; exit 1; }
cat "$OUT/claims.log"
# HTTP claims wait for their answer, so they have neither the breaker nor delayed
# redelivery: the outage starts once they are answered, while orders keep arriving.
say "downstream down for $OUTAGE_FOR (503) while orders keep arriving: the breaker and delayed redelivery take over"
"$ROOT/bin/downstream" -start-outage "http://$DOWNSTREAM" -outage-for "$OUTAGE_FOR" >/dev/null
wait "$producer" || { cat "$OUT/produce.log"; exit 1; }
producer=
cat "$OUT/produce.log"

say "orders produced; waiting for the pipeline to drain, then verifying"
# Poison sent on purpose ends quarantined: verify then accepts failed inbox rows (its FAILED
# line still counts them); without poison a failed row is a finding (exit 1).
allow_failed=()
if [[ "$POISON" != 0 ]]; then allow_failed=(--allow-failed); fi
set +e
"$R" verify --ledger "$OUT/ledger.txt" --kafka --result --wait 180s "${allow_failed[@]}" >"$OUT/verify.log" 2>&1
rc=$?
set -e
stop_routers
calls="$("$ROOT/bin/downstream" -fetch-stats "http://$DOWNSTREAM" -stats-out "$OUT/downstream-stats.json")" || { echo "downstream stats missing"; exit 1; }
stop_all
trap - EXIT
say "metrics of router A were at http://127.0.0.1:9464/metrics; logs in $OUT"
grep -v '^RESULT' "$OUT/verify.log" || true
echo "$calls"
result="$(grep '^RESULT' "$OUT/verify.log")" || { echo "RESULT missing (verify exit $rc)"; exit 1; }
claims="$(grep -o 'claims=[0-9]* .*' "$OUT/claims.log" | grep -o 'claims=[0-9]*\|claim_duplicates_blocked=[0-9]*\|claim_coupons=[0-9]*' | tr '\n' ' ')"
after="$(grep -o 'calls_after_success=[0-9]*' <<<"$calls")"
overlapping="$(grep -o 'overlapping_calls=[0-9]*' <<<"$calls")"
if [[ "$after" != calls_after_success=0 || "$overlapping" != overlapping_calls=0 ]]; then
  echo "the downstream was called again for a key and step after its success, or twice at once (calls_after_success_after_failure: after a later step of its order failed): the first such calls are odd_calls in $OUT/downstream-stats.json, every call in $OUT/downstream-calls.jsonl"
  rc=1
fi
echo "$result ${claims% } $after $overlapping"
exit "$rc"
