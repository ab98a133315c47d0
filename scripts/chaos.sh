#!/usr/bin/env bash
# make chaos: the chaos harness (cmd/chaos) on the real MariaDB and Kafka.
#   CHAOS_PROFILE=short|long (default short, ~3 min; long ~12 min), CHAOS_SEED (default 1),
#   CHAOS_ARGS (extra flags, e.g. "-inject all" to show the checker failing).
# It restarts MariaDB and Kafka on purpose (scripts/infra.sh db-stop/kafka-stop ...): do not
# run it while other tests use the services. The services are brought back up at the end,
# whatever happened. The last line of output is the CHAOS line; logs in .run/chaos/last/.
set -Eeuo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
trap 'bash scripts/infra.sh up >/dev/null 2>&1 || echo "chaos: WARNING: scripts/infra.sh up failed at exit" >&2' EXIT
bash scripts/infra.sh up
go build -o bin/router ./cmd/router
mkdir -p .run/chaos
go build -o .run/chaos/chaos ./cmd/chaos
# shellcheck disable=SC2086
.run/chaos/chaos -profile "${CHAOS_PROFILE:-short}" -seed "${CHAOS_SEED:-1}" ${CHAOS_ARGS:-} 2>&1 | tee .run/chaos/chaos.log
exit "${PIPESTATUS[0]}"
