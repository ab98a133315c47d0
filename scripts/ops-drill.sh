#!/usr/bin/env bash
# ops-drill: four incidents against two real routers and Debian's Prometheus with the shipped
# alert rules (tools/opsdrill): a downstream failing every call for 3 minutes, the relay lease
# holder frozen (SIGSTOP) for 2 minutes, 600 poison orders, the relay's output topic deleted.
# Prints per incident the alert that paged and the time to page, and ends with one DRILL line
# (`DRILL ok incidents=4 …` or `DRILL FAIL …`). About half an hour; not part of `make test`.
# Needs the services (bash scripts/infra.sh up); installs the prometheus package when missing
# (scripts/ops-test.sh install). Logs, configs and ledgers: .run/opsdrill/<run>/.
#   OPSDRILL_ARGS: extra flags of tools/opsdrill (e.g. "-incidents poison -keep").
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
bash scripts/ops-test.sh install
"$GO" build -buildvcs=auto -o bin/router ./cmd/router
"$GO" build -C tools -o ../bin/downstream ./downstream
"$GO" build -C tools -o ../bin/opsdrill ./opsdrill
# shellcheck disable=SC2086 # OPSDRILL_ARGS is a list of flags
exec bin/opsdrill -root . -router bin/router -downstream bin/downstream ${OPSDRILL_ARGS:-}
