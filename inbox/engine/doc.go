// Package engine runs the handlers of package inbox exactly once in effect: the inbox
// table's claim, retries, quarantine, delayed redelivery, the circuit breaker, group
// commit (Batcher) and HTTP commands (NewCommand, RunCommand).
//
// A plugin author needs none of it: a plugin imports package inbox and declares itself in
// an inbox.Plugin, and the runtime (package onceflow and the router binary) builds an
// Inbox and a Batcher for it. This package is for those who run handlers without the
// runtime, such as a team that wires Watermill by hand,
//
//	ib, err := engine.New(db, handler, engine.Config{BizType: "order-shipped"}, logger, nil)
//	b, err := ib.NewBatcher(engine.BatchConfig{})
//	router.AddConsumerHandler("order-shipped", "order-shipped", sub, b.HandlerFunc("order-shipped"))
//
// and the packages that run or inspect the inbox: the runtime, inbox/inboxops, the test
// kit inbox/inboxtest, inbox/httpcmd and the tools.
//
// Every delivery claims its row in the inbox table in the transaction of its handler's
// step. A failed attempt rolls back and is counted on the row. After Config.MaxAttempts
// the row is 'failed' with its Reason, in a transaction of its own, and the offset moves
// on, so one poison message never stalls a partition. Process runs one delivery at a
// time. A Batcher runs deliveries that arrive together in shared transactions: one
// multi-row claim, each delivery's Handle, or an inbox.BatchHandler's HandleBatch, and one
// commit, with the guarantees of Process for each delivery.
package engine
