package onceflow

import (
	"context"
	"database/sql"
	"slices"

	"github.com/onceflow/onceflow/inbox/inboxops"
	"github.com/onceflow/onceflow/internal/console"
	"github.com/onceflow/onceflow/internal/metrics"
)

// newConsole returns the operator console of package internal/console, which the admin
// listener serves at /. Its biz types are those of the binary's plugins, as `router replay`
// resolves them. Its replays run the way `router replay` and `router inbox retry` run
// theirs. ReplayInbox builds the inbox of the biz type's plugin, and inboxops.Replay
// records the run in the replay table.
func (s *Setup) newConsole(ctx context.Context, db *sql.DB, m *metrics.Metrics, token string) (*console.Console, error) {
	cfg := console.Config{DB: db, Metrics: m, Token: token, Logger: s.logger}
	if m != nil {
		if gl, ok := m.Consumers.Judge().(console.GroupLagReader); ok { // the runtime's kafkax.LagReader
			cfg.Lags = gl
		}
	}
	if s.plugins != nil { // nil in a Runtime built with New, not by the command line
		all, err := s.bizTypes()
		if err != nil {
			return nil, err
		}
		seen := map[string]int{}
		for _, bt := range sortedKeys(all) {
			b := console.BizType{Name: bt}
			for _, p := range all[bt] {
				if p.command == nil && p.ConsumerGroup != "" && len(p.Topics) > 0 {
					i, ok := seen[p.ConsumerGroup]
					if !ok {
						i = len(cfg.Groups)
						seen[p.ConsumerGroup] = i
						cfg.Groups = append(cfg.Groups, console.Group{Name: p.ConsumerGroup})
					}
					for _, t := range p.Topics {
						if !slices.Contains(cfg.Groups[i].Topics, t) {
							cfg.Groups[i].Topics = append(cfg.Groups[i].Topics, t)
						}
					}
				}
				b.Plugins = append(b.Plugins, p.Name)
				if p.History != nil {
					b.History = p.History
				}
			}
			cfg.BizTypes = append(cfg.BizTypes, b)
		}
		cfg.Replay = func(ctx context.Context, opts inboxops.ReplayOptions) (inboxops.ReplayReport, error) {
			ib, closeHandler, err := s.ReplayInbox(ctx, db, &opts.Filter)
			if err != nil {
				return inboxops.ReplayReport{}, err
			}
			defer closeHandler()
			return inboxops.Replay(ctx, ib, opts)
		}
	}
	return console.New(ctx, cfg)
}
