package kafkax

import (
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
)

// TestSettler: settler runs fn in the order messages were added, never blocks add, and close
// runs what is left.
func TestSettler(t *testing.T) {
	var got []string
	release := make(chan struct{})
	st := newSettler(func(m *message.Message, _ error) {
		<-release
		got = append(got, m.UUID)
	})
	for i := range 1000 { // fn is blocked: add must not be
		st.add(message.NewMessage(fmt.Sprint(i), nil), nil)
	}
	close(release)
	st.close()
	if len(got) != 1000 {
		t.Fatalf("%d settled, want 1000", len(got))
	}
	for i, id := range got {
		if id != fmt.Sprint(i) {
			t.Fatalf("settled #%d is %s: out of order", i, id)
		}
	}
}
