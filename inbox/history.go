package inbox

import (
	"context"
	"database/sql"
	"time"
)

// HistoryEntry is one step of what a plugin did for a business key, as its own tables
// record it. A state machine's transition is an example.
type HistoryEntry struct {
	At     time.Time `json:"at"`
	From   string    `json:"from,omitempty"`
	To     string    `json:"to"`
	Detail string    `json:"detail,omitempty"`
}

// HistoryFunc returns what a plugin recorded for the business key key, oldest first, from
// its own tables on db. key is an inbox row's dedup_key. A HistoryFunc returns nil when the
// plugin recorded nothing. The operator console shows the entries on the row's page. A
// HistoryFunc only reads, through an index of the plugin's tables, and returns a bounded
// number of entries.
type HistoryFunc func(ctx context.Context, db *sql.DB, key string) ([]HistoryEntry, error)
