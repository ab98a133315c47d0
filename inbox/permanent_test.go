package inbox_test

import (
	"errors"
	"fmt"
	"io/fs"
	"testing"

	"github.com/onceflow/onceflow/inbox"
)

// TestPermanentWrapsItsCause checks that a permanent error is ErrPermanent and still its
// cause. errors.Is and errors.As find both, and errors.Unwrap gives the cause back.
func TestPermanentWrapsItsCause(t *testing.T) {
	cause := &fs.PathError{Op: "open", Path: "x", Err: fs.ErrNotExist}
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"plain", inbox.Permanent(cause)},
		{"wrapped", fmt.Errorf("grant: %w", inbox.Permanent(cause))},
		{"twice", inbox.Permanent(inbox.Permanent(cause))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var pe *fs.PathError
			switch {
			case !errors.Is(tc.err, inbox.ErrPermanent):
				t.Error("not ErrPermanent")
			case !errors.Is(tc.err, fs.ErrNotExist):
				t.Error("not its cause's sentinel")
			case !errors.As(tc.err, &pe) || pe != cause:
				t.Error("errors.As does not find the cause")
			}
		})
	}
	if got := errors.Unwrap(inbox.Permanent(cause)); got != cause {
		t.Errorf("errors.Unwrap(Permanent(cause)) = %v, want the cause", got)
	}
	if got := inbox.Permanent(cause).Error(); got != cause.Error() {
		t.Errorf("text %q, want the cause's %q", got, cause.Error())
	}
	if inbox.Permanent(nil) != nil {
		t.Error("Permanent(nil) is not nil")
	}
	if errors.Is(cause, inbox.ErrPermanent) {
		t.Error("the cause itself is ErrPermanent")
	}
}
