// Package onceflow is the onceflow runtime as a library: the configuration (Config,
// DefaultConfig, LoadConfig), the pipeline's wiring and lifecycle as a list of parts (New,
// Runtime), the admin server with its operator console, the HTTP commands' listener, the
// outbox relay and tracing, and the plugins as a deployment runs them. Bad input — a setting,
// a DSN, a plugin's section it refuses before anything changes — is ErrBadInput.
//
// The router's command line is pkg/routercmd, over this package's Setup; the stock binary,
// cmd/router, is routercmd.Main with the bundled plugins. A program of one's own embeds the
// runtime with New:
//
//	cfg := onceflow.DefaultConfig()
//	cfg.DB.DSN, cfg.Kafka.Brokers = dsn, brokers
//	rt, err := onceflow.New(cfg, []inbox.Plugin{points.Plugin()}, logger)
//	if err != nil {
//		return err
//	}
//	return rt.Run(ctx) // until ctx is cancelled
package onceflow
