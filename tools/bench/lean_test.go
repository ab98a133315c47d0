package main

import (
	"testing"
	"time"

	"github.com/onceflow/onceflow/pkg/kafkax"
)

// The lean child takes the router's fetch settings from their environment variables, and
// refuses values the router would refuse too.
func TestLeanFetchEnv(t *testing.T) {
	kc := kafkax.Config{}.WithDefaults()
	want := kc
	if err := leanFetchEnv(&kc); err != nil || kc.FetchMinBytes != want.FetchMinBytes || kc.MaxPollWait != want.MaxPollWait {
		t.Fatalf("without the variables: %v, %d / %s; want the defaults %d / %s", err, kc.FetchMinBytes, kc.MaxPollWait, want.FetchMinBytes, want.MaxPollWait)
	}
	t.Setenv("ONCEFLOW_KAFKA_FETCH_MIN_BYTES", "1")
	t.Setenv("ONCEFLOW_KAFKA_MAX_POLL_WAIT", "10ms")
	if err := leanFetchEnv(&kc); err != nil || kc.FetchMinBytes != 1 || kc.MaxPollWait != 10*time.Millisecond {
		t.Fatalf("leanFetchEnv: %v, %d / %s; want 1 / 10ms", err, kc.FetchMinBytes, kc.MaxPollWait)
	}
	for k, v := range map[string]string{"ONCEFLOW_KAFKA_FETCH_MIN_BYTES": "0", "ONCEFLOW_KAFKA_MAX_POLL_WAIT": "soon"} {
		t.Run(k, func(t *testing.T) {
			t.Setenv(k, v)
			if err := leanFetchEnv(&kc); err == nil {
				t.Fatalf("%s=%s: no error", k, v)
			}
		})
	}
}
