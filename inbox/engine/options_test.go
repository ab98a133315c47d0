package engine_test

import (
	"reflect"
	"testing"

	"github.com/onceflow/onceflow/inbox/engine"
)

// TestProcessOptionsHasNoHiddenFields checks that ProcessOptions holds only what a caller
// sets. No field of it is out of reach, so no caller's zero value stands for a mode it
// cannot see.
func TestProcessOptionsHasNoHiddenFields(t *testing.T) {
	typ := reflect.TypeFor[engine.ProcessOptions]()
	for i := range typ.NumField() {
		if f := typ.Field(i); !f.IsExported() {
			t.Errorf("ProcessOptions.%s is unexported", f.Name)
		}
	}
}
