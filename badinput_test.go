package onceflow_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/onceflow/onceflow"
)

// BadInput marks an error without changing its text, through any wrapping, and leaves nil
// alone.
func TestBadInput(t *testing.T) {
	err := onceflow.BadInput(errors.New("db.dsn is empty"))
	wrapped := fmt.Errorf("migrate: %w", err)
	if !errors.Is(wrapped, onceflow.ErrBadInput) || wrapped.Error() != "migrate: db.dsn is empty" {
		t.Fatalf("%q: errors.Is(ErrBadInput) %t, want true and the text unchanged", wrapped, errors.Is(wrapped, onceflow.ErrBadInput))
	}
	if errors.Is(errors.New("broker unreachable"), onceflow.ErrBadInput) {
		t.Fatal("an unmarked error is bad input")
	}
	if onceflow.BadInput(nil) != nil {
		t.Fatal("BadInput(nil) is not nil")
	}
}
