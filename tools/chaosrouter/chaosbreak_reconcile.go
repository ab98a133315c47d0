//go:build onceflow_broken_reconcile

package main

// A deliberately broken router, for the chaos harness only (scripts/chaos.sh
// CHAOS_BROKEN=reconcile, make chaos-broken): the exactly-once relay skips its
// reconciliation at session start, so a batch that was committed to Kafka but not marked (a
// crash between the two) is published again. The harness's checker must report the
// duplicate events.

import "github.com/onceflow/onceflow/internal/faults"

type skipReconcile struct{}

var _ faults.Outbox = skipReconcile{}

func (skipReconcile) SkipReconcile() bool { return true }

func init() { faults.SetOutbox(skipReconcile{}) }
