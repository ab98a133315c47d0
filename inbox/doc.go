// Package inbox makes a message handler exactly-once in effect.
//
// Every delivery first claims a row in the inbox table, keyed by the business key the
// handler extracts (not the transport message id) and the handler's biz type, inside the
// same MySQL transaction as the handler's own writes:
//
//   - a new key runs the handler; its writes and the inbox row commit together;
//   - a key already 'done' is a duplicate: it is counted and changes nothing;
//   - a key still 'processing' (a multi-step handler committed some steps, then crashed or
//     lost its partition) resumes: the handler's own state decides what is left;
//   - the same key with a different payload fingerprint is a conflict: quarantined, never
//     silently dropped.
//
// A failure rolls the step back, so no dedup mark outlives a failed business step. Retries
// are bounded with backoff; after MaxAttempts the message is quarantined as 'failed' in its
// own transaction and the offset moves on, so one poison message never stalls a partition.
//
// # Writing a handler
//
// A plugin implements Handler — most simply with Typed, a Codec (JSON) and a function of
// the decoded value — and declares it in a Plugin. Handle writes in the inbox's
// transaction, its rows through an Inserter and its events through outbox.Writer, and
// returns Done (or Continue after one step of a multi-step handler):
//
//	h := inbox.Typed(
//		inbox.JSON[OrderShipped]{Key: func(o OrderShipped) (string, error) { return o.OrderID, nil }},
//		func(ctx context.Context, tx *sql.Tx, d *inbox.Delivery, o OrderShipped) (inbox.Progress, error) {
//			return inbox.Done, credits.Insert(ctx, tx, o.OrderID, o.Points)
//		})
//
// JSON decodes a payload as sent or not at all: bytes that are not UTF-8 make it poison
// (CheckJSONText, which a plugin's own JSON decoder calls too).
//
// Optional: a Preparer makes slow outside calls before the step's transaction; an
// io.Closer is closed when the runtime is done with the handler; a BatchHandler is the
// expert path of group commit (below).
//
// # Group commit
//
// A Batcher (Inbox.NewBatcher; the router's default) runs deliveries that arrive together
// in shared transactions: one multi-row claim, each delivery's Handle, one commit, with
// Process's guarantees per delivery (grouped.go). The rows an Inserter and outbox.Writer
// defer go out in multi-row INSERTs at the end of the batch. A BatchHandler's HandleBatch
// does a batch's work with its own multi-row statements instead.
//
// The package knows no domain and no other onceflow layer; inbox/inboxops is the inbox as
// an operator's tools use it (rows, replay, cleaner).
package inbox
