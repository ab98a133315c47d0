package dbx

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/go-sql-driver/mysql"
)

// A DSN may list several servers of one cluster, comma separated, in the address part.
//
//	onceflow:pw@tcp(127.0.0.1:4306,127.0.0.1:4307,127.0.0.1:4308)/onceflow
//
// Open then connects through a failover connector. New connections go to the first server
// in that order that answers and, on Galera, is ready and Synced. They stay with it until
// it fails, then move to the next one. The list lives in the DSN and is not a setting of
// its own. So every tool that takes a DSN fails over the same way. Such tools are migrate,
// produce, the tests and the chaos harness.

// galeraSynced is Galera's wsrep_local_state for Synced. ErWsrepNotReady is the error a
// node answers while it is not part of the primary component or not yet ready. It is
// ER_UNKNOWN_COM_ERROR, with the message "WSREP has not yet prepared node for application
// use".
const (
	galeraSynced    = "4"
	ErWsrepNotReady = 1047
)

// ServerAddrs are the addresses of a go-sql-driver DSN's tcp(...) part. There is one, or
// several comma separated.
func ServerAddrs(addr string) []string {
	var out []string
	for a := range strings.SplitSeq(addr, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// failoverConnector opens each connection to the current server. When that fails, it tries
// the others in the DSN's order. The first that answers, and is Synced on Galera, becomes
// the current one.
type failoverConnector struct {
	addrs []string
	conns []driver.Connector
	drv   driver.Driver

	mu  sync.Mutex
	cur int
}

func newFailoverConnector(mc *mysql.Config, addrs []string) (*failoverConnector, error) {
	f := &failoverConnector{addrs: addrs}
	for _, a := range addrs {
		c := mc.Clone()
		c.Addr = a
		conn, err := mysql.NewConnector(c)
		if err != nil {
			return nil, fmt.Errorf("database dsn: server %s: %w", a, err)
		}
		f.conns = append(f.conns, conn)
		f.drv = conn.Driver()
	}
	return f, nil
}

func (f *failoverConnector) Driver() driver.Driver { return f.drv }

// Current is the address new connections go to first.
func (f *failoverConnector) Current() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.addrs[f.cur]
}

func (f *failoverConnector) Connect(ctx context.Context) (driver.Conn, error) {
	f.mu.Lock()
	cur := f.cur
	f.mu.Unlock()
	order := []int{cur}
	for i := range f.addrs {
		if i != cur {
			order = append(order, i)
		}
	}
	var errs []error
	for _, i := range order {
		conn, err := f.conns[i].Connect(ctx)
		if err == nil {
			err = checkNode(ctx, conn)
			if err != nil {
				_ = conn.Close()
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f.addrs[i], err))
			if ctx.Err() != nil {
				break
			}
			continue
		}
		f.mu.Lock()
		f.cur = i
		f.mu.Unlock()
		full, ok := conn.(mysqlConn)
		if !ok {
			_ = conn.Close()
			return nil, fmt.Errorf("failover: the driver's connection %T lacks an interface", conn)
		}
		return &nodeConn{mysqlConn: full}, nil
	}
	// Unreachable servers are a connection-class error for IsConnError, whatever their causes.
	return nil, fmt.Errorf("%w: no server of %s answered: %w", driver.ErrBadConn, strings.Join(f.addrs, ","), errors.Join(errs...))
}

// errNotSynced is a Galera node that answers but is not ready or not Synced. Such a node
// may be a joiner, a donor or a node outside the primary component.
var errNotSynced = errors.New("galera node not ready or not synced")

// checkNode refuses a Galera node that is not ready or not Synced, or has no such status.
// A Galera node has @@wsrep_on 1. A node recovering alone has no such status. A server
// without wsrep passes. Its @@wsrep_on is 0, or it has no such variable, as on MySQL.
func checkNode(ctx context.Context, conn driver.Conn) error {
	q, ok := conn.(driver.QueryerContext)
	if !ok {
		return nil
	}
	var on bool
	if rows, err := q.QueryContext(ctx, "SELECT @@wsrep_on", nil); err == nil {
		row := make([]driver.Value, 1)
		on = rows.Next(row) == nil && asString(row[0]) == "1"
		_ = rows.Close()
	} else if !IsConnError(err) {
		return nil // no wsrep_on variable, so not Galera
	} else {
		return err
	}
	if !on {
		return nil
	}
	rows, err := q.QueryContext(ctx, "SHOW GLOBAL STATUS WHERE Variable_name IN ('wsrep_ready', 'wsrep_local_state')", nil)
	if err != nil {
		return err
	}
	defer rows.Close()
	vals := map[string]string{}
	row := make([]driver.Value, len(rows.Columns()))
	for {
		if err := rows.Next(row); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return err
		}
		if len(row) == 2 {
			vals[strings.ToLower(asString(row[0]))] = asString(row[1])
		}
	}
	if vals["wsrep_ready"] != "ON" || vals["wsrep_local_state"] != galeraSynced {
		return fmt.Errorf("%w (wsrep_ready=%s, wsrep_local_state=%s)", errNotSynced, vals["wsrep_ready"], vals["wsrep_local_state"])
	}
	return nil
}

func asString(v driver.Value) string {
	switch s := v.(type) {
	case []byte:
		return string(s)
	case string:
		return s
	}
	return fmt.Sprint(v)
}

// nodeConn is a connection to one server of a failover DSN. The server may answer that it
// is not ready, as a Galera node that left the primary component does. The pool then drops
// the connection rather than reuse it. The next connection goes to a node that is Synced.
type nodeConn struct {
	mysqlConn
	bad atomic.Bool
}

func (c *nodeConn) note(err error) error {
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == ErWsrepNotReady {
		c.bad.Store(true)
	}
	return err
}

func (c *nodeConn) IsValid() bool { return !c.bad.Load() && c.mysqlConn.IsValid() }

func (c *nodeConn) ResetSession(ctx context.Context) error {
	if c.bad.Load() {
		return driver.ErrBadConn
	}
	return c.mysqlConn.ResetSession(ctx)
}

func (c *nodeConn) Prepare(q string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), q)
}

func (c *nodeConn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	s, err := c.mysqlConn.PrepareContext(ctx, q)
	return s, c.note(err)
}

func (c *nodeConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	r, err := c.mysqlConn.ExecContext(ctx, q, args)
	return r, c.note(err)
}

func (c *nodeConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	r, err := c.mysqlConn.QueryContext(ctx, q, args)
	return r, c.note(err)
}

func (c *nodeConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	tx, err := c.mysqlConn.BeginTx(ctx, opts)
	if err != nil {
		return nil, c.note(err)
	}
	return nodeTx{tx, c}, nil
}

func (c *nodeConn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

type nodeTx struct {
	driver.Tx
	c *nodeConn
}

func (t nodeTx) Commit() error { return t.c.note(t.Tx.Commit()) }
