package bulwark

import (
	"cmp"
	"context"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// DefaultDeadlineHeader is the request header that carries the time the
// caller has left, in whole milliseconds, from one hop to the next.
const DefaultDeadlineHeader = "Bulwark-Timeout-Ms"

// AttemptHeader is the request header that numbers the attempts of one call
// (1 for the first send, 2 for the first retry, …), like Envoy's
// x-envoy-attempt-count, so a server can tell a retry from a new call. It is
// written only when the retry layer is on.
const AttemptHeader = "Bulwark-Attempt"

// Package defaults for Timeout. A timeout is a capacity decision: these are
// generous bounds meant to be tightened to about the p99.9 of the upstream's
// healthy latency, not values tuned for any service.
const (
	DefaultTotalTimeout   = 30 * time.Second
	DefaultAttemptTimeout = 10 * time.Second
)

// deadlineMargin is taken off the time left before it is written into the
// deadline header: the response still has to travel back, so the server
// should give up slightly before the client does.
const deadlineMargin = 5 * time.Millisecond

// minSendTime is the least time left for which a request is still sent.
// Below it the answer would arrive after the caller stopped waiting, so the
// attempt fails at once with ErrDeadlineTooShort instead of loading the
// upstream with work nobody will read.
const minSendTime = 10 * time.Millisecond

// Timeout bounds how long a call and each of its attempts may take, and
// names the header that tells the upstream how long it has.
type Timeout struct {
	// Total bounds the whole call: every attempt, every wait between them and
	// the reading of the final response body, like http.Client.Timeout. Zero
	// inherits from Default, then DefaultTotalTimeout. A caller's context
	// deadline that comes sooner wins.
	Total time.Duration

	// Attempt bounds one attempt, from sending until its response body is
	// read or closed. It may not exceed Total. Zero inherits from Default,
	// then DefaultAttemptTimeout, capped at Total.
	Attempt time.Duration

	// Header is the request header that carries the time left, in
	// milliseconds: the smaller of the context deadline, Total's deadline and
	// Attempt, less a 5 ms margin, recomputed for every attempt. Empty
	// inherits from Default, then DefaultDeadlineHeader. DeadlineHandler
	// reads it on the server side.
	Header string

	// Disabled turns off both deadline layers for this upstream: no timeout
	// beyond the caller's context and no deadline header. An upstream
	// inherits Disabled from Default; it cannot turn back on what Default
	// disabled.
	Disabled bool
}

func (t Timeout) inherit(parent Timeout) Timeout {
	t.Total = cmp.Or(t.Total, parent.Total)
	t.Attempt = cmp.Or(t.Attempt, parent.Attempt)
	t.Header = cmp.Or(t.Header, parent.Header)
	t.Disabled = t.Disabled || parent.Disabled
	return t
}

func (t Timeout) validate() error {
	if t.Total < 0 {
		return fieldError("Timeout.Total", t.Total, "must be ≥ 0")
	}
	if t.Attempt < 0 {
		return fieldError("Timeout.Attempt", t.Attempt, "must be ≥ 0")
	}
	if t.Total > 0 && t.Attempt > t.Total {
		return fieldError("Timeout.Attempt", t.Attempt, "must not exceed Timeout.Total ("+t.Total.String()+")")
	}
	if t.Header != "" && !validHeaderName(t.Header) {
		return fieldError("Timeout.Header", strconv.Quote(t.Header), "not a valid header name")
	}
	return nil
}

func (t Timeout) withDefaults() Timeout {
	t.Total = cmp.Or(t.Total, DefaultTotalTimeout)
	t.Attempt = cmp.Or(t.Attempt, min(DefaultAttemptTimeout, t.Total))
	t.Header = cmp.Or(t.Header, DefaultDeadlineHeader)
	t.Header = http.CanonicalHeaderKey(t.Header)
	return t
}

// validHeaderName reports whether s is an RFC 9110 token.
func validHeaderName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
			continue
		}
		if !strings.ContainsRune("!#$%&'*+-.^_`|~", rune(c)) {
			return false
		}
	}
	return s != ""
}

