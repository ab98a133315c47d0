package engine

import (
	"slices"
	"testing"
)

// The payload's id is read from a JSON object whose field of the business key comes before
// anything unreadable. It is named as the plugin's key log field, or in camelCase.
func TestPayloadID(t *testing.T) {
	if got := idFields("order_id"); !slices.Equal(got, []string{"order_id", "orderId"}) {
		t.Errorf("idFields(order_id) = %q", got)
	}
	if got := idFields("id"); !slices.Equal(got, []string{"id"}) {
		t.Errorf("idFields(id) = %q", got)
	}
	fields := []string{"order_id", "orderId"}
	for payload, want := range map[string]string{
		`{"orderId":"oc-pz-0093","amountCents":"12"}`:      "oc-pz-0093",
		` {"userId":{"a":[1,2]},"order_id":"o-2"}`:         "o-2",
		`{"orderId":"oc-1","userId":`:                      "oc-1",
		`{"orderId":12345}`:                                "12345",
		`{"userId":"u","orderId"`:                          "",
		`{"userId":"u" "orderId":"o-3"}`:                   "",
		`{"orderId":null}`:                                 "",
		`{"orderId":"o-` + "\xff" + `"}`:                   "",
		`["orderId","o-4"]`:                                "",
		`not json`:                                         "",
		``:                                                 "",
		`{"OrderId":"o-5"}`:                                "",
		`{"orderId":"o-\u00e9\n"}`:                         "o-é\n",
		`{"nested":{"orderId":"inner"},"orderId":"outer"}`: "outer",
	} {
		if got := payloadID([]byte(payload), fields); got != want {
			t.Errorf("payloadID(%q) = %q, want %q", payload, got, want)
		}
	}
}
