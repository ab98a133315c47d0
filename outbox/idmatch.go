package outbox

import "strings"

// idMatch returns a condition on id matching exactly ids, and its arguments. A batch's ids
// are mostly consecutive, so it lists their ranges, and each range costs MariaDB one scan.
// When a shard's rows interleave with other shards', there can be more than half as many
// ranges as ids. It then writes an IN list, which costs one index dive per id. ranges
// reports which form it chose. On PostgreSQL sqlText.idIn writes the list as "id = ANY(?)".
func (d sqlText) idMatch(ids []int64) (cond string, args []any, ranges bool) {
	rs := idRanges(ids)
	if len(rs)*2 > len(ids) {
		cond, args = d.idIn("id", ids)
		return cond, args, false
	}
	var b strings.Builder
	args = make([]any, 0, 2*len(rs))
	b.WriteByte('(')
	for i, r := range rs {
		if i > 0 {
			b.WriteString(" OR ")
		}
		if r[0] == r[1] {
			b.WriteString("id = ?")
			args = append(args, r[0])
			continue
		}
		b.WriteString("id BETWEEN ? AND ?")
		args = append(args, r[0], r[1])
	}
	b.WriteByte(')')
	return b.String(), args, true
}

// idRanges compresses ascending ids into inclusive ranges.
func idRanges(ids []int64) [][2]int64 {
	var out [][2]int64
	for _, id := range ids {
		if n := len(out); n > 0 && out[n-1][1]+1 == id {
			out[n-1][1] = id
			continue
		}
		out = append(out, [2]int64{id, id})
	}
	return out
}
