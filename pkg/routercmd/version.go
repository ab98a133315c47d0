package routercmd

import (
	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow/internal/buildinfo"
)

func (a *app) versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "print the router's build: main module and version, commit, Go version (from the binary's build info)",
		Args:  cobra.NoArgs,
		// No configuration is read, so a binary whose configuration is broken still prints
		// its version.
		PersistentPreRunE: func(*cobra.Command, []string) error { return nil },
		RunE: func(*cobra.Command, []string) error {
			printf("%s\n", buildinfo.Read())
			return nil
		},
	}
}
