#!/usr/bin/env bash
# make chaos: the chaos harness (tools/chaos) on a second, private instance of MariaDB and Kafka
# (scripts/infra.sh with its own run dir and ports), never on the shared services
# (127.0.0.1:3306 / :5432 / :9092) that `make test` and `make demo` use: the harness restarts
# the services it runs against.
#
#   DB=postgres: the routers, the checker and the database restarts on the chaos instance's own
#     PostgreSQL (CHAOS_PG_PORT, default 5433; scripts/infra.sh pg-stop/pg-start) instead of
#     its MariaDB; the CHAOS line then says db=postgres. DB=mariadb (default): MariaDB.
#   CHAOS_PROFILE=short|long|broken (default short, ~2 min; long ~12 min), CHAOS_SEED (default 1),
#   CHAOS_PROFILE=cluster|soak: on a three-broker cluster of the chaos instance (scripts/infra.sh
#     INFRA_KAFKA_BROKERS=3; brokers on CHAOS_CLUSTER_PORT 29092-29094, controllers on
#     CHAOS_CLUSTER_CONTROLLER_PORT 29192-29194) instead of its one broker, not proxied;
#     soak (make soak): CHAOS_SOAK_ORDERS (1000000) over CHAOS_SOAK_MINUTES (30).
#   CHAOS_PROFILE=galera: the database is a three-node Galera cluster of its own instance
#     (CHAOS_RUN_DIR default .run/chaos-galera, nodes on CHAOS_GALERA_PORT 4316-4318; MariaDB
#     CHAOS_DB_PORT 3317 and Kafka 9292-9295 by default, so that a default run can go on beside
#     it): the routers reach the nodes through pkg/dbx's failover connector, the node they
#     write to is SIGKILLed three times (each rejoining before the next), router and Kafka
#     faults as in short; a fault-free phase on the single node and on the cluster first
#     (orders_per_s_single, orders_per_s_galera in the CHAOS line).
#   CHAOS_ARGS (extra flags of tools/chaos, e.g. "-inject all" to show the checker failing).
#   The router is the chaos build, tools/chaosrouter: the bundled plugins and the chaos-misbehaver
#   test plugin (tools/chaosrouter/chaosplugin.go), which the harness runs beside the coupon granter.
#   CHAOS_BROKEN=reconcile|inbox: build the router deliberately broken (-tags onceflow_broken_<kind>:
#     reconcile = the exactly-once relay skips its start-up reconcile; inbox = the claim never
#     finds the existing row), run the `broken` profile, and succeed only if the checker FAILS
#     with the violation the break must cause (duplicate-event, resp. inbox-grant-mismatch).
#   CHAOS_KEEP_INFRA=1: leave the chaos instance running at the end (default: stopped).
#   CHAOS_REV=<commit>: build the router from a clean export of that commit (git archive)
#     instead of the working tree, so that the run's figures belong to a known commit.
#
# The chaos instance (override with these variables, not with ONCEFLOW_*):
#   CHAOS_RUN_DIR (default .run/chaos-infra), CHAOS_DB_PORT (3307), CHAOS_PG_PORT (5433, with
#   DB=postgres), CHAOS_KAFKA_PORT (9192),
#   CHAOS_KAFKA_CONTROLLER_PORT (9193), CHAOS_KAFKA_CHAOS_PORT (9194: the broker's CHAOS
#   listener), CHAOS_KAFKA_PROXY_PORT (9195: where the harness's Kafka proxy listens and what
#   the CHAOS listener advertises).
# The last line of output is the CHAOS line; logs in .run/chaos/last/.
set -Eeuo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

