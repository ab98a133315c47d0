package outbox_test

import (
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	code := m.Run()
	removeRouterBinary()
	os.Exit(code)
}
