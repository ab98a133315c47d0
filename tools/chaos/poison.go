package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"unicode/utf8"

	"github.com/IBM/sarama"
)

// poisonRecord is a record of the run on order-paid that is not an order (its key is not
// of the run's prefix): `router produce --poison` sent it, and every inbox consuming the
// topic must have quarantined it as poison under poison:<topic>/<partition>/<offset>.
type poisonRecord struct {
	partition int32
	offset    int64
	kind      string
}

// poisonKindOf names what makes m poison, by the checker's own reading of its bytes.
func poisonKindOf(m *sarama.ConsumerMessage) string {
	headerBytes, badHeader := 0, false
	for _, h := range m.Headers {
		headerBytes += len(h.Key) + len(h.Value)
		if !utf8.Valid(h.Key) || !utf8.Valid(h.Value) {
			badHeader = true
		}
	}
	switch {
	case m.Value == nil:
		return "tombstone"
	case len(m.Value) == 0:
		return "empty"
	case !utf8.Valid(m.Key):
		return "utf8-key"
	case badHeader:
		return "utf8-headers"
	case headerBytes > 64<<10:
		return "big-headers"
	case len(m.Value) > 64<<10:
		return "oversized"
	case !utf8.Valid(m.Value) && json.Valid(bytes.ToValidUTF8(m.Value, []byte("\uFFFD"))):
		return "utf8-string" // JSON once its bytes that are not UTF-8 are made U+FFFD
	case !utf8.Valid(m.Value):
		return "utf8-value"
	}
	return "bad-json"
}

// checkPoisonRecords checks that each poison record has its quarantine row, status failed
// and reason poison, in the inbox of every biz type.
func checkPoisonRecords(ctx context.Context, db *sql.DB, topic string, recs []poisonRecord, bizTypes []string, v *violations) error {
	for _, biz := range bizTypes {
		rows := map[string]inboxRow{}
		if err := query(ctx, db, `SELECT dedup_key, status, COALESCE(reason, '') FROM inbox WHERE biz_type = ? AND dedup_key LIKE ?`,
			[]any{biz, likePrefix("poison:" + topic + "/")}, func(s scanner) error {
				var k string
				var r inboxRow
				err := s.Scan(&k, &r.status, &r.reason)
				rows[k] = r
				return err
			}); err != nil {
			return err
		}
		for _, p := range recs {
			key := fmt.Sprintf("poison:%s/%d/%d", topic, p.partition, p.offset)
			r, ok := rows[key]
			switch {
			case !ok:
				v.add("poison-lost", "biz type %s: %s record %s/%d/%d has no quarantine row", biz, p.kind, topic, p.partition, p.offset)
			case r.status != "failed" || r.reason != "poison":
				v.add("poison-lost", "biz type %s: %s record %s/%d/%d: inbox %s %q, want failed poison", biz, p.kind, topic, p.partition, p.offset, r.status, r.reason)
			}
		}
	}
	return nil
}
