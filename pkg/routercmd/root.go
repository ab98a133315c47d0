package routercmd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/registry"
)

// app is what every subcommand works with. It holds the binary's plugins. Once the root
// command's PersistentPreRunE has read the configuration, it holds the runtime's Setup of
// it too.
type app struct {
	*onceflow.Setup // nil until the configuration is read, and `router version` reads none

	configFile string         // --config
	plugins    []inbox.Plugin // the binary's plugins, inbox.RegisteredPlugins unless WithPlugins sets others
}

// Option configures Run.
type Option func(*app)

// WithPlugins makes Run use plugins instead of those registered with inbox.MustRegister. A
// test runs the command line with plugins of its own this way, as a binary with other
// imports would. WithPlugins panics on an invalid plugin or a name given twice, as
// inbox.MustRegister does.
func WithPlugins(plugins ...inbox.Plugin) Option {
	ps := checkPlugins(plugins)
	return func(a *app) { a.plugins = ps }
}

// checkPlugins returns plugins in name order, panicking on an invalid plugin or a name given
// twice.
func checkPlugins(plugins []inbox.Plugin) []inbox.Plugin {
	r := registry.New[inbox.Plugin]("plugin")
	for _, p := range plugins {
		if err := p.Validate(); err != nil {
			panic(err)
		}
		r.MustRegister(p.Name, p)
	}
	out := make([]inbox.Plugin, 0, len(plugins))
	for _, n := range r.Names() {
		p, _ := r.Get(n)
		out = append(out, p)
	}
	return out
}

// commonBindings maps configuration keys to the persistent flags that override them.
var commonBindings = map[string]string{
	"db.dsn":        "dsn",
	"kafka.brokers": "brokers",
	"log.level":     "log-level",
}

// Run runs the router command line on args, which leave out the program name. It returns
// the error that Main would report. ExitCode maps the error to an exit code.
func Run(ctx context.Context, args []string, opts ...Option) error {
	a := &app{plugins: checkPlugins(inbox.RegisteredPlugins())}
	for _, o := range opts {
		o(a)
	}
	root := &cobra.Command{
		Use:           "router",
		Short:         "onceflow router: exactly-once effects for Kafka consumers",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			s, err := onceflow.LoadSetup(onceflow.Source{File: a.configFile, Flags: cmd.Flags(), FlagKeys: commonBindings}, a.plugins)
			if err != nil {
				return err
			}
			a.Setup = s
			return nil
		},
	}
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return badInput(err) })
	pf := root.PersistentFlags()
	pf.StringVar(&a.configFile, "config", "", "config file (default configs/router.yaml if present; env ONCEFLOW_CONFIG)")
	pf.String("dsn", "", "application database DSN (overrides db.dsn)")
	pf.StringSlice("brokers", nil, "Kafka brokers (overrides kafka.brokers)")
	pf.String("log-level", "", "log level (overrides log.level)")

	root.AddCommand(a.runCmd(), a.relayCmd(), a.migrateCmd(), a.produceCmd(), a.verifyCmd(), a.pluginsCmd(), a.replayCmd(), a.inboxCmd(), a.outboxCmd(), a.topicsCmd(), a.configCmd(), a.versionCmd())
	typeArgErrors(root)
	root.SetArgs(args)
	if _, _, err := root.Find(args); err != nil {
		return badInput(err) // an unknown command
	}
	_, err := root.ExecuteContextC(ctx)
	return err
}

// typeArgErrors makes the errors of the argument checks of cmd and its subcommands bad
// input. Such an error is a wrong number of arguments or a bad value. It exits with code 2,
// as a flag error does through SetFlagErrorFunc.
func typeArgErrors(cmd *cobra.Command) {
	if check := cmd.Args; check != nil {
		cmd.Args = func(c *cobra.Command, args []string) error { return badInput(check(c, args)) }
	}
	for _, sub := range cmd.Commands() {
		typeArgErrors(sub)
	}
}

// selectPlugins returns the plugins named in only, resolved. An empty only selects every
// plugin of the binary. selectPlugins fails on an unknown name, on a configuration section
// of a plugin the binary lacks, and when there is no plugin.
func (a *app) selectPlugins(only []string) ([]onceflow.Plugin, error) {
	if err := a.CheckSections(); err != nil {
		return nil, err
	}
	out, err := a.Plugins(only...)
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, badInput(errors.New("no plugins registered"))
	}
	return out, nil
}

// bizTypesOf are the biz types of plugins and of their HTTP commands, in that order, each once.
func bizTypesOf(plugins []onceflow.Plugin) []string {
	var out []string
	add := func(bt string) {
		if !slices.Contains(out, bt) {
			out = append(out, bt)
		}
	}
	for _, p := range plugins {
		add(p.BizType)
	}
	for _, p := range plugins {
		for _, c := range p.Commands {
			add(c.BizType)
		}
	}
	return out
}

func printf(format string, args ...any) { fmt.Fprintf(os.Stdout, format, args...) }
