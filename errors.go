package bulwark

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Every rejection bulwark makes on its own is checkable with
// errors.Is against one of these; the typed errors that carry the host and,
// where it applies, when to try again unwrap to them.
var (
	// ErrBreakerOpen reports that the host's circuit breaker is open (or
	// half-open with every probe slot taken, or forced open), so the
	// request was not sent.
	ErrBreakerOpen error = errors.New("bulwark: circuit breaker open")

	// ErrBulkheadFull reports that the host's bulkhead had no free slot (and
	// no queue room, or the queue wait ran out), so the request was not sent.
	ErrBulkheadFull error = errors.New("bulwark: bulkhead full")

	// ErrRetryBudget reports that a retry was due but the upstream's retry
	// budget was spent, so the last failure is returned as it was.
	ErrRetryBudget error = errors.New("bulwark: retry budget spent")

	// ErrPushback reports that the host asked callers, with Retry-After, to
	// stay away until a time that has not come yet.
	ErrPushback error = errors.New("bulwark: host asked callers to back off")

	// ErrDeadlineTooShort reports that the time left before the request's
	// deadline was below the minimum worth sending (10 ms), so the request
	// was not sent. It wraps context.DeadlineExceeded, so code that checks
	// for a deadline keeps working.
	ErrDeadlineTooShort error = &wrapError{msg: "bulwark: deadline too short to send", err: context.DeadlineExceeded}

	// ErrAttemptTimeout reports that one attempt ran past Timeout.Attempt
	// before its response headers came, or that a read of its body waited
	// past Timeout.BodyIdle: bulwark's own bound, not the caller's. It wraps
	// context.DeadlineExceeded. The breaker counts it as a failure and the
	// retry layer may retry it; the caller's own deadline is never reported
	// this way.
	ErrAttemptTimeout error = &wrapError{msg: "bulwark: attempt timed out", err: context.DeadlineExceeded}

	// ErrTotalTimeout reports that the call ran past Timeout.Total: every
	// attempt and wait included, and the body's reading too when Total was
	// set explicitly. It wraps context.DeadlineExceeded, and is never the
	// caller's own deadline.
	ErrTotalTimeout error = &wrapError{msg: "bulwark: call timed out", err: context.DeadlineExceeded}

	// ErrThrottled reports that the host's client-side throttle refused the
	// request locally, without sending it, because the host has recently
	// accepted too few of the requests sent to it (see Throttle). A
	// *ThrottledError matches it.
	ErrThrottled error = errors.New("bulwark: client-side throttle rejected the request")

	// ErrInvalidRequest reports a request that cannot be written as it
	// is, which net/http's Transport would refuse too: a nil URL or
	// Header, a header or trailer name or value it rejects, an invalid
	// method, an http or https URL without a host, or (with Config.Base
	// nil) a scheme other than http and https. Nothing was sent; the error
	// says nothing about the host, so no layer counts it (breaker,
	// throttle, balancer, adaptive limit, budget) and it is never retried.
	// The error also wraps net/http's own words for the fault.
	ErrInvalidRequest error = errors.New("bulwark: invalid request")

	// ErrRequestBody reports that the request's body failed to read while
	// it was being sent: the caller's fault, not the host's, so no layer
	// counts it and it is never retried. The error wraps the body's own
	// error too.
	ErrRequestBody error = errors.New("bulwark: request body failed to read")

	// errNilURL is returned for a request without a URL, as net/http does.
	errNilURL = errors.New("bulwark: nil Request.URL")

	// errNilHeader is returned for a request without a Header, as
	// net/http does.
	errNilHeader = errors.New("bulwark: nil Request.Header")

	// errNilResponse is returned when the base breaks the RoundTripper
	// contract with neither a response nor an error, in the words net/http's
	// Client uses for the same fault.
	errNilResponse = errors.New("bulwark: RoundTripper returned a nil *Response with a nil error")
)

// wrapError is a fixed message over a wrapped cause, allocated once so that
// returning it costs nothing on a hot rejection path.
type wrapError struct {
	msg string
	err error
}

