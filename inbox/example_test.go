package inbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"testing/fstest"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
)

// greeter greets each user once, however often user-signed-up is delivered.
type greeter struct{}

func (greeter) Decode(m *message.Message) (inbox.Decoded, error) {
	if len(m.Payload) == 0 {
		return inbox.Decoded{}, inbox.PoisonError("empty payload") // quarantined, never retried
	}
	return inbox.Decoded{Key: string(m.Payload)}, nil // dedup is per (key, biz type)
}

func (greeter) Handle(ctx context.Context, tx *sql.Tx, d *inbox.Delivery) (inbox.Progress, error) {
	_, err := tx.ExecContext(ctx, "INSERT INTO greeting (user_id) VALUES (?)", d.Key)
	return inbox.Done, err // an error rolls this step back and retries it
}

// greeterMigrations are the plugin's own tables, numbered by the plugin. A plugin package
// embeds its SQL files with //go:embed migrations/*.sql, then takes fs.Sub.
var greeterMigrations fs.FS = fstest.MapFS{"00001_greeting.sql": {Data: []byte(`-- +goose Up
CREATE TABLE greeting (user_id VARCHAR(64) NOT NULL PRIMARY KEY);
-- +goose Down
DROP TABLE greeting;
`)}}

// Example_plugin shows a minimal plugin, a handler and its declaration. A plugin package
// registers it from its init function with inbox.MustRegister, which checks it as Validate
// does. `router migrate` applies its Migrations, with the version table
// goose_db_version_greeter. A deployment may rename its topics and group, with
// plugins.greeter.topics and plugins.greeter.consumer_group.
func Example_plugin() {
	p := inbox.Plugin{
		Name: "greeter", Topics: []string{"user-signed-up"}, ConsumerGroup: "greeter", BizType: "greet",
		Migrations: greeterMigrations,
		Tables:     []string{"greeting"},
		Build:      func(context.Context, inbox.PluginEnv) (inbox.Handler, error) { return greeter{}, nil },
	}
	if err := p.Validate(); err != nil {
		panic(err)
	}

	h, _ := p.Build(context.Background(), inbox.PluginEnv{})
	d, err := h.Decode(message.NewMessage("m-1", []byte("user-7")))
	fmt.Println(p.Name, p.BizType, d.Key, err)
	_, err = h.Decode(message.NewMessage("m-2", nil))
	fmt.Println(err)
	// Output:
	// greeter greet user-7 <nil>
	// poison message: empty payload
}
