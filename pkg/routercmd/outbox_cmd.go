package routercmd

import (
	"context"
	"database/sql"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/onceflow/onceflow/outbox"
)

func (a *app) outboxCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "outbox",
		Short: "inspect parked outbox events (ls, show), release them (retry, drop); send a topic's published events again (republish)",
		Long: `The relay parks an outbox event Kafka refuses for good (its topic does not exist, it is too
large, invalid, or writing to the topic is not authorized) in outbox_parked, with Kafka's error,
and holds the later events of its key behind it, so the key's order holds while every other
key and topic keeps flowing. Fix the cause (create the topic, raise the limit), then retry the
parked event: it and the events held behind it go back into the outbox with their original ids
and are published in their original order. Drop deletes a parked event for good and releases
the events held behind it.

Republish sends the published events of a topic kept in the outbox (relay.retention) again,
for a topic that lost its records; every consumer of the topic gets them again.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(a.outboxLsCmd(), a.outboxShowCmd(), a.outboxRetryCmd(), a.outboxDropCmd(), a.outboxRepublishCmd())
	return cmd
}

func checkOutput(o string) error {
	if o != "table" && o != "json" {
		return badInput(fmt.Errorf("--output %q: use table or json", o))
	}
	return nil
}

// openParked opens the database and the parked events' store.
func (a *app) openParked(ctx context.Context) (*sql.DB, *outbox.Parked, error) {
	db, err := a.OpenDB(ctx, 2, "outbox", "outbox_parked")
	if err != nil {
		return nil, nil, err
	}
	store, err := outbox.NewParked(db, "")
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return db, store, nil
}

// parkedErr marks the store's input errors as bad input, so they exit with status 2.
func parkedErr(err error) error {
	if errors.Is(err, outbox.ErrNotParked) || errors.Is(err, outbox.ErrHeld) || errors.Is(err, outbox.ErrBadRef) {
		return badInput(err)
	}
	return err
}

// checkRef refuses, before connecting, a reference no parked event can have.
func checkRef(ref string) error {
	if ref == "" || len(ref) > 36 || strings.ContainsFunc(ref, func(r rune) bool { return unsafeRune(r) }) || !utf8.ValidString(ref) {
		return badInput(fmt.Errorf(`"%s" is neither an outbox id nor an event id (1..36 printable bytes)`, safeText(ref)))
	}
	return nil
}

func (a *app) outboxLsCmd() *cobra.Command {
	var (
		limit  int
		output string
	)
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "list parked outbox events in outbox id order (refused ones and those held behind them)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			if limit < 0 {
				return badInput(fmt.Errorf("--limit %d: must not be negative (0: all)", limit))
			}
			return a.outboxLs(cmd.Context(), limit, output)
		},
	}
	cmd.Flags().IntVar(&limit, "limit", 50, "at most this many rows (0: all)")
	cmd.Flags().StringVar(&output, "output", "table", "table or json")
	return cmd
}

func (a *app) outboxLs(ctx context.Context, limit int, output string) error {
	db, store, err := a.openParked(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	rows, err := store.List(ctx, limit)
	if err != nil {
		return err
	}
	refused, held, err := store.Count(ctx)
	if err != nil {
		return err
	}
	if output == "json" {
		if rows == nil {
			rows = []outbox.ParkedRow{}
		}
		return writeJSON(rows)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tEVENT_ID\tTYPE\tTOPIC\tKEY\tREASON\tHELD_BEHIND\tHOLDING\tPARKED_AT\tERROR")
	for _, r := range rows {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", r.ID, safeText(r.EventID), safeText(r.Type), safeText(r.Topic),
			safeText(cut(r.Key, 40)), r.Reason, dash(safeText(r.HeldBehind)), r.Holding, r.ParkedAt.Format(time.RFC3339),
			dash(safeText(oneLineString(r.Error, 80))))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	total := refused + held
	if int64(len(rows)) < total {
		printf("%d of %d parked events (%d refused, %d held; raise --limit, or --limit 0 for all)\n", len(rows), total, refused, held)
	} else {
		printf("%d parked events (%d refused, %d held)\n", total, refused, held)
	}
	if refused > 0 {
		printf("fix the cause, then `router outbox retry <id>` (or `router outbox drop <id> --yes`) per refused event, or choose several with --all, --topic or --reason (--dry-run first)\n")
	}
	return nil
}

func (a *app) outboxShowCmd() *cobra.Command {
	var (
		maxBytes int
		output   string
	)
	cmd := &cobra.Command{
		Use:   "show <id|event-id>",
		Short: "print a parked outbox event in full: Kafka's error, headers and payload",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			if maxBytes < 0 {
				return badInput(fmt.Errorf("--max-bytes %d: must not be negative (0: all)", maxBytes))
			}
			if err := checkRef(args[0]); err != nil {
				return err
			}
			return a.outboxShow(cmd.Context(), args[0], maxBytes, output)
		},
	}
	cmd.Flags().IntVar(&maxBytes, "max-bytes", 4096, "print at most this many bytes of the payload (0: all)")
	cmd.Flags().StringVar(&output, "output", "table", "table or json")
	return cmd
}

// parkedJSON is the --output json form of a shown parked event.
type parkedJSON struct {
	outbox.ParkedRow
	Payload       string `json:"payload,omitempty"`
	PayloadBase64 string `json:"payload_base64,omitempty"`
	Truncated     bool   `json:"payload_truncated,omitempty"`
}

func (a *app) outboxShow(ctx context.Context, ref string, maxBytes int, output string) error {
	db, store, err := a.openParked(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	r, err := store.Get(ctx, ref)
	if err != nil {
		return parkedErr(err)
	}
	payload, truncated := r.Payload, false
	if maxBytes > 0 && len(payload) > maxBytes {
		payload, truncated = payload[:maxBytes], true
		for len(payload) > 0 && !utf8.Valid(payload) && utf8.Valid(r.Payload) {
			payload = payload[:len(payload)-1] // do not cut a character in two
		}
	}
	if output == "json" {
		j := parkedJSON{ParkedRow: r, Truncated: truncated}
		if utf8.Valid(payload) {
			j.Payload = string(payload)
		} else {
			j.PayloadBase64 = base64.StdEncoding.EncodeToString(payload)
		}
		return writeJSON(j)
	}
	behind := "-"
	if r.HeldBehind != "" {
		behind = safeText(r.HeldBehind) + " (released with it: retry or drop that one)"
	}
	fields := []struct{ k, v string }{
		{"id", fmt.Sprint(r.ID)}, {"event_id", safeText(r.EventID)}, {"event_type", safeText(r.Type)},
		{"topic", safeText(r.Topic)}, {"key", safeText(r.Key)}, {"reason", r.Reason}, {"error", safeText(r.Error)},
		{"held_behind", behind}, {"holding", fmt.Sprintf("%d events held behind it", r.Holding)},
		{"created_at", r.CreatedAt.Format(time.RFC3339Nano)}, {"parked_at", r.ParkedAt.Format(time.RFC3339Nano)},
		{"headers", headersLine(r.Headers)},
	}
	for _, kv := range fields {
		printf("%-12s %s\n", kv.k+":", kv.v)
	}
	shown := ""
	if truncated {
		shown = fmt.Sprintf(", first %d shown (--max-bytes)", len(payload))
	}
	if utf8.Valid(payload) {
		printf("%-12s (%d bytes%s) %s\n", "payload:", r.Size, shown, safeText(string(payload)))
	} else {
		printf("%-12s (%d bytes%s, not UTF-8, base64) %s\n", "payload:", r.Size, shown, base64.StdEncoding.EncodeToString(payload))
	}
	return nil
}

func headersLine(h map[string]string) string {
	if len(h) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = safeText(k) + "=" + safeText(h[k])
	}
	return strings.Join(parts, " ")
}

// parkedSelection is the flags choosing refused parked events for retry or drop instead of
// one named event.
type parkedSelection struct {
	all           bool
	topic, reason string
	dryRun        bool
}

func (s *parkedSelection) flags(cmd *cobra.Command, verb string) {
	cmd.Flags().BoolVar(&s.all, "all", false, verb+" every refused parked event")
	cmd.Flags().StringVar(&s.topic, "topic", "", verb+" the refused parked events of this topic")
	cmd.Flags().StringVar(&s.reason, "reason", "", verb+" the refused parked events of this reason ("+strings.Join(refusalReasons, ", ")+")")
	cmd.Flags().BoolVar(&s.dryRun, "dry-run", false, "with --all, --topic or --reason: print the events chosen, change nothing")
}

// refusalReasons are the reasons --reason accepts.
var refusalReasons = []string{outbox.ReasonUnknownTopic, outbox.ReasonTooLarge, outbox.ReasonInvalidRecord, outbox.ReasonUnauthorized}

func (s parkedSelection) set() bool { return s.all || s.topic != "" || s.reason != "" }

// check refuses, before connecting, a command that names an event and a selection, or
// neither, or a selection no parked event can match.
func (s parkedSelection) check(args []string) error {
	switch {
	case len(args) == 1 && s.set():
		return badInput(errors.New("name one event or choose with --all, --topic or --reason, not both"))
	case len(args) == 0 && !s.set():
		return badInput(errors.New("name an event (outbox id or event id) or choose with --all, --topic or --reason"))
	case len(args) == 1:
		if s.dryRun {
			return badInput(errors.New("--dry-run goes with --all, --topic or --reason"))
		}
		return checkRef(args[0])
	case s.all && (s.topic != "" || s.reason != ""):
		return badInput(errors.New("--all chooses every refused event: leave out --topic and --reason, or --all"))
	case s.reason != "" && !slices.Contains(refusalReasons, s.reason):
		return badInput(fmt.Errorf(`--reason "%s": one of %s (held events are released with the event they wait behind)`, safeText(s.reason), strings.Join(refusalReasons, ", ")))
	case s.topic != "" && (len(s.topic) > 249 || !utf8.ValidString(s.topic) || strings.ContainsFunc(s.topic, unsafeRune)):
		return badInput(fmt.Errorf(`--topic "%s": not a topic name`, safeText(s.topic)))
	}
	return nil
}

func (s parkedSelection) String() string {
	if s.all {
		return "all"
	}
	var parts []string
	if s.topic != "" {
		parts = append(parts, "topic "+safeText(s.topic))
	}
	if s.reason != "" {
		parts = append(parts, "reason "+s.reason)
	}
	return strings.Join(parts, ", ")
}

func (a *app) outboxRetryCmd() *cobra.Command {
	var sel parkedSelection
	cmd := &cobra.Command{
		Use:   "retry <id|event-id> | --all | --topic <topic> | --reason <reason> [--dry-run]",
		Short: "move parked events and the events held behind them back into the outbox (original ids and order)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := sel.check(args); err != nil {
				return err
			}
			if sel.set() {
				return a.outboxReleaseSelected(cmd.Context(), sel, true, false)
			}
			db, store, err := a.openParked(cmd.Context())
			if err != nil {
				return err
			}
			defer db.Close()
			rel, err := store.Retry(cmd.Context(), args[0])
			if err != nil {
				return parkedErr(err)
			}
			e := rel.Event
			printf("retried event %s (topic %s, key %s): %d events back in the outbox (it and %d held behind it); the relay publishes them in their original order\n",
				safeText(e.EventID), safeText(e.Topic), safeText(e.Key), rel.Moved, rel.Moved-1)
			return nil
		},
	}
	sel.flags(cmd, "retry")
	return cmd
}

func (a *app) outboxDropCmd() *cobra.Command {
	var (
		yes bool
		sel parkedSelection
	)
	cmd := &cobra.Command{
		Use:   "drop <id|event-id> | --all | --topic <topic> | --reason <reason> [--dry-run] --yes",
		Short: "delete parked events for good and release the events held behind them",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := sel.check(args); err != nil {
				return err
			}
			if sel.set() {
				return a.outboxReleaseSelected(cmd.Context(), sel, false, yes)
			}
			db, store, err := a.openParked(cmd.Context())
			if err != nil {
				return err
			}
			defer db.Close()
			if !yes {
				r, err := store.Get(cmd.Context(), args[0])
				if err != nil {
					return parkedErr(err)
				}
				return badInput(fmt.Errorf("drop deletes event %s (topic %s, key %s) for good and releases the %d events held behind it: add --yes",
					safeText(r.EventID), safeText(r.Topic), safeText(r.Key), r.Holding))
			}
			rel, err := store.Drop(cmd.Context(), args[0])
			if err != nil {
				return parkedErr(err)
			}
			e := rel.Event
			printf("dropped event %s (topic %s, key %s, %d bytes); %d events held behind it are back in the outbox\n",
				safeText(e.EventID), safeText(e.Topic), safeText(e.Key), e.Size, rel.Moved)
			return nil
		},
	}
	cmd.Flags().BoolVar(&yes, "yes", false, "really delete the events")
	sel.flags(cmd, "drop")
	return cmd
}

// chosenShown is how many of the chosen refused events retry and drop list before acting.
const chosenShown = 20

// outboxReleaseSelected retries or drops the refused parked events that sel chooses, each
// with the events held behind it. outbox.RetrySelected and outbox.DropSelected release them
// in batches of set-based statements. outboxReleaseSelected first prints how many it chose
// and the first of them.
func (a *app) outboxReleaseSelected(ctx context.Context, sel parkedSelection, retry, yes bool) error {
	db, store, err := a.openParked(ctx)
	if err != nil {
		return err
	}
	defer db.Close()
	osel := outbox.Selection{Topic: sel.topic, Reason: sel.reason}
	chosen, err := store.Choose(ctx, osel, chosenShown)
	if err != nil {
		return parkedErr(err)
	}
	verb := map[bool]string{true: "retry", false: "drop"}[retry]
	printf("%d refused parked events chosen (%s), %d events held behind them\n", chosen.Refused, sel, chosen.Held)
	if chosen.Refused == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tEVENT_ID\tTOPIC\tKEY\tREASON\tHOLDING")
	for _, r := range chosen.First {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\n", r.ID, safeText(r.EventID), safeText(r.Topic), safeText(cut(r.Key, 40)), r.Reason, r.Holding)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if more := chosen.Refused - int64(len(chosen.First)); more > 0 {
		printf("… and %d more (router outbox ls --limit 0 lists every parked event)\n", more)
	}
	if sel.dryRun {
		printf("dry run: nothing done (%s them without --dry-run)\n", verb)
		return nil
	}
	if !retry && !yes {
		return badInput(fmt.Errorf("drop deletes these %d events for good and releases the %d events held behind them: add --yes", chosen.Refused, chosen.Held))
	}
	start, shown := time.Now(), time.Now()
	progress := func(r outbox.BulkRelease) {
		if time.Since(shown) >= 5*time.Second {
			shown = time.Now()
			printf("… %d of %d refused events so far, %d events back in the outbox (%s)\n", r.Released, chosen.Refused, r.Moved, time.Since(start).Round(time.Second))
		}
	}
	var rel outbox.BulkRelease
	if retry {
		rel, err = store.RetrySelected(ctx, osel, progress)
	} else {
		rel, err = store.DropSelected(ctx, osel, progress)
	}
	if err != nil {
		return fmt.Errorf("%s: after %d of %d refused events (%d events back in the outbox; run it again for the rest): %w", verb, rel.Released, chosen.Refused, rel.Moved, err)
	}
	if retry {
		printf("retried %d events: %d events back in the outbox, published in their original order", rel.Released, rel.Moved)
	} else {
		printf("dropped %d events; %d events held behind them are back in the outbox", rel.Released, rel.Moved)
	}
	if int64(rel.Released) != chosen.Refused {
		printf(" (%d were chosen: the parked events changed meanwhile)", chosen.Refused)
	}
	printf(" in %s\n", time.Since(start).Round(time.Millisecond))
	return nil
}

// cut shortens s to n runes, ending it with "…".
func cut(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}
