package dbx

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"weak"

	"github.com/go-sql-driver/mysql"
)

// ReadCommitted is the session isolation every onceflow pool must run at, as the server
// names it.
const ReadCommitted = "READ-COMMITTED"

// ErrIsolation is wrapped by the error of a pool whose sessions do not run at READ
// COMMITTED. Retrying does not help, because the pool must be opened differently.
var ErrIsolation = errors.New("database session isolation is not READ-COMMITTED")

// errUnknownVariable is the server's error 1193, "Unknown system variable".
const errUnknownVariable = 1193

// Querier is what SessionIsolation reads through, such as a pool, a connection or a
// transaction.
type Querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// SessionIsolation returns the isolation level of a session of q, as the server names it,
// such as READ-COMMITTED or REPEATABLE-READ. It reads @@tx_isolation, MariaDB's name. Where
// the server has no such variable, as on MySQL 8, it reads @@transaction_isolation.
func SessionIsolation(ctx context.Context, q Querier) (string, error) {
	var iso string
	db, isPool := q.(*sql.DB)
	if isPool && DialectOf(db) == Postgres {
		return postgresIsolation(ctx, q)
	}
	err := q.QueryRowContext(ctx, "SELECT @@tx_isolation").Scan(&iso)
	if pgCode(err) != "" {
		return postgresIsolation(ctx, q)
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == errUnknownVariable {
		err = q.QueryRowContext(ctx, "SELECT @@transaction_isolation").Scan(&iso)
	}
	if err != nil {
		return "", fmt.Errorf("read session isolation: %w", err)
	}
	return iso, nil
}

// postgresIsolation reads PostgreSQL's "read committed" as READ-COMMITTED.
func postgresIsolation(ctx context.Context, q Querier) (string, error) {
	var iso string
	if err := q.QueryRowContext(ctx, "SHOW transaction_isolation").Scan(&iso); err != nil {
		return "", fmt.Errorf("read session isolation: %w", err)
	}
	return strings.ToUpper(strings.ReplaceAll(iso, " ", "-")), nil
}

// CheckIsolation reports an error wrapping ErrIsolation unless the sessions of db run at
// READ COMMITTED. It reads the level from one pooled connection, because every connection
// of a pool is opened from the same DSN.
//
// Under REPEATABLE READ, MariaDB's default, InnoDB takes gap locks. The inbox's claims of
// new keys then block each other's inserts and deadlock. A plain read inside a transaction
// also sees the snapshot of its first read, so a relay that lingers for more rows never
// sees them. Pools opened by Open pass. For a pool of one's own, add
// tx_isolation='READ-COMMITTED' to its DSN, or transaction_isolation on MySQL 8.
func CheckIsolation(ctx context.Context, db Querier) error {
	iso, err := SessionIsolation(ctx, db)
	if err != nil {
		return err
	}
	if iso != ReadCommitted {
		return fmt.Errorf("%w: the pool's sessions run at %s; open it with dbx.Open, or add tx_isolation='READ-COMMITTED' to its DSN (transaction_isolation on MySQL 8)", ErrIsolation, iso)
	}
	return nil
}

// checkedPools holds the pools whose isolation InTx has checked. It holds them weakly, so a
// closed, unreferenced pool leaves the set when it is collected.
var checkedPools sync.Map // weak.Pointer[sql.DB] → struct{}

// checkPool runs CheckIsolation on db the first time InTx sees it. A pool that failed, or
// could not be read, is checked again next time.
func checkPool(ctx context.Context, db *sql.DB) error {
	k := weak.Make(db)
	if _, ok := checkedPools.Load(k); ok {
		return nil
	}
	if err := CheckIsolation(ctx, db); err != nil {
		return err
	}
	if _, loaded := checkedPools.LoadOrStore(k, struct{}{}); !loaded {
		runtime.AddCleanup(db, func(k weak.Pointer[sql.DB]) { checkedPools.Delete(k) }, k)
	}
	return nil
}
