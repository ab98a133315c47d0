package routercmd

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow"
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/outbox"
	"github.com/onceflow/onceflow/pkg/dbx"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

type verifyOpts struct {
	plugins []string
	ledgers []string
	kafka   bool
	wait    time.Duration
	result  bool
	// allowFailed accepts the quarantined inbox rows, whose status is failed. verify
	// reports them but does not fail for them.
	allowFailed bool
}

func (a *app) verifyCmd() *cobra.Command {
	o := verifyOpts{}
	cmd := &cobra.Command{
		Use:   "verify",
		Short: "audit the invariants (each plugin's own, e.g. the coupon granter's: one coupon per order, inbox ⇔ grant ⇔ outbox, counters; every plugin's inbox rows ended, relay lag, consumer lag; parked outbox events; failed inbox rows); exit 1 on a violation or a failed row",
		Long: `Audits the invariants of every plugin that declares them (inbox.Plugin.Verify) under this
configuration, and for every plugin, with invariants or without, the generic ones: each inbox
row of its biz types ended processed (done) or quarantined (failed with a reason), none still
processing; no outbox row unpublished for longer than relay.lag_bound; with --kafka, its
consumer group has consumed every record of its topics (lag 0). It names the plugins that
declare no invariants of their own. It reports parked outbox events and failed (quarantined)
inbox rows. With --ledger (written by ` + "`router produce --ledger`" + `), every key the producer sent
must have ended processed or quarantined: the plugins with invariants check their ledger
keys themselves, the runtime checks them for a plugin that takes ` + "`router produce`" + `'s input
(inbox.Plugin.Sampler) and has none. With --kafka, the plugins also count what reached Kafka
(read_committed).

Exit 1 on a violation, and on failed inbox rows of the plugins' biz types (counted by reason;
` + "`router inbox ls --status failed`" + ` lists them) unless --allow-failed accepts them, e.g. after
sending poison on purpose (` + "`router produce --poison`" + `). A row an operator resolved
(` + "`router inbox resolve`" + `) is done, not failed. Exit 2 for bad input.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.verify(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&o.plugins, "plugins", nil, "audit only these plugins (default: every registered plugin)")
	f.StringSliceVar(&o.ledgers, "ledger", nil, "producer ledger(s): every key in them must have ended processed or quarantined")
	f.BoolVar(&o.kafka, "kafka", false, "also read the written topics back (read_committed) and count distinct event ids")
	f.DurationVar(&o.wait, "wait", 0, "wait up to this long for the pipeline to drain before auditing")
	f.BoolVar(&o.result, "result", false, "end with one RESULT line (needs --ledger)")
	f.BoolVar(&o.allowFailed, "allow-failed", false, "report failed (quarantined) inbox rows without failing (exit 0): when they are expected, e.g. poison sent on purpose")
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
	var plugins, bare []onceflow.Plugin // plugins with a Verify of their own, and those without
	tables := []string{"inbox", "outbox", "outbox_parked"}
	for _, p := range selected {
		if p.Verify != nil {
			plugins = append(plugins, p)
			tables = append(tables, p.Tables...)
		} else {
			bare = append(bare, p)
		}
	}
	for _, p := range selected { // a bad plugin configuration exits 2 before connecting
		if _, err := p.WrittenTopics(); err != nil {
			return err
		}
	}
	var l ledger
	if len(o.ledgers) > 0 {
		if l, err = readLedgers(o.ledgers); err != nil {
			return err
		}
	}
	db, err := a.OpenDB(ctx, 4, tables...)
	if err != nil {
		return err
	}
	defer db.Close()

	audit := func(readBack bool) ([]inbox.Verification, error) {
		var out []inbox.Verification
		for _, p := range plugins {
			env := inbox.VerifyEnv{DB: db, Settings: p.Settings(), Keys: l.orders, LagBound: a.Config.Relay.LagBound}
			if readBack {
				env.ReadTopic = func(ctx context.Context, topic string) ([]kafkax.Record, error) {
					return a.Kafka().ReadAll(ctx, topic, 3*time.Second)
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
	var lags *kafkax.LagReader
	if o.kafka {
		if lags, err = a.Kafka().NewLagReader(); err != nil {
			return err
		}
		defer lags.Close()
	}
	checks := genericChecks{db: db, plugins: selected, bare: bare, lagBound: a.Config.Relay.LagBound, keys: l.orders, lags: lags}
	deadline := time.Now().Add(o.wait)
	var results []inbox.Verification
	var generic inbox.Verification
	for {
		if results, err = readAgain("the plugins' audit", func() ([]inbox.Verification, error) { return audit(false) }); err != nil {
			return err
		}
		if generic, err = readAgain("the generic checks", func() (inbox.Verification, error) { return checks.run(ctx) }); err != nil {
			return err
		}
		pending := generic.Pending
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
		if results, err = readAgain("the plugins' audit", func() ([]inbox.Verification, error) { return audit(true) }); err != nil {
			return err
		}
	}

	// Invariant 4 is about the relay keeping up. Parked events are not lag, but they are
	// not published either. Kafka refuses a parked event for good, or the event waits
	// behind one that Kafka refuses.
	parked, err := outbox.NewParked(db, "")
	if err != nil {
		return err
	}
	refused, held, err := parked.Count(ctx)
	if err != nil {
		return fmt.Errorf("verify: %w (run `router migrate`)", err)
	}
	failed, failedBy, delayed, err := failedRows(ctx, db, bizTypesOf(selected))
	if err != nil {
		return fmt.Errorf("verify: %w", err)
	}

	var summary, violations, notes, result []string
	for _, p := range bare {
		notes = append(notes, fmt.Sprintf("NOTE plugin %s declares no invariants (inbox.Plugin.Verify): only the generic checks ran for it", p.Name))
	}
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
	summary = append(summary, generic.Summary, fmt.Sprintf("outbox_parked=%d", refused+held))
	violations = append(violations, generic.Violations...)
	for _, n := range notes {
		printf("%s\n", n)
	}
	printf("verify: %s\n", strings.Join(summary, " "))
	if refused+held > 0 {
		printf("PARKED %d outbox events are not published: Kafka refuses %d of them for good, %d wait behind those (router outbox ls; retry or drop them)\n",
			refused+held, refused, held)
	}
	if failed > 0 {
		accepted := ""
		if o.allowFailed {
			accepted = ", accepted by --allow-failed"
		}
		printf("FAILED inbox rows: %d (%s)%s; router inbox ls --status failed lists them; router replay runs them again once their cause is fixed (poison: the record itself, so its producer); router inbox resolve <id> --reason <why> closes one that needs nothing more\n",
			failed, failedBy, accepted)
	}
	if delayed > 0 {
		printf("DELAYED inbox rows: %d wait for a delayed redelivery (inbox.delayed_retries), not processed yet; router inbox ls --status failed --reason delayed lists them\n", delayed)
	}
	for _, v := range violations {
		printf("VIOLATION %s\n", v)
	}
	if o.result {
		printf("RESULT %s\n", strings.Join(append([]string{fmt.Sprintf("orders=%d deliveries=%d", len(l.orders), l.deliveries)}, result...), " "))
	}
	var findings []string
	if len(violations) > 0 {
		findings = append(findings, fmt.Sprintf("%d invariant violations", len(violations)))
	}
	if failed > 0 && !o.allowFailed {
		findings = append(findings, fmt.Sprintf("%d failed inbox rows (router inbox ls --status failed lists them; --allow-failed when they are expected)", failed))
	}
	if delayed > 0 {
		findings = append(findings, fmt.Sprintf("%d inbox rows wait for a delayed redelivery (verify again once they ran)", delayed))
	}
	if len(findings) > 0 {
		return fmt.Errorf("verify: %s", strings.Join(findings, ", "))
	}
	return nil
}

// failedRows counts the failed inbox rows of bizTypes that are quarantined. It says how
// many have each reason, most first, as in "retries_exhausted 2, poison 1". It counts apart
// the failed rows waiting for a delayed redelivery, whose reason is delayed. The query
// reads the failed range of the inbox's index that starts with biz_type and status, never
// the done rows.
func failedRows(ctx context.Context, db *sql.DB, bizTypes []string) (int, string, int, error) {
	if len(bizTypes) == 0 {
		return 0, "", 0, nil
	}
	args := make([]any, len(bizTypes))
	for i, bt := range bizTypes {
		args[i] = bt
	}
	rows, err := db.QueryContext(ctx, dbx.DialectOf(db).Rebind(`SELECT COALESCE(reason, ''), COUNT(*) FROM inbox
		WHERE biz_type IN (?`+strings.Repeat(", ?", len(bizTypes)-1)+`) AND status = 'failed' GROUP BY reason`), args...)
	if err != nil {
		return 0, "", 0, fmt.Errorf("failed inbox rows: %w", err)
	}
	defer rows.Close()
	type count struct {
		reason string
		n      int
	}
	var counts []count
	total, delayed := 0, 0
	for rows.Next() {
		var c count
		if err := rows.Scan(&c.reason, &c.n); err != nil {
			return 0, "", 0, fmt.Errorf("failed inbox rows: %w", err)
		}
		if c.reason == "" {
			c.reason = "unknown"
		}
		if c.reason == string(engine.ReasonDelayed) { // not quarantined but waiting for its next round
			delayed = c.n
			continue
		}
		counts = append(counts, c)
		total += c.n
	}
	if err := rows.Err(); err != nil {
		return 0, "", 0, fmt.Errorf("failed inbox rows: %w", err)
	}
	slices.SortFunc(counts, func(a, b count) int { return cmp.Or(b.n-a.n, strings.Compare(a.reason, b.reason)) })
	by := make([]string, len(counts))
	for i, c := range counts {
		by[i] = safeText(c.reason) + " " + strconv.Itoa(c.n)
	}
	return total, strings.Join(by, ", "), delayed, nil
}
