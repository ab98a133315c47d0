package routercmd

import "github.com/spf13/cobra"

func (a *app) relayCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "relay",
		Short: "run only the outbox relay (exactly-once by default); SIGINT/SIGTERM stop it and release its lease",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.RunRelay(cmd.Context())
		},
	}
}
