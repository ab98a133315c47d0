package coupon

// The external tests (package coupon_test) reach the state machine, the outside services and
// the grant history, which the package keeps unexported, by these names.

var (
	AllStates            = allStates
	Transit              = transit
	ParseState           = parseState
	ErrIllegalTransition = errIllegalTransition
	ErrTerminal          = errTerminal
	ErrUnknownState      = errUnknownState
	ErrStaleState        = errStaleState
	ErrInjected          = errInjected
	NewSimulatedService  = newSimulatedService
	NewHTTPService       = newHTTPService
	History              = grantHistory
)

type (
	HTTPConfig      = httpConfig
	HTTPService     = httpService
	HTTPStatusError = httpStatusError
)

func (s State) Terminal() bool             { return s.terminal() }
func (s State) Next() State                { return s.next() }
func (s State) Step() string               { return s.step() }
func (s State) CanTransitTo(to State) bool { return s.canTransitTo(to) }
