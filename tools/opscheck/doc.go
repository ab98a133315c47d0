// Package opscheck checks deploy/prometheus and deploy/grafana against a running router:
// Debian's Prometheus scrapes a router (bin/router, its own database and topics) fed orders
// that succeed, fail and repeat, loads the alert rules, and answers every query of every
// dashboard panel. Run by `make ops-test` (scripts/ops-test.sh).
package opscheck
