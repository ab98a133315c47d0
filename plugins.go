package onceflow

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"github.com/go-viper/mapstructure/v2"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/inbox/inboxops"
	"github.com/onceflow/onceflow/internal/registry"
	"github.com/onceflow/onceflow/internal/settings"
	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// keyTopics and keyConsumerGroup are the keys of a plugins.<name> section that belong to
// the runtime, not to the plugin. They give the plugin a deployment's topics and consumer
// group.
const (
	keyTopics        = "topics"
	keyConsumerGroup = "consumer_group"
)

// groupName matches a consumer group id as this runtime accepts it, in Kafka's topic
// characters.
var groupName = regexp.MustCompile(`^[A-Za-z0-9._-]{1,249}$`)

// Plugin is a plugin as a deployment runs it. It is the plugin's declaration, an
// inbox.Plugin, with the topics and consumer group of its configuration section. Those are
// plugins.<name>.topics and plugins.<name>.consumer_group. Plugin also holds the plugin's
// settings, decoded from that section. Setup.Plugins returns a deployment's plugins.
type Plugin struct {
	inbox.Plugin
	settings any            // a value of the type of Plugin.Settings from decodeSettings, or nil
	command  *inbox.Command // set by commandPlugins for the plugin's HTTP command, run as a plugin of its biz type
}

// Settings is the plugin's settings under the configuration. The value has the type of
// inbox.Plugin.Settings, and is a pointer when that is one. Each setting is at its default
// unless plugins.<name>.<key> or its ONCEFLOW_ variable gives it another. Settings returns
// nil when the plugin declares no settings. The runtime hands the same value to the
// plugin's
// Writes, Build and Verify.
func (p Plugin) Settings() any { return p.settings }

// resolvePlugin applies section to p, as resolveSection does. Its errors begin with
// "config: ".
func resolvePlugin(p inbox.Plugin, section map[string]any) (Plugin, error) {
	r, err := resolveSection(p, section)
	if err != nil {
		return Plugin{}, BadInput(fmt.Errorf("config: %w", err))
	}
	return r, nil
}

// resolveSection applies section to p. The section is plugins.<name>, and may be nil. Its
// topics and consumer_group are checked, then replace p's. decodeSettings decodes the rest
// as p's settings. resolveSection connects to nothing. Its errors name the key,
// plugins.<name>.<key>, and are bad input.
func resolveSection(p inbox.Plugin, section map[string]any) (Plugin, error) {
	if err := p.Validate(); err != nil {
		return Plugin{}, BadInput(err)
	}
	r := Plugin{Plugin: p}
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
				return Plugin{}, BadInput(fmt.Errorf("plugins.%s.topics: %s (a list of topic names)", p.Name, oneLine(err)))
			}
			if len(topics) == 0 {
				return Plugin{}, BadInput(fmt.Errorf("plugins.%s.topics is empty", p.Name))
			}
			seen := map[string]bool{}
			for _, t := range topics {
				if err := kafkax.CheckTopicName(t); err != nil {
					return Plugin{}, BadInput(fmt.Errorf("plugins.%s.topics: %w", p.Name, err))
				}
				if seen[t] {
					return Plugin{}, BadInput(fmt.Errorf("plugins.%s.topics: %q twice", p.Name, t))
				}
				seen[t] = true
			}
			r.Topics = topics
		case keyConsumerGroup:
			g, ok := v.(string)
			if !ok || !groupName.MatchString(g) {
				return Plugin{}, BadInput(fmt.Errorf("plugins.%s.consumer_group %q: 1..249 of [A-Za-z0-9._-]", p.Name, fmt.Sprint(v)))
			}
			r.ConsumerGroup = g
		default:
			own[k] = v
		}
	}
	decoded, err := decodeSettings(p, own)
	if err != nil {
		return Plugin{}, BadInput(err)
	}
	r.settings = decoded
	return r, nil
}

// decodeSettings decodes raw into a new value of the type of p.Settings. raw is a
// plugins.<name> section without the reserved keys. Each setting starts at its default tag,
// and raw's values go over them. decodeSettings refuses a key that names no setting, and a
// value of the wrong type or out of its range. Each refusal names plugins.<name>.<key>.
// Then the type's Validate method, if it has one, checks the whole. The value is of the
// declared type, so it is a pointer when p.Settings is one. It is nil when p declares no
// settings.
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
			// mapstructure names a key in quotes at the start of each of its lines. The
			// prefix makes it the setting's full key, as the framework's settings are
			// named.
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

// unknownKeys are the keys of raw that name neither a setting of list nor a section holding
// some, in key order. Each is dotted and under prefix.
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

