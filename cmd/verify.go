package onceflowcmd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

type verifyOpts struct {
	plugins []string
	ledgers []string
	kafka   bool
	wait    time.Duration
	result  bool
}

func (a *app) verifyCmd() *cobra.Command {
	o := verifyOpts{}
	cmd := &cobra.Command{
		Use:   "verify",
		Short: "audit the invariants (each plugin's own, e.g. the coupon granter's: one coupon per order, inbox ⇔ grant ⇔ outbox, counters, relay lag; parked outbox events); exit 1 on a violation",
		Long: `Audits the invariants of every plugin that declares them (inbox.Plugin.Verify) under this
configuration, and reports parked outbox events. With --ledger (written by ` + "`router produce --ledger`" + `),
every key the producer sent must have ended processed or quarantined; with --kafka, the
plugins also count what reached Kafka (read_committed).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.verify(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&o.plugins, "plugins", nil, "audit only these plugins (default: every registered plugin with invariants)")
	f.StringSliceVar(&o.ledgers, "ledger", nil, "producer ledger(s): every key in them must have ended processed or quarantined")
	f.BoolVar(&o.kafka, "kafka", false, "also read the written topics back (read_committed) and count distinct event ids")
	f.DurationVar(&o.wait, "wait", 0, "wait up to this long for the pipeline to drain before auditing")
	f.BoolVar(&o.result, "result", false, "end with one RESULT line (needs --ledger)")
	return cmd
}

func (a *app) verify(ctx context.Context, o verifyOpts) error {
	if o.result && len(o.ledgers) == 0 {
		return badInput(errors.New("verify --result needs --ledger"))
	}
	selected, err := a.selectPlugins(o.plugins)
	if err != nil {
		return err
	}
	var plugins []plugin
	tables := []string{"inbox", "outbox", "outbox_parked"}
	for _, p := range selected {
		if p.Verify != nil {
			plugins = append(plugins, p)
			tables = append(tables, p.Tables...)
		} else if len(o.plugins) > 0 {
			return badInput(fmt.Errorf("plugin %s declares no invariants (inbox.Plugin.Verify)", p.Name))
		}
	}
	for _, p := range plugins { // bad plugin configuration: exit 2 before connecting
		if _, err := p.writes(); err != nil {
			return err
		}
	}
	var l ledger
	if len(o.ledgers) > 0 {
		if l, err = readLedgers(o.ledgers); err != nil {
			return err
		}
	}
	db, err := a.openAppDB(ctx, 4, tables...)
	if err != nil {
		return err
	}
	defer db.Close()

	audit := func(readBack bool) ([]inbox.Verification, error) {
		var out []inbox.Verification
		for _, p := range plugins {
			env := inbox.VerifyEnv{DB: db, DecodeConfig: p.decodeConfig, Keys: l.orders, LagBound: a.cfg.Relay.LagBound}
			if readBack {
				env.ReadTopic = func(ctx context.Context, topic string) ([]kafkax.Record, error) {
					return a.kafka().ReadAll(ctx, topic, 3*time.Second)
				}
			}
			v, err := p.Verify(ctx, env)
			if err != nil {
				return nil, fmt.Errorf("verify plugin %s: %w", p.Name, err)
			}
			out = append(out, v)
		}
		return out, nil
	}
	deadline := time.Now().Add(o.wait)
	var results []inbox.Verification
	for {
		if results, err = audit(false); err != nil {
			return err
		}
		pending := false
		for _, v := range results {
			pending = pending || v.Pending
		}
		if !pending || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	if o.kafka && len(plugins) > 0 {
		if results, err = audit(true); err != nil {
			return err
		}
	}

	// Invariant 4 is about the relay keeping up: parked events (Kafka refuses them for good,
	// or they wait behind one that it refuses) are not lag, but they are not published either.
	parked, err := outbox.NewParked(db, "")
	if err != nil {
		return err
	}
	refused, held, err := parked.Count(ctx)
	if err != nil {
		return fmt.Errorf("verify: %w (run `router migrate`)", err)
	}

	var summary, violations, notes, result []string
	for i, v := range results {
		s := v.Summary
		if len(plugins) > 1 {
			s = "plugin=" + plugins[i].Name + " " + s
		}
		summary = append(summary, s)
		violations = append(violations, v.Violations...)
		notes = append(notes, v.Notes...)
		if v.Result != "" {
			result = append(result, v.Result)
		}
	}
	summary = append(summary, fmt.Sprintf("outbox_parked=%d", refused+held))
	for _, n := range notes {
		printf("%s\n", n)
	}
	printf("verify: %s\n", strings.Join(summary, " "))
	if refused+held > 0 {
		printf("PARKED %d outbox events are not published: Kafka refuses %d of them for good, %d wait behind those (router outbox ls; retry or drop them)\n",
			refused+held, refused, held)
	}
	for _, v := range violations {
		printf("VIOLATION %s\n", v)
	}
	if o.result {
		printf("RESULT %s\n", strings.Join(append([]string{fmt.Sprintf("orders=%d deliveries=%d", len(l.orders), l.deliveries)}, result...), " "))
	}
	if len(violations) > 0 {
		return fmt.Errorf("verify: %d invariant violations", len(violations))
	}
	return nil
}
