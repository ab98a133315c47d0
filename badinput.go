package onceflow

import "errors"

// ErrBadInput is what every error of bad input matches. Bad input is a setting, a flag, a
// DSN, or a plugin's section or settings that the runtime refuses before it changes
// anything. Test for it with errors.Is. The router's command line exits with status 2 for
// it. Such an error's text is the refusal alone, without the words of ErrBadInput.
var ErrBadInput = errors.New("bad input")

// BadInput marks err as bad input, so that errors.Is(err, ErrBadInput) holds. The error
// keeps err's text. BadInput returns nil for a nil err.
func BadInput(err error) error {
	if err == nil {
		return nil
	}
	return badInputError{err}
}

// badInputError is an error that BadInput marked as bad input.
type badInputError struct{ err error }

func (e badInputError) Error() string        { return e.err.Error() }
func (e badInputError) Unwrap() error        { return e.err }
func (e badInputError) Is(target error) bool { return target == ErrBadInput }
