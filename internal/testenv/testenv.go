// Package testenv gives integration tests a real database and real Kafka topics, started by
// `scripts/infra.sh up`. OFTEST_DB chooses the database. It is MariaDB, PostgreSQL, or
// MySQL 8's SQL on MariaDB. When a service is unreachable the test FAILS and says how to
// start it. Only `go test -short` skips integration tests.
//
// Each DB call creates a fresh database that is dropped when the test ends. It is migrated
// with the framework's schema and the plugin migrations the test names. So test packages
// can run in parallel against one server.
package testenv

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/onceflow/onceflow/migrations"
	"github.com/onceflow/onceflow/pkg/dbx"
	"github.com/onceflow/onceflow/pkg/kafkax"
)

const howToStart = "start the services with `scripts/infra.sh up` (or `make infra`), or run `go test -short` to skip integration tests"

// Integration skips t under -short and otherwise does nothing. Call it first in every
// integration test.
func Integration(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test: skipped with -short")
	}
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// Dialect is the database the integration tests run on, set by OFTEST_DB. It is mariadb by
// default, or postgres. mysql8 runs MySQL 8's SQL with db.dialect=mysql8 on the MariaDB
// server.
func Dialect() dbx.Dialect {
	d, err := dbx.ParseDialect(os.Getenv("OFTEST_DB"))
	if err != nil {
		panic(fmt.Sprintf("testenv: OFTEST_DB: %v", err))
	}
	if d == "" {
		return dbx.MariaDB
	}
	return d
}

// AdminDSN is the privileged DSN without a database, from OFTEST_ADMIN_DSN. On PostgreSQL
// it is a URL of the "postgres" database, from OFTEST_PG_ADMIN_DSN.
func AdminDSN() string {
	if Dialect().IsPostgres() {
		return env("OFTEST_PG_ADMIN_DSN", "postgres://onceflow_admin:onceflow_admin@127.0.0.1:5432/postgres")
	}
	return env("OFTEST_ADMIN_DSN", "onceflow_admin:onceflow_admin@tcp(127.0.0.1:3306)/")
}

// DSN is the DSN of database name as user:pass, in the form of the tests' dialect.
func DSN(name, userPass string) string {
	user, pass, _ := strings.Cut(userPass, ":")
	if Dialect().IsPostgres() {
		u, err := url.Parse(AdminDSN())
		if err != nil {
			panic(fmt.Sprintf("testenv: admin dsn: %v", err))
		}
		u.User, u.Path = url.UserPassword(user, pass), "/"+name
		return u.String()
	}
	mc, err := mysql.ParseDSN(AdminDSN())
	if err != nil {
		panic(fmt.Sprintf("testenv: admin dsn: %v", err))
	}
	mc.User, mc.Passwd, mc.DBName = user, pass, name
	return mc.FormatDSN()
}

// adminUser is the privileged user:password of AdminDSN.
func adminUser() string {
	if Dialect().IsPostgres() {
		u, _ := url.Parse(AdminDSN())
		p, _ := u.User.Password()
		return u.User.Username() + ":" + p
	}
	mc, _ := mysql.ParseDSN(AdminDSN())
	return mc.User + ":" + mc.Passwd
}

// Config is the dbx.Config of a DSN under the tests' dialect. In mysql8 mode it sets
// db.dialect=mysql8.
func Config(dsn string, maxConns int) dbx.Config {
	c := dbx.Config{DSN: dsn, MaxOpenConns: maxConns}
	if Dialect() == dbx.MySQL8 {
		c.Dialect = string(dbx.MySQL8)
	}
	return c
}

// MonitorDSN is a DSN of a user with the PROCESS privilege only, which reads other
// sessions' transactions. OFTEST_MONITOR_DSN sets it.
func MonitorDSN() string {
	return env("OFTEST_MONITOR_DSN", "onceflow_monitor:onceflow_monitor@tcp(127.0.0.1:3306)/")
}