// pluginRegistry holds plugins by name. A plugin that inbox.Plugin.Validate refuses, or a
// name given twice, is an error.
func pluginRegistry(plugins []inbox.Plugin) (*registry.Registry[inbox.Plugin], error) {
	r := registry.New[inbox.Plugin]("plugin")
	for _, p := range plugins {
		if err := p.Validate(); err != nil {
			return nil, err
		}
		if err := r.Register(p.Name, p); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// declared are the binary's plugins as they declare themselves, in name order.
func (s *Setup) declared() []inbox.Plugin {
	var out []inbox.Plugin
	for _, n := range s.plugins.Names() {
		p, _ := s.plugins.Get(n)
		out = append(out, p)
	}
	return out
}

// PluginNames are the names of the binary's plugins, sorted.
func (s *Setup) PluginNames() []string { return s.plugins.Names() }

// Plugins returns the binary's plugins of the given names, or all of them in name order
// when no name is given. Each is resolved under its section of the configuration. A name of
// no plugin is bad input, and so is a section that its plugin refuses. Plugins leaves the
// sections of plugins the binary lacks to CheckSections.
func (s *Setup) Plugins(names ...string) ([]Plugin, error) {
	if len(names) == 0 {
		names = s.plugins.Names()
	}
	out := make([]Plugin, 0, len(names))
	for _, n := range names {
		p, ok := s.plugins.Get(n)
		if !ok {
			return nil, BadInput(fmt.Errorf("unknown plugin %q (registered: %v)", n, s.plugins.Names()))
		}
		r, err := resolvePlugin(p, s.Config.Plugins[n])
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// CheckSections refuses a section plugins.<name> of the configuration whose plugin the
// binary lacks. So a typo is not silently ignored. The refusal is bad input.
func (s *Setup) CheckSections() error {
	for name := range s.Config.Plugins {
		if _, ok := s.plugins.Get(name); !ok {
			return BadInput(fmt.Errorf("config plugins.%s: no such plugin (registered: %v)", name, s.plugins.Names()))
		}
	}
	return nil
}

// WrittenTopics are the topics the plugin writes its events to under its settings, as
// inbox.Plugin.Writes returns them. They are nil when the plugin declares no Writes. The
// errors are bad input.
func (p Plugin) WrittenTopics() ([]string, error) {
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

// Migrations are the migrations of the binary's plugins that have any, in name order.
// `router migrate` applies them in this order, after the framework's migrations.FS. It
// rolls them back in the reverse order, before the framework's.
func (s *Setup) Migrations() []migrations.Set { return migrationSets(s.plugins) }

// migrationSets are the migrations of r's plugins that have any, in name order.
func migrationSets(r *registry.Registry[inbox.Plugin]) []migrations.Set {
	var sets []migrations.Set
	for _, n := range r.Names() {
		if p, _ := r.Get(n); p.Migrations != nil {
			sets = append(sets, migrations.Set{Name: p.Name, FS: p.Migrations})
		}
	}
	return sets
}

// bizTypes returns the registered biz types and their plugins, resolved.
func (s *Setup) bizTypes() (map[string][]Plugin, error) {
	ps, err := s.Plugins()
	if err != nil {
		return nil, err
	}
	out := map[string][]Plugin{}
	for _, p := range append(ps, commandPlugins(ps)...) {
		out[p.BizType] = append(out[p.BizType], p)
	}
	return out, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// BizTypes are the biz types of the binary's plugins and of their HTTP commands, sorted. A
// replay can run the inbox rows of these biz types. A section that its plugin refuses is
// bad input.
func (s *Setup) BizTypes() ([]string, error) {
	all, err := s.bizTypes()
	if err != nil {
		return nil, err
	}
	return sortedKeys(all), nil
}

// pluginFor resolves the plugin whose handler replays f's rows. It takes the biz type of
// --biz-type, else the only registered biz type, else the only biz type among the matching
// rows.
func (s *Setup) pluginFor(ctx context.Context, store *inboxops.Store, f *inboxops.Filter) (Plugin, error) {
	all, err := s.bizTypes()
	if err != nil {
		return Plugin{}, err
	}
	if f.BizType == "" {
		switch keys := sortedKeys(all); {
		case len(keys) == 1:
			f.BizType = keys[0]
		default:
			var found []string
			for _, bt := range keys {
				g := *f
				g.BizType, g.Limit = bt, 1
				n, err := store.Count(ctx, g)
				if err != nil {
					return Plugin{}, err
				}
				if n > 0 {
					found = append(found, bt)
				}
			}
			switch len(found) {
			case 0:
				return Plugin{}, BadInput(fmt.Errorf("--biz-type is required: no matching row to infer it from (registered: %s)", strings.Join(keys, ", ")))
			case 1:
			default:
				return Plugin{}, BadInput(fmt.Errorf("--biz-type is required: rows of %s match", strings.Join(found, " and ")))
			}
			f.BizType = found[0]
		}
	}
	ps, ok := all[f.BizType]
	if !ok {
		return Plugin{}, BadInput(fmt.Errorf("unknown biz type %q (registered: %s)", f.BizType, strings.Join(sortedKeys(all), ", ")))
	}
	if len(ps) > 1 {
		return Plugin{}, BadInput(fmt.Errorf("biz type %q is shared by %d plugins; replay cannot choose a handler", f.BizType, len(ps)))
	}
	return ps[0], nil
}

// ReplayInbox builds the inbox on db whose handler replays the rows f selects. It is the
// inbox of the plugin of f.BizType. When f names no biz type, it is the inbox of the
// binary's only biz type, else of the only biz type among the rows that match, and
// ReplayInbox sets f.BizType to it. It is the handler path of a live delivery. `router
// replay`, `router inbox retry` and the console run inboxops.Replay on it. A biz type
// ReplayInbox cannot choose, or one shared by two plugins, is bad input. The returned func
// closes the plugin's handler. Call it once the replay is over.
func (s *Setup) ReplayInbox(ctx context.Context, db *sql.DB, f *inboxops.Filter) (*engine.Inbox, func(), error) {
	store, err := inboxops.NewStore(db, "inbox")
	if err != nil {
		return nil, nil, err
	}
	p, err := s.pluginFor(ctx, store, f)
	if err != nil {
		return nil, nil, err
	}
	return s.buildInbox(ctx, db, p, nil)
}
