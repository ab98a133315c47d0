package outbox

import (
	"database/sql"
	"sync"
	"sync/atomic"
	"unsafe"
)

// The hand-off lets an exactly-once relay take the rows of a group-committed batch from
// memory instead of reading them back. A Writer hands the rows over when it writes through
// the pool of such a relay in the same process. Its UseStatements was then given the
// relay's *sql.DB, and it writes the relay's table. It hands the rows over only once the
// batch's transaction committed, through txdefer.Commit.
//
// The relay still decides what to publish from the database alone. It reads the ids and
// key hashes of the oldest pending rows in id order. That read is index-only, on
// idx_unpublished, and costs the database far less than a read of the rows in full. The
// relay takes a row's columns from the hand-off only when every row of that read was handed
// over, with the key hash the database gives for it. Otherwise it reads the batch in full.
// So the published set, its order, its positions and its marks are what a read of the
// database gives. Only the source of the bytes changes.
//
// Outbox rows never change after they are written, because the relay and the cleaner only
// mark and delete them. The hand-off drops a row once it is published or parked, or once a
// read of the pending rows shows that another relay published it. It drops every row when
// the relay's session starts. A full hand-off takes no more rows until the relay drains it,
// so RelayConfig.HandOffBytes bounds its memory.
//
// See docs/ARCHITECTURE.md, section "The relay, and why each event is published once", and
// docs/BENCHMARKS.md, section "End to end against the inbox's ceiling, and the router's CPU
// per order".

// handoffKey names the rows of one table of one pool.
type handoffKey struct {
	db    *sql.DB
	table string
}

// handoffs holds a hand-off for each pool and table that an exactly-once relay of this
// process runs on.
var handoffs sync.Map // handoffKey → *handoff

// handedRow is one row a Writer wrote. hash is the database's key_hash column. vals are
// the values the Writer gave to the insert, in the order of writerColumns.
type handedRow struct {
	hash int64
	vals [rowWidth]any
	size int
	seq  uint64 // when it was handed
}

// handedID is a row of the hand-off's queue: its id and when it was handed.
type handedID struct {
	id  int64
	seq uint64
}

// handoff is the rows handed to the relays of one pool and table.
type handoff struct {
	max    int
	refs   int                         // relays using it, guarded by handoffMu
	relays atomic.Pointer[[]*eosRelay] // those relays, since rows go in only for a shard one of them owns

	mu    sync.Mutex
	rows  map[int64]handedRow
	order []handedID // in the order handed, with dropped rows too; order[:head] are gone
	head  int
	seq   uint64 // puts so far
	bytes int

	// handed and full count the rows handed and not taken. hits and misses count the
	// batches taken and read in full.
	handed, full, hits, misses atomic.Int64
}

var handoffMu sync.Mutex

// registerHandoff returns the hand-off of db and table for relay r. If there is none, it
// makes one of max bytes. unregisterHandoff releases it.
func registerHandoff(db *sql.DB, table string, max int, r *eosRelay) *handoff {
	handoffMu.Lock()
	defer handoffMu.Unlock()
	k := handoffKey{db, table}
	h := &handoff{max: max, rows: map[int64]handedRow{}}
	if v, ok := handoffs.Load(k); ok {
		h = v.(*handoff)
	} else {
		handoffs.Store(k, h)
	}
	h.refs++
	rs := []*eosRelay{r}
	if old := h.relays.Load(); old != nil {
		rs = append(rs, *old...)
	}
	h.relays.Store(&rs)
	return h
}

// unregisterHandoff releases relay r's registerHandoff. The last relay's release removes the
// hand-off.
func unregisterHandoff(db *sql.DB, table string, h *handoff, r *eosRelay) {
	handoffMu.Lock()
	defer handoffMu.Unlock()
	var rs []*eosRelay
	for _, x := range *h.relays.Load() {
		if x != r {
			rs = append(rs, x)
		}
	}
	h.relays.Store(&rs)
	if h.refs--; h.refs == 0 {
		handoffs.CompareAndDelete(handoffKey{db, table}, h)
	}
}

// owned reports whether a relay of the hand-off owns the shard of a row of key hash hash.
// The hand-off keeps no rows of a shard that another process publishes or whose relay waits
// for its lease. That relay would never drop them.
func (h *handoff) owned(hash int64) bool {
	rs := h.relays.Load()
	if rs == nil {
		return false
	}
	for _, r := range *rs {
		if n := int64(len(r.shards)); n > 0 && r.shards[hash%n].owner.Load() {
			return true
		}
	}
	return false
}

// empty reports whether the hand-off holds no row.
func (h *handoff) empty() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.rows) == 0
}

// lookupHandoff returns the hand-off of db and table, or nil when no exactly-once relay of
// this process runs on them.
func lookupHandoff(db *sql.DB, table string) *handoff {
	if db == nil {
		return nil
	}
	v, ok := handoffs.Load(handoffKey{db, table})
	if !ok {
		return nil
	}
	return v.(*handoff)
}

// rowOverhead is what a handed row holds beyond its bytes, in its map entry, values and id.
const rowOverhead = 160