// OpenTransactions returns the number of InnoDB transactions open in database name. It
// reads information_schema.innodb_trx as the monitor user. A test shows with it that no
// transaction, and so no row lock, outlived what it ran.
//
// On PostgreSQL it counts the sessions of database name, other than its own, that are
// inside a transaction by pg_stat_activity.xact_start. It reads them as the application
// user, because a role sees the transaction state of its own sessions only. Every session a
// test runs is the application user's, except the migrations', which hold none open.
func OpenTransactions(t testing.TB, name string) int {
	t.Helper()
	if Dialect().IsPostgres() {
		return pgOpenTransactions(t, name)
	}
	db, err := sql.Open("mysql", MonitorDSN())
	if err != nil {
		t.Fatalf("testenv: monitor dsn: %v", err)
	}
	defer db.Close()
	var n int
	err = db.QueryRow(`SELECT COUNT(*) FROM information_schema.innodb_trx x
 JOIN information_schema.processlist l ON l.id = x.trx_mysql_thread_id WHERE l.db = ?`, name).Scan(&n)
	if err != nil {
		t.Fatalf("testenv: read open transactions as %s: %v (scripts/infra.sh up creates the monitor user)", dbx.MaskDSN(MonitorDSN()), err)
	}
	return n
}

func pgOpenTransactions(t testing.TB, name string) int {
	t.Helper()
	db, err := sql.Open("pgx", DSN(name, AppUser()))
	if err != nil {
		t.Fatalf("testenv: app dsn: %v", err)
	}
	defer db.Close()
	var n int
	err = db.QueryRow(`SELECT COUNT(*) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid() AND xact_start IS NOT NULL`, name).Scan(&n)
	if err != nil {
		t.Fatalf("testenv: read open transactions of %s: %v", name, err)
	}
	return n
}

// SQL returns the statement of the tests' dialect. It is mysql on MariaDB and in mysql8
// mode, and postgres on PostgreSQL. It serves a test's own DDL and queries where the two
// differ.
func SQL(mysql, postgres string) string {
	if Dialect().IsPostgres() {
		return postgres
	}
	return mysql
}

// Rebind is q, with '?' placeholders, for the tests' dialect. See dbx.Dialect.Rebind.
func Rebind(q string) string { return Dialect().Rebind(q) }

// AppUser is the least-privilege user:password, from OFTEST_APP_USER.
func AppUser() string { return env("OFTEST_APP_USER", "onceflow:onceflow") }

// Brokers is the Kafka bootstrap list, from OFTEST_BROKERS.
func Brokers() []string {
	return strings.Split(env("OFTEST_BROKERS", "127.0.0.1:9092"), ",")
}

// Database is a fresh, migrated database.
type Database struct {
	Name  string
	DSN   string  // application user
	DB    *sql.DB // application user pool
	Admin *sql.DB // privileged pool on the same database (DDL for tests that need it)
	// AdminDSN is the privileged user's DSN of the database, as a router's db.admin_dsn.
	AdminDSN string
}

// AdminExec runs a privileged statement, such as CREATE TABLE for a naive comparison table.
func (d Database) AdminExec(t testing.TB, q string, args ...any) {
	t.Helper()
	if _, err := d.Admin.Exec(q, args...); err != nil {
		t.Fatalf("testenv: %s: %v", q, err)
	}
}

// DB creates a fresh database and applies the framework's migrations, then the plugins', as
// the admin user. Each plugin has its own version table, as with `router migrate`. DB
// returns a pool of maxConns connections opened as the application user. A test of a
// plugin's tables passes the plugin's migrations.
//
//	d := testenv.DB(t, 4, migrations.Set{Name: coupon.PluginName, FS: coupon.Migrations})
func DB(t testing.TB, maxConns int, plugins ...migrations.Set) Database {
	t.Helper()
	Integration(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := "onceflow_t_" + randHex(6)
	if maxConns == 0 {
		maxConns = 16
	}
	adminDSN := DSN(name, adminUser())
	if Dialect().IsPostgres() {
		createPostgres(ctx, t, name)
	} else {
		createMySQL(ctx, t, name)
	}
	// The admin pool is a plain one at the server's default isolation, REPEATABLE READ on
	// MariaDB. A test's locking read there takes gap locks and stalls the inserts it means
	// to stall. The migrations are the MariaDB files in mysql8 mode too. MySQL 8 would
	// refuse their collation and ALTER TABLE options. See docs/ARCHITECTURE.md, section
	// "Databases".
	driver := "mysql"
	if Dialect().IsPostgres() {
		driver = "pgx"
	}
	mig, err := sql.Open(driver, adminDSN)
	if err == nil {
		err = mig.PingContext(ctx)
	}
	if err != nil {
		t.Fatalf("testenv: %s: %v\n%s", dbx.MaskDSN(adminDSN), err, howToStart)
	}
	mig.SetMaxOpenConns(4)
	t.Cleanup(func() { mig.Close() })
	if Dialect().IsPostgres() {
		// Every table the admin user creates here gives the application user its rows, as
		// the onceflow_t_% grant does on MariaDB. That covers the migrations' tables and a
		// test's own.
		if _, err := mig.ExecContext(ctx, "ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO "+pgUser(AppUser())); err != nil {
			t.Fatalf("testenv: default privileges: %v", err)
		}
	}
	if err := migrations.Up(ctx, mig, plugins...); err != nil {
		t.Fatalf("testenv: migrate %s: %v", name, err)
	}
	dsn := DSN(name, AppUser())
	db, err := dbx.Open(ctx, Config(dsn, maxConns))
	if err != nil {
		t.Fatalf("testenv: %v\n%s", err, howToStart)
	}
	t.Cleanup(func() { db.Close() })
	return Database{Name: name, DSN: dsn, DB: db, Admin: mig, AdminDSN: adminDSN}
}

func pgUser(userPass string) string {
	u, _, _ := strings.Cut(userPass, ":")
	return `"` + strings.ReplaceAll(u, `"`, `""`) + `"`
}

// createMySQL creates database name on MariaDB, dropped when the test ends.
func createMySQL(ctx context.Context, t testing.TB, name string) {
	t.Helper()
	admin, err := sql.Open("mysql", AdminDSN())
	if err != nil {
		t.Fatalf("testenv: admin dsn: %v", err)
	}
	t.Cleanup(func() { admin.Close() })
	if err := admin.PingContext(ctx); err != nil {
		t.Fatalf("testenv: MariaDB unreachable (%s): %v\n%s", dbx.MaskDSN(AdminDSN()), err, howToStart)
	}
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("testenv: create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name); err != nil {
			t.Logf("testenv: drop database %s: %v", name, err)
		}
	})
}

