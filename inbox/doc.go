// Package inbox is the contract of a onceflow plugin: what its author writes and reads.
//
// A plugin implements Handler and declares it in a Plugin, which its package registers
// with MustRegister. Every delivery first claims a row in the inbox table, inside the same
// database transaction as the handler's own writes. The row is keyed by the handler's biz
// type and by the business key its Decode extracts, not by the transport's message id.
//
//   - A new key runs the handler. Its writes and the inbox row commit together.
//   - A key already done is a duplicate. It is counted and changes nothing.
//   - A key still processing resumes. A multi-step handler committed some steps there,
//     then crashed or lost its partition. The handler's own state decides what is left.
//   - The same key with a different Fingerprint is a conflict. It is quarantined, never
//     silently dropped.
//
// A failure rolls the step back, so no dedup mark outlives a failed business step. Retries
// are bounded and back off, then the message is quarantined, and the offset moves on. An
// error wrapped by Permanent, and a Decode error, which makes the message poison, are
// quarantined at once.
//
// # Writing a handler
//
// The simplest Handler is made by Typed from a Codec, such as JSON, and a function of the
// decoded value. Handle writes in the inbox's transaction. It writes its rows through an
// Inserter and its events through outbox.Writer. It returns Done, or Continue after one
// step of a multi-step handler.
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
// handler. A BatchHandler is the expert path of group commit: deliveries that arrive
// together run in shared transactions, and HandleBatch does a batch's work with multi-row
// statements of its own. A plain Handler is group-committed without it. The rows that an
// Inserter and outbox.Writer defer then go out in multi-row INSERTs at the end of the
// batch.
//
// A Plugin may also declare HTTP commands (Command), a Verify of its invariants for
// `router verify`, the History of a business key for the operator console, and a Sampler
// for `router produce`. Package inbox/inboxtest tests a plugin.
//
// The package knows no domain and no other onceflow layer. Package inbox/engine runs the
// contract: the Inbox, its group commit and the Watermill handler the runtime builds.
package inbox
