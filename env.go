package onceflow

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/settings"
)

// envPrefix starts every environment variable the router reads.
const envPrefix = "ONCEFLOW_"

// configEnv names the config file when --config does not.
const configEnv = envPrefix + "CONFIG"

// pluginsEnv starts the variable names of the plugins' settings, plugins.<name>.<key>.
const pluginsEnv = envPrefix + "PLUGINS"

// ownEnv are the variables the router reads that name no setting.
var ownEnv = []string{configEnv}

// envName is the environment variable of a key. It is ONCEFLOW_ followed by the key, in
// upper case, with each . and - as _.
func envName(key string) string {
	return envPrefix + strings.ToUpper(strings.NewReplacer(".", "_", "-", "_").Replace(key))
}

// settingEnv maps the environment variable of every setting to its key. The settings are
// the framework's and those the plugins declare as plugins.<name>.<key>.
func settingEnv(plugins []inbox.Plugin) map[string]string {
	m := map[string]string{}
	for _, s := range settings.List(Config{}) {
		m[envName(s.Key)] = s.Key
	}
	for _, p := range plugins {
		if p.Settings == nil {
			continue
		}
		for _, s := range settings.List(p.Settings) {
			key := pluginKey(p.Name, s.Key)
			m[envName(key)] = key
		}
	}
	return m
}

// checkEnv refuses the ONCEFLOW_ variables of environ that the router does not read.
// environ holds KEY=value entries, and the prefix may be in any case. The router reads
// ownEnv and known, which maps the variable of every setting as settingEnv does. Each
// refusal names the variable. For a near miss it also names the known name that the
// variable resembles. A refused variable under ONCEFLOW_PLUGINS_ names the plugin it would
// set, or lists the plugins when it names none.
func checkEnv(environ []string, known map[string]string, plugins []inbox.Plugin) error {
	names := slices.Clone(ownEnv)
	for n := range known {
		names = append(names, n)
	}
	var bad []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(strings.ToUpper(name), envPrefix) || known[name] != "" || slices.Contains(ownEnv, name) {
			continue
		}
		if upper := strings.ToUpper(name); upper == pluginsEnv || strings.HasPrefix(upper, pluginsEnv+"_") {
			bad = append(bad, pluginEnvRefusal(name, plugins))
			continue
		}
		msg := name + " is no setting of the router"
		if near := nearest(name, names); near != "" {
			msg += " (did you mean " + near + "?)"
		}
		bad = append(bad, msg)
	}
	if len(bad) == 0 {
		return nil
	}
	slices.Sort(bad)
	return BadInput(fmt.Errorf("environment: %s; the router reads %s and %s followed by a setting's key (README, Configuration)",
		strings.Join(bad, "; "), configEnv, envPrefix))
}

// pluginEnvRefusal says why name, a ONCEFLOW_PLUGINS_ variable, is not read. The variable
// may name topics or consumer_group, a plugin's keys that only the config file sets. It may
// name no setting of the plugin whose name it begins with. The longest such plugin name
// counts, and the refusal suggests the nearest of that plugin's variables. Or it may name
// no plugin of plugins at all.
func pluginEnvRefusal(name string, plugins []inbox.Plugin) string {
	upper := strings.ToUpper(name)
	var best *inbox.Plugin
	var all []string
	for i, p := range plugins {
		all = append(all, p.Name)
		if strings.HasPrefix(upper, envName("plugins."+p.Name)+"_") && (best == nil || len(p.Name) > len(best.Name)) {
			best = &plugins[i]
		}
	}
	if best == nil {
		return fmt.Sprintf("%s names no plugin's setting (registered plugins: %v)", name, all)
	}
	switch key := strings.ToLower(upper[len(envName("plugins."+best.Name))+1:]); key {
	case keyTopics, keyConsumerGroup:
		return fmt.Sprintf("%s: plugins.%s.%s is read from the config file only", name, best.Name, key)
	}
	var own []string
	if best.Settings != nil {
		for _, s := range settings.List(best.Settings) {
			own = append(own, envName(pluginKey(best.Name, s.Key)))
		}
	}
	msg := name + " is no setting of plugin " + best.Name
	if len(own) == 0 {
		msg += " (it has none)"
	} else if near := nearest(name, own); near != "" {
		msg += " (did you mean " + near + "?)"
	}
	return msg
}

// nearest lists the names among names closest to name, within a few edits. It ignores case
// and the ONCEFLOW_ prefix. Names of name's length come first, for a mistyped letter. The
// names are joined by " or ". nearest returns "" when no name is that close.
func nearest(name string, names []string) string {
	target := strings.TrimPrefix(strings.ToUpper(name), envPrefix)
	var best []string
	bestD := min(3, max(1, len(target)/4)) + 1
	for _, n := range names {
		switch d := editDistance(target, strings.TrimPrefix(strings.ToUpper(n), envPrefix)); {
		case d < bestD:
			best, bestD = []string{n}, d
		case d == bestD:
			best = append(best, n)
		}
	}
	slices.SortFunc(best, func(a, b string) int {
		if la, lb := len(a) == len(name), len(b) == len(name); la != lb {
			if la {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	return strings.Join(best, " or ")
}

// editDistance is the Levenshtein distance between a and b, counted in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// fromEnv names the setting variables of environ that may hold the value err refuses. known
// maps the variables as settingEnv does. The variables named are those whose key err names,
// or whose value err quotes. A value's comma-separated items count too. When no variable is
// named so, fromEnv names every one that is set, because a library's check need not name
// the key. A key whose flag was given is left out, because the flag's value is the one in
// effect.
func fromEnv(err error, environ []string, known map[string]string, flags *pflag.FlagSet, bind map[string]string) []string {
	msg := err.Error()
	var set, named []string
	for _, kv := range environ {
		name, value, _ := strings.Cut(kv, "=")
		key := known[name]
		if key == "" || value == "" {
			continue
		}
		if f := bind[key]; f != "" && flags != nil && flags.Changed(f) {
			continue
		}
		set = append(set, name)
		if mentions(msg, key) || quotes(msg, value) {
			named = append(named, name)
		}
	}
	if len(named) > 0 {
		set = named
	}
	slices.Sort(set)
	return set
}

// mentions reports whether msg names key as a whole. So relay.shards does not name
// relay.shard.
func mentions(msg, key string) bool {
	for i := 0; ; {
		j := strings.Index(msg[i:], key)
		if j < 0 {
			return false
		}
		end := i + j + len(key)
		if end == len(msg) || !isKeyByte(msg[end]) {
			return true
		}
		i = end
	}
}

// quotes reports whether msg holds value, or one of its comma-separated items, as %q writes
// it.
func quotes(msg, value string) bool {
	for _, item := range append([]string{value}, strings.Split(value, ",")...) {
		if item = strings.TrimSpace(item); item != "" && strings.Contains(msg, strconv.Quote(item)) {
			return true
		}
	}
	return false
}

func isKeyByte(c byte) bool {
	return c == '_' || c == '.' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
}

// configError is a refused configuration, on one line. It names file, which may be empty.
// It also names the setting variables of environ that may hold the refused value. known
// maps the variables as settingEnv does.
func configError(err error, file string, environ []string, known map[string]string, flags *pflag.FlagSet, bind map[string]string) error {
	where := "config"
	if file != "" {
		where += " " + file
	}
	if env := fromEnv(err, environ, known, flags, bind); len(env) > 0 {
		where += " (env " + strings.Join(env, ", ") + ")"
	}
	return BadInput(fmt.Errorf("%s: %w", where, err))
}
