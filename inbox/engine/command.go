package engine

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/onceflow/onceflow/inbox"
)

// MaxIdempotencyKeyLen is the longest client token accepted. Tokens longer than
// inbox.MaxKeyLen, and tokens that begin with "sha256:", are stored as their sha256. See
// CommandKey.
const MaxIdempotencyKeyLen = 255

// digestPrefix begins the stored form of a token kept as its sha256, and no token kept as
// itself. CommandKey hashes every token that begins with it.
const digestPrefix = "sha256:"

// CheckIdempotencyKey reports why key is not a client token. A client token is 1 to 255
// printable ASCII characters, from space to ~.
func CheckIdempotencyKey(key string) error {
	if key == "" {
		return errors.New("the Idempotency-Key header is required (1-255 printable ASCII characters, one per intended operation)")
	}
	if len(key) > MaxIdempotencyKeyLen {
		return fmt.Errorf("Idempotency-Key of %d characters is longer than %d", len(key), MaxIdempotencyKeyLen)
	}
	if strings.ContainsFunc(key, func(r rune) bool { return r < ' ' || r > '~' }) {
		return errors.New("Idempotency-Key must be printable ASCII characters (space to ~)")
	}
	return nil
}

// CommandKey is the inbox business key of a client token. It is the token itself, unless
// the token is longer than inbox.MaxKeyLen or begins with "sha256:". Then it is "sha256:"
// and the hex digest of the token's sha256. So two tokens never share a key. A token stored
// as itself never begins with "sha256:", and one stored as its digest always does. A
// client's token "sha256:<64 hex>" is hashed too, so it is never taken for the digest of
// another client's long token.
func CommandKey(token string) string {
	if len(token) <= inbox.MaxKeyLen && !strings.HasPrefix(token, digestPrefix) {
		return token
	}
	s := sha256.Sum256([]byte(token))
	return digestPrefix + hex.EncodeToString(s[:])
}

// Reply is a command's response, an HTTP status and a JSON body.
type Reply struct {
	Status int
	Body   []byte
}

// CommandRequest is one HTTP command request.
type CommandRequest struct {
	Token    string            // the Idempotency-Key, checked by CheckIdempotencyKey
	Body     []byte            // the request body
	Metadata map[string]string // optional, stored with the inbox row, such as the client's address
	Source   inbox.Source      // where it came from, such as {Topic: "http POST /v1/claims", Partition: -1, Offset: -1}
	// OutcomeWait is how much longer, once ctx is done, a request already handed to a
	// batch by Batcher.RunCommand waits for its batch's outcome. It then gives up with an
	// error wrapping ErrOutcomeUnknown. Zero waits no longer. Inbox.RunCommand ignores
	// OutcomeWait, because its transaction ends with ctx.
	OutcomeWait time.Duration
}

// CommandResult is what RunCommand did.
type CommandResult struct {
	// Outcome says what happened to the request. OutcomeProcessed means this request ran
	// the command. OutcomeDuplicate means it was a retry, and Reply is the first request's.
	// OutcomeConflict means the token was used with another request, and nothing was
	// written. OutcomeQuarantined means the command failed, and a retry with the token runs
	// it again.
	Outcome Outcome
	InboxID int64
	Reply   Reply  // for processed and duplicate outcomes
	Reason  Reason // for quarantined outcomes
	Err     error  // the cause of a quarantine
}

// ErrBadRequest wraps RunCommand's errors for requests the command refuses before anything
// is written, such as a bad token or a body its Decode refuses. The client must fix them,
// and HTTP answers 400.
var ErrBadRequest = errors.New("bad request")

// ErrOutcomeUnknown wraps the errors of Process and RunCommand returned while the
// delivery's work may be committed, in whole or in part, or may still commit. That happens
// after a commit that got no answer, or a batch that was still running when ctx ended. It
// also happens when a step committed before a later one failed. Only a retry with the same
// key tells what happened. The retry finds the row done, or resumes or runs what is left.
// A new key could run the work twice.
var ErrOutcomeUnknown = errors.New("outcome unknown: the work may have committed")

// outcomeUnknown wraps err in ErrOutcomeUnknown, unless err wraps it already.
func outcomeUnknown(err error) error {
	if errors.Is(err, ErrOutcomeUnknown) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
}

