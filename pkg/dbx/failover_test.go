package dbx_test

import (
	"database/sql/driver"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/onceflow/onceflow/pkg/dbx"
)

// Galera's answers are classified as the inbox must retry them. A certification failure,
// 1213 at a statement or at COMMIT, is a lock conflict that rolled back. A node not ready,
// 1047, is a connection-class error, and another node may take the statement. Neither is
// an unknown commit outcome.
func TestGaleraErrorClasses(t *testing.T) {
	cert := &mysql.MySQLError{Number: 1213, Message: "Deadlock found when trying to get lock; try restarting transaction"}
	notReady := &mysql.MySQLError{Number: 1047, Message: "WSREP has not yet prepared node for application use"}
	for _, tc := range []struct {
		name               string
		err                error
		lock, conn, unknow bool
	}{
		{"certification failure at commit", fmt.Errorf("commit: %w", cert), true, false, false},
		{"certification failure at a statement", fmt.Errorf("insert: %w", cert), true, false, false},
		{"node not ready", fmt.Errorf("begin: %w", notReady), false, true, false},
		{"no node answered", fmt.Errorf("%w: no server answered", driver.ErrBadConn), false, true, false},
		{"duplicate key", &mysql.MySQLError{Number: 1062}, false, false, false},
		{"syntax error", &mysql.MySQLError{Number: 1064}, false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := dbx.IsLockConflict(tc.err); got != tc.lock {
				t.Errorf("IsLockConflict = %v, want %v", got, tc.lock)
			}
			if got := dbx.IsConnError(tc.err); got != tc.conn {
				t.Errorf("IsConnError = %v, want %v", got, tc.conn)
			}
			if got := errors.Is(tc.err, dbx.ErrCommitUnknown); got != tc.unknow {
				t.Errorf("commit unknown = %v, want %v", got, tc.unknow)
			}
		})
	}
}

func TestServerAddrs(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"127.0.0.1:3306", []string{"127.0.0.1:3306"}},
		{"127.0.0.1:4306,127.0.0.1:4307, 127.0.0.1:4308", []string{"127.0.0.1:4306", "127.0.0.1:4307", "127.0.0.1:4308"}},
		{"a:1,,b:2,", []string{"a:1", "b:2"}},
	} {
		if got := dbx.ServerAddrs(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("ServerAddrs(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	// The driver keeps the list as the address; Open splits it.
	mc, err := dbx.ParseDSN("u:p@tcp(127.0.0.1:4306,127.0.0.1:4307)/db")
	if err != nil || mc.Addr != "127.0.0.1:4306,127.0.0.1:4307" {
		t.Fatalf("ParseDSN: addr %q, %v", mc.Addr, err)
	}
}
