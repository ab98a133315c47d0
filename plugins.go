package onceflow

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/registry"
	"github.com/onceflow/onceflow/internal/settings"
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
// and consumer group, and its settings decoded from its configuration section.
type plugin struct {
	inbox.Plugin
	settings any            // a value of the type of Plugin.Settings (decodeSettings); nil without
	command  *inbox.Command // set for the plugin's HTTP command run as a plugin of its biz type (commandPlugins)
}

// resolvePlugin applies section (plugins.<name>, may be nil) to p, as resolveSection does;
// its errors begin with "config: ".
func resolvePlugin(p inbox.Plugin, section map[string]any) (plugin, error) {
	r, err := resolveSection(p, section)
	if err != nil {
		return plugin{}, BadInput(fmt.Errorf("config: %w", err))
	}
	return r, nil
}

// resolveSection applies section (plugins.<name>, may be nil) to p: topics and
// consumer_group replace p's, checked; the rest are p's settings (decodeSettings). It
// connects to nothing; its errors name the key (plugins.<name>.<key>) and are bad input.
func resolveSection(p inbox.Plugin, section map[string]any) (plugin, error) {
	if err := p.Validate(); err != nil {
		return plugin{}, BadInput(err)
	}
	r := plugin{Plugin: p}
	r.Topics = append([]string(nil), p.Topics...)
	own := map[string]any{}
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
				return plugin{}, BadInput(fmt.Errorf("plugins.%s.topics: %s (a list of topic names)", p.Name, oneLine(err)))
			}
			if len(topics) == 0 {
				return plugin{}, BadInput(fmt.Errorf("plugins.%s.topics is empty", p.Name))
			}
			seen := map[string]bool{}
			for _, t := range topics {
				if err := kafkax.CheckTopicName(t); err != nil {
					return plugin{}, BadInput(fmt.Errorf("plugins.%s.topics: %w", p.Name, err))
				}
				if seen[t] {
					return plugin{}, BadInput(fmt.Errorf("plugins.%s.topics: %q twice", p.Name, t))
				}
				seen[t] = true
			}
			r.Topics = topics
		case keyConsumerGroup:
			g, ok := v.(string)
			if !ok || !groupName.MatchString(g) {
				return plugin{}, BadInput(fmt.Errorf("plugins.%s.consumer_group %q: 1..249 of [A-Za-z0-9._-]", p.Name, fmt.Sprint(v)))
			}
			r.ConsumerGroup = g
		default:
			own[k] = v
		}
	}
	decoded, err := decodeSettings(p, own)
	if err != nil {
		return plugin{}, BadInput(err)
	}
	r.settings = decoded
	return r, nil
}

// decodeSettings decodes raw, a plugins.<name> section without the reserved keys, into a
// new value of the type of p.Settings: each setting at its default tag, then raw's values
// over them; a key that names no setting, a value of the wrong type or out of its range is
// refused naming plugins.<name>.<key>, and then the type's Validate method, if it has one,
// checks the whole. The value is of the declared type (a pointer when p.Settings is one);
// nil when p declares no settings.
func decodeSettings(p inbox.Plugin, raw map[string]any) (any, error) {
	prefix := "plugins." + p.Name + "."
	var list []settings.Setting
	if p.Settings != nil {
		list = settings.List(p.Settings)
	}
	if unknown := unknownKeys(raw, list, ""); len(unknown) > 0 {
		var names []string
		for _, s := range list {
			names = append(names, s.Key)
		}
		var msgs []string
		for _, k := range unknown {
			msg := prefix + k + " is no setting of plugin " + p.Name
			if len(names) == 0 {
				msg += " (it has none)"
			} else if near := nearest(k, names); near != "" {
				msg += " (did you mean " + prefix + near + "?)"
			}
			msgs = append(msgs, msg)
		}
		return nil, errors.New(strings.Join(msgs, "; "))
	}
	if p.Settings == nil {
		return nil, nil
	}
	t := reflect.TypeOf(p.Settings)
	pointer := t.Kind() == reflect.Pointer
	if pointer {
		t = t.Elem()
	}
	v := reflect.New(t)
	settings.SetDefaults(v.Interface())
	if len(raw) > 0 {
		dec, err := mapstructure.NewDecoder(&mapstructure.DecoderConfig{
			Result: v.Interface(), TagName: "key", IgnoreUntaggedFields: true, ErrorUnused: true, WeaklyTypedInput: true,
			DecodeHook: mapstructure.ComposeDecodeHookFunc(strictDuration, mapstructure.StringToSliceHookFunc(",")),
		})
		if err != nil {
			return nil, err
		}
		if err := dec.Decode(raw); err != nil {
			// mapstructure names a key in quotes at the start of each of its lines: the
			// setting's full key, as the framework's settings are named.
			return nil, errors.New(oneLine(errors.New(strings.ReplaceAll("\n"+err.Error(), "\n'", "\n'"+prefix))))
		}
	}
	settings.Resolve(v.Interface())
	if err := settings.Check(v.Interface()); err != nil {
		return nil, fmt.Errorf("%s%w", prefix, err)
	}
	if c, ok := v.Interface().(interface{ Validate() error }); ok {
		if err := c.Validate(); err != nil {
			return nil, fmt.Errorf("plugins.%s: %w", p.Name, err)
		}
	}
	if pointer {
		return v.Interface(), nil
	}
	return v.Elem().Interface(), nil
}

// unknownKeys are the keys of raw (under prefix, dotted) that name neither a setting of list
// nor a section holding some, in key order.
func unknownKeys(raw map[string]any, list []settings.Setting, prefix string) []string {
	var out []string
	for k, v := range raw {
		key := prefix + strings.ToLower(k)
		known, section := false, false
		for _, s := range list {
			known = known || s.Key == key
			section = section || strings.HasPrefix(s.Key, key+".")
		}
		switch sub, isMap := v.(map[string]any); {
		case known:
		case section && isMap:
			out = append(out, unknownKeys(sub, list, key+".")...)
		default:
			out = append(out, key)
		}
	}
	slices.Sort(out)
	return out
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

// declared are the binary's plugins as they declare themselves, in name order.
func (a *app) declared() []inbox.Plugin {
	var out []inbox.Plugin
	for _, n := range a.plugins.Names() {
		p, _ := a.plugins.Get(n)
		out = append(out, p)
	}
	return out
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
			return BadInput(fmt.Errorf("config plugins.%s: no such plugin (registered: %v)", name, a.plugins.Names()))
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
			return nil, BadInput(fmt.Errorf("unknown plugin %q (registered: %v)", n, a.plugins.Names()))
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, BadInput(errors.New("no plugins registered"))
	}
	return out, nil
}

// writes returns the topics p writes to under its settings (nil without Writes).
func (p plugin) writes() ([]string, error) {
	if p.Writes == nil {
		return nil, nil
	}
	topics, err := p.Writes(p.settings)
	if err != nil {
		if errors.Is(err, ErrBadInput) {
			return nil, err
		}
		return nil, BadInput(fmt.Errorf("plugin %s: %w", p.Name, err))
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