galera=0
[[ "${CHAOS_PROFILE:-}" == galera ]] && galera=1
if [[ $galera == 1 ]]; then
  export INFRA_RUN_DIR="${CHAOS_RUN_DIR:-$ROOT/.run/chaos-galera}"
  export INFRA_DB_PORT="${CHAOS_DB_PORT:-3317}"
  export INFRA_KAFKA_PORT="${CHAOS_KAFKA_PORT:-9292}"
  export INFRA_KAFKA_CONTROLLER_PORT="${CHAOS_KAFKA_CONTROLLER_PORT:-9293}"
  export INFRA_KAFKA_CHAOS_PORT="${CHAOS_KAFKA_CHAOS_PORT:-9294}"
  export INFRA_KAFKA_CHAOS_ADVERTISED_PORT="${CHAOS_KAFKA_PROXY_PORT:-9295}"
  export INFRA_GALERA_PORT="${CHAOS_GALERA_PORT:-4316}"
else
  export INFRA_RUN_DIR="${CHAOS_RUN_DIR:-$ROOT/.run/chaos-infra}"
  export INFRA_DB_PORT="${CHAOS_DB_PORT:-3307}"
  export INFRA_KAFKA_PORT="${CHAOS_KAFKA_PORT:-9192}"
  export INFRA_KAFKA_CONTROLLER_PORT="${CHAOS_KAFKA_CONTROLLER_PORT:-9193}"
  export INFRA_KAFKA_CHAOS_PORT="${CHAOS_KAFKA_CHAOS_PORT:-9194}"
  export INFRA_KAFKA_CHAOS_ADVERTISED_PORT="${CHAOS_KAFKA_PROXY_PORT:-9195}"
fi
export KAFKA_HEAP_OPTS="${KAFKA_HEAP_OPTS:--Xms256m -Xmx768m}"
db_args=""
db_desc="mariadb :$INFRA_DB_PORT"
case "${DB:-mariadb}" in
  mariadb) ;;
  postgres)
    # infra.sh up/down/status include the PostgreSQL of a non-default instance when it names
    # its port (pg_wanted).
    export INFRA_PG_PORT="${CHAOS_PG_PORT:-5433}"
    db_args="-dialect postgres -db-addr 127.0.0.1:$INFRA_PG_PORT"
    db_desc="postgres :$INFRA_PG_PORT"
    ;;
  *)
    echo "chaos: DB=$DB: use mariadb or postgres" >&2
    exit 2
    ;;
esac
if [[ $galera == 1 ]]; then
  [[ "${DB:-mariadb}" == mariadb ]] || { echo "chaos: CHAOS_PROFILE=galera runs on MariaDB only (DB=$DB)" >&2; exit 2; }
  p=$INFRA_GALERA_PORT
  db_args="-db-addr 127.0.0.1:$p,127.0.0.1:$((p + 1)),127.0.0.1:$((p + 2)) -speed-single 127.0.0.1:$INFRA_DB_PORT"
  db_desc="galera :$p-$((p + 2)) (single node :$INFRA_DB_PORT for the speed comparison)"
fi
cluster_args=""
case "${CHAOS_PROFILE:-}" in
  cluster | soak)
    export INFRA_KAFKA_BROKERS=3
    export INFRA_CLUSTER_PORT="${CHAOS_CLUSTER_PORT:-29092}"
    export INFRA_CLUSTER_CONTROLLER_PORT="${CHAOS_CLUSTER_CONTROLLER_PORT:-29192}"
    unset INFRA_KAFKA_CHAOS_PORT INFRA_KAFKA_CHAOS_ADVERTISED_PORT
    cluster_args="-brokers 127.0.0.1:$INFRA_CLUSTER_PORT,127.0.0.1:$((INFRA_CLUSTER_PORT + 1)),127.0.0.1:$((INFRA_CLUSTER_PORT + 2))"
    ;;
esac
if [[ "$INFRA_DB_PORT" == 3306 || "${INFRA_PG_PORT:-}" == 5432 || "$INFRA_KAFKA_PORT" == 9092 || "${INFRA_GALERA_PORT:-}" == 4306 ]]; then
  echo "chaos: refusing to run against the shared services (3306 / 5432 / 9092 / galera 4306)" >&2
  exit 2
fi

