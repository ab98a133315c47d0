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

// Plugin declares a handler to the runtime, which is package onceflow and the router
// binary. A plugin package registers its Plugin from its init function with
// MustRegister. The binary that imports the package runs it.
//
// A deployment's configuration section plugins.<name> holds the plugin's own Settings. It
// also holds two keys the runtime reserves, the list topics and consumer_group. They
// replace Topics and ConsumerGroup for that deployment. A plugin's own settings cannot be
// named topics or consumer_group.
type Plugin struct {
	Name          string   // unique, such as "coupon-granter", naming the config section and the migrations' version table
	Topics        []string // topics consumed by default, overridden by plugins.<name>.topics
	ConsumerGroup string   // Kafka consumer group by default, overridden by plugins.<name>.consumer_group
	BizType       string   // inbox biz type, so one order is processed once per biz type
	KeyLogField   string   // the business key's name in log lines, such as "order_id", by default "dedup_key"
	// Settings declares the plugin's own settings, plugins.<name>.<key>. It holds the zero
	// value, or the defaults, of a struct. The struct's fields carry the tags the runtime's
	// own settings carry.
	//
	//	type Config struct {
	//		CreditedTopic string `key:"credited_topic" default:"points-credited" help:"topic of the PointsCredited events"`
	//		MaxPoints     int    `key:"max_points" default:"100000" range:"1..1000000" help:"a larger credit is poison"`
	//	}
	//
	// The key tag names the setting. The default tag is its value when the configuration
	// leaves it out. The range tag bounds a number or a duration, inclusive. The help tag
	// is its line in the configuration table. A setting is a string, bool, int, int64,
	// uint64, float64, time.Duration or []string.
	//
	// Before anything connects, the runtime decodes the section into a new value of that
	// type. The variables ONCEFLOW_PLUGINS_<NAME>_<KEY> take precedence over the file. The
	// defaults come first. An unknown key, a value of another type or a value out of its
	// range is refused by name, and the router exits with status 2. Then the type's
	// Validate method, if it has one, checks the settings that go together. Its signature
	// is Validate() error. Writes, Build and Verify get the decoded value, of the declared
	// type. A nil Settings means the plugin has no settings. Any key of its section but the
	// reserved ones is then refused.
	Settings any
	// Writes returns the topics of the outbox events the plugin writes, under its decoded
	// settings. Topic names are often settings. Writes returns nil when the plugin writes no
	// events. `router run` checks at start that the topics exist, under
	// relay.check_topics. Otherwise the relay would park every event for a missing topic. A
	// plugin with fixed topics returns them.
	//
	//	Writes: func(any) ([]string, error) { return []string{"user-greeted"}, nil },
	Writes func(settings any) ([]string, error)
	// Migrations create the plugin's own tables. They are goose SQL files with
	// "-- +goose Up" and "-- +goose Down" sections, at the root of the FS. The plugin
	// numbers them from 00001, and usually embeds them. `router migrate` applies them after
	// the framework's. It records them in a version table of the plugin's own, named
	// goose_db_version_<name> with '-' written as '_'. `router migrate --reset` rolls them
	// back before the framework's. A nil Migrations means the plugin has no tables.
	Migrations fs.FS
	// Tables are the plugin's tables that its handler needs. The runtime checks at start
	// that the application user can read them. So a missing `router migrate` is one clear
	// error.
	Tables []string
	// Build creates the handler once the runtime has its database and configuration. ctx
	// ends when the runtime gives up starting. If the handler implements io.Closer, the
	// runtime calls Close once it no longer uses the handler. For `router run` that is
	// after the router stopped. For `router replay` and `router inbox retry` it is after the
	// replay.
	Build func(ctx context.Context, env PluginEnv) (Handler, error)
	// Commands are the plugin's HTTP commands, served on http.listen when it is set. Each
	// has its own biz type, and goes through the same inbox table and outbox as the plugin's
	// Kafka handler. See Command.
	Commands []Command

	// Verify, when set, audits the plugin's invariants for `router verify`. See VerifyEnv.
	Verify func(ctx context.Context, env VerifyEnv) (Verification, error)
	// History, when set, returns what the plugin recorded for a business key, such as its
	// state machine's transitions. The operator console shows it on the inbox row's page.
	History HistoryFunc
	// Sampler, when set, is the plugin's input for the load tool, `router produce`. A
	// Sampler that is also a Poisoner gives the tool the values Decode refuses too.
	Sampler Sampler
}

// Sampler makes the messages of a plugin for the load tool, `router produce`. Sample
// returns the value of the seq-th distinct message of a load run. key is the message's
// business key and its Kafka key. A duplicate delivery is the same value sent again. rng,
// seeded by the run, varies the other fields.
type Sampler interface {
	Sample(key string, seq int, rng *rand.Rand) []byte
}

// Poisoner is implemented by a Sampler that knows values Decode refuses as poison, such as
// bad JSON or a missing field. `router produce --poison` sends them among its other kinds
// of poison. It also sends variants of them, under a key or headers that are not UTF-8, or
// behind bytes that are not. prefix is the run's key prefix.
type Poisoner interface {
	Poison(prefix string) [][]byte
}

// PluginEnv is what a plugin's Build receives.
type PluginEnv struct {
	DB     *sql.DB
	Logger watermill.LoggerAdapter
	// Settings are the plugin's settings as the runtime decoded and checked them. The
	// value has the type Plugin.Settings declared. It is nil when the plugin declares none.
	Settings any
	// ObserveCall, when set, records one outside call of the plugin in the call latency
	// metrics of each step. A plugin that makes slow calls reports each one.
	ObserveCall func(step string, elapsed time.Duration, err error)
}

// tableName matches a plain identifier. The tables a plugin names reach SQL as
// identifiers.
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

// checkSettings checks a plugin's settings declaration. It must be a struct, or a pointer
// to one, whose tags are well formed. No key may be one the runtime reserves. Each setting
// must hold its zero value or its default.
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

// plugins are the binary's plugins. The packages it imports register them from their init
// functions.
var plugins = registry.New[Plugin]("plugin")

// MustRegister validates p and registers it for the binary. A plugin package calls it from
// its init function. It panics on an invalid declaration and on an empty or duplicate
// name.
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
