package inbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/registry"
)

type nopHandler struct{}

func (nopHandler) Decode(m *message.Message) (inbox.Decoded, error) {
	return inbox.Decoded{Key: string(m.Payload)}, nil
}
func (nopHandler) Handle(context.Context, *sql.Tx, *inbox.Delivery) (inbox.Progress, error) {
	return inbox.Done, nil
}

func testPlugin(name string) inbox.Plugin {
	return inbox.Plugin{Name: name, Topics: []string{"t"}, ConsumerGroup: "g", BizType: "b",
		Build: func(context.Context, inbox.PluginEnv) (inbox.Handler, error) { return nopHandler{}, nil }}
}

func mustPanic(t *testing.T, want string, fn func()) {
	t.Helper()
	defer func() {
		t.Helper()
		r := recover()
		if r == nil {
			t.Fatalf("no panic, want one mentioning %q", want)
		}
		if msg := fmt.Sprint(r); !strings.Contains(msg, want) {
			t.Fatalf("panic %q does not mention %q", msg, want)
		}
	}()
	fn()
}

// TestPluginRegisteredTwicePanics checks that a plugin registered twice, by two packages
// claiming one name, fails at start-up with a message naming it. So do empty names and
// incomplete declarations.
func TestPluginRegisteredTwicePanics(t *testing.T) {
	r := registry.New[inbox.Plugin]("plugin")
	inbox.RegisterIn(r, testPlugin("greeter"))
	mustPanic(t, `"greeter" registered twice`, func() { inbox.RegisterIn(r, testPlugin("greeter")) })
	if got := r.Names(); len(got) != 1 || got[0] != "greeter" {
		t.Fatalf("names after the failed registration: %v", got)
	}
	mustPanic(t, "empty name", func() { inbox.RegisterIn(r, testPlugin("")) })
	noTopics := testPlugin("x")
	noTopics.Topics = nil
	mustPanic(t, `plugin "x": no topics`, func() { inbox.RegisterIn(r, noTopics) })
	noBiz := testPlugin("y")
	noBiz.BizType = ""
	mustPanic(t, `plugin "y": no biz type`, func() { inbox.RegisterIn(r, noBiz) })
	noBuild := testPlugin("z")
	noBuild.Build = nil
	mustPanic(t, `plugin "z": no Build`, func() { inbox.RegisterIn(r, noBuild) })
	badTable := testPlugin("w")
	badTable.Tables = []string{"widget; DROP TABLE inbox"}
	mustPanic(t, `plugin "w": table name`, func() { inbox.RegisterIn(r, badTable) })
}

// TestPluginSettingsDeclaration checks a plugin's settings declaration as it registers. It
// must be a struct with well-formed tags, none of the keys the runtime reserves, and each
// setting at its zero value or its default. The zero value, the defaults and a nil pointer
// of the type are accepted.
func TestPluginSettingsDeclaration(t *testing.T) {
	type good struct {
		Topic string `key:"topic" default:"out" help:"topic"`
		Limit int    `key:"limit" default:"10" range:"1..100" help:"limit"`
	}
	type badRange struct {
		Limit int `key:"limit" range:"100..1" help:"limit"`
	}
	type reserved struct {
		Topics []string `key:"topics" help:"topics"`
	}
	type reservedGroup struct {
		Group string `key:"consumer_group" help:"group"`
	}
	r := registry.New[inbox.Plugin]("plugin")
	for i, v := range []any{good{}, good{Topic: "out", Limit: 10}, (*good)(nil), &good{}} {
		p := testPlugin(fmt.Sprintf("ok-%d", i))
		p.Settings = v
		inbox.RegisterIn(r, p)
	}
	for _, tc := range []struct {
		settings any
		want     string
	}{
		{"text", "string is no struct"},
		{map[string]any{"a": 1}, "map[string]interface {} is no struct"},
		{badRange{}, `inbox_test.badRange.Limit: range "100..1" is empty`},
		{reserved{}, "key topics is reserved"},
		{reservedGroup{}, "key consumer_group is reserved"},
		{good{Limit: 5}, "limit is 5, neither its zero value nor its default tag"},
	} {
		p := testPlugin("bad")
		p.Settings = tc.settings
		mustPanic(t, `plugin "bad": settings: `+tc.want, func() { inbox.RegisterIn(r, p) })
	}
}
