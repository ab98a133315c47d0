package onceflow

import (
	"github.com/onceflow/onceflow/inbox"
	"github.com/onceflow/onceflow/internal/registry"

	// The tests run with the stock binary's plugins: the bundled plugins registered, as
	// cmd/router/main.go has them.
	_ "github.com/onceflow/onceflow/coupon"
	_ "github.com/onceflow/onceflow/coupon/notify"
)

// registered are the plugins registered with inbox.MustRegister, as LoadSetup holds them.
func registered() *registry.Registry[inbox.Plugin] {
	r, err := pluginRegistry(inbox.RegisteredPlugins())
	if err != nil {
		panic(err)
	}
	return r
}
