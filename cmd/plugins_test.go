package onceflowcmd

// The tests run the stock binary's command line: the bundled plugins registered, as
// cmd/router/main.go has them.
import (
	_ "github.com/onceflow/onceflow/coupon"
	_ "github.com/onceflow/onceflow/coupon/notify"
)
