// Package onceflow is the onceflow runtime as a library. Config holds the configuration,
// and DefaultConfig and LoadConfig build one. New returns a Runtime, whose Run starts the
// pipeline and stops it in order. Besides the plugins' consumers, a Runtime runs the outbox
// relay, the inbox cleaner and tracing. When their listeners are set, it also serves the
// admin endpoints with the operator console, and the plugins' HTTP commands. A Plugin is a
// plugin as a deployment runs it. The runtime refuses bad input, such as a setting, a DSN
// or a plugin's section, before anything changes. Every such error matches ErrBadInput.
//
// The router's command line is package pkg/routercmd, built on Setup. The stock binary,
// cmd/router, is routercmd.Main with the bundled plugins. A program of its own embeds the
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
