package onceflow

import (
	"errors"
	"fmt"

	"github.com/onceflow/onceflow/pkg/kafkax"
)

// checkWrittenTopics checks at start that every topic the plugins write to (Plugin.Writes,
// under their configuration) exists, and fails naming the plugin and the topic otherwise
// (exit 1): an event for a missing topic would be parked by the relay (`router outbox ls`).
// relay.check_topics=false skips the check, for topics created after the router starts.
func (a *app) checkWrittenTopics(kc kafkax.Config, plugins []plugin) error {
	if !a.cfg.Relay.CheckTopics {
		return nil
	}
	for _, p := range plugins {
		topics, err := p.writes()
		if err != nil {
			return err
		}
		if len(topics) == 0 {
			continue
		}
		if _, err := kc.CheckTopics(topics...); err != nil {
			if errors.Is(err, kafkax.ErrMissingTopic) {
				return fmt.Errorf("plugin %s writes its events to a topic that does not exist: %w; or set relay.check_topics=false (its events are then parked until it exists)", p.Name, err)
			}
			return err
		}
	}
	return nil
}
