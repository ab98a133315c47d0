package onceflow

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/onceflow/onceflow/inbox"
)

// The tests run at the repository root, beside configs/router.yaml, which LoadSetup reads
// when no config is named: they run without it, as a deployment without that file.
func TestMain(m *testing.M) {
	defaultConfigFile = ""
	os.Exit(m.Run())
}

// isBadInput reports whether err is bad input (ErrBadInput): what the command line exits 2
// for.
func isBadInput(err error) bool { return errors.Is(err, ErrBadInput) }

// runRouter runs what `router [--config file] <command>` runs with the registered plugins,
// through the runtime's API (the command line is pkg/routercmd's, and so are its tests):
// LoadSetup, then for "run" the pipeline of the plugins named (default: every one) until ctx
// ends, for "relay" the relay alone, and for "plugins" the plugins resolved with the topics
// they write.
func runRouter(ctx context.Context, file, command string, plugins ...string) error {
	s, err := LoadSetup(Source{File: file}, inbox.RegisteredPlugins())
	if err != nil {
		return err
	}
	if command == "relay" {
		return s.RunRelay(ctx)
	}
	if err := s.CheckSections(); err != nil {
		return err
	}
	ps, err := s.Plugins(plugins...)
	if err != nil {
		return err
	}
	switch command {
	case "run":
		return s.Runtime(ps).Run(ctx)
	case "plugins":
		for _, p := range ps {
			if _, err := p.WrittenTopics(); err != nil {
				return err
			}
		}
		return nil
	}
	return errors.New("runRouter: no command " + command)
}
