package inboxtest

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

// A plugin's integration tests run on the MariaDB and Kafka broker of
// `scripts/infra.sh up`. OFTEST_ADMIN_DSN, OFTEST_APP_USER and OFTEST_BROKERS point them
// elsewhere. When a service is unreachable, each function fails the test and says how to
// start it. Under go test -short each function skips the test.

// Database is a fresh, migrated database of one test, dropped when the test ends.
type Database struct {
	Name  string
	DSN   string  // the application user's DSN (a router's db.dsn)
	DB    *sql.DB // a pool of the application user
	Admin *sql.DB // a privileged pool on the same database (DDL a test needs)
	// AdminDSN is the privileged user's DSN of the database, as a router's db.admin_dsn.
	AdminDSN string
}

// AdminExec runs a privileged statement on the database, such as one that creates a table
// the test needs. It fails t on error.
func (d Database) AdminExec(t testing.TB, q string, args ...any) {
	t.Helper()
	if _, err := d.Admin.Exec(q, args...); err != nil {
		t.Fatalf("inboxtest: %s: %v", q, err)
	}
}

// DB creates a fresh database with the framework's migrations and then the plugins'. Each
// plugin's migrations get their own version table, as `router migrate` applies them. DB
// returns a pool of maxConns connections of the application user, or 16 when maxConns is
// 0.
//
//	d := inboxtest.DB(t, 8, migrations.Set{Name: points.Name, FS: points.Migrations})
func DB(t testing.TB, maxConns int, plugins ...migrations.Set) Database {
	t.Helper()
	return Database(testenv.DB(t, maxConns, plugins...))
}

// Kafka returns the client configuration of the test broker.
func Kafka(t testing.TB) kafkax.Config {
	t.Helper()
	return testenv.Kafka(t)
}

// NewTopic creates a topic of the test's own, prefix followed by a random suffix, with the
// given partitions. The topic is deleted when the test ends.
func NewTopic(t testing.TB, kc kafkax.Config, prefix string, partitions int32) string {
	t.Helper()
	return testenv.Topic(t, kc, prefix, partitions)
}

// CommittedLag returns, per partition of topic, how far group's committed offset is behind
// the partition's end. All are zero once the group has handled everything.
func CommittedLag(t testing.TB, kc kafkax.Config, group, topic string) map[int32]int64 {
	t.Helper()
	return testenv.CommittedLag(t, kc, group, topic)
}

// ReadTopic returns the committed records of topic up to its end when called, each
// partition in offset order. It reads as read_committed, so it never returns an aborted
// transaction's records.
func ReadTopic(t testing.TB, kc kafkax.Config, topic string) []kafkax.Record {
	t.Helper()
	recs, err := kc.ReadAll(context.Background(), topic, 3*time.Second)
	if err != nil {
		t.Fatalf("inboxtest: read %s: %v", topic, err)
	}
	return recs
}
