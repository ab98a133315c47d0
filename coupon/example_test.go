package coupon_test

import (
	"errors"
	"fmt"

	"github.com/onceflow/onceflow/coupon"
)

func ExampleTransit() {
	fmt.Println(coupon.Transit(coupon.StateInit, coupon.StateLocked))
	fmt.Println(errors.Is(coupon.Transit(coupon.StateInit, coupon.StateGranted), coupon.ErrIllegalTransition))
	fmt.Println(errors.Is(coupon.Transit(coupon.StateGranted, coupon.StateFailed), coupon.ErrTerminal))
	fmt.Println(errors.Is(coupon.Transit("REFUNDED", coupon.StateFailed), coupon.ErrUnknownState))
	// Output:
	// <nil>
	// true
	// true
	// true
}

func ExampleState_CanTransitTo() {
	for s := coupon.StateInit; s != ""; s = s.Next() {
		fmt.Println(s, s.Step(), s.CanTransitTo(coupon.StateFailed))
	}
	// Output:
	// INIT lock_stock true
	// LOCKED deduct_budget true
	// BUDGET_DEDUCTED write_wallet true
	// GRANTED  false
}
