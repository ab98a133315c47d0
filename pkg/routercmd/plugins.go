package routercmd

import (
	"strings"

	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow/migrations"
)

func (a *app) pluginsCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "plugins",
		Short: "list the registered handler plugins as this configuration runs them (topics, group, biz type, topics written, migrations)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if err := a.CheckSections(); err != nil {
				return err
			}
			ps, err := a.Plugins()
			if err != nil {
				return err
			}
			const row = "%-20s %-24s %-18s %-10s %-40s %s\n"
			printf(row, "NAME", "TOPICS", "GROUP", "BIZ_TYPE", "WRITES", "MIGRATIONS")
			for _, p := range ps {
				writes, err := p.WrittenTopics()
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
