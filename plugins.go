package onceflow

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/registry"
	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// The keys of a plugins.<name> section that belong to the runtime, not to the plugin: a
// deployment's topics and consumer group for the plugin.
const (
	keyTopics        = "topics"
	keyConsumerGroup = "consumer_group"
)

// groupName: a consumer group id as this runtime accepts it (Kafka's topic characters).
var groupName = regexp.MustCompile(`^[A-Za-z0-9._-]{1,249}$`)

// plugin is a plugin as a deployment runs it: its declaration with the configured topics
// and consumer group, and its own configuration section without the reserved keys.
type plugin struct {
	inbox.Plugin
	section map[string]any
	command *inbox.Command // set for the plugin's HTTP command run as a plugin of its biz type (commandPlugins)
}

// decodeConfig decodes the plugin's own section into target (PluginEnv.DecodeConfig).
func (p plugin) decodeConfig(target any) error { return decodePluginConfig(p.Name, p.section, target) }

// resolvePlugin applies section (plugins.<name>, may be nil) to p: topics and
// consumer_group replace p's, checked; the rest is the plugin's own configuration.
func resolvePlugin(p inbox.Plugin, section map[string]any) (plugin, error) {
	if err := p.Validate(); err != nil {
		return plugin{}, badInput(err)
	}
	r := plugin{Plugin: p, section: map[string]any{}}
	r.Topics = append([]string(nil), p.Topics...)
	for k, v := range section {
		switch strings.ToLower(k) {
		case keyTopics:
			var topics []string
			dec, err := mapstructure.NewDecoder(&mapstructure.DecoderConfig{Result: &topics,
				DecodeHook: mapstructure.StringToSliceHookFunc(",")})
			if err == nil {
				err = dec.Decode(v)
			}
			if err != nil {
				return plugin{}, badInput(fmt.Errorf("config plugins.%s.topics: %s (a list of topic names)", p.Name, oneLine(err)))
			}
			if len(topics) == 0 {
				return plugin{}, badInput(fmt.Errorf("config plugins.%s.topics is empty", p.Name))
			}
			seen := map[string]bool{}
			for _, t := range topics {
				if err := kafkax.CheckTopicName(t); err != nil {
					return plugin{}, badInput(fmt.Errorf("config plugins.%s.topics: %w", p.Name, err))
				}
				if seen[t] {
					return plugin{}, badInput(fmt.Errorf("config plugins.%s.topics: %q twice", p.Name, t))
				}
				seen[t] = true
			}
			r.Topics = topics
		case keyConsumerGroup:
			g, ok := v.(string)
			if !ok || !groupName.MatchString(g) {
				return plugin{}, badInput(fmt.Errorf("config plugins.%s.consumer_group %q: 1..249 of [A-Za-z0-9._-]", p.Name, fmt.Sprint(v)))
			}
			r.ConsumerGroup = g
		default:
			r.section[k] = v
		}
	}
	return r, nil
}

// plugin resolves the registered plugin name under the configuration.
func (a *app) plugin(name string) (plugin, bool, error) {
	p, ok := a.plugins.Get(name)
	if !ok {
		return plugin{}, false, nil
	}
	r, err := resolvePlugin(p, a.cfg.Plugins[name])
	return r, true, err
}

// allPlugins resolves every registered plugin, in name order.
func (a *app) allPlugins() ([]plugin, error) {
	var out []plugin
	for _, n := range a.plugins.Names() {
		p, _, err := a.plugin(n)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// checkSections fails on configuration sections for plugins that are not registered (a
// typo must not be silently ignored).
func (a *app) checkSections() error {
	for name := range a.cfg.Plugins {
		if _, ok := a.plugins.Get(name); !ok {
			return badInput(fmt.Errorf("config plugins.%s: no such plugin (registered: %v)", name, a.plugins.Names()))
		}
	}
	return nil
}

// selectPlugins returns the plugins named in only (default: all registered), resolved,
// failing on unknown names and on configuration sections of unregistered plugins.
func (a *app) selectPlugins(only []string) ([]plugin, error) {
	if err := a.checkSections(); err != nil {
		return nil, err
	}
	names := only
	if len(names) == 0 {
		names = a.plugins.Names()
	}
	var out []plugin
	for _, n := range names {
		p, ok, err := a.plugin(n)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, badInput(fmt.Errorf("unknown plugin %q (registered: %v)", n, a.plugins.Names()))
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, badInput(errors.New("no plugins registered"))
	}
	return out, nil
}

// writes returns the topics p writes to under its configuration (nil without Writes).
func (p plugin) writes() ([]string, error) {
	if p.Writes == nil {
		return nil, nil
	}
	topics, err := p.Writes(p.decodeConfig)
	if err != nil {
		var ue usageError
		if errors.As(err, &ue) {
			return nil, err
		}
		return nil, badInput(fmt.Errorf("plugin %s: %w", p.Name, err))
	}
	return topics, nil
}

// migrationSets are the migrations of the registered plugins that have any, in name order:
// `router migrate` applies them in this order after the framework's and rolls them back in
// the reverse order before the framework's.
func migrationSets(r *registry.Registry[inbox.Plugin]) []migrations.Set {
	var sets []migrations.Set
	for _, n := range r.Names() {
		if p, _ := r.Get(n); p.Migrations != nil {
			sets = append(sets, migrations.Set{Name: p.Name, FS: p.Migrations})
		}
	}
	return sets
}

func (a *app) pluginsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "plugins",
		Short: "list the registered handler plugins as this configuration runs them (topics, group, biz type, topics written, migrations)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if err := a.checkSections(); err != nil {
				return err
			}
			ps, err := a.allPlugins()
			if err != nil {
				return err
			}
			const row = "%-20s %-24s %-18s %-10s %-40s %s\n"
			printf(row, "NAME", "TOPICS", "GROUP", "BIZ_TYPE", "WRITES", "MIGRATIONS")
			for _, p := range ps {
				writes, err := p.writes()
				if err != nil {
					return err
				}
				mig := "-"
				if p.Migrations != nil {
					mig = migrations.Set{Name: p.Name}.Table()
				}
				printf(row, p.Name, strings.Join(p.Topics, ","), p.ConsumerGroup, p.BizType, dash(strings.Join(writes, ",")), mig)
			}
			return nil
		},
	}
}
