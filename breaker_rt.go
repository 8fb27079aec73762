package bulwark

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"
)

// Package defaults for Breaker. The rates, minimum, open time and probe
// count are resilience4j's defaults, as the reference note quotes them.
const (
	DefaultFailureRate   = 0.5
	DefaultSlowCallRate  = 0.5
	DefaultBreakerWindow = 60 * time.Second
	DefaultMinCalls      = 100
	DefaultOpenFor       = 60 * time.Second
	DefaultHalfOpenCalls = 10
)

// breakerBuckets is how many buckets a Window is cut into: the window rolls
// forward a tenth at a time, so an old burst fades out in steps rather than
// all at once.
const breakerBuckets = 10

// minBreakerWindow keeps buckets long enough to hold a meaningful sample.
const minBreakerWindow = 100 * time.Millisecond

// Outcome is what one attempt tells the breaker about its host's health.
type Outcome uint8

const (
	// Success is a call the host served: it counts toward the window, and
	// toward the slow-call rate when it took SlowCall or longer.
	Success Outcome = iota
	// Failure is a call the host failed: it counts toward the failure rate
	// (and toward the slow-call rate when it was slow).
	Failure
	// Ignored is a call that says nothing about the host, such as one the
	// caller cancelled: it is not counted at all, and a half-open probe that
	// ends this way frees its slot without a verdict.
	Ignored
)

// String returns "success", "failure" or "ignored".
func (o Outcome) String() string {
	switch o {
	case Success:
		return "success"
	case Failure:
		return "failure"
	case Ignored:
		return "ignored"
	}
	return "outcome(" + strconv.Itoa(int(o)) + ")"
}

// Breaker configures the circuit breaker of each host of an upstream. The
// breaker watches every attempt (retries included) and, once the failure
// rate or the slow-call rate over the last Window reaches its threshold,
// opens: for OpenFor every request fails at once with a *BreakerOpenError,
// without touching the network. Then it lets HalfOpenCalls probes through;
// if all succeed it closes, if one fails (or is slow) it opens again for
// another OpenFor.
//
// Rates are computed only once MinCalls calls have completed within the
// window, so a quiet endpoint's occasional failure never trips it. Each
// attempt's verdict is taken when its response headers arrive (or its
// error does): an error while the caller reads the body is not counted.
type Breaker struct {
	// FailureRate is the share of counted calls (0 < FailureRate ≤ 1) that
	// were failures at which the breaker opens: it trips when failures ÷
	// calls ≥ FailureRate. Zero inherits from Default, then
	// DefaultFailureRate (50 %).
	FailureRate float64

	// SlowCallRate is the share of counted calls (0 < SlowCallRate ≤ 1) that
	// took SlowCall or longer at which the breaker opens, even if every one
	// of them succeeded: a dependency that answers correctly in 10 s is the
	// one that takes callers down. Zero inherits from Default, then
	// DefaultSlowCallRate (50 %).
	SlowCallRate float64

	// SlowCall is how long an attempt may take, from sending to its
	// response headers, before it counts as slow. Zero inherits from
	// Default, then half of the policy's Timeout.Attempt (5 s with the
	// package defaults): an attempt that uses half its timeout is already
	// far past the p99.9 a timeout should be set to. Setting it to
	// Timeout.Attempt or more turns slow-call detection off in effect, since
	// an attempt that long times out and counts as a failure instead.
	SlowCall time.Duration

	// Window is the rolling window the rates are computed over, kept as ten
	// buckets of Window/10 that expire one at a time. It must be at least
	// 100 ms. Zero inherits from Default, then DefaultBreakerWindow (60 s).
	Window time.Duration

	// MinCalls is how many counted calls the window must hold before any
	// rate is computed; below it the breaker never trips. Zero inherits from
	// Default, then DefaultMinCalls (100).
	//
	// Size it with Window: the window must see MinCalls calls at the
	// upstream's real traffic, or the breaker can never trip. At 150 calls/s
	// a 100 ms window holds about 15 calls, so MinCalls 20 would never be
	// reached and a sick upstream would keep every call.
	MinCalls int

	// OpenFor is how long the breaker stays open before it probes. Zero
	// inherits from Default, then DefaultOpenFor (60 s).
	OpenFor time.Duration

	// HalfOpenCalls is how many probes a half-open breaker lets through (at
	// most that many in flight at once); all of them must succeed for it to
	// close. Zero inherits from Default, then DefaultHalfOpenCalls (10).
	HalfOpenCalls int

	// Classify decides each attempt's Outcome from what the next layer
	// returned: exactly one of resp and err is non-nil. It runs on the
	// request path, outside any lock, and must be safe for concurrent use.
	// Nil inherits from Default, then DefaultClassify.
	Classify func(resp *http.Response, err error) Outcome

	// Disabled turns the breaker off for this upstream: every request goes
	// through. An upstream inherits Disabled from Default.
	Disabled bool
}

