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
// The package knows no domain and no other onceflow layer: a plugin implements Handler.
package inbox
