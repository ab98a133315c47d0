package onceflowcmd

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/pkg/health"
	"github.com/onceflow/onceflow/pkg/kafkax"
	"github.com/onceflow/onceflow/pkg/metrics"
)

// readiness paces /readyz's background checks: each check runs every Interval, at most
// one call at a time, each call bounded by Timeout.
var readiness = health.Config{Interval: 5 * time.Second, Timeout: 3 * time.Second}

// startAdmin serves /healthz, /readyz and /metrics on a dedicated mux. /readyz answers from
// the latest results of background checks of MariaDB and Kafka (health.Checker), never
// from a check of its own: a request costs no connection and cannot hang on a broker that
// accepts connections and never answers. The returned func stops the server and the checks.
func (a *app) startAdmin(ctx context.Context, db *sql.DB, kc kafkax.Config, m *metrics.Metrics) (func(), error) {
	if a.cfg.Admin.Listen == "" {
		return func() {}, nil
	}
	ready, err := health.New(readiness, a.logger,
		health.Check{Name: "mariadb", Func: db.PingContext},
		health.Check{Name: "kafka", Func: kc.Probe})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.Handle("/readyz", ready)
	mux.Handle("/metrics", m.Handler())
	ln, err := net.Listen("tcp", a.cfg.Admin.Listen)
	if err != nil {
		return nil, badInput(fmt.Errorf("admin.listen %s: %w (set admin.listen to a free port, or empty to disable)", a.cfg.Admin.Listen, err))
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	checkCtx, stopChecks := context.WithCancel(ctx)
	checksDone := make(chan struct{})
	go func() { defer close(checksDone); ready.Run(checkCtx) }()
	a.logger.Info("admin listener", watermill.LogFields{"addr": ln.Addr().String()})
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		stopChecks()
		<-checksDone
	}, nil
}
