package bulwark

import (
	"context"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/bulwark-http/bulwark/internal/wire"
)

// The headers by which bulwark's client and its server half (package
// server) speak to each other. Both halves import this package, so the
// names live here, with the root's helpers for reading and copying
// headers, and CallRecord, by which the server half learns what a
// request's outgoing calls met below.

// NoRetryHeader is the response header by which a server says "do not retry
// this", so that only one layer of a deep stack retries instead of every
// layer multiplying the load. Any value counts, however malformed: it can
// only stop a retry, never cause one, a pause or an error. bulwark's retry
// layer never retries a response that carries it.
//
// Two writers set it. A load-shedding server (server.Shedder) sets it to
// "1" on the 503s it answers when overloaded: that is the host's own
// overload, and bulwark's breaker and adaptive limit count it as the
// host's failure. The server half (server.DeadlineHandler, server.PassUp)
// sets it to NoRetryFromBelow on a failure it passes up from below: see
// CallRecord.
const NoRetryHeader = "Bulwark-No-Retry"

// NoRetryFromBelow is NoRetryHeader's value on a failure passed up: a 5xx
// or 429 a service answered after a bulwark call it made below failed in a
// way the tier below already dealt with, so that of a chain of services
// exactly one layer retries and trips. The client reading it neither
// retries the answer nor counts it as the host's failure in its breaker or
// adaptive limit (or an instance's ejection); it is counted apart, as
// HostSnapshot.PassedUp and the outcome label "passed_up", and a fallback
// still answers for it. The value is matched without regard to case or
// surrounding spaces; any other value is the shed "1".
//
// A call below marks the answer when it was retried and still failed (its
// hedges included), was due for a retry that could not fit before its
// deadline, was refused locally (an open breaker, the fleet's trip
// included; a full bulkhead, a pushback pause, the throttle, the retry
// budget), or was answered don't-retry. A call that failed once because
// retries were off or its request may not be sent twice does not mark,
// nor does one its Fallback answered (other than with a 5xx or 429); the
// mark never replaces a NoRetryHeader the handler set.
// See docs/design.md, "The chain".
const NoRetryFromBelow = "below"

// passedUp reports whether a response's NoRetryHeader says the failure was
// passed up from below (NoRetryFromBelow). Only the first value counts.
func passedUp(h http.Header) bool {
	v, ok := h[NoRetryHeader]
	return ok && len(v) > 0 && strings.EqualFold(trimOWS(v[0]), NoRetryFromBelow)
}

// The don't-retry signals of other stacks, which bulwark reads as its own
// NoRetryHeader: Envoy's x-envoy-overloaded (any value: the answer is
// Envoy's own refusal, "do not retry"), and gRPC's grpc-retry-pushback-ms
// (gRFC A6; read from the response header, since the retry is decided when
// the headers arrive: a gRPC server that sends it only as a trailer is not
// heard). bulwark does not emit them: its own header says the same to its
// own clients, x-envoy-overloaded says the answer is an overloaded proxy's
// (which a pass-up is not), and a proxy in front can be told to honour
// NoRetryHeader by its own retry policy (Envoy's retriable headers).
const (
	envoyOverloadedHeader = "X-Envoy-Overloaded"
	grpcPushbackHeader    = "Grpc-Retry-Pushback-Ms"
)

// maxPushbackDigits bounds grpc-retry-pushback-ms: 10 digits is over 100
// days, beyond any Retry.MaxRetryAfter cap.
const maxPushbackDigits = 10

