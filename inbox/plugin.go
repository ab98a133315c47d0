package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"reflect"
	"regexp"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/onceflow/onceflow/internal/registry"
	"github.com/onceflow/onceflow/internal/settings"
)

// Plugin declares a handler to the runtime (package onceflow, the router binary). A
// plugin package registers it from init() with MustRegister; the binary that imports the
// package runs it.
//
// A deployment's configuration section plugins.<name> holds the plugin's own settings
// (Settings) and two keys the runtime reserves: topics (a list) and consumer_group, which
// replace Topics and ConsumerGroup for that deployment. A plugin's own settings cannot be
// named topics or consumer_group.
type Plugin struct {
	Name          string   // unique, e.g. "coupon-granter"; names the config section and the migrations' version table
	Topics        []string // topics consumed (default; plugins.<name>.topics overrides)
	ConsumerGroup string   // Kafka consumer group (default; plugins.<name>.consumer_group overrides)
	BizType       string   // inbox biz type: one order is processed once per biz type
	KeyLogField   string   // the business key's name in log lines, e.g. "order_id" (default "dedup_key")
	// Settings declares the plugin's own settings, plugins.<name>.<key>: the zero value (or
	// the defaults) of a struct whose fields carry the tags the runtime's own settings carry:
	//
	//	type Config struct {
	//		CreditedTopic string `key:"credited_topic" default:"points-credited" help:"topic of the PointsCredited events"`
	//		MaxPoints     int    `key:"max_points" default:"100000" range:"1..1000000" help:"a larger credit is poison"`
	//	}
	//
	// key names the setting, default is its value when the configuration leaves it out,
	// range bounds a number or a duration (inclusive), and help is its line in the
	// configuration table; the types are string, bool, int, int64, uint64, float64,
	// time.Duration and []string. Before anything connects, the runtime decodes the section,
	// with the variables ONCEFLOW_PLUGINS_<NAME>_<KEY> over the file, into a new value of
	// that type: the defaults first; an unknown key, a value of another type or out of its
	// range is refused by name (exit 2); then the type's Validate() error method, when it has
	// one, checks the settings that go together. Writes, Build and Verify get that value,
	// of the declared type. nil: the plugin has no settings, and any key of its section but
	// the reserved ones is refused.
	Settings any
	// Writes returns the topics the plugin's events go to (the topics of the outbox events it
	// writes) under its decoded settings (topic names are often settings); nil when it writes
	// none. `router run` checks at start that they exist (relay.check_topics), rather than
	// the relay parking every event for a missing one. A plugin with fixed topics returns
	// them:
	//
	//	Writes: func(any) ([]string, error) { return []string{"user-greeted"}, nil },
	Writes func(settings any) ([]string, error)
	// Migrations are the plugin's own tables: goose SQL files (-- +goose Up / Down) at the
	// root of the FS, numbered by the plugin from 00001, usually embedded. `router migrate`
	// applies them after the framework's, recorded in a version table of the plugin's own
	// (goose_db_version_<name>, '-' as '_'), and `router migrate --reset` rolls them back
	// before the framework's. nil: the plugin has no tables.
	Migrations fs.FS
	// Tables are the plugin's tables its handler needs: the runtime checks at start that the
	// application user can read them, so a missing `router migrate` is one clear error.
	Tables []string
	// Build creates the handler once the runtime has its database and configuration; ctx
	// ends when the runtime gives up starting. If the handler implements io.Closer, the
	// runtime calls Close once it no longer uses it: after the router stopped (`router run`),
	// or after the replay (`router replay`, `router inbox retry`).
	Build func(ctx context.Context, env PluginEnv) (Handler, error)
	// Commands are the plugin's HTTP commands (see Command), served on http.listen when it is
	// set: each with its own biz type, through the same inbox table and outbox as its Kafka
	// handler.
	Commands []Command

	// Verify, when set, audits the plugin's invariants for `router verify` (see VerifyEnv).
	Verify func(ctx context.Context, env VerifyEnv) (Verification, error)
	// History, when set, returns what the plugin recorded for a business key (its state
	// machine's transitions, say): the operator console shows it on the inbox row's page.
	History HistoryFunc
	// Sampler, when set, is the plugin's input for the load tool, `router produce`; one that
	// is also a Poisoner gives it the values Decode refuses too.
	Sampler Sampler
}