// createPostgres creates database name on PostgreSQL, owned by the admin user. The database
// is dropped WITH FORCE when the test ends, so pools a test left open are cut.
func createPostgres(ctx context.Context, t testing.TB, name string) {
	t.Helper()
	admin, err := sql.Open("pgx", AdminDSN())
	if err != nil {
		t.Fatalf("testenv: admin dsn: %v", err)
	}
	t.Cleanup(func() { admin.Close() })
	if err := admin.PingContext(ctx); err != nil {
		t.Fatalf("testenv: PostgreSQL unreachable (%s): %v\n%s", dbx.MaskDSN(AdminDSN()), err, howToStart)
	}
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("testenv: create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		// FORCE cuts only sessions the admin may signal. Another role's session, such as one
		// of a pool the test closed a moment ago, may take a moment to go.
		var err error
		for try := 0; try < 50; try++ {
			if _, err = admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("testenv: drop database %s: %v", name, err)
	})
}

// Kafka returns a client config for the test broker, failing when it is unreachable.
func Kafka(t testing.TB) kafkax.Config {
	t.Helper()
	Integration(t)
	c := kafkax.Config{Brokers: Brokers(), ClientID: "onceflow-test", SessionTimeout: 6 * time.Second,
		RebalanceTimeout: 10 * time.Second, HeartbeatEvery: time.Second, MaxPollWait: 50 * time.Millisecond}
	c = c.WithDefaults()
	sc := c.SaramaConfig()
	sc.Net.DialTimeout = 3 * time.Second
	sc.Metadata.Retry.Max = 1
	client, err := sarama.NewClient(c.Brokers, sc)
	if err != nil {
		t.Fatalf("testenv: Kafka unreachable at %s: %v\n%s", strings.Join(c.Brokers, ","), err, howToStart)
	}
	client.Close()
	return c
}

// Topic creates a fresh topic with the given partitions, deleted when the test ends.
func Topic(t testing.TB, c kafkax.Config, prefix string, partitions int32) string {
	t.Helper()
	return TopicWithConfig(t, c, prefix, partitions, nil)
}