// callKey finds a call's state in a request context.
type callKey struct{}

// callState is what the layers of one call share: the deadline Total set,
// the number of the attempt under way, a clock reading, and room for the
// first attempt. The router makes it and the layers hand it down (callRT);
// a layer used on its own finds it in the request context (withCall), and
// so does a RoundTripper below the attempt layer (attemptCtx.Value).
type callState struct {
	owner *Transport
	// total is the instant Timeout.Total ends; zero means no such bound.
	// Waiting layers (retry sleeps, bulkhead queues, rate limits) must not
	// wait past it: see callDeadline.
	total time.Time
	// attempt is the number of the attempt being sent, set by the retry
	// layer before each send; zero when no retry layer runs.
	attempt int
	// sent is the clock reading the layers of the attempt under way share
	// (see clock), zero when stale: the router's as the call begins;
	// attemptRT, the last to use it, clears it, and a layer that waits
	// between the first reader and attemptRT (the bulkhead's queue and rate
	// limit) must call staleClock after its wait.
	sent time.Time
	// tried holds the ids of the last instances the balancer sent this
	// call to, so that a retry goes to another one; ntried counts sends.
	tried  [maxTried]uint32
	ntried uint8

	// Room for the first attempt, so that a call whose first attempt is
	// its last costs one allocation for its state, its attempt context,
	// its response-body wrapper and its header values together. Each is
	// taken once (spare records which), by attemptRT, observeRT and
	// onBodyEndIn, all during the call's own RoundTrip; later attempts
	// allocate their own.
	spare     uint8
	firstCtx  attemptCtx
	firstBody body
	firstVals [firstVals]string
}

// firstVals is how many header values the first attempt writes: the time
// left and the attempt number.
const firstVals = 2

// The bits of callState.spare.
const (
	spareCtx = 1 << iota
	spareBody
	spareVals
)

// clock returns the shared clock reading of the attempt under way, reading
// t's clock when there is none. Every layer of an attempt reads the clock
// at its start (the breaker for the slow-call rate, the deadlines for the
// time left); one reading serves them all, since they run microseconds
// apart, and on some virtual machines a clock read costs more than the
// layer that wants it. s may be nil.
func (s *callState) clock(t *Transport) time.Time {
	if s == nil {
		return t.now()
	}
	if s.sent.IsZero() {
		s.sent = t.now()
	}
	return s.sent
}

// staleClock marks the shared reading out of date after a wait. s may be
// nil.
func (s *callState) staleClock() {
	if s != nil {
		s.sent = time.Time{}
	}
}

// attemptCtx returns an attempt context: the call's spare, the first time,
// else a new one. s may be nil.
func (s *callState) attemptCtx() *attemptCtx {
	if s != nil && s.spare&spareCtx == 0 {
		s.spare |= spareCtx
		return &s.firstCtx
	}
	return new(attemptCtx)
}

// spareBody returns a zero body wrapper: the call's spare, the first time,
// else a new one. s may be nil.
func (s *callState) spareBody() *body {
	if s != nil && s.spare&spareBody == 0 {
		s.spare |= spareBody
		return &s.firstBody
	}
	return new(body)
}

// values returns n zero strings for a header copy: the call's spare, the
// first time and when they fit, else a new slice. s may be nil.
func (s *callState) values(n int) []string {
	if s != nil && s.spare&spareVals == 0 && n <= firstVals {
		s.spare |= spareVals
		return s.firstVals[:n:n]
	}
	return make([]string, n)
}

// callCtx carries a callState in one allocation. It adds a value and changes
// nothing else about its parent: Done, Err and Deadline are the parent's.
type callCtx struct {
	context.Context
	st callState
}

func (c *callCtx) Value(key any) any {
	if key == (callKey{}) {
		return &c.st
	}
	return c.Context.Value(key)
}

