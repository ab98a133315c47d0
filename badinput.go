package onceflow

import "errors"

// ErrBadInput is what every error of bad input is: a setting, a flag, a DSN, a plugin's
// section or settings that the runtime refuses before it changes anything. Test for it with
// errors.Is; the router's command line exits 2 for it. Such an error's text is the refusal
// alone, without the words of ErrBadInput.
var ErrBadInput = errors.New("bad input")

// BadInput marks err as bad input, so that errors.Is(err, ErrBadInput) holds, and keeps its
// text; nil stays nil.
func BadInput(err error) error {
	if err == nil {
		return nil
	}
	return badInputError{err}
}

// badInputError is an error marked as bad input (BadInput).
type badInputError struct{ err error }

func (e badInputError) Error() string        { return e.err.Error() }
func (e badInputError) Unwrap() error        { return e.err }
func (e badInputError) Is(target error) bool { return target == ErrBadInput }
