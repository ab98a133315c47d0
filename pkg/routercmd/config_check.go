package routercmd

import (
	"strings"

	"github.com/spf13/cobra"
)

func (a *app) configCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "check the configuration (check)",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(a.configCheckCmd())
	return cmd
}

func (a *app) configCheckCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "check",
		Short: "check the configuration (file, environment, flags) without connecting anything: exit 0 when it is valid, 2 with its refusals",
		Long: `Reads the configuration as every command does (flags > environment > config file >
defaults) and checks it whole, connecting to nothing: every key and ONCEFLOW_ variable names a
setting, every value is of its type and within its range, the settings that relate agree, and
each plugin's section (its topics, consumer group and settings) is valid, for every plugin the
binary has; a section of no such plugin is refused too. Exit 0 with one line when it is valid,
2 with the refusals otherwise.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			// The root's PersistentPreRunE read and checked the settings, the environment
			// and every registered plugin's section before this runs. It did so with
			// onceflow.LoadSetup. Check checks what the commands that connect check first.
			if err := a.Check(); err != nil {
				return err
			}
			where := "(no file: the defaults and the environment)"
			if f := a.ConfigFile(); f != "" {
				where = f
			}
			note := ""
			if a.Config.DB.DSN == "" {
				note = "; db.dsn is not set: the commands that connect need it"
			}
			printf("config %s is valid (plugins: %s)%s\n", where, dash(strings.Join(a.PluginNames(), ", ")), note)
			return nil
		},
	}
}
