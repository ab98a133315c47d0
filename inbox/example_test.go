package inbox_test

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/pkg/registry"
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

// A minimal plugin: a handler and its declaration. A plugin package registers with
// inbox.MustRegister from init(); tests use an isolated registry.
func Example_plugin() {
	plugins := registry.New[inbox.Plugin]("plugin")
	inbox.RegisterIn(plugins, inbox.Plugin{
		Name: "greeter", Topics: []string{"user-signed-up"}, ConsumerGroup: "greeter", BizType: "greet",
		Build: func(inbox.PluginEnv) (inbox.Handler, error) { return greeter{}, nil },
	})

	p, _ := plugins.Get("greeter")
	h, _ := p.Build(inbox.PluginEnv{})
	d, err := h.Decode(message.NewMessage("m-1", []byte("user-7")))
	fmt.Println(plugins.Names(), p.BizType, d.Key, err)
	_, err = h.Decode(message.NewMessage("m-2", nil))
	fmt.Println(err)
	// Output:
	// [greeter] greet user-7 <nil>
	// poison message: empty payload
}
