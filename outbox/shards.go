package outbox

import (
	"fmt"
	"strconv"
	"strings"
)

// ShardName is the lease name of shard i of n in the shard group of RelayConfig.Shard.
// It is the group name itself when n is 1, else group#i/n.
func ShardName(group string, i, n int) string {
	if n == 1 {
		return group
	}
	return fmt.Sprintf("%s#%d/%d", group, i, n)
}

// shardTxnID is the transactional id of shard i of n of a group whose id is group. It is
// the group's own id when n is 1, else group-<i>of<n>.
func shardTxnID(group string, i, n int) string {
	if n == 1 {
		return group
	}
	return fmt.Sprintf("%s-%dof%d", group, i, n)
}

// shardCountOf reports the shard count a lease name implies for group. It returns 0 for
// a name of another group.
func shardCountOf(group, name string) int {
	if name == group {
		return 1
	}
	rest, ok := strings.CutPrefix(name, group+"#")
	if !ok {
		return 0
	}
	_, count, ok := strings.Cut(rest, "/")
	n, err := strconv.Atoi(count)
	if !ok || err != nil || n < 1 {
		return 0
	}
	return n
}
