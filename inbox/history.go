package inbox

import (
	"context"
	"database/sql"
	"time"
)

// HistoryEntry is one step of what a plugin did for a business key, as its own tables
// record it: a state machine's transition, for instance.
type HistoryEntry struct {
	At     time.Time `json:"at"`
	From   string    `json:"from,omitempty"`
	To     string    `json:"to"`
	Detail string    `json:"detail,omitempty"`
}

// HistoryFunc returns what a plugin recorded for the business key key (an inbox row's
// dedup_key), oldest first, from its own tables on db; nil when it recorded nothing. The
// operator console shows it on the row's page. It reads only, by an index of the plugin's
// tables, and returns a bounded number of entries.
type HistoryFunc func(ctx context.Context, db *sql.DB, key string) ([]HistoryEntry, error)
