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
// A plugin implements Handler: Decode extracts the business key (an error makes the
// message poison), Handle does the work in the inbox's transaction and returns Done, or
// Continue after one step of a multi-step handler. The zero Progress is invalid: a Handle
// that returns it has its attempt failed, never taken for Done.
//
// Most plugins need not write Decode nor cast Delivery.Value: Typed builds the Handler from
// a Codec and a function that receives the decoded value. JSON is the default codec (fields
// the type does not know are allowed, data after the value and bytes that are not UTF-8 are
// refused: CheckJSONText, which a plugin's own JSON decoder calls too); the plugin gives
// the business key, and optionally the fingerprint:
//
//	h := inbox.Typed(
//		inbox.JSON[OrderShipped]{Key: func(o OrderShipped) (string, error) { return o.OrderID, nil }},
//		func(ctx context.Context, tx *sql.Tx, d *inbox.Delivery, o OrderShipped) (inbox.Progress, error) {
//			_, err := tx.ExecContext(ctx, "INSERT INTO points_credit (order_id, points) VALUES (?, ?)", o.OrderID, o.Points)
//			return inbox.Done, err
//		})
//
// A handler whose steps call slow outside services also implements Preparer: Prepare makes
// the calls before the step's transaction, so no lock is held across them.
//
// # Group commit
//
// A Batcher (Inbox.NewBatcher; the router's default) runs deliveries that arrive together
// in shared transactions: one multi-row claim of their inbox rows, the handler's work, one
// commit. Any Handler is group-committed: each delivery's Handle runs in the batch's
// transaction, behind a savepoint once a delivery has failed, so a delivery that fails,
// panics or times out is rolled back alone and retried or quarantined alone, its attempts
// counted on its row; per-key order and every guarantee above are Process's. A Preparer's
// Prepare runs before the batch, outside it. Rows a Handle inserts through an Inserter (and
// events it adds with outbox.Writer.Add) wait for the end of the batch and go out in
// multi-row INSERTs, so a one-step plain handler costs the batch no round trip of its own.
// A BatchHandler does a batch's work with its own multi-row statements (HandleBatch).
//
// The package knows no domain and no other onceflow layer: a plugin implements Handler.
package inbox