// Sampler makes the messages of a plugin for the load tool (`router produce`): the value of
// the seq-th distinct message of a load run, whose business key (and Kafka key) is key. A
// duplicate delivery is the same value sent again; rng (seeded by the run) varies the other
// fields.
type Sampler interface {
	Sample(key string, seq int, rng *rand.Rand) []byte
}

// Poisoner is implemented by a Sampler that knows values Decode refuses as poison (bad
// JSON, a missing field): `router produce --poison` sends them, and variants of them (under
// a key or headers that are not UTF-8, behind bytes that are not), among its other kinds of
// poison. prefix is the run's key prefix.
type Poisoner interface {
	Poison(prefix string) [][]byte
}

// PluginEnv is what a plugin's Build receives.
type PluginEnv struct {
	DB     *sql.DB
	Logger watermill.LoggerAdapter
	// Settings are the plugin's settings as the runtime decoded and checked them
	// (Plugin.Settings): a value of the declared type; nil when the plugin declares none.
	Settings any
	// ObserveCall, when set, records one outside call of the plugin (metrics: call latency
	// per step). A plugin that makes slow calls reports each one.
	ObserveCall func(step string, elapsed time.Duration, err error)
}

// tableName: the tables a plugin names reach SQL as identifiers.
var tableName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

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
	for _, c := range p.Commands {
		if err := c.Validate(); err != nil {
			return fmt.Errorf("plugin %q: %w", p.Name, err)
		}
		if c.BizType == p.BizType {
			return fmt.Errorf("plugin %q: command %s %s shares the plugin's biz type %q (its tokens need their own)", p.Name, c.Method, c.Path, c.BizType)
		}
	}
	for _, t := range p.Tables {
		if !tableName.MatchString(t) {
			return fmt.Errorf("plugin %q: table name %q is not a plain identifier", p.Name, t)
		}
	}
	if p.Settings != nil {
		if err := checkSettings(p.Settings); err != nil {
			return fmt.Errorf("plugin %q: %w", p.Name, err)
		}
	}
	return nil
}

// checkSettings checks a plugin's settings declaration: a struct (or a pointer to one)
// whose tags are well formed, no key the runtime reserves, and each setting at its zero
// value or its default.
func checkSettings(v any) error {
	list, err := settings.Parse(v)
	if err != nil {
		return err
	}
	rv := reflect.ValueOf(v)
	nilPointer := rv.Kind() == reflect.Pointer && rv.IsNil()
	for _, s := range list {
		if top, _, _ := strings.Cut(s.Key, "."); top == "topics" || top == "consumer_group" {
			return fmt.Errorf("settings: key %s is reserved: plugins.<name>.%s sets the plugin's %s", s.Key, top, top)
		}
		if nilPointer {
			continue
		}
		if x := s.Get(v); !reflect.ValueOf(x).IsZero() && !reflect.DeepEqual(x, s.Default) {
			return fmt.Errorf("settings: %s is %v, neither its zero value nor its default tag: declare a default with the tag", s.Key, x)
		}
	}
	return nil
}

// plugins are the binary's plugins: the packages it imports register them from init().
var plugins = registry.New[Plugin]("plugin")

// MustRegister validates p and registers it for the binary; for a plugin package's init().
// It panics on an invalid, empty or duplicate name.
func MustRegister(p Plugin) {
	registerIn(plugins, p)
}

// RegisteredPlugins returns the plugins registered with MustRegister, in name order.
func RegisteredPlugins() []Plugin {
	var out []Plugin
	for _, n := range plugins.Names() {
		p, _ := plugins.Get(n)
		out = append(out, p)
	}
	return out
}

// registerIn validates p and registers it in r, panicking on failure.
func registerIn(r *registry.Registry[Plugin], p Plugin) {
	if err := p.Validate(); err != nil {
		panic(err)
	}
	r.MustRegister(p.Name, p)
}