func (b Breaker) inherit(parent Breaker) Breaker {
	b.FailureRate = cmp.Or(b.FailureRate, parent.FailureRate)
	b.SlowCallRate = cmp.Or(b.SlowCallRate, parent.SlowCallRate)
	b.SlowCall = cmp.Or(b.SlowCall, parent.SlowCall)
	b.Window = cmp.Or(b.Window, parent.Window)
	b.MinCalls = cmp.Or(b.MinCalls, parent.MinCalls)
	b.OpenFor = cmp.Or(b.OpenFor, parent.OpenFor)
	b.HalfOpenCalls = cmp.Or(b.HalfOpenCalls, parent.HalfOpenCalls)
	if b.Classify == nil {
		b.Classify = parent.Classify
	}
	b.Disabled = b.Disabled || parent.Disabled
	return b
}

// withDefaults fills zero fields; the slow-call threshold depends on the
// attempt timeout, so it takes the policy's Timeout after its own defaults.
func (b Breaker) withDefaults(t Timeout) Breaker {
	b.FailureRate = cmp.Or(b.FailureRate, DefaultFailureRate)
	b.SlowCallRate = cmp.Or(b.SlowCallRate, DefaultSlowCallRate)
	if b.SlowCall == 0 {
		b.SlowCall = t.Attempt / 2
		if b.SlowCall <= 0 {
			b.SlowCall = DefaultAttemptTimeout / 2
		}
	}
	b.Window = cmp.Or(b.Window, DefaultBreakerWindow)
	b.MinCalls = cmp.Or(b.MinCalls, DefaultMinCalls)
	b.OpenFor = cmp.Or(b.OpenFor, DefaultOpenFor)
	b.HalfOpenCalls = cmp.Or(b.HalfOpenCalls, DefaultHalfOpenCalls)
	if b.Classify == nil {
		b.Classify = DefaultClassify
	}
	return b
}

func (b Breaker) validate() error {
	switch {
	case !(b.FailureRate > 0 && b.FailureRate <= 1):
		return fieldError("Breaker.FailureRate", b.FailureRate, "must be in (0, 1]")
	case !(b.SlowCallRate > 0 && b.SlowCallRate <= 1):
		return fieldError("Breaker.SlowCallRate", b.SlowCallRate, "must be in (0, 1]")
	case b.SlowCall < 0:
		return fieldError("Breaker.SlowCall", b.SlowCall, "must be ≥ 0")
	case b.Window < minBreakerWindow:
		return fieldError("Breaker.Window", b.Window, "must be ≥ "+minBreakerWindow.String())
	case b.MinCalls < 0 || b.MinCalls > math.MaxInt32:
		return fieldError("Breaker.MinCalls", b.MinCalls, "must be in [0, 2^31)")
	case b.OpenFor < 0:
		return fieldError("Breaker.OpenFor", b.OpenFor, "must be ≥ 0")
	case b.HalfOpenCalls < 0 || b.HalfOpenCalls > math.MaxInt32:
		return fieldError("Breaker.HalfOpenCalls", b.HalfOpenCalls, "must be in [0, 2^31)")
	}
	return nil
}

// DefaultClassify is the classifier a nil Breaker.Classify means. Failures:
// transport errors, bulwark's own attempt or total timeout
// (ErrAttemptTimeout), 5xx responses other than 501, and 429. Ignored: the
// caller's own cancellation or deadline, rejections by a layer inside the
// breaker that never reached the host (ErrBulkheadFull,
// ErrDeadlineTooShort), 501 and 4xx responses other than 429, which say
// the request was wrong, not that the host is sick. Everything else is a
// Success. A custom classifier can wrap it.
func DefaultClassify(resp *http.Response, err error) Outcome {
	if err != nil {
		switch {
		case errors.Is(err, ErrAttemptTimeout):
			return Failure
		case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded),
			errors.Is(err, ErrBulkheadFull):
			// ErrDeadlineTooShort wraps DeadlineExceeded and lands here too.
			return Ignored
		}
		return Failure
	}
	switch c := resp.StatusCode; {
	case failureStatus(c):
		return Failure
	case c >= 400:
		return Ignored
	}
	return Success
}

