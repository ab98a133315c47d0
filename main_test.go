package onceflow

import (
	"os"
	"testing"
)

// The tests run at the repository root, beside configs/router.yaml, which the command line
// reads when no config is named: they run without it, as a deployment without that file.
func TestMain(m *testing.M) {
	defaultConfigFile = ""
	os.Exit(m.Run())
}