// callOf returns the state of the call t is serving in ctx, or nil.
func callOf(ctx context.Context, t *Transport) *callState {
	st, _ := ctx.Value(callKey{}).(*callState)
	if st == nil || st.owner != t {
		// Another Transport's call (one bulwark stacked on another) is not ours.
		return nil
	}
	return st
}

// withCall returns req with a call state for t in its context, reusing one
// an outer layer made. It serves a layer's RoundTrip used on its own; under
// the router, layers receive the state through roundTripCall instead. The
// request is copied only when a state is created; the caller's own request
// is never changed.
func withCall(req *http.Request, t *Transport) (*http.Request, *callState) {
	if st := callOf(req.Context(), t); st != nil {
		return req, st
	}
	c := &callCtx{Context: req.Context(), st: callState{owner: t}}
	return req.WithContext(c), &c.st
}

// callRT is implemented by bulwark's own layers: roundTripCall is RoundTrip
// with the call's state handed down by the layer above (nil when there is
// none), rather than looked up in the request's context. The router makes
// the state and hands it down, so the caller's request itself travels down
// to the attempt layer, which makes the one copy an attempt needs; carrying
// the state in the context instead would cost a second copy of the request
// per call, and a context lookup in every layer. Each layer's RoundTrip,
// for use on its own, finds the state in the context (withCall, callOf).
type callRT interface {
	roundTripCall(req *http.Request, st *callState) (*http.Response, error)
}

// sendCall hands req and st to next: through roundTripCall when next is one
// of bulwark's layers, else through RoundTrip (a base, or a RoundTripper a
// test put between layers), where st reaches only a layer that finds it in
// the context.
func sendCall(next http.RoundTripper, req *http.Request, st *callState) (*http.Response, error) {
	if c, ok := next.(callRT); ok {
		return c.roundTripCall(req, st)
	}
	return next.RoundTrip(req)
}

// callDeadline is the instant the call must be over by: the sooner of the
// context's deadline and Total's (in st, which may be nil). Every layer that
// waits bounds its wait by it, since Total is enforced without a timer of
// its own.
func callDeadline(ctx context.Context, st *callState) (time.Time, bool) {
	d, ok := ctx.Deadline()
	if st != nil && !st.total.IsZero() && (!ok || st.total.Before(d)) {
		return st.total, true
	}
	return d, ok
}

// totalDeadlineRT is layer 3: it starts the clock on Timeout.Total. It sets
// no timer: the deadline is recorded in the call state, every attempt's
// context is bounded by it (attemptRT) and every wait between attempts is
// too. One timer per attempt then enforces both bounds.
type totalDeadlineRT struct {
	next  http.RoundTripper
	t     *Transport
	total time.Duration
}

func (d *totalDeadlineRT) RoundTrip(req *http.Request) (*http.Response, error) {
	return d.roundTripCall(req, nil)
}

func (d *totalDeadlineRT) roundTripCall(req *http.Request, st *callState) (*http.Response, error) {
	if st == nil {
		// Used on its own: the state is in the context, or made here.
		req, st = withCall(req, d.t)
	}
	// The router read the clock as the call began (st.clock).
	end := st.clock(d.t).Add(d.total)
	if cd, ok := req.Context().Deadline(); !ok || end.Before(cd) {
		// Else the caller's deadline comes first: nothing to add.
		st.total = end
	}
	return sendCall(d.next, req, st)
}

// attemptRT is layer 8, the innermost: it bounds one attempt by the sooner
// of the caller's deadline, Total's and Attempt, refuses to send when too
// little time is left, and writes the per-attempt headers (time left and
// attempt number) on a copy of the request.
type attemptRT struct {
	next      http.RoundTripper
	t         *Transport
	attempt   time.Duration // zero: no per-attempt bound
	attemptMs string        // deadlineValue(attempt), set by instanceStack
	header    string        // empty: no deadline header (Timeout disabled)
	hs        *hostState    // where refusals are reported (observe.go)
}