func (e *wrapError) Error() string { return e.msg + ": " + e.err.Error() }
func (e *wrapError) Unwrap() error { return e.err }

// timeoutError pairs bulwark's own bound (ErrAttemptTimeout or
// ErrTotalTimeout) with the error the base or the body returned, so
// errors.Is finds the bound and context.DeadlineExceeded, and errors.As
// still finds the base's *url.Error or *net.OpError.
type timeoutError struct {
	limit error // ErrAttemptTimeout or ErrTotalTimeout
	cause error
}

func (e *timeoutError) Error() string {
	return e.limit.(*wrapError).msg + ": " + e.cause.Error()
}
func (e *timeoutError) Unwrap() []error { return []error{e.limit, e.cause} }

// ErrInvalidConfig is matched by every error New returns for a bad Config.
var ErrInvalidConfig = errors.New("bulwark: invalid config")

// ConfigError reports one invalid Config value: which upstream (empty for
// Default), which field, the value given and why it was refused.
type ConfigError struct {
	Upstream string // the Upstreams key; empty for Config.Default or Config itself
	Route    string // the Routes key, when the value is a route's
	Field    string // e.g. "Retry.MaxAttempts"
	Value    any
	Reason   string
}

func (e *ConfigError) Error() string {
	where := "Default"
	if e.Upstream != "" {
		where = fmt.Sprintf("upstream %q", e.Upstream)
	}
	if e.Route != "" {
		if e.Upstream != "" {
			where = fmt.Sprintf("route %q on upstream %q", e.Route, e.Upstream)
		} else {
			where = fmt.Sprintf("route %q", e.Route)
		}
	}
	if e.Field == "" {
		return fmt.Sprintf("bulwark: %s: %s", where, e.Reason)
	}
	return fmt.Sprintf("bulwark: %s: %s = %v: %s", where, e.Field, e.Value, e.Reason)
}

// Is makes every ConfigError match ErrInvalidConfig.
func (e *ConfigError) Is(target error) bool { return target == ErrInvalidConfig }

// fieldError is what a sub-policy's validate returns; New adds the upstream.
func fieldError(field string, value any, reason string) error {
	return &ConfigError{Field: field, Value: value, Reason: reason}
}

// inUpstream labels a validation error with the upstream it came from.
func inUpstream(err error, upstream string) error {
	var ce *ConfigError
	if errors.As(err, &ce) {
		c := *ce
		c.Upstream = upstream
		return &c
	}
	return err
}

// errString is an error that is only its text: a constant reason, such as
// the one a malformed Upstreams key gets.
type errString string

func (e errString) Error() string { return string(e) }

// maxPolicyDuration is the longest duration any Policy field may hold. A
// week is past any sane timeout, window or backoff; the bound keeps every
// sum bulwark makes of them (a deadline, a wait plus a margin, a doubled
// open time) far from time.Duration's overflow.
const maxPolicyDuration = 7 * 24 * time.Hour

// doneError reports a call whose context ended before bulwark sent it. It
// wraps ctx.Err() (and the cause, when one was given), so errors.Is works.
func doneError(ctx context.Context) error {
	return &contextDoneError{err: ctx.Err(), cause: context.Cause(ctx)}
}

type contextDoneError struct{ err, cause error }

func (e *contextDoneError) Error() string {
	return "bulwark: request context done before sending: " + e.cause.Error()
}

func (e *contextDoneError) Unwrap() []error {
	if e.cause == e.err {
		return []error{e.err}
	}
	return []error{e.err, e.cause}
}

// localError is an attempt that failed for a reason of the request's own,
// not its host's: it matches is (ErrInvalidRequest or ErrRequestBody) and
// err, and reads as err, whose words the caller would have got from
// net/http. classify recognises it by type (kindLocal).
type localError struct {
	is  error
	err error
}

func (e *localError) Error() string   { return e.err.Error() }
func (e *localError) Unwrap() []error { return []error{e.is, e.err} }