// noRetry reads a response's don't-retry signals: stop when the response
// must not be retried (NoRetryHeader or x-envoy-overloaded, any value; a
// negative grpc-retry-pushback-ms, or one that does not parse, as gRFC A6
// reads it); otherwise wait, the least wait before a retry that a valid
// grpc-retry-pushback-ms asks for (zero without one); x-should-retry and
// Stripe-Should-Retry "false" stop too (sdk.go). bad reports a
// grpc-retry-pushback-ms, x-should-retry or Stripe-Should-Retry that did
// not parse, which the caller counts. A
// malformed or hostile value can only stop a retry: never cause one, nor
// a pause of other requests, nor an error.
func noRetry(h http.Header) (stop bool, wait time.Duration, bad bool) {
	if _, ok := h[NoRetryHeader]; ok {
		return true, 0, false
	}
	// The SDKs' servers' own answers (x-should-retry, Stripe-Should-Retry):
	// "false" stops as NoRetryHeader does; a malformed one is counted and
	// stops nothing, since it is no don't-retry of bulwark's or of a stack
	// that shares its rules.
	sdkStop, sdkBad := shouldNotRetry(h)
	if sdkStop {
		return true, 0, sdkBad
	}
	stop, wait, bad = noRetryInterop(h)
	return stop, wait, bad || sdkBad
}

// noRetryInterop is noRetry's reading of Envoy's and gRPC's signals.
func noRetryInterop(h http.Header) (stop bool, wait time.Duration, bad bool) {
	if _, ok := h[envoyOverloadedHeader]; ok {
		return true, 0, false
	}
	vs, ok := h[grpcPushbackHeader]
	if !ok {
		return false, 0, false
	}
	if len(vs) != 1 {
		return true, 0, true // two pushbacks contradict each other
	}
	v := trimOWS(vs[0])
	neg := strings.HasPrefix(v, "-")
	digits := strings.TrimPrefix(v, "-")
	if digits == "" || len(digits) > maxPushbackDigits || !allDigits(digits) {
		return true, 0, true
	}
	if neg {
		return true, 0, false
	}
	ms, _ := strconv.ParseInt(digits, 10, 64) // at most 10 digits: cannot fail
	return false, time.Duration(ms) * time.Millisecond, false
}

// A CallRecord is the server half's note, in an incoming request's
// context, of what the bulwark calls made with that context met below.
// The server half (server.DeadlineHandler, server.PassUp) attaches one to
// each request; a Transport's call made with that context, or a context
// derived from it, notes in it a failure the tier below already dealt
// with (see NoRetryFromBelow for which), and the server half reads it when
// the handler answers. It is a fixed-size value with no goroutine: the
// server half embeds it in the one allocation it makes per request. A call
// whose context carries none behaves as it always did.
//
// The zero CallRecord is ready to use. Attach it once, before the request
// is served; FailedBelow and the notes are safe for concurrent use.
type CallRecord struct {
	parent context.Context
	notes  atomic.Uint32
}

// Attach returns parent carrying r, for the request r records. It keeps
// parent's deadline, cancellation and values; a context derived from it
// (context.WithTimeout, say) carries r too, and no goroutine is started.
func (r *CallRecord) Attach(parent context.Context) context.Context {
	r.parent = parent
	return (*recordCtx)(r)
}

// FailedBelow reports whether a bulwark call made with the request's
// context noted a failure the tier below already dealt with: the server
// half then marks a 5xx or 429 answer with NoRetryFromBelow.
func (r *CallRecord) FailedBelow() bool { return r.notes.Load() != 0 }

// What a CallRecord notes.
const (
	noteRetried uint32 = 1 << iota // retried, or hedged, and still failed
	noteRefused                    // refused locally: breaker, bulkhead, pushback, throttle, budget
	noteNoRetry                    // the last answer said don't retry
)

// recordKey is the context key a CallRecord answers to.
type recordKey struct{}

// recordCtx is a CallRecord as the context it is attached to.
type recordCtx CallRecord

func (c *recordCtx) Deadline() (time.Time, bool) { return c.parent.Deadline() }
func (c *recordCtx) Done() <-chan struct{}       { return c.parent.Done() }
func (c *recordCtx) Err() error                  { return c.parent.Err() }
func (c *recordCtx) Value(key any) any {
	if _, ok := key.(recordKey); ok {
		return (*CallRecord)(c)
	}
	return c.parent.Value(key)
}