// deadlineValue is the deadline header's value for left time left: whole
// milliseconds, less deadlineMargin for the time the request takes to
// arrive.
func deadlineValue(left time.Duration) string {
	return strconv.FormatInt(int64((left-deadlineMargin)/time.Millisecond), 10)
}

func (a *attemptRT) RoundTrip(req *http.Request) (*http.Response, error) {
	return a.roundTripCall(req, callOf(req.Context(), a.t))
}

func (a *attemptRT) roundTripCall(req *http.Request, st *callState) (*http.Response, error) {
	ctx := req.Context()
	if err := ctx.Err(); err != nil {
		closeBody(req)
		return nil, doneError(ctx)
	}
	var (
		now       time.Time
		dl        time.Time
		hasDL     bool
		ours      bool // the deadline is bulwark's, not the caller's
		attemptNo int
	)
	if st != nil {
		attemptNo = st.attempt
	}
	if a.header != "" {
		now = st.clock(a.t)
	}
	// This attempt is the reading's last user: whatever sends the next one
	// (a retry, after its wait) reads the clock again.
	st.staleClock()
	if a.header != "" {
		dl, hasDL = ctx.Deadline()
		if st != nil && !st.total.IsZero() && (!hasDL || st.total.Before(dl)) {
			dl, hasDL, ours = st.total, true, true
		}
		if a.attempt > 0 {
			if ad := now.Add(a.attempt); !hasDL || ad.Before(dl) {
				dl, hasDL, ours = ad, true, true
			}
		}
	}
	if !hasDL && attemptNo == 0 {
		return sendCall(a.next, req, st)
	}
	var left time.Duration
	if hasDL {
		left = dl.Sub(now)
		if left < minSendTime {
			closeBody(req)
			a.hs.deadlineTooShort(ctx)
			return nil, ErrDeadlineTooShort
		}
	}
	if !ours {
		return sendCall(a.next, a.outgoing(req, ctx, hasDL, left, attemptNo, st), st)
	}
	actx := st.attemptCtx()
	actx.init(ctx, dl, st)
	resp, err := sendCall(a.next, a.outgoing(req, actx, hasDL, left, attemptNo, st), st)
	if err != nil {
		if actx.Err() != nil && ctx.Err() == nil {
			err = &timeoutError{cause: err}
		}
		actx.bodyEnd()
		return nil, err
	}
	// The attempt's context must outlive RoundTrip: the body is read under
	// it. It ends when the caller is done with the body.
	onBodyEndIn(resp, actx, st)
	return resp, nil
}

// outgoing copies req with context ctx and the per-attempt headers.
func (a *attemptRT) outgoing(req *http.Request, ctx context.Context, hasDL bool, left time.Duration, attemptNo int, st *callState) *http.Request {
	out := req.WithContext(ctx)
	// The new values share one backing array: st's spare, on the first
	// attempt.
	vals := st.values(2)
	out.Header = cloneHeader(req.Header)
	if hasDL {
		if left == a.attempt && a.attemptMs != "" {
			// The usual first attempt: its own bound is the sooner one, and
			// it starts at the clock reading the bound was set from.
			vals[0] = a.attemptMs
		} else {
			vals[0] = deadlineValue(left)
		}
		out.Header[a.header] = vals[0:1:1]
	}
	if attemptNo > 0 {
		vals[1] = strconv.Itoa(attemptNo)
		out.Header[AttemptHeader] = vals[1:2:2]
	}
	return out
}

// cloneHeader copies h's map so that keys can be added or replaced without
// touching h. The value slices are shared with h, not copied: no layer
// writes into a value slice (each replaces it, as http.Header.Set does),
// and the RoundTripper contract forbids the base to modify the request at
// all. Sharing them lets maps.Clone copy the map's storage wholesale, about
// half the cost of rebuilding it key by key as http.Header.Clone does, on
// every attempt.
func cloneHeader(h http.Header) http.Header {
	if h == nil {
		return make(http.Header, 2)
	}
	return maps.Clone(h)
}

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

