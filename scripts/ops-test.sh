#!/usr/bin/env bash
# ops-test: the alert rules and the dashboard (deploy/prometheus, deploy/grafana) checked
# with Debian's Prometheus: `promtool check rules`, `promtool test rules`, `promtool check
# config` on the example scrape config, then tools/opscheck (a router and a Prometheus
# scraping it, every dashboard query evaluated). Installs the prometheus package (which
# ships promtool) when missing, without starting its service.
#   bash scripts/ops-test.sh [install|rules|dashboard|all]   (default all)
# OFTEST_OPSCHECK_EXPECT_MISSING: metric names whose panels may return nothing (comma-separated).
set -euo pipefail
cd "$(dirname "$0")/.."

GO=${GO:-go}
what=${1:-all}

install() {
  if command -v prometheus >/dev/null && command -v promtool >/dev/null; then
    return 0
  fi
  echo "ops-test: installing prometheus (apt-get)"
  if [ "$(id -u)" != 0 ]; then echo "ops-test: prometheus/promtool missing and this is not root: apt-get install prometheus" >&2; exit 1; fi
  # The package's own service is neither wanted nor started: a policy-rc.d keeps the
  # install from starting it.
  local policy=/usr/sbin/policy-rc.d had_policy=1
  if [ ! -e "$policy" ]; then
    had_policy=0
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy"
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o Dpkg::Use-Pty=0 --no-install-recommends prometheus >/dev/null
  [ "$had_policy" = 1 ] || rm -f "$policy"
  command -v prometheus >/dev/null && command -v promtool >/dev/null ||
    { echo "ops-test: apt-get install prometheus left no prometheus or promtool on the PATH" >&2; exit 1; }
}

rules() {
  promtool check rules deploy/prometheus/onceflow-alerts.yml
  promtool test rules deploy/prometheus/onceflow-alerts_test.yml
  promtool check config --syntax-only deploy/prometheus/prometheus.yml
}

dashboard() {
  "$GO" build -buildvcs=auto -o bin/router ./cmd/router
  OFTEST_ROUTER_BIN="$PWD/bin/router" "$GO" test -C tools -count=1 -v -timeout 10m ./opscheck/
}

case "$what" in
install) install ;;
rules) install; rules ;;
dashboard) install; dashboard ;;
all) install; rules; dashboard ;;
*) echo "usage: $0 [install|rules|dashboard|all]" >&2; exit 2 ;;
esac
echo "ops-test: ok ($what)"
