package outbox

import (
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
)

// warnLogger records what is logged at each level.
type warnLogger struct {
	watermill.NopLogger
	warns, infos, errors []string
}

func (l *warnLogger) Warn(msg string, _ watermill.LogFields) { l.warns = append(l.warns, msg) }
func (l *warnLogger) Info(msg string, _ watermill.LogFields) { l.infos = append(l.infos, msg) }
func (l *warnLogger) Error(msg string, _ error, _ watermill.LogFields) {
	l.errors = append(l.errors, msg)
}

// A foreign position (the last batch in the positions topic is not of this database's rows)
// is said at WARN with what to do, once per batch and shard in a process: a later session
// that finds the same batch says nothing more at WARN; another batch is said again. A logger
// without a Warn method gets it at INFO.
func TestForeignPositionWarnsOnce(t *testing.T) {
	l := &warnLogger{}
	e := &eosShard{r: &eosRelay{relayBase: &relayBase{logger: l}}}
	first := Position{Kind: "batch", TxnID: "t", Session: "s1", Seq: 7, Events: 3}
	e.foreignPosition(first, 0)
	e.foreignPosition(first, 0)
	if len(l.warns) != 1 || len(l.errors) != 0 {
		t.Fatalf("the same foreign batch twice: warnings %q, errors %q; want one warning, no error", l.warns, l.errors)
	}
	for _, want := range []string{"not of this database's outbox rows", "harmless to the rows not yet published",
		"router migrate --reset", "nothing needs doing", "relay.transactional_id"} {
		if !strings.Contains(l.warns[0], want) {
			t.Errorf("the warning lacks %q: %s", want, l.warns[0])
		}
	}
	e.foreignPosition(Position{Kind: "batch", TxnID: "t", Session: "s2", Seq: 1, Events: 1}, 0)
	if len(l.warns) != 2 {
		t.Fatalf("another foreign batch: %d warnings, want 2", len(l.warns))
	}

	infoOnly := &struct{ watermill.LoggerAdapter }{l}
	e = &eosShard{r: &eosRelay{relayBase: &relayBase{logger: infoOnly}}}
	e.foreignPosition(first, 0)
	if len(l.infos) != 1 || l.infos[0] != msgForeignPosition || len(l.warns) != 2 {
		t.Fatalf("a logger without Warn: infos %q, warnings %d; want the message at INFO", l.infos, len(l.warns))
	}
}
