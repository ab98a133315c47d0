package coupon

import (
	"context"
	"time"

	"github.com/onceflow/onceflow/inbox"
)

// Plugin identity. The router binary imports this package for its init().
const (
	PluginName     = "coupon-granter"
	BizType        = "coupon"
	ConsumerGroup  = "coupon-sender"
	OrderPaidTopic = "order-paid"
)

// Plugin returns the granter's plugin declaration.
func Plugin() inbox.Plugin {
	return inbox.Plugin{
		Name:          PluginName,
		Topics:        []string{OrderPaidTopic},
		ConsumerGroup: ConsumerGroup,
		BizType:       BizType,
		KeyLogField:   "order_id",
		Build: func(env inbox.PluginEnv) (inbox.Handler, error) {
			cfg := DefaultConfig()
			if env.DecodeConfig != nil {
				if err := env.DecodeConfig(&cfg); err != nil {
					return nil, err
				}
			}
			if err := cfg.Validate(); err != nil {
				return nil, err
			}
			if env.DB != nil {
				if err := EnsureCampaign(context.Background(), env.DB, cfg); err != nil {
					return nil, err
				}
			}
			seed := cfg.Seed
			if seed == 0 {
				seed = uint64(time.Now().UnixNano())
			}
			svc := NewSimulatedService(cfg.StepDelay, cfg.StepJitter, cfg.StepFailureRate, seed)
			g, err := NewGranter(cfg, svc, env.Logger)
			if err != nil || env.DB == nil {
				return g, err
			}
			return g.UsePrepare(env.DB).UseStatements(env.DB), nil
		},
	}
}

func init() { inbox.MustRegister(Plugin()) }
