package routercmd

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

func (a *app) topicsCmd() *cobra.Command {
	var (
		only        []string
		partitions  int32
		replication int16
		dryRun      bool
	)
	cmd := &cobra.Command{
		Use:   "topics",
		Short: "create the Kafka topics the plugins read and write that do not exist yet (existing ones are left as they are)",
		Long: `Creates each topic the selected plugins consume (their topics, under plugins.<name>.topics) and
write their events to (their Writes, under their configuration) that the cluster does not have,
with --partitions and --replication-factor. An existing topic is left as it is and reported; one
whose partitions differ from an explicit --partitions is reported, not changed (adding partitions
moves keys to other partitions: kafka-topics.sh --alter, deliberately). Running it again changes
nothing.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if partitions < 1 {
				return badInput(fmt.Errorf("--partitions %d: want at least 1", partitions))
			}
			if replication < 0 {
				return badInput(fmt.Errorf("--replication-factor %d: want 1 or more (0: min(3, brokers))", replication))
			}
			ps, err := a.selectPlugins(only)
			if err != nil {
				return err
			}
			return a.topics(ps, partitions, replication, cmd.Flags().Changed("partitions"), dryRun)
		},
	}
	cmd.Flags().StringSliceVar(&only, "plugins", nil, "only these plugins' topics (default: all registered)")
	cmd.Flags().Int32Var(&partitions, "partitions", 12, "partitions of a topic created")
	cmd.Flags().Int16Var(&replication, "replication-factor", 0, "replicas of a topic created (0: min(3, the cluster's brokers))")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print what would be created, create nothing")
	return cmd
}

// topics creates the plugins' missing topics and prints a line per topic.
func (a *app) topics(ps []onceflow.Plugin, partitions int32, replication int16, checkPartitions, dryRun bool) error {
	var names []string
	users := map[string][]string{} // each topic's plugins, each marked as reading or writing it
	for _, p := range ps {
		writes, err := p.WrittenTopics()
		if err != nil {
			return err
		}
		for _, use := range []struct {
			topics []string
			verb   string
		}{{p.Topics, "reads"}, {writes, "writes"}} {
			for _, t := range use.topics {
				if _, ok := users[t]; !ok {
					names = append(names, t)
				}
				users[t] = append(users[t], p.Name+" ("+use.verb+")")
			}
		}
	}
	sort.Strings(names)
	states, err := a.Kafka().EnsureTopics(names, partitions, replication, dryRun)
	if errors.Is(err, kafkax.ErrReplication) {
		return badInput(fmt.Errorf("--replication-factor: %w", err))
	}
	if err != nil {
		return err
	}
	var created, existed, other int
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TOPIC\tPARTITIONS\tREPLICAS\tSTATUS\tPLUGINS")
	for _, s := range states {
		status := "exists"
		switch {
		case s.Created && dryRun:
			status, created = "would be created", created+1
		case s.Created:
			status, created = "created", created+1
		case checkPartitions && s.Partitions != int(partitions):
			status, existed, other = fmt.Sprintf("exists with %d partitions, not %d: left as it is", s.Partitions, partitions), existed+1, other+1
		default:
			existed++
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\n", s.Topic, s.Partitions, s.ReplicationFactor, status, strings.Join(users[s.Topic], ", "))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	verb := "created"
	if dryRun {
		verb = "to create (dry run)"
	}
	printf("%d topics %s, %d existed", created, verb, existed)
	if other > 0 {
		printf(" (%d with other partitions than --partitions, not changed)", other)
	}
	printf("\n")
	return nil
}