// String names the context, as the context package's own do.
func (c *recordCtx) String() string { return "bulwark.CallRecord" }

// noteBelow notes what in the record ctx carries, if any.
func noteBelow(ctx context.Context, what uint32) {
	if r, ok := ctx.Value(recordKey{}).(*CallRecord); ok {
		r.notes.Or(what)
	}
}

// PriorityHeader is the request header that carries a request's Priority
// from client to server: "critical", "high", "normal", "low" or "test" (any
// case). RequestPriority reads it first; bulwark's client sends a priority
// set with WithPriority as this header.
const PriorityHeader = "Bulwark-Priority"

// ShedPriorityHeader is the response header on a Shedder's 503 (package
// server) that names the Priority it refused, as Priority.String spells it.
// Bulwark's client reads it: the refusal's Retry-After then pauses requests
// to that host of that priority and less important ones only. Without it, a
// Shedder refusing low-priority work would stop the client's critical
// requests too, before they could reach the workers the Shedder reserves
// for them.
const ShedPriorityHeader = "Bulwark-Shed-Priority"

// DefaultDeadlineHeader is the request header that carries the time the
// caller has left, in whole milliseconds, from one hop to the next.
// Bulwark's client writes it unless Timeout.Header names another;
// server.DeadlineHandler reads it.
const DefaultDeadlineHeader = "Bulwark-Timeout-Ms"

// AttemptHeader is the request header that numbers the attempts of one call
// (1 for the first send, 2 for the first retry, …), like Envoy's
// x-envoy-attempt-count, so a server can tell a retry from a new call. It is
// written only when the retry layer is on and the deadline header is sent.
// Read on a request, it says a client above retries the call, as the SDKs'
// headers below say it of them: such a request is sent once. Each header is
// evidence, never required: one that does not parse is ignored and counted
// (Snapshot.RetryAfterIgnored), the longest of several waits is obeyed, and
// none makes bulwark retry what its classifier would not.
//
//	request header               sent by                              bulwark
//	Bulwark-Attempt              another bulwark Transport            sent once; no learned timeout, no default Total
//	amz-sdk-request              AWS SDKs ("attempt=N; max=M")        the same (with max=1 the SDK does not retry: none of this)
//	X-Stainless-Retry-Count      OpenAI's and Anthropic's SDKs        the same
//	X-Goog-Api-Client            Google Cloud clients, with           the same
//	                             "gccl-attempt-count/N" in it
//	x-ms-client-request-id       Azure SDKs (one id for all tries)    the same
//	X-Stripe-Client-User-Agent   Stripe's SDKs                        the same
//
//	response header              sent by                              bulwark
//	x-should-retry: false        servers of Stainless SDKs            not retried, as NoRetryHeader
//	Stripe-Should-Retry: false   Stripe                               not retried, as NoRetryHeader
//	retry-after-ms               Stainless and Azure servers          on 429 and 503, as Retry-After (milliseconds)
//	x-ms-retry-after-ms          Azure                                the same
//	X-Amz-Retry-After            AWS (milliseconds)                   the same
const AttemptHeader = hdrBulwarkAttempt

// cloneHeader copies h's map so that keys can be added or replaced without
// touching h. The value slices are shared with h, not copied: no layer
// writes into a value slice (each replaces it, as http.Header.Set does),
// and the RoundTripper contract forbids the base to modify the request at
// all. Sharing them lets maps.Clone copy the map's storage wholesale, about
// half the cost of rebuilding it key by key as http.Header.Clone does.
func cloneHeader(h http.Header) http.Header {
	if h == nil {
		return make(http.Header, 2)
	}
	return maps.Clone(h)
}

// allDigits is wire.AllDigits, under the short name the root's header
// parsers use.
func allDigits(s string) bool { return wire.AllDigits(s) }

// trimOWS is wire.TrimOWS, under the short name the root's header parsers
// use.
func trimOWS(s string) string { return wire.TrimOWS(s) }
