package onceflow

import (
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/registry"

	// The tests run the stock binary's command line: the bundled plugins registered, as
	// cmd/router/main.go has them.
	_ "github.com/onceflow/onceflow/coupon"
	_ "github.com/onceflow/onceflow/coupon/notify"
)

// registered are the plugins registered with inbox.MustRegister, as Run holds them.
func registered() *registry.Registry[inbox.Plugin] {
	return pluginRegistry(inbox.RegisteredPlugins())
}
