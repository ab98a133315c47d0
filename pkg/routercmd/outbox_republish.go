package routercmd

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

type republishFlags struct {
	topic        string
	since, until string
	batchSize    int
	dryRun       bool
}

func (a *app) outboxRepublishCmd() *cobra.Command {
	var f republishFlags
	cmd := &cobra.Command{
		Use:   "republish --topic <topic> --since <time> [--until <time>] [--dry-run]",
		Short: "send a topic's published events again from the outbox's retained rows (same event ids, original order); every consumer of the topic gets them again",
		Long: `The relay keeps published outbox rows for relay.retention (7 days by default). When a topic
lost records it had been sent, for example because it was deleted and created again, republish
sends the events of that topic published at or after --since (and before --until) again, from
those rows: the same key, value and headers, the event_id header included, in the order the
relay published them (each key's events in their order, on the partition of the key's later
events), in Kafka transactions of --batch-size events through a transactional producer of its
own (transactional.id onceflow-republish-<database>-<topic>).

It re-delivers them to every consumer of the topic, not only to those that lost them: consumers
must dedupe, by the event_id header or, as onceflow's inbox does, by a business key. Events published
before the oldest retained row were deleted and cannot be sent again; events not yet published
are the relay's to send. The command never changes the outbox. --dry-run counts what it would
send. Should it fail part-way, the error names the last event it sent: run it again with
--since that time (the events of that time go again, under the same event ids).

Times are RFC3339 (2026-11-11T00:00:00Z) or a duration ago (2h). Exit 2 for bad input, such as a
topic that does not exist in Kafka.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.outboxRepublish(cmd.Context(), f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.topic, "topic", "", "the topic whose published events are sent again (required)")
	fl.StringVar(&f.since, "since", "", "events published at or after this (required): RFC3339 or a duration ago (48h)")
	fl.StringVar(&f.until, "until", "", "and before this: RFC3339 or a duration ago (default: now)")
	fl.IntVar(&f.batchSize, "batch-size", 2000, "events per Kafka transaction (1..10000)")
	fl.BoolVar(&f.dryRun, "dry-run", false, "count the events it would send, send nothing")
	return cmd
}

func (a *app) outboxRepublish(ctx context.Context, f republishFlags) error {
	now := time.Now()
	switch {
	case f.topic == "":
		return badInput(errors.New("--topic is required: the topic whose events are sent again"))
	case f.since == "":
		return badInput(errors.New("--since is required: events published at or after it are sent again (RFC3339, or a duration ago such as 48h)"))
	case f.batchSize < 1 || f.batchSize > 10000:
		return badInput(fmt.Errorf("--batch-size %d: 1..10000", f.batchSize))
	}
	if !utf8.ValidString(f.topic) || kafkax.CheckTopicName(f.topic) != nil {
		return badInput(fmt.Errorf(`--topic "%s": not a topic name`, safeText(f.topic)))
	}
	cfg := outbox.RepublishConfig{Topic: f.topic, BatchSize: f.batchSize, TxnTimeout: a.Config.Relay.TxnTimeout}
	var err error
	if cfg.Since, err = parseWhen("since", f.since, now); err != nil {
		return badInput(err)
	}
	if cfg.Until, err = parseWhen("until", f.until, now); err != nil {
		return badInput(err)
	}
	if !cfg.Until.IsZero() && !cfg.Until.After(cfg.Since) {
		return badInput(fmt.Errorf("--until %s is not after --since %s", cfg.Until.Format(time.RFC3339), cfg.Since.Format(time.RFC3339)))
	}
	if _, err := a.Kafka().CheckTopics(f.topic); err != nil {
		if errors.Is(err, kafkax.ErrMissingTopic) {
			return badInput(fmt.Errorf("%w (create the topic first, then republish)", err))
		}
		return err
	}
	db, err := a.OpenDB(ctx, 2, "outbox")
	if err != nil {
		return err
	}
	defer db.Close()
	plan, err := outbox.PlanRepublish(ctx, db, cfg)
	if err != nil {
		return err
	}
	until := "now"
	if !cfg.Until.IsZero() {
		until = cfg.Until.Format(time.RFC3339Nano)
	}
	printf("%d published events of topic %s chosen (published from %s to %s)", plan.Events, safeText(f.topic), cfg.Since.Format(time.RFC3339Nano), until)
	if plan.Events > 0 {
		printf(": the first published at %s, the last at %s", plan.First.Format(time.RFC3339Nano), plan.Last.Format(time.RFC3339Nano))
	}
	printf("\n")
	switch {
	case plan.Oldest.IsZero():
		printf("the outbox keeps no published event of topic %s (relay.retention deletes them after it)\n", safeText(f.topic))
	case plan.Oldest.After(cfg.Since):
		printf("WARNING events of topic %s published before %s are no longer in the outbox (relay.retention): they cannot be sent again\n",
			safeText(f.topic), plan.Oldest.Format(time.RFC3339Nano))
	}
	if plan.Unpublished > 0 {
		printf("%d events of topic %s are not published yet: the relay sends them, republish does not\n", plan.Unpublished, safeText(f.topic))
	}
	if plan.Events == 0 {
		return nil
	}
	printf("they go to every consumer of topic %s again, with their original event_id header: consumers dedupe by it\n", safeText(f.topic))
	if f.dryRun {
		printf("dry run: nothing sent (republish them without --dry-run)\n")
		return nil
	}
	start, shown := time.Now(), time.Now()
	res, err := outbox.Republish(ctx, db, a.Kafka(), cfg, func(r outbox.RepublishResult) {
		if time.Since(shown) >= 5*time.Second {
			shown = time.Now()
			printf("… %d of %d events sent (%s)\n", r.Events, plan.Events, time.Since(start).Round(time.Second))
		}
	})
	if errors.Is(err, kafkax.ErrMissingTopic) {
		return badInput(fmt.Errorf("%w (create the topic first, then republish)", err))
	}
	if err != nil {
		if res.Events == 0 {
			return fmt.Errorf("republish: nothing sent: %w", err)
		}
		return fmt.Errorf("republish: %d events sent, the last published at %s (outbox id %d); run it again with --since %s: %w",
			res.Events, res.Last.Format(time.RFC3339Nano), res.LastID, res.Last.Format(time.RFC3339Nano), err)
	}
	printf("republished %d events to topic %s in %d Kafka transactions, with their original event ids, in %s\n",
		res.Events, safeText(f.topic), res.Batches, time.Since(start).Round(time.Millisecond))
	return nil
}
