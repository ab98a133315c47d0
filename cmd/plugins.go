package onceflowcmd

import (
	"strings"

	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow/inbox"
)

func (a *app) pluginsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "plugins",
		Short: "list the registered handler plugins",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			printf("%-20s %-24s %-18s %s\n", "NAME", "TOPICS", "GROUP", "BIZ_TYPE")
			for _, n := range inbox.Plugins.Names() {
				p, _ := inbox.Plugins.Get(n)
				printf("%-20s %-24s %-18s %s\n", p.Name, strings.Join(p.Topics, ","), p.ConsumerGroup, p.BizType)
			}
			return nil
		},
	}
}
