// Package inbox makes a message handler exactly-once in effect.
//
// Every delivery first claims a row in the inbox table, inside the same database
// transaction as the handler's own writes. The row is keyed by the handler's biz type and
// by the business key the handler extracts, not by the transport's message id. What the
// row says decides what happens.
//
//   - A new key runs the handler. Its writes and the inbox row commit together.
//   - A key already 'done' is a duplicate. It is counted and changes nothing.
//   - A key still 'processing' resumes. A multi-step handler committed some steps there,
//     then crashed or lost its partition. The handler's own state decides what is left.
//   - The same key with a different payload fingerprint is a conflict. It is quarantined,
//     never silently dropped.
//
// A failure rolls the step back, so no dedup mark outlives a failed business step. Retries
// are bounded and back off. After MaxAttempts the message is quarantined as 'failed' in
// its own transaction, and the offset moves on. So one poison message never stalls a
// partition.
//
// # Writing a handler
//
// A plugin implements Handler and declares it in a Plugin. The simplest Handler is made by
// Typed from a Codec, such as JSON, and a function of the decoded value. Handle writes in
// the inbox's transaction. It writes its rows through an Inserter and its events through
// outbox.Writer. It returns Done, or Continue after one step of a multi-step handler.
//
//	h := inbox.Typed(
//		inbox.JSON[OrderShipped]{Key: func(o OrderShipped) (string, error) { return o.OrderID, nil }},
//		func(ctx context.Context, tx *sql.Tx, d *inbox.Delivery, o OrderShipped) (inbox.Progress, error) {
//			return inbox.Done, credits.Insert(ctx, tx, o.OrderID, o.Points)
//		})
//
// JSON decodes a payload as sent or not at all. Bytes that are not UTF-8 make the payload
// poison. JSON checks them with CheckJSONText, which a plugin's own JSON decoder calls too.
//
// A handler may implement three optional interfaces. A Preparer makes slow outside calls
// before the step's transaction. An io.Closer is closed when the runtime is done with the
// handler. A BatchHandler is the expert path of group commit, described below.
//
// # Group commit
//
// A Batcher runs deliveries that arrive together in shared transactions. Inbox.NewBatcher
// builds one, and the router uses one by default. A batch makes one multi-row claim, runs
// each delivery's Handle and commits once. Each delivery keeps the guarantees of Process.
// The rows that an Inserter and outbox.Writer defer go out in multi-row INSERTs at the end
// of the batch. A BatchHandler's HandleBatch does a batch's work with its own multi-row
// statements instead.
//
// The package knows no domain and no other onceflow layer. Package inbox/inboxops is the
// inbox as an operator's tools use it, with its rows, replay and cleaner.
package inbox
