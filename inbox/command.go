package inbox

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
)

// Command is an HTTP command a plugin declares next to its Kafka handler. A request carries
// a client token in the Idempotency-Key header. The same Handler contract as for a Kafka
// message handles it, in the same inbox. The token is the inbox row's business key under
// the command's own biz type. So the token is claimed in the transaction of the command's
// effect and its outbox events, and the key exists exactly when the effect committed. A
// retry with the same token gets the first request's response back, never a second
// effect. Delivery.Respond states that response.
//
// The handler's Decode sees a message whose payload is the request body. Its metadata
// holds the token under MetadataIdempotencyKey. The Key that Decode returns is ignored,
// because the token is the key. Its Fingerprint identifies the request's meaning, and an
// empty one stands for the sha256 of the body. The Fingerprint decides whether a retry
// with the same token is the same request. A Decode error answers 400 and writes nothing.
// Its text is the answer's, so write it for the client. Make it a fixed text, never a
// wrapped Go error. A panic in Decode answers a fixed text of the inbox's.
//
// Handle states the response with Delivery.Respond when it returns Done. A handler that
// finishes a request in one Handle or HandleBatch call commits the key with the whole
// effect. A handler that returns Continue has its steps committed as they go, as for a
// Kafka delivery. The runtime runs all of a request's steps in one transaction, and group
// commit commits the first step with its batch. A retry with the token resumes what is
// left.
//
// A token longer than MaxKeyLen, or one that begins with "sha256:", is keyed by "sha256:"
// and its digest instead. So a Verify that needs a row's token reads it from the row's
// stored metadata, under MetadataIdempotencyKey.
type Command struct {
	Method  string // POST, PUT, PATCH or DELETE
	Path    string // such as "/v1/claims"
	BizType string // the inbox biz type of its tokens, such as "coupon-claim", never the plugin's own
	// Build creates the command's handler once the runtime has its database and
	// configuration. It gets the plugin's, as Plugin.Build does.
	Build func(ctx context.Context, env PluginEnv) (Handler, error)
}

// MetadataIdempotencyKey is the metadata key of a command message's client token.
const MetadataIdempotencyKey = "Idempotency-Key"

var commandPath = regexp.MustCompile(`^(/[A-Za-z0-9._~-]+)+$`)

// Validate checks a command declaration.
func (c Command) Validate() error {
	switch {
	case c.Method != "POST" && c.Method != "PUT" && c.Method != "PATCH" && c.Method != "DELETE":
		return fmt.Errorf("command %s %s: method must be POST, PUT, PATCH or DELETE", c.Method, c.Path)
	case !commandPath.MatchString(c.Path):
		return fmt.Errorf("command %s %q: path must be /segment[/segment...] of [A-Za-z0-9._~-]", c.Method, c.Path)
	case c.BizType == "":
		return fmt.Errorf("command %s %s: no biz type", c.Method, c.Path)
	case c.Build == nil:
		return fmt.Errorf("command %s %s: no Build function", c.Method, c.Path)
	}
	return nil
}

// MaxReplyBytes bounds a stored response body.
const MaxReplyBytes = 64 << 10

// Respond states the response of an HTTP command, status and v as JSON. Handle calls it
// before returning Done. The response is stored with the inbox row, in the step's
// transaction, and returned to every retry with the same token. Kafka deliveries have no
// response, so for them Respond only records it.
func (d *Delivery) Respond(status int, v any) error {
	if status < 200 || status > 599 {
		return fmt.Errorf("respond: status %d outside 200..599", status)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("respond: %w", err)
	}
	if len(b) > MaxReplyBytes {
		return fmt.Errorf("respond: body of %d bytes exceeds %d", len(b), MaxReplyBytes)
	}
	d.reply = &reply{status: status, body: b}
	return nil
}
