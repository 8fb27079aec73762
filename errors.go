package bulwark

import (
	"context"
	"errors"
)

// Sentinel errors. Every rejection bulwark makes on its own is checkable with
// errors.Is against one of these; the typed errors that carry the host and,
// where it applies, when to try again unwrap to them.
var (
	// ErrBreakerOpen reports that the host's circuit breaker is open (or
	// half-open with every probe slot taken), so the request was not sent.
	ErrBreakerOpen = errors.New("bulwark: circuit breaker open")

	// ErrBulkheadFull reports that the host's bulkhead had no free slot (and
	// no queue room, or the queue wait ran out), so the request was not sent.
	ErrBulkheadFull = errors.New("bulwark: bulkhead full")

	// ErrRetryBudget reports that a retry was due but the upstream's retry
	// budget was spent, so the last failure is returned as it was.
	ErrRetryBudget = errors.New("bulwark: retry budget spent")

	// ErrPushback reports that the host asked callers, with Retry-After, to
	// stay away until a time that has not come yet.
	ErrPushback = errors.New("bulwark: host asked callers to back off")

	// ErrDeadlineTooShort reports that the time left before the request's
	// deadline was below the minimum worth sending (see Timeout), so the
	// request was not sent. It wraps context.DeadlineExceeded, so code that
	// checks for a deadline keeps working.
	ErrDeadlineTooShort = &wrapError{msg: "bulwark: deadline too short to send", err: context.DeadlineExceeded}

	// ErrAttemptTimeout reports that one attempt ran past Timeout.Attempt or
	// the call ran past Timeout.Total: bulwark's own deadline, not the
	// caller's. It wraps context.DeadlineExceeded. The breaker counts it as a
	// failure and the retry layer may retry it; the caller's own deadline is
	// never reported this way.
	ErrAttemptTimeout = &wrapError{msg: "bulwark: attempt timed out", err: context.DeadlineExceeded}

	// errNilURL is returned for a request without a URL, as net/http does.
	errNilURL = errors.New("bulwark: nil Request.URL")
)

// wrapError is a fixed message over a wrapped cause, allocated once so that
// returning it costs nothing on a hot rejection path.
type wrapError struct {
	msg string
	err error
}

func (e *wrapError) Error() string { return e.msg + ": " + e.err.Error() }
func (e *wrapError) Unwrap() error { return e.err }

// timeoutError pairs bulwark's own timeout with the error the base returned,
// so errors.Is finds ErrAttemptTimeout and context.DeadlineExceeded, and
// errors.As still finds the base's *url.Error or *net.OpError.
type timeoutError struct {
	cause error
}

func (e *timeoutError) Error() string   { return "bulwark: attempt timed out: " + e.cause.Error() }
func (e *timeoutError) Unwrap() []error { return []error{ErrAttemptTimeout, e.cause} }
