package main

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/onceflow/onceflow/internal/chaosplan"
)

// The misbehaving plugin (tools/chaosrouter/chaosplugin.go, biz type "chaos" in the run)
// consumes the same orders as the coupon granter, writes nothing, and panics resp. blocks
// for ever on the orders chaosplan.For picks. The checker's prediction comes from that one
// function (internal/chaosplan imports nothing); the outcome it checks is read with its own SQL.

// checkMisbehaver checks that every ledger order has exactly one inbox row of bizType:
// 'done' for the orders chaosplan.For lets behave, 'failed' with reason panic resp. timeout
// for the ones it makes panic resp. block; and that no row of the prefix is for an order no
// ledger lists.
func checkMisbehaver(ctx context.Context, db *sql.DB, bizType, like string, ledger map[string]bool, ids []string, rep *Report, v *violations) error {
	rows := map[string]inboxRow{}
	if err := query(ctx, db, `SELECT dedup_key, status, COALESCE(reason, '') FROM inbox WHERE biz_type = ? AND dedup_key LIKE ?`,
		[]any{bizType, like}, func(s scanner) error {
			var k string
			var r inboxRow
			if err := s.Scan(&k, &r.status, &r.reason); err != nil {
				return err
			}
			if strings.Contains(k, "#conflict:") {
				v.add("conflict", "%s (biz type %s) quarantined as conflict", k, bizType)
				return nil
			}
			rows[k] = r
			return nil
		}); err != nil {
		return err
	}
	rep.MisbehaverWant, rep.MisbehaverGot = map[string]int{}, map[string]int{}
	for _, id := range ids {
		want := chaosplan.For(id).String() // done, panic or timeout
		rep.MisbehaverWant[want]++
		r, ok := rows[id]
		got := "no inbox row"
		switch {
		case !ok:
		case r.status == "done":
			got = "done"
		case r.status == "failed":
			got = r.reason
			if got == "" {
				got = "failed without a reason"
			}
		default:
			got = r.status
		}
		if got == want {
			rep.MisbehaverGot[got]++
			continue
		}
		v.add("misbehaver-outcome", "order %s (biz type %s): %s, want %s", id, bizType, got, want)
	}
	for k := range rows {
		if !ledger[k] {
			v.add("never-produced", "inbox row %s (biz type %s), which no ledger lists", k, bizType)
		}
	}
	return nil
}

// misbehaverSummary is "done a/A panic b/B timeout c/C" (as predicted / predicted).
func misbehaverSummary(r Report) string {
	var s []string
	for _, k := range []string{"done", "panic", "timeout"} {
		s = append(s, fmt.Sprintf("%s %d/%d", k, r.MisbehaverGot[k], r.MisbehaverWant[k]))
	}
	return strings.Join(s, ", ")
}
