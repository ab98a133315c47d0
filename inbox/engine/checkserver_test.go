package engine_test

import (
	"context"
	"database/sql"
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/go-sql-driver/mysql"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/inbox/engine"
	"github.com/onceflow/onceflow/internal/testenv"
	"github.com/onceflow/onceflow/pkg/dbx"
)

// csHandler records one row per key in the inbox's own transaction.
type csHandler struct{}

func (csHandler) Decode(m *message.Message) (inbox.Decoded, error) {
	return inbox.Decoded{Key: string(m.Payload)}, nil
}

func (csHandler) Handle(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
	_, err := tx.ExecContext(ctx, testenv.Rebind("INSERT INTO cs_effect (k) VALUES (?)"), d.Key)
	return inbox.Done, err
}

// ownPool opens the test database as a user of the library would, with sql.Open and the
// given DSN parameters. With none, the session has the server's default isolation.
//
// On PostgreSQL the parameters have the MySQL names, such as tx_isolation, and values.
// They are given to the session as default_transaction_isolation.
func ownPool(t *testing.T, d testenv.Database, params map[string]string) *sql.DB {
	t.Helper()
	if testenv.Dialect().IsPostgres() {
		u, err := url.Parse(d.DSN)
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		if iso, ok := params["tx_isolation"]; ok {
			q.Set("default_transaction_isolation", strings.ToLower(strings.ReplaceAll(strings.Trim(iso, "'"), "-", " ")))
		}
		u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20") // pgx reads no "+" as a space
		db, err := sql.Open("pgx", u.String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}
	mc, err := mysql.ParseDSN(d.DSN)
	if err != nil {
		t.Fatal(err)
	}
	mc.Params = params
	db, err := sql.Open("mysql", mc.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// TestCheckServerRefusesRepeatableRead checks that CheckServer refuses an inbox on a pool
// of one's own left at REPEATABLE READ, with a clear error. A delivery on it writes
// nothing, because dbx.InTx refuses its transactions. The same database at READ COMMITTED
// passes.
func TestCheckServerRefusesRepeatableRead(t *testing.T) {
	d := testenv.DB(t, 2)
	d.AdminExec(t, testenv.SQL("CREATE TABLE cs_effect (k VARCHAR(64) NOT NULL) ENGINE=InnoDB", "CREATE TABLE cs_effect (k VARCHAR(64) NOT NULL)"))
	ctx := context.Background()
	cases := []struct {
		name    string
		db      *sql.DB
		refused bool
	}{
		{"own pool at REPEATABLE READ", ownPool(t, d, map[string]string{"tx_isolation": "'REPEATABLE-READ'"}), true},
		{"own pool at READ COMMITTED", ownPool(t, d, map[string]string{"tx_isolation": "'READ-COMMITTED'"}), false},
		{"dbx.Open pool", d.DB, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ib, err := engine.New(tc.db, csHandler{}, engine.Config{BizType: "cs-" + strings.ReplaceAll(tc.name, " ", "-")[:12], MaxAttempts: 1}, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			err = ib.CheckServer(ctx)
			if !tc.refused {
				if err != nil {
					t.Fatalf("CheckServer: %v", err)
				}
				return
			}
			if !errors.Is(err, dbx.ErrIsolation) || !strings.Contains(err.Error(), "REPEATABLE-READ") {
				t.Fatalf("CheckServer = %v; want a refusal (dbx.ErrIsolation) naming REPEATABLE-READ", err)
			}
			before := count(t, d.DB, "SELECT COUNT(*) FROM cs_effect")
			if _, err := ib.Process(ctx, message.NewMessage("m-1", []byte("key-1")), inbox.Source{}, engine.ProcessOptions{}); !errors.Is(err, dbx.ErrIsolation) {
				t.Fatalf("Process = %v; want an error wrapping dbx.ErrIsolation (outcome not recorded)", err)
			}
			if n := count(t, d.DB, "SELECT COUNT(*) FROM cs_effect") - before; n != 0 {
				t.Fatalf("a refused pool wrote %d effects", n)
			}
			if n := count(t, d.DB, "SELECT COUNT(*) FROM inbox"); n != 0 {
				t.Fatalf("a refused pool wrote %d inbox rows", n)
			}
		})
	}
}

// TestCheckServerPacket checks that a payload limit the server's max_allowed_packet cannot
// carry is refused, with the limit that would fit. PostgreSQL has no limit below its 1 GB
// message, so every limit is accepted there.
func TestCheckServerPacket(t *testing.T) {
	d := testenv.DB(t, 2)
	packet := int64(1 << 30)
	if !testenv.Dialect().IsPostgres() {
		if err := d.DB.QueryRow("SELECT @@max_allowed_packet").Scan(&packet); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name  string
		bytes int
		ok    bool
	}{
		{"default", 0, true},
		{"the largest", engine.MaxPayloadLimit, packet >= 2*int64(engine.MaxPayloadLimit+32<<10)+64<<10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ib, err := engine.New(d.DB, csHandler{}, engine.Config{BizType: "cs-packet", MaxPayloadBytes: tc.bytes}, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			err = ib.CheckServer(context.Background())
			if (err == nil) != tc.ok || (err != nil && !strings.Contains(err.Error(), "max_allowed_packet")) {
				t.Fatalf("CheckServer (max_allowed_packet %d) = %v; want ok=%v", packet, err, tc.ok)
			}
		})
	}
}
