package server

import (
	"context"
	"net/http"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/bulwark-http/bulwark/internal/wire"
)

// DefaultMaxDeadline caps an incoming deadline when
// DeadlineOptions.Max is zero.
const DefaultMaxDeadline = 30 * time.Second

// DeadlineOptions configures DeadlineHandler. The zero value is ready to use.
type DeadlineOptions struct {
	// Max caps the deadline a caller may ask for, so that a hostile or buggy
	// header cannot make the server hold work for hours. Zero or less means
	// DefaultMaxDeadline.
	Max time.Duration

	// Header is the name of bulwark's deadline header to read, as set in the
	// calling client's bulwark.Timeout.Header. Empty means
	// bulwark.DefaultDeadlineHeader.
	Header string

	// OnMalformed, if not nil, is called with the header's name for every
	// deadline header that was present but ignored because it did not parse
	// or was not positive. Use it to count hostile input.
	OnMalformed func(header string)
}

// DeadlineHandler returns a handler that turns an incoming deadline into the
// request context's deadline, so a deadline crosses every hop: an outgoing
// call made with r.Context() through a bulwark client carries the time left
// on to the next service.
//
// It reads, in this order, bulwark's header (milliseconds), grpc-timeout
// (gRPC's "<digits><unit>" form) and Envoy's x-envoy-expected-rq-timeout-ms,
// takes the smallest valid one, and caps it at opts.Max. A header that does
// not parse, or is zero or negative, is ignored (and reported to
// opts.OnMalformed): a bad header never fails the request. With no valid
// header the request is served with its context's deadline unchanged.
//
// It is also the server half of a chain of services as PassUp is, for a
// request from a bulwark client (one with a valid deadline header, or
// bulwark.AttemptHeader): it attaches a bulwark.CallRecord to the
// request's context, and marks a 5xx or 429 answer
// bulwark.NoRetryFromBelow when a bulwark call the handler made below
// failed in a way the tier below already dealt with, so that the caller
// above neither retries it nor trips on it. Under a PassUp its record
// shadows PassUp's (a call notes in the nearest). The record and its
// writer are one allocation per request, and the request's copy with the
// new context is the one a deadline needs anyway; any other request is
// served exactly as before. Wrap the handler in PassUp to mark the
// answers to every caller.
func DeadlineHandler(next http.Handler, opts DeadlineOptions) http.Handler {
	if opts.Max <= 0 {
		opts.Max = DefaultMaxDeadline
	}
	if opts.Header == "" {
		opts.Header = bulwark.DefaultDeadlineHeader
	}
	opts.Header = http.CanonicalHeaderKey(opts.Header)
	return &deadlineHandler{next: next, opts: opts}
}

type deadlineHandler struct {
	next http.Handler
	opts DeadlineOptions
	// noRecord leaves the CallRecord out: for the benchmark that pairs
	// the handler with and without it, never set otherwise.
	noRecord bool
}

// The header names DeadlineHandler reads besides its own.
const (
	grpcTimeoutHeader  = "Grpc-Timeout"
	envoyTimeoutHeader = "X-Envoy-Expected-Rq-Timeout-Ms"
)

func (h *deadlineHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d, ok := h.incoming(r.Header)
	ctx := r.Context()
	// The record only for a caller that can read the mark (bulwark's
	// client sends a deadline, or numbers its attempts), so that any
	// other request is served as it was, without the copy of the request
	// a record needs.
	_, attempt := r.Header[bulwark.AttemptHeader]
	// A record of PassUp's above is not looked for (a lookup that walks
	// the whole context on every request): this one shadows it, and the
	// client notes in the nearest.
	if !h.noRecord && (ok || attempt) {
		pw := newPassUpWriter(w, ctx)
		w, ctx = pw, &pw.ctx
	}
	if !ok {
		if ctx != r.Context() {
			r = r.WithContext(ctx)
		}
		h.next.ServeHTTP(w, r)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	h.next.ServeHTTP(w, r.WithContext(ctx))
}

// incoming returns the smallest valid deadline among the headers, capped.
func (h *deadlineHandler) incoming(hd http.Header) (time.Duration, bool) {
	var best time.Duration
	found := false
	consider := func(name string, parse func(string) (time.Duration, bool)) {
		v, present := hd[name]
		if !present || len(v) == 0 {
			return
		}
		d, ok := parse(v[0])
		if !ok || len(v) > 1 {
			// Two values for one deadline contradict each other: trust neither.
			if h.opts.OnMalformed != nil {
				h.opts.OnMalformed(name)
			}
			return
		}
		if !found || d < best {
			best, found = d, true
		}
	}
	consider(h.opts.Header, wire.ParseMillis)
	consider(grpcTimeoutHeader, wire.ParseGRPCTimeout)
	consider(envoyTimeoutHeader, wire.ParseMillis)
	if found && best > h.opts.Max {
		best = h.opts.Max
	}
	return best, found
}
