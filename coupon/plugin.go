package coupon

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/onceflow/onceflow/inbox"
)

// PluginName, BizType, ConsumerGroup and OrderPaidTopic identify the plugin. The router
// binary imports this package for its init function.
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
		Migrations:    Migrations,
		// The settings under plugins.coupon-granter name the campaign, the topics and the
		// simulated or real outside calls.
		Settings: Config{},
		// CouponGranted and CouponGrantFailed events, to the configured topics.
		Writes: func(s any) ([]string, error) {
			cfg, err := settingsOf(s)
			if err != nil {
				return nil, err
			}
			return []string{cfg.GrantedTopic, cfg.FailedTopic}, nil
		},
		Tables: []string{"coupon_grant", "coupon_grant_log", "coupon_stock", "coupon_budget", "user_coupon"},
		Build: func(ctx context.Context, env inbox.PluginEnv) (inbox.Handler, error) {
			g, err := buildGranter(ctx, env)
			if err != nil {
				return nil, err
			}
			return g.Handler(env.DB)
		},
		// A POST to /v1/claims on http.listen claims a coupon for the client token in its
		// Idempotency-Key header.
		Commands: []inbox.Command{claimCommand()},
		// Verify serves `router verify`, and Sampler the orders and poison of
		// `router produce`.
		Verify:  verifyPlugin,
		Sampler: traffic{},

		// The operator console's row page shows the grant's transitions for the order.
		History: grantHistory,
	}
}

// buildGranter builds the plugin's granter from its settings, creating the campaign's
// counters if they do not exist.
func buildGranter(ctx context.Context, env inbox.PluginEnv) (*Granter, error) {
	cfg, err := settingsOf(env.Settings)
	if err != nil {
		return nil, err
	}
	if env.DB == nil {
		return nil, errors.New("coupon: the plugin needs a database")
	}
	if err := EnsureCampaign(ctx, env.DB, cfg); err != nil {
		return nil, err
	}
	svc, err := externalService(cfg)
	if err != nil {
		return nil, err
	}
	if env.ObserveCall != nil {
		svc = observedService{svc: svc, observe: env.ObserveCall}
	}
	return NewGranter(cfg, svc, env.Logger)
}

// externalService is the service the steps call. It is the HTTP downstream of
// downstream_url if one is set, else the simulated one of the step_* settings.
func externalService(cfg Config) (ExternalService, error) {
	if cfg.DownstreamURL != "" {
		return newHTTPService(httpConfig{URL: cfg.DownstreamURL, Timeout: cfg.DownstreamTimeout, MaxConns: cfg.DownstreamMaxConns})
	}
	seed := cfg.Seed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	return newSimulatedService(cfg.StepDelay, cfg.StepJitter, cfg.StepFailureRate, seed), nil
}

// settingsOf is the plugin's settings as the runtime decoded them into Plugin.Settings.
func settingsOf(s any) (Config, error) {
	cfg, ok := s.(Config)
	if !ok {
		return Config{}, fmt.Errorf("coupon: settings of type %T, want a coupon.Config", s)
	}
	return cfg, nil
}

func init() { inbox.MustRegister(Plugin()) }