// put adds committed rows. ids[i] and hashes[i] belong to the row whose values are
// args[i*rowWidth:(i+1)*rowWidth], whose payload is a copy of its own. put does not take
// rows that do not fit in max, or rows of a shard no relay of the hand-off owns. Those rows
// are read back.
func (h *handoff) put(ids, hashes []int64, args []any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seq++
	taken := 0
	for i, id := range ids {
		vals := args[i*rowWidth : (i+1)*rowWidth]
		size := rowOverhead + valueBytes(vals)
		if h.bytes+size > h.max || !h.owned(hashes[i]) {
			continue
		}
		h.dropLocked(id)
		r := handedRow{hash: hashes[i], size: size, seq: h.seq}
		copy(r.vals[:], vals)
		h.rows[id] = r
		h.order = append(h.order, handedID{id, h.seq})
		h.bytes += size
		taken++
	}
	h.handed.Add(int64(taken))
	h.full.Add(int64(len(ids) - taken))
}

// mark returns the current put count, for a read of the pending rows about to start.
func (h *handoff) mark() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.seq
}

// dropStale drops the rows handed before mark whose ids are below oldest. A read of the
// pending rows started at mark, and oldest is the smallest pending id it found. Such rows
// committed before the read started and are not pending. So another relay published them,
// or they were parked. Rows handed later may have smaller ids, because a transaction may
// commit after the transaction of a later id. With several shards, the read covered shard
// of shards, by MOD(key_hash, shards). It tells nothing of the other shards' rows, and the
// scan stops at the first of them.
func (h *handoff) dropStale(oldest int64, mark uint64, shard, shards int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for h.head < len(h.order) {
		q := h.order[h.head]
		r, ok := h.rows[q.id]
		if ok && r.seq == q.seq && (q.seq > mark || q.id >= oldest || shards > 1 && r.hash%int64(shards) != int64(shard)) {
			break
		}
		if ok && r.seq == q.seq {
			h.dropLocked(q.id)
		}
		h.head++
	}
	h.compactLocked()
}

func (h *handoff) compactLocked() {
	if h.head == len(h.order) {
		h.order, h.head = h.order[:0], 0
	} else if h.head > 1024 && h.head*2 > len(h.order) {
		h.order = append(h.order[:0], h.order[h.head:]...)
		h.head = 0
	}
}

// take returns the handed rows of ids, in that order, when every one of them was handed
// with the key hash hashes[i] that the database gives. Otherwise it returns nil, and the
// batch is read in full.
func (h *handoff) take(ids, hashes []int64, into []handedRow) []handedRow {
	h.mu.Lock()
	defer h.mu.Unlock()
	into = into[:0]
	for i, id := range ids {
		r, ok := h.rows[id]
		if !ok || r.hash != hashes[i] {
			h.misses.Add(1)
			return nil
		}
		into = append(into, r)
	}
	h.hits.Add(1)
	return into
}

// drop forgets the rows of ids. They were parked, or published when their Kafka
// transaction committed.
func (h *handoff) drop(ids []int64) {
	h.mu.Lock()
	for _, id := range ids {
		h.dropLocked(id)
	}
	for h.head < len(h.order) { // skip the published rows at the queue's head
		q := h.order[h.head]
		if r, ok := h.rows[q.id]; ok && r.seq == q.seq {
			break
		}
		h.head++
	}
	h.compactLocked()
	h.mu.Unlock()
}

// reset forgets every row when a relay session starts. What the database holds may have
// changed meanwhile, by a restore or a failover. A relay that waited for the lease may hold
// rows that another relay published.
func (h *handoff) reset() {
	h.mu.Lock()
	clear(h.rows)
	h.order, h.head, h.bytes = h.order[:0], 0, 0
	h.mu.Unlock()
}

func (h *handoff) dropLocked(id int64) {
	if r, ok := h.rows[id]; ok {
		h.bytes -= r.size
		delete(h.rows, id)
	}
}

// valueBytes is the bytes of a row's values.
func valueBytes(vals []any) int {
	n := 0
	for _, v := range vals {
		switch v := v.(type) {
		case string:
			n += len(v)
		case []byte:
			n += len(v)
		}
	}
	return n
}

// rawOf is a value v of a Writer's row as the bytes a database read of its column gives.
// v is a string, a []byte or nil, and nil gives nil for NULL. A string's bytes are shared
// and never written to.
func rawOf(v any) sql.RawBytes {
	switch v := v.(type) {
	case string:
		if v == "" {
			return sql.RawBytes{}
		}
		return unsafe.Slice(unsafe.StringData(v), len(v))
	case []byte:
		if v == nil {
			return sql.RawBytes{}
		}
		return v
	}
	return nil
}

// HandOffStats counts the hand-off of the exactly-once relays of one pool and table in this
// process. See RelayConfig.HandOffBytes.
type HandOffStats struct {
	Handed   int64 // events Writers handed over once their batch committed
	Full     int64 // events not taken and read back, because the hand-off was full or their shard is another process's
	Batches  int64 // batches whose rows all came from the hand-off
	ReadBack int64 // batches read in full, because a row of theirs was not handed over
}

// HandOff returns the counts of the relay's hand-off. They are zero when the relay has
// none, because it is at least once or HandOffBytes is off.
func (r *Relay) HandOff() HandOffStats {
	e, ok := r.engine.(*eosRelay)
	if !ok || e.handoff == nil {
		return HandOffStats{}
	}
	h := e.handoff
	return HandOffStats{Handed: h.handed.Load(), Full: h.full.Load(), Batches: h.hits.Load(), ReadBack: h.misses.Load()}
}