// DefaultCommandRetention is how long a command's client token and its stored response are
// kept by default. It is the default of the stock router's http.idempotency_ttl. A client
// retries within hours, not over the days a Kafka topic can be replayed over.
const DefaultCommandRetention = 24 * time.Hour

// ReplyTable is the table of command responses for inbox table t.
func ReplyTable(t string) string { return t + "_response" }

// NewCommand builds the inbox of a command. inbox.Handler h runs behind the inbox table, under
// the command's biz type in cfg.BizType. Every step of a request runs in one transaction.
// The response is stored in ReplyTable, in the transaction that makes the row done. The
// inbox's Batcher, from NewBatcher, runs requests that arrive together in one transaction,
// as it does Kafka deliveries.
//
// A command's rows hold its clients' tokens, and ReplyTable the stored responses. They are
// kept for cfg.Retention. Zero stands for DefaultCommandRetention, not for the Kafka
// inbox's default.
func NewCommand(db *sql.DB, h inbox.Handler, cfg Config, logger watermill.LoggerAdapter, obs Observer) (*Inbox, error) {
	if cfg.Retention == 0 {
		cfg.Retention = DefaultCommandRetention
	}
	cfg.setDefaults()
	cfg.StepsPerTx = cfg.MaxSteps
	ib, err := New(db, h, cfg, logger, obs)
	if err != nil {
		return nil, err
	}
	table := ReplyTable(cfg.Table)
	ib.replyQuery = ib.d.Rebind(fmt.Sprintf(`SELECT status, body FROM %s WHERE inbox_id = ?`, table))
	// A client waits on its request, so it gets an answer, not a wait on a breaker. Its
	// retry with the token runs a quarantined row again, so there is no delayed
	// redelivery.
	ib.br = nil
	ib.replySave = fmt.Sprintf(`INSERT INTO %s (inbox_id, status, body) VALUES `, table)
	return ib, nil
}

// saveReplies stores the responses of ds, finished in tx, in a command inbox only. Each
// response is what Handle stated with Respond, or 204 without a body when it stated none.
// It returns the responses it stored, in the order of ds, and nil in a Kafka inbox.
func (ib *Inbox) saveReplies(ctx context.Context, tx *sql.Tx, ds []*inbox.Delivery) ([]*Reply, error) {
	if ib.replySave == "" || len(ds) == 0 {
		return nil, nil
	}
	replies := make([]*Reply, len(ds))
	args := make([]any, 0, 3*len(ds))
	for i, d := range ds {
		r := replyOf(d)
		if r == nil {
			r = &Reply{Status: 204}
		}
		replies[i] = r
		args = append(args, d.InboxID, r.Status, r.Body)
	}
	q := ib.replySave + strings.TrimSuffix(strings.Repeat("(?, ?, ?), ", len(ds)), ", ")
	if ib.d.IsPostgres() {
		q = ib.d.Rebind(q + " ON CONFLICT (inbox_id) DO UPDATE SET status = EXCLUDED.status, body = EXCLUDED.body")
	} else {
		q += " ON DUPLICATE KEY UPDATE status = VALUES(status), body = VALUES(body)"
	}
	if _, err := tx.ExecContext(ctx, q, args...); err != nil {
		return nil, fmt.Errorf("store %d command responses: %w", len(ds), err)
	}
	return replies, nil
}

// liveOptions are the options of a live delivery. A Kafka message has none. For a
// command's request, its Decode errors and conflicts are the client's. A quarantined row
// runs again, as the client's retry.
func (ib *Inbox) liveOptions() runOpts {
	if ib.replyQuery == "" {
		return runOpts{}
	}
	return runOpts{ProcessOptions: ProcessOptions{Reopen: true}, command: true}
}

// RunCommand runs one command request to its end, in a transaction of its own. Its errors
// are of three kinds.
//
//   - An error wrapping ErrBadRequest means the request was refused before anything was
//     written.
//   - An error wrapping ErrOutcomeUnknown means the request may have committed. Its
//     commit got no answer, or it committed and its response could not be read.
//   - Another error means the outcome could not be recorded, because the database was
//     unreachable or ctx was cancelled. Then nothing of the request committed.
//
// After either of the last two, a retry with the token runs the command or returns its
// response.
func (ib *Inbox) RunCommand(ctx context.Context, req CommandRequest) (CommandResult, error) {
	return ib.runCommand(ctx, req, func(msg *message.Message) (Result, error) {
		return ib.run(ctx, msg, req.Source, ib.liveOptions())
	})
}