// failureStatus reports whether a status says the host is failing: 5xx
// other than 501 Not Implemented, and 429 Too Many Requests.
func failureStatus(code int) bool {
	return code == http.StatusTooManyRequests || code >= 500 && code != http.StatusNotImplemented
}

// BreakerOpenError is the error for a request the breaker refused to send.
// It matches ErrBreakerOpen. One is made each time the breaker opens and
// shared by every refusal until the next, so refusing allocates nothing:
// treat it as read-only.
type BreakerOpenError struct {
	// Host is the "host:port" whose breaker is open.
	Host string
	// ProbeAt is when the breaker lets probes through again. When it has
	// passed, the breaker is half-open with every probe slot taken, and a
	// slot may free up any moment.
	ProbeAt time.Time
}

func (e *BreakerOpenError) Error() string {
	return "bulwark: circuit breaker open for " + e.Host + " until " + e.ProbeAt.Format(time.RFC3339)
}

// Unwrap returns ErrBreakerOpen.
func (e *BreakerOpenError) Unwrap() error { return ErrBreakerOpen }

// CircuitState is a breaker's state, as BreakerState reports it.
type CircuitState uint8

const (
	// CircuitClosed lets every request through and counts outcomes.
	CircuitClosed CircuitState = iota
	// CircuitHalfOpen lets a few probes through to learn if the host is back.
	CircuitHalfOpen
	// CircuitOpen refuses every request without sending it.
	CircuitOpen
)

// String returns "closed", "half-open" or "open".
func (s CircuitState) String() string {
	switch s {
	case CircuitClosed:
		return "closed"
	case CircuitHalfOpen:
		return "half-open"
	case CircuitOpen:
		return "open"
	}
	return "state(" + strconv.Itoa(int(s)) + ")"
}

func circuitState(s gobreaker.State) CircuitState {
	switch s {
	case gobreaker.StateHalfOpen:
		return CircuitHalfOpen
	case gobreaker.StateOpen:
		return CircuitOpen
	}
	return CircuitClosed
}

// BreakerState reports the state of the breaker of host, given as
// "host:port" (lower-case, port always present, as BreakerOpenError.Host
// has it; case does not matter). ok is false when the host has no live
// state or its breaker is disabled. Should one host:port be reached over two
// schemes, the least healthy state is reported. Asking may move an open
// breaker whose OpenFor has passed to half-open, as the next request would.
func (t *Transport) BreakerState(host string) (state CircuitState, ok bool) {
	var found []*breakerRT
	t.mu.RLock()
	for _, hs := range t.hosts {
		if hs.breaker != nil && strings.EqualFold(hs.name, host) {
			found = append(found, hs.breaker)
		}
	}
	t.mu.RUnlock()
	for _, b := range found {
		state, ok = max(state, b.state()), true
	}
	return state, ok
}

// The verdicts breakerRT hands gobreaker's done callback. They are
// sentinels, not errors anyone sees: gobreaker only passes them back to
// the IsExcluded and IsSuccessful hooks below.
var (
	errVerdictSlow    = errors.New("bulwark: slow call")
	errVerdictFailure = errors.New("bulwark: failed call")
	errVerdictIgnored = errors.New("bulwark: ignored call")
)

