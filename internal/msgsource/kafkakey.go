package msgsource

import (
	"context"
	"strconv"
	"strings"

	wkafka "github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
)

// KeyQuery is the context key of a record's Kafka key. A subscriber's message context
// answers it with the key as a string, "" for a record without one. pkg/kafkax's
// ParallelSubscriber answers it from the slot of the message.
type KeyQuery struct{}

// WithKey returns ctx carrying key as the record's Kafka key. A replay sets it from the key
// a poison row recorded.
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, KeyQuery{}, key)
}

// Key returns the Kafka key of the record that ctx is the message context of. It reads
// KeyQuery, then watermill-kafka's own key, which its one-at-a-time subscriber sets. ok is
// false when ctx holds neither, as for an HTTP command.
func Key(ctx context.Context) (key string, ok bool) {
	if ctx == nil {
		return "", false
	}
	if k, ok := ctx.Value(KeyQuery{}).(string); ok {
		return k, true
	}
	if b, ok := wkafka.MessageKeyFromCtx(ctx); ok {
		return string(b), true
	}
	return "", false
}

// A poison row's key names the record's place in Kafka, such as "poison:orders/3/1200". Its
// last error therefore begins with notes of what an operator searches it by. One note holds
// the record's Kafka key. Another holds the payload's id, when the payload is JSON enough to
// read it. Each value is Go-quoted. So bytes that are not UTF-8 and characters that do not
// show as themselves are written as escapes such as \xff, and never replaced.

// Labels of the notes.
const (
	keyNoteLabel = "kafka key "
	idNoteLabel  = "payload id "
	noteEnd      = "; "
)

// MaxNoted is the longest key or id a note holds, in bytes. It is the longest dedup key. A
// longer value is named by its length only.
const MaxNoted = 191

// KeyNote is the note of a Kafka key, such as `kafka key "oc-1"`.
func KeyNote(key string) string { return keyNoteLabel + strconv.Quote(key) }

// IDNote is the note of a payload's id, such as `payload id "oc-1"`.
func IDNote(id string) string { return idNoteLabel + strconv.Quote(id) }

// Notes returns the notes that begin a poison row's last error. hasKey says whether the
// record's Kafka key is known. An empty id is left out.
func Notes(key string, hasKey bool, id string) string {
	var b strings.Builder
	if hasKey {
		if len(key) > MaxNoted {
			b.WriteString(keyNoteLabel + "of " + strconv.Itoa(len(key)) + " bytes" + noteEnd)
		} else {
			b.WriteString(KeyNote(key) + noteEnd)
		}
	}
	if id != "" && len(id) <= MaxNoted {
		b.WriteString(IDNote(id) + noteEnd)
	}
	return b.String()
}

// NotedKey returns the Kafka key that a last error's notes hold. ok is false when they
// hold none.
func NotedKey(text string) (key string, ok bool) {
	rest, found := strings.CutPrefix(text, keyNoteLabel)
	if !found {
		return "", false
	}
	q, err := strconv.QuotedPrefix(rest)
	if err != nil {
		return "", false
	}
	key, err = strconv.Unquote(q)
	return key, err == nil
}

// WithoutNotes returns a last error without the notes it begins with.
func WithoutNotes(text string) string {
	for {
		var rest string
		var found bool
		for _, label := range []string{keyNoteLabel, idNoteLabel} {
			if rest, found = strings.CutPrefix(text, label); found {
				break
			}
		}
		if !found {
			return text
		}
		if after, ok := strings.CutPrefix(rest, "of "); ok {
			if _, tail, ok := strings.Cut(after, " bytes"+noteEnd); ok {
				text = tail
				continue
			}
			return text
		}
		q, err := strconv.QuotedPrefix(rest)
		if err != nil || !strings.HasPrefix(rest[len(q):], noteEnd) {
			return text
		}
		text = rest[len(q)+len(noteEnd):]
	}
}