// TopicWithConfig is Topic with topic-level settings, such as max.message.bytes.
func TopicWithConfig(t testing.TB, c kafkax.Config, prefix string, partitions int32, settings map[string]string) string {
	t.Helper()
	entries := map[string]*string{}
	for k, v := range settings {
		entries[k] = &v
	}
	admin, err := sarama.NewClusterAdmin(c.Brokers, c.SaramaConfig())
	if err != nil {
		t.Fatalf("testenv: Kafka unreachable: %v\n%s", err, howToStart)
	}
	name := fmt.Sprintf("%s-%s", prefix, randHex(5))
	if err := admin.CreateTopic(name, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: 1, ConfigEntries: entries}, false); err != nil {
		admin.Close()
		t.Fatalf("testenv: create topic %s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := admin.DeleteTopic(name); err != nil {
			t.Logf("testenv: delete topic %s: %v", name, err)
		}
		admin.Close()
	})
	// Wait until the metadata of every partition is visible.
	deadline := time.Now().Add(15 * time.Second)
	for {
		if parts, err := c.CheckTopics(name); err == nil && parts[name] == int(partitions) {
			return name
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: topic %s not ready", name)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// CommittedLag returns, per partition of topic, how far group's committed offset is behind
// the partition's end. Where the group committed nothing, it is the whole partition.
func CommittedLag(t testing.TB, c kafkax.Config, group, topic string) map[int32]int64 {
	t.Helper()
	client, err := sarama.NewClient(c.Brokers, c.SaramaConfig())
	if err != nil {
		t.Fatalf("testenv: Kafka unreachable: %v\n%s", err, howToStart)
	}
	defer client.Close()
	parts, err := client.Partitions(topic)
	if err != nil {
		t.Fatalf("testenv: partitions of %s: %v", topic, err)
	}
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	offs, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: parts})
	if err != nil {
		t.Fatalf("testenv: offsets of group %s: %v", group, err)
	}
	lag := map[int32]int64{}
	for _, p := range parts {
		end, err := client.GetOffset(topic, p, sarama.OffsetNewest)
		if err != nil {
			t.Fatalf("testenv: end of %s/%d: %v", topic, p, err)
		}
		committed := int64(0)
		if b := offs.GetBlock(topic, p); b != nil && b.Offset >= 0 {
			committed = b.Offset
		}
		lag[p] = end - committed
	}
	return lag
}

// GrantsDatabase is a fresh database with no table and no privilege of the application user
// on it. Its name starts with onceflow_g_. On such databases scripts/infra.sh gives the admin
// user DDL and GRANT OPTION, and the application user nothing as a whole. `router migrate`
// run on it grants the application user its tables as on a deployment's database. The
// tests of those grants need that. The test databases of DB instead give the application
// user every table's rows.
type GrantsDatabase struct {
	Name     string
	DSN      string // application user
	AdminDSN string // privileged user
	Account  string // the application user's account, as GRANT names it (dbx.Account)
}

// GrantsDB creates a GrantsDatabase. When the test ends, the application user's grants on
// its tables are revoked, because table grants outlive a dropped database. The database is
// then dropped.
func GrantsDB(t testing.TB) GrantsDatabase {
	t.Helper()
	Integration(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if Dialect().IsPostgres() {
		name := "onceflow_g_" + randHex(6)
		g := GrantsDatabase{Name: name, AdminDSN: DSN(name, adminUser()), DSN: DSN(name, AppUser())}
		createPostgres(ctx, t, name)
		var err error
		if g.Account, err = dbx.Account(ctx, dbx.Config{DSN: g.DSN}); err != nil {
			t.Fatalf("testenv: %v\n%s", err, howToStart)
		}
		return g
	}
	mc, err := mysql.ParseDSN(AdminDSN())
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	mc.DBName = "onceflow_g_" + randHex(6)
	g := GrantsDatabase{Name: mc.DBName, AdminDSN: mc.FormatDSN()}
	user, pass, _ := strings.Cut(AppUser(), ":")
	app := *mc
	app.User, app.Passwd = user, pass
	g.DSN = app.FormatDSN()
	if g.Account, err = dbx.Account(ctx, dbx.Config{DSN: g.DSN}); err != nil {
		t.Fatalf("testenv: %v\n%s", err, howToStart)
	}
	if err := dbx.CreateDatabase(ctx, g.AdminDSN); err != nil {
		t.Fatalf("testenv: %v (scripts/infra.sh up gives %s the onceflow_g_%% databases)\n%s", err, mc.User, howToStart)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		admin, err := sql.Open("mysql", g.AdminDSN)
		if err != nil {
			t.Logf("testenv: %v", err)
			return
		}
		defer admin.Close()
		var tables []string
		rows, err := admin.QueryContext(ctx, "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE()")
		if err == nil {
			for rows.Next() {
				var s string
				if rows.Scan(&s) == nil {
					tables = append(tables, s)
				}
			}
			rows.Close()
		}
		for _, tb := range tables {
			// A table the user was never granted gives error 1147, no such grant.
			_, _ = admin.ExecContext(ctx, "REVOKE SELECT, INSERT, UPDATE, DELETE ON `"+tb+"` FROM "+g.Account)
		}
		if _, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+g.Name); err != nil {
			t.Logf("testenv: drop database %s: %v", g.Name, err)
		}
	})
	return g
}