// breakerRT is layer 6, one per host: gobreaker's state machine
// around the rest of the attempt.
//
// gobreaker's Counts have no slow-call count, and it credits each outcome
// to the bucket its request started in, on time.Now rather than the
// Transport's clock. So the rates are computed from a window of our own
// (win): completed calls, failures and slow calls in ten buckets on the
// Transport's clock, all three keyed by completion time, so both rates
// share one window and one denominator. While closed, calls bypass
// gobreaker (closedTrip) and count in win only if no state change came
// between their admission and their end (mirror), as gobreaker drops such
// outcomes itself; calls through gobreaker are counted from its
// IsSuccessful hook, which it calls only for outcomes of its current
// generation. win is cleared from OnStateChange, so it never counts a call
// of an earlier state.
//
// A slow success is reported to gobreaker as a failure: that is how
// ReadyToTrip gets asked, and, half-open, a slow probe reopens the breaker
// since the host is evidently not well yet. The same goes for a success
// that takes the window to MinCalls with a rate already at its threshold.
// What gobreaker counts as failures is therefore never read; win decides.
type breakerRT struct {
	next     http.RoundTripper
	hs       *hostState
	cb       *gobreaker.CircuitBreaker[struct{}]
	slow     time.Duration
	classify func(*http.Response, error) Outcome
	openFor  time.Duration

	// cbState is gobreaker's state, written and read under its mutex (in
	// its hooks).
	cbState gobreaker.State
	// mirror is gobreaker's state for readers outside its mutex: the state
	// in the low two bits, above them a count of state changes, so that a
	// call admitted in one closed period is not counted in another.
	mirror atomic.Uint64

	// win and what tripped reads are guarded by winMu. Lock order:
	// gobreaker's mutex, then winMu.
	winMu    sync.Mutex
	win      breakerWindow
	minCalls uint32
	failRate float64
	slowRate float64

	// lastEnd is the latest completion time, in Unix nanoseconds on the
	// Transport's clock.
	lastEnd atomic.Int64

	// openErr is the error every refusal returns, replaced each time the
	// breaker opens.
	openErr atomic.Pointer[BreakerOpenError]

	// Transitions queue here under gobreaker's mutex and are logged by
	// whichever request finds them there after leaving it.
	pending atomic.Bool
	evMu    sync.Mutex
	events  [8]breakerEvent
	nEvents int
	dropped int
}

type breakerEvent struct {
	from, to gobreaker.State
	at       time.Time
	failures uint32
	slow     uint32
	calls    uint32
}

func newBreakerRT(next http.RoundTripper, hs *hostState) *breakerRT {
	p := hs.policy.Breaker
	b := &breakerRT{
		next: next, hs: hs, slow: p.SlowCall, classify: p.Classify, openFor: p.OpenFor,
		minCalls: uint32(p.MinCalls), failRate: p.FailureRate, slowRate: p.SlowCallRate,
	}
	if b.classify == nil {
		b.classify = DefaultClassify
	}
	b.win.width = p.Window / breakerBuckets
	b.win.start = hs.t.now()
	b.cb = gobreaker.NewCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        hs.name,
		MaxRequests: uint32(p.HalfOpenCalls),
		// A rolling window keeps gobreaker's own counters from growing
		// without end; their values are not used (see win).
		Interval:      p.Window,
		BucketPeriod:  p.Window / breakerBuckets,
		Timeout:       p.OpenFor,
		ReadyToTrip:   b.readyToTrip,
		OnStateChange: b.onStateChange,
		IsSuccessful:  b.isSuccessful,
		IsExcluded:    func(err error) bool { return err == errVerdictIgnored },
	})
	return b
}

func (b *breakerRT) RoundTrip(req *http.Request) (*http.Response, error) {
	return b.roundTripCall(req, callOf(req.Context(), b.hs.t))
}

func (b *breakerRT) roundTripCall(req *http.Request, st *callState) (*http.Response, error) {
	if m := b.mirror.Load(); gobreaker.State(m&3) == gobreaker.StateClosed {
		return b.closedTrip(req, st, m)
	}
	var (
		resp *http.Response
		err  error
		ran  bool
	)
	// Execute rather than the two-step Allow: Allow returns a fresh done
	// closure on every call, while Execute's argument does not escape, so
	// this closure lives on the stack. Execute also reports a panic in next
	// as a failure (see isSuccessful) before letting it go on, so a
	// half-open probe slot is never left taken.
	_, _ = b.cb.Execute(func() (struct{}, error) {
		ran = true
		start := st.clock(b.hs.t)
		resp, err = sendCall(b.next, req, st)
		took := b.hs.t.since(start)
		end := start.Add(took)
		// The window's clock, read by isSuccessful: passing the time this
		// way saves a third clock read per call (about 60 ns on a VM).
		// Concurrent calls may see each other's end time, microseconds
		// apart, which does not matter to buckets of Window/10.
		b.lastEnd.Store(end.UnixNano())
		return struct{}{}, b.verdict(resp, err, took)
	})
	if b.pending.Load() {
		b.flush()
	}
	if !ran {
		// Refused: open, or half-open with every probe slot taken.
		b.hs.rejected(req.Context(), layerBreaker)
		closeBody(req)
		if e := b.openErr.Load(); e != nil {
			return nil, e
		}
		return nil, ErrBreakerOpen
	}
	return resp, err
}

