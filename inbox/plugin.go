package inbox

import (
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/pkg/registry"
)

// Plugin declares a handler to the router binary.
type Plugin struct {
	Name          string   // unique, e.g. "coupon-granter"
	Topics        []string // topics consumed
	ConsumerGroup string   // Kafka consumer group
	BizType       string   // inbox biz type: one order is processed once per biz type
	KeyLogField   string   // the business key's name in log lines, e.g. "order_id" (default "dedup_key")
	// Writes returns the topics the plugin's events go to (the topics of the outbox events it
	// writes) under its configuration, which decodeConfig decodes as PluginEnv.DecodeConfig
	// does (topic names are often settings); nil when it writes none. `router run` checks at
	// start that they exist (relay.check_topics), rather than the relay parking every event
	// for a missing one. A plugin with fixed topics returns them:
	//
	//	Writes: func(func(any) error) ([]string, error) { return []string{"user-greeted"}, nil },
	Writes func(decodeConfig func(target any) error) ([]string, error)
	// Migrations are the plugin's own tables: goose SQL files (-- +goose Up / Down) at the
	// root of the FS, numbered by the plugin from 00001, usually embedded. `router migrate`
	// applies them after the framework's, recorded in a version table of the plugin's own
	// (goose_db_version_<name>, '-' as '_'), and `router migrate --reset` rolls them back
	// before the framework's. nil: the plugin has no tables.
	Migrations fs.FS
	// Build creates the handler once the router has its database and configuration.
	Build func(env PluginEnv) (Handler, error)
}

// PluginEnv is what a plugin's Build receives.
type PluginEnv struct {
	DB     *sql.DB
	Logger watermill.LoggerAdapter
	// DecodeConfig decodes the plugin's own configuration section
	// (plugins.<name> in router.yaml) into target, rejecting unknown keys.
	DecodeConfig func(target any) error
	// ObserveCall, when set, records one outside call of the plugin (metrics: call latency
	// per step). A plugin that makes slow calls reports each one.
	ObserveCall func(step string, elapsed time.Duration, err error)
}

// Validate checks a plugin declaration.
func (p Plugin) Validate() error {
	switch {
	case p.Name == "":
		return errors.New("plugin: empty name")
	case len(p.Topics) == 0:
		return fmt.Errorf("plugin %q: no topics", p.Name)
	case p.ConsumerGroup == "":
		return fmt.Errorf("plugin %q: no consumer group", p.Name)
	case p.BizType == "":
		return fmt.Errorf("plugin %q: no biz type", p.Name)
	case p.Build == nil:
		return fmt.Errorf("plugin %q: no Build function", p.Name)
	}
	return nil
}

// Plugins is the binary's global plugin registry. Tests use registry.New for isolation.
var Plugins = registry.New[Plugin]("plugin")

// MustRegister validates p and registers it in Plugins; for a plugin package's init().
// It panics on an invalid, empty or duplicate name.
func MustRegister(p Plugin) {
	RegisterIn(Plugins, p)
}

// RegisterIn validates p and registers it in r, panicking on failure.
func RegisterIn(r *registry.Registry[Plugin], p Plugin) {
	if err := p.Validate(); err != nil {
		panic(err)
	}
	r.MustRegister(p.Name, p)
}
