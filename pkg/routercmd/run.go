package routercmd

import (
	"github.com/spf13/cobra"
)

func (a *app) runCmd() *cobra.Command {
	var only []string
	var noRelay bool
	cmd := &cobra.Command{
		Use:   "run",
		Short: "consume with every registered plugin, relay the outbox, clean the inbox",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			plugins, err := a.selectPlugins(only)
			if err != nil {
				return err
			}
			if noRelay {
				a.Config.Relay.Enabled = false
			}
			return a.Runtime(plugins).Run(cmd.Context())
		},
	}
	cmd.Flags().StringSliceVar(&only, "plugins", nil, "run only these plugins (default: all registered)")
	cmd.Flags().BoolVar(&noRelay, "no-relay", false, "do not run the outbox relay in this process")
	return cmd
}
