package coupon_test

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/onceflow/onceflow/coupon"
)

// TestGrantEventEncodeIsMarshal: Encode writes the bytes json.Marshal writes, for the
// events the grant path makes and for every string and time it must hand to json.Marshal.
func TestGrantEventEncodeIsMarshal(t *testing.T) {
	at := time.Date(2026, 12, 7, 13, 45, 1, 123456789, time.UTC)
	base := coupon.GrantEvent{EventID: coupon.EventID(coupon.EventGranted, "o-1", "c-1"), OrderID: "o-1", UserID: "u-1",
		CampaignID: "c-1", CouponID: coupon.CouponID("o-1", "c-1"), ValueCents: 500, GrantedAt: at}
	strs := []string{"", "plain", `quo"te`, `back\slash`, "<b>&amp;", "ctl\x01\n\t", "del\x7f", "é ü", "\u2028\u2029",
		"bad\xffutf8", "\xc3", "emoji 😀", "a/b", "&", "<", ">", "\"", "\\", "\x00", "\x1f", "\x7f", "\x80"}
	times := []time.Time{{}, at, at.In(time.FixedZone("plus", 5*3600+30*60)), at.In(time.FixedZone("secs", 3600+7)),
		at.In(time.FixedZone("far", 25*3600)), time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), time.Unix(0, 1).UTC()}
	var cases []coupon.GrantEvent
	cases = append(cases, base, coupon.GrantEvent{})
	for _, s := range strs {
		for f := range 6 {
			e := base
			switch f {
			case 0:
				e.EventID = s
			case 1:
				e.OrderID = s
			case 2:
				e.UserID = s
			case 3:
				e.CampaignID = s
			case 4:
				e.CouponID = s
			case 5:
				e.Reason, e.CouponID, e.GrantedAt, e.FailedAt = s, "", time.Time{}, at
			}
			cases = append(cases, e)
		}
	}
	for _, tm := range times {
		e := base
		e.GrantedAt = tm
		cases = append(cases, e)
		e.GrantedAt, e.FailedAt, e.Reason = time.Time{}, tm, "stock exhausted"
		cases = append(cases, e)
	}
	for _, v := range []int64{0, -1, math.MaxInt64, math.MinInt64} {
		e := base
		e.ValueCents = v
		cases = append(cases, e)
	}
	for _, e := range cases {
		checkEncode(t, e)
	}
}

func checkEncode(t *testing.T, e coupon.GrantEvent) {
	t.Helper()
	want, err := json.Marshal(e)
	if err != nil {
		want = nil // Encode gives nil where json.Marshal refuses
	}
	if got := e.Encode(); !bytes.Equal(got, want) {
		t.Errorf("Encode(%+v)\n got %q\nwant %q", e, got, want)
	}
}

func FuzzGrantEventEncode(f *testing.F) {
	f.Add("e", "o-1", "u-1", "c-1", "k", int64(500), int64(1765115101123456789), "", int64(0), 0)
	f.Add("e", "o<1>", "u\xff", "c\"1", "", int64(-1), int64(0), "why\n", int64(1765115101), 3600+7)
	f.Fuzz(func(t *testing.T, ev, order, user, campaign, couponID string, value, granted int64, reason string, failed int64, off int) {
		zone := time.FixedZone("z", off%(30*3600))
		tm := func(ns int64) time.Time {
			if ns == 0 {
				return time.Time{}
			}
			return time.Unix(0, ns).In(zone)
		}
		checkEncode(t, coupon.GrantEvent{EventID: ev, OrderID: order, UserID: user, CampaignID: campaign, CouponID: couponID,
			ValueCents: value, GrantedAt: tm(granted), Reason: reason, FailedAt: tm(failed)})
	})
}