// DefaultServerMaxDeadline caps an incoming deadline when
// DeadlineOptions.Max is zero.
const DefaultServerMaxDeadline = 30 * time.Second

// DeadlineOptions configures DeadlineHandler. The zero value is ready to use.
type DeadlineOptions struct {
	// Max caps the deadline a caller may ask for, so that a hostile or buggy
	// header cannot make the server hold work for hours. Zero or less means
	// DefaultServerMaxDeadline.
	Max time.Duration

	// Header is the name of bulwark's deadline header to read, as set in the
	// calling client's Timeout.Header. Empty means DefaultDeadlineHeader.
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
// header the request is served with its context unchanged.
func DeadlineHandler(next http.Handler, opts DeadlineOptions) http.Handler {
	if opts.Max <= 0 {
		opts.Max = DefaultServerMaxDeadline
	}
	if opts.Header == "" {
		opts.Header = DefaultDeadlineHeader
	}
	opts.Header = http.CanonicalHeaderKey(opts.Header)
	return &deadlineHandler{next: next, opts: opts}
}

type deadlineHandler struct {
	next http.Handler
	opts DeadlineOptions
}

// The header names DeadlineHandler reads besides its own.
const (
	grpcTimeoutHeader  = "Grpc-Timeout"
	envoyTimeoutHeader = "X-Envoy-Expected-Rq-Timeout-Ms"
)

func (h *deadlineHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d, ok := h.incoming(r.Header)
	if !ok {
		h.next.ServeHTTP(w, r)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), d)
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
	consider(h.opts.Header, parseMillis)
	consider(grpcTimeoutHeader, ParseGRPCTimeout)
	consider(envoyTimeoutHeader, parseMillis)
	if found && best > h.opts.Max {
		best = h.opts.Max
	}
	return best, found
}

// maxHeaderMillis bounds a millisecond header before conversion, so that a
// value like 10^18 cannot overflow time.Duration; anything past it is capped
// by DeadlineOptions.Max anyway.
const maxHeaderMillis = int64(1<<63-1) / int64(time.Millisecond)

// parseMillis parses a positive whole number of milliseconds. A number too
// large for int64 is capped rather than refused: it is valid, only absurd,
// and DeadlineOptions.Max caps it anyway.
func parseMillis(s string) (time.Duration, bool) {
	s = strings.TrimSpace(s)
	if !allDigits(s) {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n > maxHeaderMillis {
		// After allDigits only overflow is left to fail.
		n = maxHeaderMillis
	}
	if n == 0 {
		return 0, false
	}
	return time.Duration(n) * time.Millisecond, true
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// ParseGRPCTimeout parses a grpc-timeout header value: 1 to 8 ASCII digits
// followed by a unit, H, M, S, m, u or n (hours to nanoseconds), as the gRPC
// over HTTP/2 specification defines it. It reports false for anything else
// and for a zero timeout.
func ParseGRPCTimeout(s string) (time.Duration, bool) {
	if len(s) < 2 || len(s) > 9 {
		return 0, false
	}
	digits, unit := s[:len(s)-1], s[len(s)-1]
	if !allDigits(digits) {
		return 0, false
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil || n == 0 {
		return 0, false
	}
	var u time.Duration
	switch unit {
	case 'H':
		u = time.Hour
	case 'M':
		u = time.Minute
	case 'S':
		u = time.Second
	case 'm':
		u = time.Millisecond
	case 'u':
		u = time.Microsecond
	case 'n':
		u = time.Nanosecond
	default:
		return 0, false
	}
	// 8 digits of hours (about 11,400 years) would overflow: cap instead.
	if n > int64(1<<63-1)/int64(u) {
		return time.Duration(1<<63 - 1), true
	}
	return time.Duration(n) * u, true
}