at_exit() {
  if [[ "${CHAOS_KEEP_INFRA:-0}" == 1 ]]; then
    bash scripts/infra.sh up >/dev/null 2>&1 || echo "chaos: WARNING: scripts/infra.sh up (chaos instance) failed at exit" >&2
  else
    bash scripts/infra.sh down >/dev/null 2>&1 || echo "chaos: WARNING: scripts/infra.sh down (chaos instance) failed at exit" >&2
    if [[ $galera == 1 ]]; then
      bash scripts/infra.sh galera-down >/dev/null 2>&1 || echo "chaos: WARNING: scripts/infra.sh galera-down (chaos instance) failed at exit" >&2
    fi
  fi
}
trap at_exit EXIT
if [[ -n "$cluster_args" ]]; then
  echo "chaos: instance $INFRA_RUN_DIR: $db_desc, three-broker kafka cluster ${cluster_args#-brokers }"
else
  echo "chaos: instance $INFRA_RUN_DIR: $db_desc, kafka :$INFRA_KAFKA_PORT (CHAOS listener :$INFRA_KAFKA_CHAOS_PORT advertised as :$INFRA_KAFKA_CHAOS_ADVERTISED_PORT)"
fi
bash scripts/infra.sh up
[[ $galera == 0 ]] || bash scripts/infra.sh galera-up
mkdir -p .run/chaos
profile="${CHAOS_PROFILE:-short}"
router=.run/chaos/router # not bin/router: this build has the test plugin
expect=""
src="$ROOT"
if [[ -n "${CHAOS_REV:-}" ]]; then
  rev="$(git rev-parse --short "$CHAOS_REV^{commit}")"
  src="$ROOT/.run/chaos/src-$rev"
  rm -rf "$src"
  mkdir -p "$src"
  git archive "$rev" | tar -x -C "$src"
  router=".run/chaos/router-$rev"
  built="chaos: router built from commit $rev (clean export in $src)"
else
  built="chaos: router built from the working tree at $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . 2>/dev/null || echo ' plus uncommitted changes')"
fi
case "${CHAOS_BROKEN:-}" in
  "") (cd "$src/tools" && go build -o "$ROOT/$router" ./chaosrouter) ;;
  reconcile | inbox)
    router=".run/chaos/router-broken-$CHAOS_BROKEN"
    (cd "$src/tools" && go build -tags "onceflow_broken_$CHAOS_BROKEN" -o "$ROOT/$router" ./chaosrouter)
    profile="${CHAOS_PROFILE:-broken}"
    expect=duplicate-event
    if [[ "$CHAOS_BROKEN" == inbox ]]; then
      expect=inbox-grant-mismatch
      # The break is in the one-delivery claim (inbox.Process); group commit has its own.
      CHAOS_ARGS="${CHAOS_ARGS:-} -router-env ONCEFLOW_INBOX_BATCH_SIZE=1"
    fi
    echo "chaos: router built with -tags onceflow_broken_$CHAOS_BROKEN: the checker must report $expect"
    ;;
  *)
    echo "chaos: CHAOS_BROKEN=$CHAOS_BROKEN: use reconcile or inbox" >&2
    exit 2
    ;;
esac
go build -C tools -o ../.run/chaos/chaos ./chaos
set +e
# shellcheck disable=SC2086
.run/chaos/chaos -profile "$profile" -seed "${CHAOS_SEED:-1}" -router "$router" $db_args $cluster_args ${CHAOS_ARGS:-} 2>&1 | { echo "$built"; cat; } | tee .run/chaos/chaos.log
rc="${PIPESTATUS[0]}"
set -e
if [[ -z "$expect" ]]; then
  exit "$rc"
fi
line="$(grep '^CHAOS ' .run/chaos/chaos.log | tail -n 1)"
if [[ "$line" == "CHAOS FAIL"* && "$line" == *" $expect="* ]]; then
  echo "chaos-broken: PASS: the checker caught the broken build ($expect reported, exit $rc)"
  exit 0
fi
echo "chaos-broken: FAIL: against the build broken with onceflow_broken_$CHAOS_BROKEN the checker did not report $expect (exit $rc): ${line:-no CHAOS line}" >&2
exit 1
