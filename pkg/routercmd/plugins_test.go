package routercmd

import (
	"net"
	"sync/atomic"
	"testing"

	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/registry"
	"github.com/onceflow/onceflow/migrations"

	// The tests run the stock binary's command line, with the bundled plugins registered as
	// cmd/router/main.go has them.
	_ "github.com/onceflow/onceflow/coupon"
	_ "github.com/onceflow/onceflow/coupon/notify"
)

// registered are the plugins registered with inbox.MustRegister, by name.
func registered() *registry.Registry[inbox.Plugin] {
	r := registry.New[inbox.Plugin]("plugin")
	for _, p := range checkPlugins(inbox.RegisteredPlugins()) {
		r.MustRegister(p.Name, p)
	}
	return r
}

// registeredMigrations are the migrations of the registered plugins, in name order, as
// `router migrate` applies them after the framework's.
func registeredMigrations() []migrations.Set {
	var sets []migrations.Set
	for _, p := range checkPlugins(inbox.RegisteredPlugins()) {
		if p.Migrations != nil {
			sets = append(sets, migrations.Set{Name: p.Name, FS: p.Migrations})
		}
	}
	return sets
}

// countingListener is a TCP listener on 127.0.0.1 that counts the connections it is offered
// and closes each at once, so a command that dials it fails fast.
func countingListener(t *testing.T) (string, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var n atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			c.Close()
		}
	}()
	return ln.Addr().String(), &n
}