// closedTrip is RoundTrip while the breaker is closed (mirror m). Closed,
// gobreaker has nothing to decide: it admits every call, and its counts are
// never read (win is). So a closed call does not go through it, which
// saves its mutex twice and two clock readings of its own per call; the
// outcome goes to win directly, and gobreaker is called only when win says
// to trip (trip), to make the transition. Open and half-open, every call
// goes through gobreaker, which admits the probes.
func (b *breakerRT) closedTrip(req *http.Request, st *callState, m uint64) (*http.Response, error) {
	start := st.clock(b.hs.t)
	done := false
	defer func() {
		if !done {
			// next panicked: a failure, as Execute would have it. The
			// panic carries on.
			b.record(m, b.hs.t.now(), true, false)
		}
	}()
	resp, err := sendCall(b.next, req, st)
	done = true
	took := b.hs.t.since(start)
	end := start.Add(took)
	if v := b.verdict(resp, err, took); v != errVerdictIgnored {
		failed, slow := verdictCounts(v)
		b.record(m, end, failed, slow)
	}
	if b.pending.Load() {
		b.flush()
	}
	return resp, err
}

// record counts a call admitted while closed (mirror m) that ended at end,
// unless the state has changed since (gobreaker drops such outcomes too),
// and trips the breaker when the window says so.
func (b *breakerRT) record(m uint64, end time.Time, failed, slow bool) {
	b.winMu.Lock()
	if b.mirror.Load() != m {
		b.winMu.Unlock()
		return
	}
	b.win.add(end, failed, slow)
	trip := b.tripped()
	b.winMu.Unlock()
	if trip {
		// Through gobreaker, which asks readyToTrip again under its mutex
		// (another call may have moved the window or the state since).
		_, _ = b.cb.Execute(func() (struct{}, error) { return struct{}{}, errVerdictTrip })
	}
}

// errVerdictTrip is the verdict of the call record makes to trip the
// breaker: a failure for gobreaker, counted nowhere else.
var errVerdictTrip = errors.New("bulwark: trip")

// verdict is what gobreaker is told of an attempt that took took: one of the
// errVerdict sentinels, or nil for a fast success.
func (b *breakerRT) verdict(resp *http.Response, err error, took time.Duration) error {
	switch b.classify(resp, err) {
	case Ignored:
		return errVerdictIgnored
	case Failure:
		if took >= b.slow {
			return errVerdictSlowFailure
		}
		return errVerdictFailure
	}
	if took >= b.slow {
		return errVerdictSlow
	}
	return nil
}

// verdictCounts is what a verdict counts toward in the window. Any verdict
// but the sentinels for success is a failure: Execute reports a panic in
// next with an error of its own.
func verdictCounts(v error) (failed, slow bool) {
	return v != nil && v != errVerdictSlow, v == errVerdictSlow || v == errVerdictSlowFailure
}

// errVerdictSlowFailure is a failure that was slow too: it counts toward both
// rates.
var errVerdictSlowFailure = errors.New("bulwark: slow failed call")

// isSuccessful is gobreaker's IsSuccessful hook, under its mutex, for a
// non-excluded outcome of the current generation: it records the outcome
// in win and says whether gobreaker may treat it as a success.
func (b *breakerRT) isSuccessful(verdict error) bool {
	if verdict == errVerdictTrip {
		return false
	}
	failed, slow := verdictCounts(verdict)
	if b.cbState != gobreaker.StateClosed {
		// Half-open: gobreaker's own probe accounting decides; a slow probe
		// fails.
		return verdict == nil
	}
	// Closed, yet through gobreaker: a call admitted half-open that ended
	// after the breaker closed.
	b.winMu.Lock()
	defer b.winMu.Unlock()
	b.win.add(time.Unix(0, b.lastEnd.Load()), failed, slow)
	if failed || slow {
		return false
	}
	// A fast success can still be the call that brings the window to
	// MinCalls with a rate at its threshold: report it as a failure so that
	// gobreaker asks readyToTrip.
	return !b.tripped()
}