// RunCommand runs one command request to its end as Inbox.RunCommand does. Its transaction
// is shared with the requests that arrive together, by group commit. That transaction
// does not end with ctx. When ctx ends first, RunCommand waits up to req.OutcomeWait for
// it, then returns an error wrapping ErrOutcomeUnknown. It returns an error that does not
// wrap ErrOutcomeUnknown only when nothing of the request committed.
func (b *Batcher) RunCommand(ctx context.Context, req CommandRequest) (CommandResult, error) {
	return b.ib.runCommand(ctx, req, func(msg *message.Message) (Result, error) {
		return b.processWaiting(ctx, msg, req.Source, req.OutcomeWait)
	})
}

// BizType returns the biz type of the Batcher's inbox.
func (b *Batcher) BizType() string { return b.ib.BizType() }

func (ib *Inbox) runCommand(ctx context.Context, req CommandRequest, run func(*message.Message) (Result, error)) (CommandResult, error) {
	if ib.replyQuery == "" {
		return CommandResult{}, errors.New("inbox: RunCommand on an inbox not made by NewCommand")
	}
	if err := CheckIdempotencyKey(req.Token); err != nil {
		return CommandResult{}, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	md := message.Metadata{}
	for k, v := range req.Metadata {
		md.Set(k, v)
	}
	md.Set(inbox.MetadataIdempotencyKey, req.Token)
	msg := message.NewMessage(watermill.NewUUID(), req.Body)
	msg.Metadata = md
	// The request is refused here, before it has a row, because a batch would quarantine
	// it as poison. The client is told the Decode error's text, which is the plugin's
	// reason. The client is never told a panic's value and stack.
	if _, err := ib.decode(msg); err != nil {
		if failureReason(err) == ReasonPanic {
			ib.logger.Error("command's Decode panicked", err, watermill.LogFields{"topic": req.Source.Topic})
			return CommandResult{}, fmt.Errorf("%w: the request body could not be decoded", ErrBadRequest)
		}
		return CommandResult{}, fmt.Errorf("%w: %s", ErrBadRequest, strings.TrimPrefix(err.Error(), inbox.ErrPoison.Error()+": "))
	}
	res, err := run(msg)
	if err == nil && res.Outcome == OutcomeHeld {
		// The request was quarantined, so the client's retry runs it again.
		res, err = ib.run(ctx, msg, req.Source, ib.liveOptions())
	}
	if err != nil {
		return CommandResult{}, err
	}
	out := CommandResult{Outcome: res.Outcome, InboxID: res.InboxID, Reason: res.Reason, Err: res.Err}
	switch res.Outcome {
	case OutcomeProcessed:
		if res.reply != nil {
			out.Reply = *res.reply
		}
	case OutcomeDuplicate:
		r, found, err := ib.storedReply(ctx, res.InboxID)
		if err != nil {
			return CommandResult{}, outcomeUnknown(err) // done, but its response is not at hand
		}
		if !found {
			// The row is done without a stored response, run by a path that stores none.
			r = Reply{Status: 200, Body: []byte(`{"status":"done"}`)}
		}
		out.Reply = r
	}
	return out, nil
}

// storedReply reads the response stored with inbox row id.
func (ib *Inbox) storedReply(ctx context.Context, id int64) (Reply, bool, error) {
	var r Reply
	err := ib.db.QueryRowContext(ctx, ib.replyQuery, id).Scan(&r.Status, &r.Body)
	if errors.Is(err, sql.ErrNoRows) {
		return Reply{}, false, nil
	}
	if err != nil {
		return Reply{}, false, fmt.Errorf("read the stored response of inbox row %d: %w", id, err)
	}
	return r, true, nil
}

// saveReplies stores the responses of the batch's deliveries finished in tx. Only a
// command inbox's Batcher stores any.
func (b *Batcher) saveReplies(ctx context.Context, tx *sql.Tx, run []*item) error {
	if b.ib.replySave == "" {
		return nil
	}
	var ds []*inbox.Delivery
	var its []*item
	for _, it := range run {
		if it.res != nil && it.res.Outcome == OutcomeProcessed {
			ds = append(ds, it.d)
			its = append(its, it)
		}
	}
	replies, err := b.ib.saveReplies(ctx, tx, ds)
	if err != nil {
		return err
	}
	for i, it := range its {
		it.res.reply = replies[i]
	}
	return nil
}
