package routercmd

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"strconv"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/inbox/inboxops"
)

func (a *app) inboxCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "inbox",
		Short: "inspect the inbox (ls, show), re-run rows (retry) and resolve quarantined ones (resolve)",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(a.inboxLsCmd(), a.inboxShowCmd(), a.inboxRetryCmd(), a.inboxResolveCmd())
	return cmd
}

func (a *app) inboxResolveCmd() *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:   "resolve <id> --reason <text>",
		Short: "mark a quarantined row resolved: its key needs nothing more (done; later deliveries of it are duplicates)",
		Long: `Marks the quarantined (failed) inbox row <id> resolved, for a row whose cause was dealt
with otherwise: the corrected record processed under its own key, a request that needs no
coupon. The row becomes done with reason resolved, so it no longer fails ` + "`router verify`" + `, and
a later delivery of its key with the same payload is a duplicate, counted and never run. Its
last error keeps what it was quarantined for after the reason given, and the resolution is
recorded in the replay table with that reason (the console's Replays page lists it).
` + "`router inbox ls --reason resolved`" + ` lists resolved rows. What the handler committed for the key
stays as it is. Exit 2 when the row does not exist or is not quarantined.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.inboxResolve(cmd.Context(), args[0], reason)
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why the row needs nothing more, kept with it and in the replay table (required, at most 500 bytes)")
	return cmd
}

func (a *app) inboxResolve(ctx context.Context, ref, reason string) error {
	id, err := strconv.ParseInt(ref, 10, 64)
	if err != nil || id <= 0 {
		return badInput(fmt.Errorf("inbox resolve: %q is not a row id (a positive number: router inbox ls --status failed lists them)", safeText(ref)))
	}
	if _, err := inboxops.CheckResolveReason(reason); err != nil {
		return badInput(fmt.Errorf("inbox resolve: --reason: %w", err))
	}
	db, store, err := a.openInboxDB(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	res, err := store.Resolve(ctx, id, reason)
	if errors.Is(err, inboxops.ErrNoRow) || errors.Is(err, inboxops.ErrNotQuarantined) {
		return badInput(fmt.Errorf("inbox resolve: %w", err))
	}
	if err != nil {
		return fmt.Errorf("inbox resolve: %w", err)
	}
	r := res.Row
	printf("resolved inbox row %d (biz type %s, key %s, quarantined as %s): done, recorded as replay %d; a later delivery of its key is a duplicate\n",
		r.ID, safeText(r.BizType), safeText(r.DedupKey), safeText(dash(r.Reason)), res.ReplayID)
	return nil
}

func (a *app) inboxLsCmd() *cobra.Command {
	var f filterFlags
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "list inbox rows (newest filters first: --status failed --biz-type coupon)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.inboxLs(cmd.Context(), f)
		},
	}
	f.register(cmd.Flags(), "all", 50)
	return cmd
}

func (a *app) inboxLs(ctx context.Context, ff filterFlags) error {
	f, db, store, err := a.openFiltered(ctx, ff, nil)
	if err != nil {
		return err
	}
	defer db.Close()
	// An order id finds a poison row too, by the Kafka key or the payload id its last
	// error notes. Its dedup key names the record's place in Kafka instead.
	if f.PoisonKeys = len(f.Keys) > 0; f.PoisonKeys && f.BizType == "" {
		if f.PoisonBizTypes, err = a.BizTypes(); err != nil {
			return err
		}
	}
	rows, err := store.List(ctx, f)
	if err != nil {
		return err
	}
	total, err := store.Count(ctx, f)
	if err != nil {
		return err
	}
	if ff.output == "json" {
		out := make([]rowJSON, 0, len(rows))
		for _, r := range rows {
			out = append(out, toRowJSON(r, false))
		}
		return writeJSON(out)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tBIZ_TYPE\tDEDUP_KEY\tSTATUS\tREASON\tATTEMPTS\tDUPS\tHELD\tREPLAY\tSOURCE\tUPDATED\tLAST_ERROR")
	for _, r := range rows {
		replay := "-"
		if r.ReplayID > 0 {
			replay = fmt.Sprint(r.ReplayID)
		} else if r.Status == engine.StatusFailed && r.Replayable() != nil {
			replay = "refused" // a replay would not run it, and inbox show says why
		}
		dups, held := fmt.Sprint(r.Duplicates), "-"
		if r.Status == engine.StatusFailed {
			dups, held = "-", fmt.Sprint(r.Duplicates)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", r.ID, safeText(r.BizType), safeText(r.DedupKey), r.StatusText(), safeText(dash(string(r.Reason))),
			r.Attempts, dups, held, replay, safeText(sourceText(r)), r.UpdatedAt.Format(time.RFC3339), safeText(dash(oneLineString(r.LastError, 60))))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if total > len(rows) {
		printf("%d of %d matching rows (raise --limit, or --limit 0 for all)\n", len(rows), total)
	} else {
		printf("%d rows\n", len(rows))
	}
	return nil
}

func (a *app) inboxShowCmd() *cobra.Command {
	var f filterFlags
	cmd := &cobra.Command{
		Use:   "show <id|dedup_key>",
		Short: "print inbox rows in full (payload, metadata, last error) by row id or dedup key",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.inboxShow(cmd.Context(), f, args[0])
		},
	}
	f.register(cmd.Flags(), "all", 0)
	return cmd
}

func (a *app) inboxShow(ctx context.Context, ff filterFlags, ref string) error {
	f, db, store, err := a.openFiltered(ctx, ff, []string{ref})
	if err != nil {
		return err
	}
	defer db.Close()
	rows, err := store.List(ctx, f)
	if err != nil {
		return err
	}
	if len(rows) == 0 {
		return fmt.Errorf("inbox show: no row with id or dedup key %q matches", ref)
	}
	if ff.output == "json" {
		out := make([]rowJSON, 0, len(rows))
		for _, r := range rows {
			out = append(out, toRowJSON(r, true))
		}
		return writeJSON(out)
	}
	for i, r := range rows {
		if i > 0 {
			printf("\n")
		}
		j := toRowJSON(r, true)
		counted := struct{ k, v string }{"duplicates", fmt.Sprint(r.Duplicates)}
		if r.Status == engine.StatusFailed {
			counted = struct{ k, v string }{"held", fmt.Sprintf("%d later deliveries, not run (a replay or `router inbox resolve` releases the key)", r.Duplicates)}
		}
		fields := []struct{ k, v string }{
			{"id", fmt.Sprint(r.ID)}, {"dedup_key", r.DedupKey}, {"biz_type", r.BizType}, {"status", r.StatusText()},
			{"reason", dash(r.Reason)}, {"attempts", fmt.Sprint(r.Attempts)}, counted,
			{"replay_id", dash(j.replayID())}, {"replayable", replayableText(j.NotReplayable)}, {"message_uuid", r.MessageUUID},
			{"source", sourceDetail(r)},
			{"fingerprint", r.Fingerprint}, {"created_at", r.CreatedAt.Format(time.RFC3339Nano)},
			{"updated_at", r.UpdatedAt.Format(time.RFC3339Nano)}, {"expire_at", r.ExpireAt.Format(time.RFC3339Nano)},
			{"metadata", headersLine(r.Metadata)}, {"last_error", dash(r.LastError)},
		}
		for _, kv := range fields {
			v := kv.v
			if kv.k != "metadata" { // headersLine escapes it already
				v = safeText(v)
			}
			printf("%-13s %s\n", kv.k+":", v)
		}
		if j.PayloadBase64 != "" {
			printf("%-13s (%d bytes, not UTF-8, base64) %s\n", "payload:", len(r.Payload), j.PayloadBase64)
		} else {
			printf("%-13s (%d bytes) %s\n", "payload:", len(r.Payload), safeText(j.Payload))
		}
	}
	return nil
}

func (a *app) inboxRetryCmd() *cobra.Command {
	var r replayFlags
	cmd := &cobra.Command{
		Use:   "retry [id|dedup_key...]",
		Short: "re-run the selected rows through their handler (a replay; default --status failed, or any status for named rows)",
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 && !cmd.Flags().Changed("status") {
				r.status = "all"
			}
			return a.replay(cmd.Context(), r, args)
		},
	}
	r.filterFlags.register(cmd.Flags(), string(engine.StatusFailed), 0)
	r.register(cmd.Flags())
	return cmd
}

// rowJSON is the --output json form of an inbox row.
type rowJSON struct {
	inboxops.Row
	Payload       string `json:"payload,omitempty"`
	PayloadBase64 string `json:"payload_base64,omitempty"`
	PayloadBytes  int    `json:"payload_bytes"`
	// Held counts the later deliveries of a failed row's key, which were not run. It is the
	// row's duplicates counter, which counts nothing else while the row is not done.
	Held int `json:"held,omitempty"`
	// NotReplayable says why a replay refuses the row. inboxops.Row.Replayable gives the
	// reason.
	NotReplayable string `json:"not_replayable,omitempty"`
}

func (j rowJSON) replayID() string {
	if j.ReplayID == 0 {
		return ""
	}
	return fmt.Sprint(j.ReplayID)
}

func toRowJSON(r inboxops.Row, payload bool) rowJSON {
	j := rowJSON{Row: r, PayloadBytes: len(r.Payload), NotReplayable: errText(r.Replayable())}
	if r.Status == engine.StatusFailed {
		j.Held = r.Duplicates
	}
	if payload {
		if utf8.Valid(r.Payload) {
			j.Payload = string(r.Payload)
		} else {
			j.PayloadBase64 = base64.StdEncoding.EncodeToString(r.Payload)
		}
	}
	return j
}

// replayableText is inbox show's answer to whether a replay would run the row.
func replayableText(why string) string {
	if why == "" {
		return "yes"
	}
	return "no, a replay refuses it: " + why
}

// sourceText is where a row's message came from, as topic/partition@offset. The row of an
// HTTP command has no partition, and sourceText is then the command's method and path.
func sourceText(r inboxops.Row) string {
	if r.Partition < 0 {
		return r.Topic
	}
	return fmt.Sprintf("%s/%d@%d", r.Topic, r.Partition, r.Offset)
}

// sourceDetail is sourceText with the fields named, for inbox show.
func sourceDetail(r inboxops.Row) string {
	if r.Partition < 0 {
		return r.Topic
	}
	return fmt.Sprintf("topic=%s partition=%d offset=%d", r.Topic, r.Partition, r.Offset)
}