// readyToTrip is gobreaker's ReadyToTrip hook, under its mutex.
func (b *breakerRT) readyToTrip(gobreaker.Counts) bool {
	b.winMu.Lock()
	defer b.winMu.Unlock()
	return b.tripped()
}

// tripped reports whether the window holds enough calls and either rate has
// reached its threshold. Under winMu.
func (b *breakerRT) tripped() bool {
	c := &b.win.total
	if c.calls == 0 || c.calls < b.minCalls {
		return false
	}
	// Divide rather than multiply the threshold: a quotient is correctly
	// rounded, so 7 of 25 is exactly the float 0.28 and trips at 0.28,
	// where 0.28*25 rounds to just above 7 and would not.
	n := float64(c.calls)
	return float64(c.failures)/n >= b.failRate || float64(c.slow)/n >= b.slowRate
}

// onStateChange is gobreaker's OnStateChange hook, under its mutex: it
// must not log or call user code, so it only records.
func (b *breakerRT) onStateChange(_ string, from, to gobreaker.State) {
	now := b.hs.t.now()
	b.cbState = to
	b.winMu.Lock()
	ev := breakerEvent{from: from, to: to, at: now, failures: b.win.total.failures, slow: b.win.total.slow, calls: b.win.total.calls}
	b.win.reset(now)
	b.mirror.Store((b.mirror.Load()>>2+1)<<2 | uint64(to))
	b.winMu.Unlock()
	if to == gobreaker.StateOpen {
		b.openErr.Store(&BreakerOpenError{Host: b.hs.name, ProbeAt: now.Add(b.openFor)})
	}
	b.evMu.Lock()
	if b.nEvents < len(b.events) {
		b.events[b.nEvents] = ev
		b.nEvents++
	} else {
		b.dropped++
	}
	b.evMu.Unlock()
	b.pending.Store(true)
}

// flush reports (logs and counts) the queued state changes, outside
// gobreaker's mutex.
func (b *breakerRT) flush() {
	b.evMu.Lock()
	evs := b.events
	n, dropped := b.nEvents, b.dropped
	b.nEvents, b.dropped = 0, 0
	b.pending.Store(false)
	b.evMu.Unlock()
	log := b.hs.t.logger
	for _, ev := range evs[:n] {
		b.hs.breakerStateChanged(circuitState(ev.from).String(), circuitState(ev.to).String(),
			slog.Uint64("calls", uint64(ev.calls)), slog.Uint64("failures", uint64(ev.failures)), slog.Uint64("slow", uint64(ev.slow)), slog.Time("at", ev.at))
	}
	if dropped > 0 {
		log.Info("bulwark: circuit breaker state changes not logged", "host", b.hs.name, "dropped", dropped)
	}
}

// state returns the breaker's state, logging any change that reading it
// caused.
func (b *breakerRT) state() CircuitState {
	s := b.cb.State()
	if b.pending.Load() {
		b.flush()
	}
	return circuitState(s)
}

// breakerCounts is one bucket, or the whole window.
type breakerCounts struct{ calls, failures, slow uint32 }

// breakerWindow counts completed calls over a rolling window of
// breakerBuckets buckets, each width long, on the Transport's clock.
type breakerWindow struct {
	width   time.Duration
	start   time.Time // start of bucket number age
	age     int64     // number of the newest bucket since start of the window
	buckets [breakerBuckets]breakerCounts
	total   breakerCounts
}

func (w *breakerWindow) reset(now time.Time) {
	*w = breakerWindow{width: w.width, start: now}
}

// advance expires the buckets older than the window at now.
func (w *breakerWindow) advance(now time.Time) {
	age := int64(now.Sub(w.start) / w.width)
	if age <= w.age {
		// Also covers a clock that went backwards: keep the newest bucket.
		return
	}
	if age-w.age >= breakerBuckets {
		w.reset(now)
		return
	}
	for w.age < age {
		w.age++
		old := &w.buckets[w.age%breakerBuckets]
		w.total.calls -= old.calls
		w.total.failures -= old.failures
		w.total.slow -= old.slow
		*old = breakerCounts{}
	}
}

func (w *breakerWindow) add(now time.Time, failed, slow bool) {
	w.advance(now)
	cur := &w.buckets[w.age%breakerBuckets]
	cur.calls++
	w.total.calls++
	if failed {
		cur.failures++
		w.total.failures++
	}
	if slow {
		cur.slow++
		w.total.slow++
	}
}
