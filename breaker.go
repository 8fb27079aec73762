package bulwark

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bulwark-http/bulwark/internal/peers"
	"github.com/bulwark-http/bulwark/internal/window"
	"github.com/sony/gobreaker/v2"
)

// Package defaults for Breaker: resilience4j's failure rate, window and
// minimum, a slow-call rate of 50 % (resilience4j's is 100 %), and an open
// time from gRPC's connection backoff, doubled on trips in a row up to a
// minute. See docs/design.md, "Breaker".
const (
	DefaultFailureRate   = 0.5
	DefaultSlowCallRate  = 0.5
	DefaultWindowCalls   = 100
	DefaultMinCalls      = 100
	DefaultOpenFor       = time.Second
	DefaultMaxOpenFor    = 60 * time.Second
	DefaultHalfOpenCalls = 10
	// DefaultBreakerConsecutive is Breaker.ConsecutiveFailures' default:
	// see there for why ten.
	DefaultBreakerConsecutive = 10
)

// BreakerCounts is what a host's breaker has counted while closed, as
// Breaker.ReadyToTrip receives it: the window's calls, failures and slow
// calls (the fleet's included, with a Fleet), and the attempts that failed
// in a row, counted on this client alone.
type BreakerCounts struct {
	Calls               int64
	Failures            int64
	Slow                int64
	ConsecutiveFailures int64
}

// breakerBuckets is how many buckets a time window is cut into: it rolls
// forward a tenth at a time, so an old burst fades out in steps rather
// than all at once.
const breakerBuckets = 10

// minBreakerWindow keeps a time window's buckets long enough to hold a
// meaningful sample.
const minBreakerWindow = 100 * time.Millisecond

// maxWindowCalls bounds a count window (a byte per attempt: 1 MiB).
const maxWindowCalls = window.MaxCalls

// Breaker configures the circuit breaker of each host of an upstream, after
// Nygard's Release It!. It watches every attempt, retries included (package
// defaults in brackets):
//
//   - Counts: Policy.Classify judges each attempt as failure, success or
//     ignored; one that took SlowCall or longer is slow too. The window
//     holds the last WindowCalls [100] counted attempts, or those of the
//     last Window. Every state change empties it.
//   - Trips, judged after every counted attempt: with MinCalls [100] or more
//     in the window, when failures ÷ attempts ≥ FailureRate [50 %] or slow ÷
//     attempts ≥ SlowCallRate [50 %]; when ConsecutiveFailures [10] attempts
//     in a row went unanswered; or when ReadyToTrip says so. While SlowCall
//     is learned, a rule met only by bulwark's own timeouts and slow calls
//     trips once it has held for the hold: the host's learned third-attempt
//     timeout (12 × its healthy p99.9, 200 ms to Timeout.Attempt's ceiling).
//     So a host failing every attempt trips at its 100th from a cold start,
//     its 50th failure after a healthy past; a dead host after 10 attempts.
//   - Refuses: open, it fails every request with a *BreakerOpenError for
//     OpenFor [1 s], doubled on each trip in a row up to MaxOpenFor [60 s].
//   - Probes: while open, one request per open time ÷ HalfOpenCalls [10] (see
//     OpenFor); then, half-open, HalfOpenCalls probes. It closes when all of
//     them succeed, none slow; one failed or slow probe opens it again.
//
// The state machine is gobreaker's, fed by bulwark's own window, since
// gobreaker counts no slow calls. See docs/design.md, "Breaker".
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
	// response headers, before it counts as slow (a wait in the bulkhead's
	// queue is not the host's and does not count). Zero inherits from
	// Default, then means learned from the host: 2 × its healthy p99.9 (the
	// baseline Timeout.Attempt learns from), at least 50 ms, at most half of
	// Timeout.Attempt (5 s with the package defaults), and that half while
	// fewer than 200 attempts have succeeded. Twice the slowest healthy
	// answers stays below the learned timeout (3 ×), so a host that slows
	// down trips the slow-call rate before its attempts time out. While it
	// is learned, a rate met only by timeouts and slow calls trips once it
	// has held for the hold (see Breaker), so that a capacity drop's brief
	// queue does not open the breaker. A set SlowCall is obeyed as set, and
	// its rate rules trip at once.
	SlowCall time.Duration

	// WindowCalls is how many of the most recent counted attempts the
	// rates are computed over, exactly: the window is a ring of one byte
	// per attempt. Zero inherits from Default, then DefaultWindowCalls
	// (100). It is ignored when Window is set.
	WindowCalls int

	// Window, when set, makes the window time-based: the calls of the last
	// Window, in ten buckets of Window/10 (so up to a tenth more of the
	// past). It must be at least 100 ms. Zero
	// inherits from Default, then means the count window of WindowCalls.
	// A time window suits a host with steady traffic; on a busy host its
	// healthy past dilutes a new failure, so a count window reacts sooner.
	Window time.Duration

	// MinCalls is how many counted calls the window must hold before any
	// rate is computed; below it the breaker never trips. Zero inherits from
	// Default, then DefaultMinCalls (100), capped at WindowCalls for a count
	// window. With a time window, the window must see MinCalls calls at the
	// upstream's real traffic, or the breaker can never trip.
	MinCalls int

	// OpenFor is how long the breaker stays open after its first trip
	// before its half-open round. Each trip in a row (a probe that failed)
	// doubles it, up to MaxOpenFor, less up to 20 % at random so that the
	// hosts of a fleet do not probe in step. While open, one request every
	// open time ÷ HalfOpenCalls goes as a probe, once a request was refused
	// since the last, and one that succeeds ends the open time: a recovered
	// host is found within that spacing, and a host still sick sees at most
	// HalfOpenCalls probes per open period. A caller calling less often
	// than the open time sees probes, not refusals. Zero inherits from
	// Default, then DefaultOpenFor (1 s).
	OpenFor time.Duration

	// MaxOpenFor caps the open time's growth. It may not be below OpenFor.
	// Zero inherits from Default, then DefaultMaxOpenFor (60 s), or OpenFor
	// if that is longer.
	MaxOpenFor time.Duration

	// HalfOpenCalls is how many probes a half-open breaker lets through (at
	// most that many in flight at once); all of them must succeed for it to
	// close. Zero inherits from Default, then DefaultHalfOpenCalls (10).
	HalfOpenCalls int

	// ReadyToTrip, if not nil, is a trip rule of the user's, beside the
	// rate rules and ConsecutiveFailures, as gobreaker's
	// Settings.ReadyToTrip is: after every counted attempt while the
	// breaker is closed (a success too, where gobreaker asks only after a
	// failure), it gets the breaker's counts and trips it by returning
	// true. It is asked whatever MinCalls says, so it can
	// trip a quiet host; the rate rules still apply. It runs under the
	// breaker's lock, on the request path: it must be fast, and must not
	// call the Transport. Nil inherits from Default, then means no rule of
	// the user's (unlike gobreaker, whose nil means more than five
	// consecutive failures: here that is ConsecutiveFailures).
	ReadyToTrip func(BreakerCounts) bool

	// ConsecutiveFailures trips the breaker when that many attempts in a
	// row failed unanswered (bulwark's own timeout, a transport error such
	// as a refused or reset connection; an answer, even a 5xx, ends the
	// run), whatever MinCalls says, so that a dead or hung host at low
	// traffic fails fast. Zero inherits from Default, then
	// DefaultBreakerConsecutive (10: three or four calls with the default
	// retries); negative turns the rule off. A run with a transport error
	// trips at once; a run of bulwark's own timeouts only, once the host
	// has a learned latency, must also last the hold (see Breaker), since a
	// shorter one is a batch that queued behind a host at capacity.
	ConsecutiveFailures int

	// OnStateChange, if not nil, is called after each state change of a
	// host's breaker, outside any lock of bulwark's and gobreaker's, on the
	// goroutine of a request that saw the change, in the order the changes
	// happened. host is the "host:port". Nil inherits from Default.
	OnStateChange func(host string, from, to CircuitState)

	// Shadow runs the breaker in shadow mode: it counts, trips and probes
	// as it would, and reports each refusal it would make (the
	// bulwark.shadow.rejections metric, a "bulwark.shadow_rejected" span
	// event, BreakerSnapshot.WouldReject), but sends the request anyway.
	// Requests it lets through that way are not counted in its window, so
	// it behaves exactly as an enforcing breaker would on the same traffic.
	// Use it to tune thresholds on production traffic before enforcing
	// them. An upstream inherits Shadow from Default (it is or-ed: an
	// upstream cannot enforce what Default shadows).
	Shadow bool

	// learn records that SlowCall was not given: then SlowCall is the
	// ceiling of the learned threshold.
	learn bool
	// holdMax is the attempt timeout's ceiling, which caps the learned
	// hold as it caps the learned third attempt's timeout.
	holdMax time.Duration

	// Disabled turns the breaker off for this upstream: every request goes
	// through. An upstream inherits Disabled from Default unless it sets
	// Enabled.
	Disabled bool

	// Enabled turns the breaker back on for an upstream whose Default set
	// Disabled. Setting both is an error.
	Enabled bool
}

func (b Breaker) inherit(parent Breaker) Breaker {
	b.FailureRate = cmp.Or(b.FailureRate, parent.FailureRate)
	b.SlowCallRate = cmp.Or(b.SlowCallRate, parent.SlowCallRate)
	b.SlowCall = cmp.Or(b.SlowCall, parent.SlowCall)
	b.WindowCalls = cmp.Or(b.WindowCalls, parent.WindowCalls)
	b.Window = cmp.Or(b.Window, parent.Window)
	b.MinCalls = cmp.Or(b.MinCalls, parent.MinCalls)
	b.OpenFor = cmp.Or(b.OpenFor, parent.OpenFor)
	b.MaxOpenFor = cmp.Or(b.MaxOpenFor, parent.MaxOpenFor)
	b.HalfOpenCalls = cmp.Or(b.HalfOpenCalls, parent.HalfOpenCalls)
	if b.OnStateChange == nil {
		b.OnStateChange = parent.OnStateChange
	}
	if b.ReadyToTrip == nil {
		b.ReadyToTrip = parent.ReadyToTrip
	}
	b.ConsecutiveFailures = cmp.Or(b.ConsecutiveFailures, parent.ConsecutiveFailures)
	b.Shadow = b.Shadow || parent.Shadow
	b.Disabled = inheritOff(b.Disabled, b.Enabled, parent.Disabled)
	return b
}

// withDefaults fills zero fields; the slow-call threshold and the hold
// depend on the attempt timeout's ceiling, which the policy works out and
// hands in as attempt.
func (b Breaker) withDefaults(attempt time.Duration) Breaker {
	b.FailureRate = cmp.Or(b.FailureRate, DefaultFailureRate)
	b.SlowCallRate = cmp.Or(b.SlowCallRate, DefaultSlowCallRate)
	if b.SlowCall == 0 {
		b.SlowCall, b.learn = attempt/2, true
	}
	b.holdMax = attempt
	b.WindowCalls = cmp.Or(b.WindowCalls, DefaultWindowCalls)
	if b.MinCalls == 0 {
		b.MinCalls = DefaultMinCalls
		if b.Window == 0 {
			b.MinCalls = min(b.MinCalls, b.WindowCalls)
		}
	}
	b.OpenFor = cmp.Or(b.OpenFor, DefaultOpenFor)
	b.MaxOpenFor = cmp.Or(b.MaxOpenFor, max(DefaultMaxOpenFor, b.OpenFor))
	b.HalfOpenCalls = cmp.Or(b.HalfOpenCalls, DefaultHalfOpenCalls)
	b.ConsecutiveFailures = cmp.Or(b.ConsecutiveFailures, DefaultBreakerConsecutive)
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
	}
	if err := b.validateWindow(); err != nil {
		return err
	}
	switch {
	case b.OpenFor < 0:
		return fieldError("Breaker.OpenFor", b.OpenFor, "must be ≥ 0")
	case b.MaxOpenFor < b.OpenFor:
		return fieldError("Breaker.MaxOpenFor", b.MaxOpenFor, "must be ≥ Breaker.OpenFor ("+b.OpenFor.String()+")")
	case b.HalfOpenCalls < 0 || b.HalfOpenCalls > math.MaxInt32:
		return fieldError("Breaker.HalfOpenCalls", b.HalfOpenCalls, "must be in [0, 2^31)")
	}
	return nil
}

// validateWindow is validate's part for the window and MinCalls.
func (b Breaker) validateWindow() error {
	switch {
	case b.WindowCalls < 1 || b.WindowCalls > maxWindowCalls:
		return fieldError("Breaker.WindowCalls", b.WindowCalls, fmt.Sprintf("must be in [1, %d]", maxWindowCalls))
	case b.Window != 0 && b.Window < minBreakerWindow:
		return fieldError("Breaker.Window", b.Window, "must be ≥ "+minBreakerWindow.String())
	case b.MinCalls < 0 || b.MinCalls > math.MaxInt32:
		return fieldError("Breaker.MinCalls", b.MinCalls, "must be in [0, 2^31)")
	case b.Window == 0 && b.MinCalls > b.WindowCalls:
		return fieldError("Breaker.MinCalls", b.MinCalls, "must not exceed Breaker.WindowCalls ("+strconv.Itoa(b.WindowCalls)+"), or the breaker could never trip")
	}
	return nil
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
	// slot may free up any moment. It is zero while ControlBreaker holds
	// the breaker open (BreakerForceOpen): no probe is due until an
	// operator releases it.
	ProbeAt time.Time
}

func (e *BreakerOpenError) Error() string {
	if e.ProbeAt.IsZero() {
		return "bulwark: circuit breaker held open for " + e.Host
	}
	return "bulwark: circuit breaker open for " + e.Host + " until " + e.ProbeAt.Format(time.RFC3339)
}

// Unwrap returns ErrBreakerOpen.
func (e *BreakerOpenError) Unwrap() error { return ErrBreakerOpen }

func (e *BreakerOpenError) refusalKind() kind { return kindBreakerOpen }

// CircuitState is a breaker's state, as BreakerSnapshot.State reports it.
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

// MarshalText returns the state's String, so a Snapshot encoded as JSON
// (the debug package's page, a user's own export) says "open" rather than
// a number its reader would have to look up.
func (s CircuitState) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText parses what MarshalText returns, so a Snapshot decodes
// from its own JSON.
func (s *CircuitState) UnmarshalText(text []byte) error {
	for c := CircuitClosed; c <= CircuitOpen; c++ {
		if string(text) == c.String() {
			*s = c
			return nil
		}
	}
	return fmt.Errorf("bulwark: unknown circuit state %q", text)
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

// BreakerControl is a manual override of a host's breaker, set with
// Transport.ControlBreaker.
type BreakerControl uint8

const (
	// BreakerAuto lets the breaker decide: the default.
	BreakerAuto BreakerControl = iota
	// BreakerForceOpen refuses every request to the host, as an open
	// breaker does, until the control is set back: for a planned
	// maintenance or a dependency known to be down.
	BreakerForceOpen
	// BreakerForceClosed lets every request through and counts none of
	// them: for an incident where the breaker must not stand in the way.
	BreakerForceClosed
)

// String returns "auto", "force-open" or "force-closed".
func (c BreakerControl) String() string {
	switch c {
	case BreakerAuto:
		return "auto"
	case BreakerForceOpen:
		return "force-open"
	case BreakerForceClosed:
		return "force-closed"
	}
	return "control(" + strconv.Itoa(int(c)) + ")"
}

// MarshalText returns the control's String, for the same reason as
// CircuitState.MarshalText.
func (c BreakerControl) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// UnmarshalText parses what MarshalText returns.
func (c *BreakerControl) UnmarshalText(text []byte) error {
	for v := BreakerAuto; v <= BreakerForceClosed; v++ {
		if string(text) == v.String() {
			*c = v
			return nil
		}
	}
	return fmt.Errorf("bulwark: unknown breaker control %q", text)
}

// The verdicts breakerLayer hands gobreaker's Execute. They are sentinels,
// not errors anyone sees: gobreaker only passes them back to the
// IsExcluded and IsSuccessful hooks below.
var (
	errVerdictSlow        = errors.New("bulwark: slow call")
	errVerdictFailure     = errors.New("bulwark: failed call")
	errVerdictSlowFailure = errors.New("bulwark: slow failed call")
	// A failure the host never answered (bulwark's own timeout, a
	// transport error): the only kind ConsecutiveFailures counts in a row.
	errVerdictUnanswered     = errors.New("bulwark: unanswered call")
	errVerdictSlowUnanswered = errors.New("bulwark: slow unanswered call")
	// An unanswered failure that is bulwark's own timeout (kindTimeout),
	// where the two above are transport errors (refused, reset): a batch of
	// timeouts may be a queue's artefact, a transport error is not.
	errVerdictTimeout     = errors.New("bulwark: timed out call")
	errVerdictSlowTimeout = errors.New("bulwark: slow timed out call")
	errVerdictIgnored     = errors.New("bulwark: ignored call")
	// errVerdictFleet is no call: the fleet's counts alone meet the trip
	// condition (fleetTrip), and gobreaker is asked to trip.
	errVerdictFleet = errors.New("bulwark: the fleet's counts trip the breaker")
)

// The breaker window's counters.
const (
	winCalls = iota
	winFailures
	winSlow
	winOwn // failures that were this pod's own (fleet.go), shared with no one
	// winTimeout counts failures that were bulwark's own timeouts: the
	// others (the host's 5xx and 429, transport errors) trip a rate at
	// once even while it is held (judged). Shared with no one.
	winTimeout
)

// breakerLayer is one host's circuit breaker: gobreaker's state machine
// around the rest of the attempt, fed through its Settings by a window of
// bulwark's (gobreaker counts no slow calls), with two things gobreaker
// does not do, in front of it: a manual control, and an open time that
// grows on trips in a row. gobreaker's own open time is the shortest one
// possible; while a longer one runs, this layer refuses without asking it.
//
// The layer is one stack's link to the host's breaker: what it sends to
// and its per-attempt settings are fixed when the stack is built; how an
// attempt is judged is the call's (Policy.Classify). The
// state (window, state machine, control) is in the shared *breakerCore, so
// Transport.Update can build a new stack around the same breaker when only
// its thresholds move.
type breakerLayer struct {
	*breakerCore
	next     layer
	slow     time.Duration // the slow-call threshold, or its ceiling when learned
	learn    bool          // the threshold is learned from the host (e.learned)
	onChange func(host string, from, to CircuitState)
	shadow   bool
}

// breakerCore is a breaker's state, shared by the layers of successive
// stacks of one host (see Transport.Update).
type breakerCore struct {
	e     env
	cb    *gobreaker.CircuitBreaker[struct{}]
	randN func(int64) int64
	// shape is what the core was built from and cannot change: the
	// window's kind and size, and gobreaker's Settings.
	shape breakerShape
	// fleet is where the host's breaker shares its counts and trips; nil
	// without a Fleet, and for a route's breaker (fleet.go).
	fleet  fleetPublisher
	peers  peers.Table // the other pods' windows
	queued atomic.Bool // counts queued for publishing (countsChanged)
	// shadow is the newest layer's Breaker.Shadow: a shadow breaker's trip
	// is not published, or the pods that enforce would refuse on a
	// threshold only being watched (a canary in shadow mode).
	shadow atomic.Bool

	// control is a BreakerControl.
	control atomic.Uint32
	// holdUntil is, in unix nanoseconds, the end of the current open time,
	// and zero once it has passed: a timer set at the trip clears it, so a
	// refusal costs one atomic load, no clock reading and no call into
	// gobreaker.
	holdUntil atomic.Int64
	// openErr is the error every refusal returns, made each time the
	// breaker opens.
	openErr atomic.Pointer[BreakerOpenError]
	// heldErr is the refusal while ControlBreaker holds the breaker open
	// (or before it ever opened): the host, no probe time, made once so
	// that refusing still allocates nothing.
	heldErr *BreakerOpenError
	// wouldReject counts the refusals a breaker in shadow mode let through.
	wouldReject atomic.Uint64
	// refused and opened count refusals and trips since the state was made.
	refused, opened atomic.Uint64
	// probes rations and spaces the requests a trip lets through
	// (breakerprobe.go).
	probes breakerProbes
	// probeEnded is set when a spaced probe's success ends the open time,
	// so that the half-open change that follows is explained by it
	// (probeEndedWhy); a trip clears it.
	probeEnded atomic.Bool
	// adopted is the hold adopted from another pod's trip (adoptOpen),
	// which that pod's FleetBreakerClosed may end; zero when the hold is
	// not one.
	adoptMu sync.Mutex
	adopted adoptedHold
	// weigh is what another pod's verdict is weighed against (applyFleet).
	weigh fleetWeigh

	// Guarded by winMu; the hooks that write them run under gobreaker's
	// mutex too (lock order: gobreaker's, then winMu). The thresholds
	// (minCalls to maxOpen) may be changed by Update (retune).
	winMu   sync.Mutex
	win     breakerWindow
	byCount bool
	// last is win when it is a count window: record and judge, on every
	// call, use it directly rather than through the interface.
	last      *window.Recent
	minCalls  int64
	failRate  float64
	slowRate  float64
	consec    int64 // attempts failed in a row, while closed (BreakerCounts)
	unans     int64 // of those, the unanswered in a row (ConsecutiveFailures)
	unansAt   int64 // unix ns of the first of them
	unansErr  bool  // one of them was a transport error, not a timeout
	maxConsec int64 // ConsecutiveFailures; ≤ 0: off
	userTrip  func(BreakerCounts) bool
	cbState   gobreaker.State
	trips     int // trips in a row, reset when the breaker closes
	// published is the generation of the last trip shared with the fleet
	// (publishOpen), 0 once its close is (publishClosed) or none was.
	published uint64
	openFor   time.Duration
	maxOpen   time.Duration

	// settle: SlowCall is learned, and then a rate rule trips only once it
	// has held for the learned failingFor (see SlowCall); dueAt is since
	// when it has held (unix ns; 0: not due). Under winMu.
	settle bool
	dueAt  int64
	// holdMax caps the hold: the attempt timeout's ceiling (Timeout.Attempt,
	// attemptCeiling when the Timeout policy is off). Under winMu.
	holdMax time.Duration
	// tripping is judge's verdict on the last outcome, for readyToTrip.
	// Under winMu.
	tripping bool

	// State changes queue here under gobreaker's mutex and are reported by
	// whichever request finds them there after leaving it.
	pending atomic.Bool
	evMu    sync.Mutex
	events  []breakerEvent // at most maxBreakerEvents
	dropped int
	flushMu sync.Mutex // one reporter at a time, so hooks see changes in order

	// hist is the last state changes, for Snapshot (breakerHistory).
	hist breakerHistory
}

// breakerWindow is what a breaker's rates are over: the last WindowCalls
// calls exactly (lastCalls), or the calls of the last Window in ten
// buckets (window.Window), where pos is the time.
type breakerWindow interface {
	Add(pos int64, c window.Counts)
	Sum(pos int64) window.Counts
	Reset()
}

// lastCalls is a count window: the last calls, whatever pos says.
type lastCalls struct{ *window.Recent }

func (l lastCalls) Add(_ int64, c window.Counts) { l.Recent.Add(c) }
func (l lastCalls) Sum(int64) window.Counts      { return l.Recent.Sum() }

// breakerShape is what a breaker's state is built on: a change in any of
// these makes Update build a new breaker (an empty window, closed), since
// the old window's buckets or gobreaker's fixed Settings no longer fit.
// Every other Breaker field is a threshold that Update moves in place.
type breakerShape struct {
	window        time.Duration
	windowCalls   int
	halfOpenCalls int
	openFor       time.Duration // gobreaker's Timeout is made of it
}

func shapeOf(p Breaker) breakerShape {
	return breakerShape{window: p.Window, windowCalls: p.WindowCalls, halfOpenCalls: p.HalfOpenCalls, openFor: p.OpenFor}
}

// maxBreakerEvents bounds the queue of unreported state changes.
const maxBreakerEvents = 8

type breakerEvent struct {
	from, to              gobreaker.State
	at                    time.Time
	calls, failures, slow int64
}

func newBreaker(next layer, p Breaker, e env, randN func(int64) int64) *breakerLayer {
	c := &breakerCore{e: e, randN: randN, shape: shapeOf(p), heldErr: &BreakerOpenError{Host: e.host}}
	c.probes.calls = int32(max(p.HalfOpenCalls, 1))
	c.weigh.probes.calls = c.probes.calls
	c.retune(p)
	if p.Window > 0 {
		c.win, _ = window.New(int64(p.Window), breakerBuckets)
	} else {
		r, _ := window.NewRecent(p.WindowCalls)
		c.win, c.last, c.byCount = lastCalls{r}, r, true
	}
	c.cb = gobreaker.NewCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        e.host,
		MaxRequests: uint32(max(p.HalfOpenCalls, 1)),
		// This layer holds every open time (holdUntil), so gobreaker's
		// own is the least that serves: the shortest open time there can
		// be (see openTime) ÷ HalfOpenCalls, the soonest a spaced probe
		// can go, after which gobreaker must be ready to go half-open. It
		// is not zero, so a request that reaches gobreaker just after
		// another trips it is still refused; while the hold lasts
		// gobreaker is not asked (see state).
		Timeout:       max((p.OpenFor-p.OpenFor/5)/time.Duration(max(p.HalfOpenCalls, 1)), 1),
		ReadyToTrip:   c.readyToTrip,
		OnStateChange: c.noteStateChange,
		IsSuccessful:  c.isSuccessful,
		IsExcluded:    func(err error) bool { return err == errVerdictIgnored },
	})
	return c.link(next, p)
}

// link is a layer over next that shares c's state, with p's per-attempt
// settings.
func (c *breakerCore) link(next layer, p Breaker) *breakerLayer {
	c.shadow.Store(p.Shadow)
	return &breakerLayer{breakerCore: c, next: next, slow: p.SlowCall, learn: p.learn, onChange: p.OnStateChange, shadow: p.Shadow}
}

// keptFor is the breaker an Update's new stack puts over next under p,
// when b, the old stack's (nil: none), has p's shape (breakerShape): b's
// core, keeping its window, state, trips and manual control, with p's
// rates, MinCalls, MaxOpenFor, SlowCall, OnStateChange and Shadow set in
// place. Nil when b is not kept.
func (b *breakerLayer) keptFor(next layer, p Breaker) *breakerLayer {
	if b == nil || b.shape != shapeOf(p) {
		return nil
	}
	b.retune(p)
	return b.link(next, p)
}

// show hands Snapshot the breaker's state (shower).
func (b *breakerLayer) show(put func(any)) { put(b.snapshot()) }

// retune sets the thresholds p gives: the rates, MinCalls and the open
// times of later trips. The window keeps what it holds.
func (c *breakerCore) retune(p Breaker) {
	c.winMu.Lock()
	c.minCalls, c.failRate, c.slowRate = int64(p.MinCalls), p.FailureRate, p.SlowCallRate
	c.maxConsec, c.userTrip = int64(p.ConsecutiveFailures), p.ReadyToTrip
	c.openFor, c.maxOpen = p.OpenFor, p.MaxOpenFor
	c.settle, c.holdMax = p.learn, p.holdMax
	c.winMu.Unlock()
}

func (b *breakerLayer) roundTrip(req *http.Request, c call) (*http.Response, error) {
	switch BreakerControl(b.control.Load()) {
	case BreakerForceOpen:
		return b.refuse(req, c, true)
	case BreakerForceClosed:
		return b.next.roundTrip(req, c)
	}
	if b.holdUntil.Load() != 0 || b.fleetTrip() {
		if resp, err, ok := b.spacedProbe(req, c); ok {
			return resp, err
		}
		return b.refuse(req, c, false)
	}
	if !b.probes.take() {
		return b.refuse(req, c, false)
	}
	var (
		resp    *http.Response
		err     error
		ran     bool
		ignored bool
	)
	// Execute reports a panic in next as a failure before letting it go
	// on, so a half-open probe slot is never left taken.
	_, _ = b.cb.Execute(func() (struct{}, error) {
		ran = true
		sc := sendClocks.Get().(*sendClock)
		sc.at, c.sendAt = time.Time{}, sc
		start := time.Now()
		resp, err = b.next.roundTrip(req, c)
		if !sc.at.IsZero() {
			start = sc.at // sent past the bulkhead's queue, if it waited there
		}
		took := time.Since(start)
		sendClocks.Put(sc)
		v := b.weighOutcome(b.verdict(c.judge(resp, err), took), err)
		switch v {
		case nil:
			b.probes.answered()
		case errVerdictIgnored:
			ignored = true
		}
		return struct{}{}, v
	})
	if b.pending.Load() {
		b.flush()
	}
	if !ran {
		// Open, or half-open with every probe slot taken.
		b.probes.giveBack()
		return b.refuse(req, c, false)
	}
	if ignored {
		b.probes.giveBack()
	}
	return resp, err
}

// refuse is a request the breaker does not send; in shadow mode, it is
// counted and sent, uncounted by the window, as an enforcing breaker would
// not have seen it either. held is a refusal by ControlBreaker's
// BreakerForceOpen, which has no probe time: the last trip's does not
// apply to it.
func (b *breakerLayer) refuse(req *http.Request, c call, held bool) (*http.Response, error) {
	if b.shadow {
		b.wouldReject.Add(1)
		b.e.rep.shadowRejected(req.Context(), layerBreaker)
		return b.next.roundTrip(req, c)
	}
	b.refused.Add(1)
	b.e.rep.rejected(req.Context(), layerBreaker)
	closeBody(req)
	if e := b.openErr.Load(); e != nil && !held {
		return nil, e
	}
	return nil, b.heldErr
}

// verdict is what gobreaker is told of an attempt judged j that took took:
// one of the errVerdict sentinels, or nil for a fast success.
func (b *breakerLayer) verdict(j judged, took time.Duration) error {
	threshold := b.slow
	if b.learn {
		threshold, _ = b.e.learned.slowCall(b.slow)
	}
	slow := took >= threshold
	switch j.v.Outcome {
	case OutcomeIgnored:
		return errVerdictIgnored
	case OutcomeFailure:
		switch unanswered := j.k == kindTransient || j.k == kindPermanent; {
		case j.k == kindTimeout && slow:
			return errVerdictSlowTimeout
		case j.k == kindTimeout:
			return errVerdictTimeout
		case unanswered && slow:
			return errVerdictSlowUnanswered
		case unanswered:
			return errVerdictUnanswered
		case slow:
			return errVerdictSlowFailure
		}
		return errVerdictFailure
	}
	if slow {
		return errVerdictSlow
	}
	return nil
}

// isSuccessful is gobreaker's IsSuccessful hook, under its mutex, for each
// counted outcome of the current state. Closed, it records the outcome in
// the window and judges the breaker's rules on what the window now holds
// (judge): after every call, a success too, since a success can complete a
// rule (the hold's time run out while the rate is still met). gobreaker
// asks ReadyToTrip only on a failure, so an outcome whose judgement trips
// is reported to it as one; readyToTrip then returns what judge found. A
// slow success is a failure to gobreaker too: half-open, a slow probe
// reopens the breaker, since the host is evidently not well yet. Any other
// error is a panic below, which Execute reports as a failure.
func (b *breakerCore) isSuccessful(verdict error) bool {
	b.winMu.Lock()
	defer b.winMu.Unlock()
	verdict, own := b.splitOwn(verdict)
	if b.cbState != gobreaker.StateClosed {
		return verdict == nil
	}
	var clk breakerClock
	if verdict != errVerdictFleet {
		b.record(verdict, own, &clk)
	}
	b.tripping = b.judge(&clk, verdict != nil)
	return verdict == nil && !b.tripping
}

// breakerClock reads the clock once, and only for a rule that needs it, so
// that judging a healthy host's call in a count window reads no clock.
type breakerClock struct{ ns int64 }

func (c *breakerClock) now() int64 {
	if c.ns == 0 {
		c.ns = time.Now().UnixNano()
	}
	return c.ns
}

// record adds a closed breaker's counted outcome to the window and to the
// runs of failures; own marks a failure that was this pod's own (fleet.go).
// Under winMu.
func (b *breakerCore) record(verdict error, own bool, clk *breakerClock) {
	c := verdictCounts(verdict, own)
	// The run ConsecutiveFailures counts is of attempts the host never
	// answered: a host that answers, even with a 503, is alive, and
	// its failure rate is the rate rules' to judge (a Shedder refusing
	// the less important requests with 503s must not cut its callers
	// off from the critical ones).
	if c[winFailures] > 0 {
		b.consec++
	} else {
		b.consec = 0
	}
	switch transport := verdict == errVerdictUnanswered || verdict == errVerdictSlowUnanswered; {
	case transport || c[winTimeout] > 0:
		if b.unans == 0 {
			b.unansAt, b.unansErr = clk.now(), false
		}
		b.unans++
		b.unansErr = b.unansErr || transport
	default:
		b.unans = 0
	}
	if b.last != nil {
		b.last.Add(c)
	} else {
		b.win.Add(b.pos(), c)
	}
	if c[winFailures]+c[winSlow] > 0 {
		b.shareCounts()
	}
}

// verdictCounts is what one call judged verdict adds to the window; own
// marks a failure that was this pod's own.
func verdictCounts(verdict error, own bool) window.Counts {
	var c window.Counts
	c[winCalls] = 1
	if verdict != nil && verdict != errVerdictSlow {
		c[winFailures] = 1
	}
	if verdict == errVerdictSlow || verdict == errVerdictSlowFailure || verdict == errVerdictSlowUnanswered || verdict == errVerdictSlowTimeout {
		c[winSlow] = 1
	}
	if verdict == errVerdictTimeout || verdict == errVerdictSlowTimeout {
		c[winTimeout] = 1
	}
	if own {
		c[winOwn] = 1
	}
	return c
}

// pos is the window's position now: the time for a time window; a count
// window (lastCalls) holds the last calls whatever the time. Under winMu.
func (b *breakerCore) pos() int64 {
	if b.byCount {
		return 0
	}
	return time.Now().UnixNano()
}

// judge decides, after a counted outcome, whether a closed breaker trips,
// by the rules of the Breaker doc in their order: the rates (with the
// other pods' counts), held for the hold while SlowCall is learned; the
// unanswered attempts in a row; the user's ReadyToTrip. The other pods'
// counts are added only after an outcome of this pod's that was not a
// fast success (fleet: ownFailed): a pod whose own latest attempt
// succeeded is not tripped by the fleet, as it declines a trip (Fleet).
// Under winMu.
func (b *breakerCore) judge(clk *breakerClock, ownFailed bool) bool {
	var s window.Counts
	peers := ownFailed && b.peers.Any()
	switch {
	case b.last != nil && !peers:
		// The count window of a host no other pod reports on: the sums
		// read in place, as this runs after every call.
		t := b.last.Total()
		return b.judged(t[winCalls], t[winFailures], t[winSlow], t[winFailures]-t[winTimeout], clk)
	case b.last != nil:
		s = *b.last.Total()
	default:
		s = b.win.Sum(b.pos())
	}
	// Failures other than timeouts: this pod's own only, as the other pods
	// share no such count, so their failures all wait for the hold.
	answered := s[winFailures] - s[winTimeout]
	if peers {
		// The other pods' windows count as if they were this one's (fleet.go).
		s = b.peers.Add(s, time.Unix(0, clk.now()))
	}
	return b.judged(s[winCalls], s[winFailures], s[winSlow], answered, clk)
}

// judged is judge on the window's sums (the fleet's included); answered is
// the failures that were not bulwark's own timeouts (the host's 5xx and
// 429, transport errors). The hold, while SlowCall is learned, spares the
// slow calls and timeouts a queue makes as a host's capacity drops; a
// failure rate met without them trips at once. So does a run of
// unanswered attempts with a transport error in it.
func (b *breakerCore) judged(calls, failures, slow, answered int64, clk *breakerClock) bool {
	due := b.dueOf(calls, failures, slow)
	switch {
	case !due:
		b.dueAt = 0 // a later breach starts afresh
	case b.dueAt == 0:
		b.dueAt = clk.now()
	}
	switch {
	case due && (!b.settle || b.dueOf(calls, answered, 0) || clk.now()-b.dueAt >= int64(b.hold())):
		return true
	case b.maxConsec > 0 && b.unans >= b.maxConsec && (b.unansErr || clk.now()-b.unansAt >= int64(b.hold())):
		return true
	case b.userTrip != nil:
		return b.userTrip(BreakerCounts{Calls: calls, Failures: failures, Slow: slow, ConsecutiveFailures: b.consec})
	}
	return false
}

// hold is how long a rate must be met, while SlowCall is learned, and how
// long a run of unanswered attempts must last, before either trips: the
// host's learned third-attempt timeout, capped as that timeout is, at the
// attempt timeout's ceiling (holdMax); zero before anything is learned.
// Under winMu.
func (b *breakerCore) hold() time.Duration {
	return min(b.e.learned.failingFor(), b.holdMax)
}

// readyToTrip is gobreaker's ReadyToTrip hook, under its mutex, right after
// isSuccessful reported a failure: what judge found there decides, not
// gobreaker's counts.
func (b *breakerCore) readyToTrip(gobreaker.Counts) bool {
	b.winMu.Lock()
	defer b.winMu.Unlock()
	return b.tripping
}

// due is the rate rules on a window's sums: MinCalls calls or more, and
// the failure rate or the slow-call rate at its threshold. Under winMu.
func (b *breakerCore) due(s window.Counts) bool {
	return b.dueOf(s[winCalls], s[winFailures], s[winSlow])
}

// dueOf is due on the sums apart, which judge, on every call, passes
// without copying the window's Counts.
func (b *breakerCore) dueOf(calls, failures, slow int64) bool {
	if calls == 0 || calls < b.minCalls || failures == 0 && slow == 0 {
		return false // the rates are > 0 (validate)
	}
	// Divide rather than multiply the threshold: a quotient is correctly
	// rounded, so 7 of 25 is exactly the float 0.28 and trips at 0.28,
	// where 0.28*25 rounds to just above 7 and would not.
	n := float64(calls)
	return float64(failures)/n >= b.failRate || float64(slow)/n >= b.slowRate
}

// onStateChange is gobreaker's OnStateChange hook, under its mutex: it
// must not log or call user code, so it only records.
func (b *breakerCore) onStateChange(_ string, from, to gobreaker.State) {
	now := time.Now()
	b.winMu.Lock()
	s := b.win.Sum(b.pos())
	ev := breakerEvent{from: from, to: to, at: now, calls: s[winCalls], failures: s[winFailures], slow: s[winSlow]}
	b.cbState = to
	b.win.Reset()
	b.consec, b.unans, b.unansErr, b.dueAt, b.tripping = 0, 0, false, 0, false
	switch to {
	case gobreaker.StateOpen:
		b.peers.ResetExcept(answering) // kept: they make the next failures own
		b.trips++
		b.opened.Add(1)
		d := b.openTime(b.trips)
		until := now.Add(d).UnixNano()
		b.openErr.Store(&BreakerOpenError{Host: b.e.host, ProbeAt: now.Add(d)})
		b.holdUntil.Store(until)
		b.probes.trip(d, now)
		b.probeEnded.Store(false)
		// A later trip's hold is not this timer's to clear.
		time.AfterFunc(d, func() { b.holdUntil.CompareAndSwap(until, 0) })
		b.publishOpen(now.Add(d), b.trips, s)
	case gobreaker.StateClosed:
		b.publishClosed(now)
		b.trips = 0
		b.probes.closed()
	}
	b.winMu.Unlock()
	b.evMu.Lock()
	if len(b.events) < maxBreakerEvents {
		b.events = append(b.events, ev)
	} else {
		b.dropped++
	}
	b.evMu.Unlock()
	b.pending.Store(true)
}

// openTime is the open time of the n-th trip in a row: OpenFor doubled
// n-1 times, capped at MaxOpenFor, less up to a fifth at random.
func (b *breakerCore) openTime(n int) time.Duration {
	d := b.maxOpen
	if s := n - 1; s < 62 && b.openFor <= b.maxOpen>>s {
		d = b.openFor << s
	}
	cut := int64(d / 5)
	if cut <= 0 {
		return d
	}
	if b.randN != nil {
		return d - time.Duration(b.randN(cut+1))
	}
	return d - time.Duration(rand.Int64N(cut+1))
}

// flush reports the queued state changes, outside gobreaker's mutex: the
// log line, the metric and the user's hook. One goroutine reports at a
// time, in order; another that finds it busy leaves the queue to it.
func (b *breakerLayer) flush() {
	if !b.flushMu.TryLock() {
		return
	}
	defer b.flushMu.Unlock()
	for {
		b.evMu.Lock()
		evs, dropped := b.events, b.dropped
		b.events, b.dropped = nil, 0
		b.pending.Store(false)
		b.evMu.Unlock()
		if len(evs) == 0 && dropped == 0 {
			return
		}
		for _, ev := range evs {
			from, to := circuitState(ev.from), circuitState(ev.to)
			b.e.rep.breakerStateChanged(from.String(), to.String(),
				slog.Int64("calls", ev.calls), slog.Int64("failures", ev.failures), slog.Int64("slow", ev.slow), slog.Time("at", ev.at))
			if b.onChange != nil {
				b.onChange(b.e.host, from, to)
			}
		}
		if dropped > 0 {
			b.e.rep.logger.Info("bulwark: circuit breaker state changes not reported", "host", b.e.host, "dropped", dropped)
		}
	}
}

// BreakerSnapshot is a breaker's state, as Snapshot reports it.
type BreakerSnapshot struct {
	// State is what the breaker does now. A forced control shows here as
	// the state it forces.
	State CircuitState
	// Control is the manual override in force (BreakerAuto when none).
	Control BreakerControl
	// Calls, Failures and Slow are what the window holds now.
	Calls, Failures, Slow int64
	// MinCalls is the Breaker.MinCalls in force: the calls the window must
	// hold before its rates can trip the breaker.
	MinCalls int
	// FleetCalls, FleetFailures and FleetSlow are the other pods' windows
	// as they last published them, still fresh (Config.Fleet): the breaker
	// adds them to its own when deciding whether to trip.
	FleetCalls, FleetFailures, FleetSlow int64
	// OpenUntil is when an open breaker lets probes through; zero unless
	// open on its own.
	OpenUntil time.Time
	// Trips is how many times in a row it has opened: what its next open
	// time doubles from.
	Trips int
	// Shadow is whether the breaker is in shadow mode (Breaker.Shadow), and
	// WouldReject how many requests it would have refused and sent instead.
	Shadow      bool
	WouldReject uint64
	// Refused is how many requests it has refused, and TotalTrips how many
	// times it has opened (not only in a row), since the breaker was built
	// (see Transport.Update for what rebuilds it).
	Refused, TotalTrips uint64
	// Changes are its last state changes (at most 8), oldest first: a
	// trip, a probe's outcome, a trip adopted from the fleet, a manual
	// control set or released.
	Changes []BreakerChange
	// LastTrip is its last trip on its own counts, with the window as it
	// was then (the window empties when the breaker opens): kept when
	// Changes has moved past it; nil until it first trips.
	LastTrip *BreakerChange
}

// snapshot is the breaker's piece of Snapshot.
func (b *breakerLayer) snapshot() *BreakerSnapshot {
	s := b.state()
	s.Refused, s.TotalTrips = b.refused.Load(), b.opened.Load()
	s.Changes, s.LastTrip = b.hist.read()
	return &s
}

// state reads the breaker. Asking gobreaker may move an open breaker whose
// open time has passed to half-open, as the next request would.
func (b *breakerLayer) state() BreakerSnapshot {
	// While this layer holds the breaker open, gobreaker is not asked: its
	// own open time is shorter than the hold, and asking would move it to
	// half-open (and record the change) while every request is refused.
	held := b.holdUntil.Load() != 0
	var gs gobreaker.State
	if !held {
		gs = b.cb.State()
	}
	var s BreakerSnapshot
	b.winMu.Lock()
	if held {
		gs = b.cbState
	}
	w := b.win.Sum(b.pos())
	s.Calls, s.Failures, s.Slow, s.Trips = w[winCalls], w[winFailures], w[winSlow], b.trips
	s.MinCalls = int(b.minCalls)
	b.winMu.Unlock()
	f := b.peers.Add(window.Counts{}, time.Now())
	s.FleetCalls, s.FleetFailures, s.FleetSlow = f[winCalls], f[winFailures], f[winSlow]
	s.State = circuitState(gs)
	if h := b.holdUntil.Load(); h != 0 {
		s.State, s.OpenUntil = CircuitOpen, time.Unix(0, h)
	}
	s.Control = BreakerControl(b.control.Load())
	s.Shadow, s.WouldReject = b.shadow, b.wouldReject.Load()
	switch s.Control {
	case BreakerForceOpen:
		s.State = CircuitOpen
	case BreakerForceClosed:
		s.State = CircuitClosed
	}
	return s
}

// setControl sets the manual override.
func (b *breakerCore) setControl(c BreakerControl) {
	if old := BreakerControl(b.control.Swap(uint32(c))); old != c {
		b.noteControl(old, c)
	}
}

// breakerController is a layer that takes a manual breaker override.
type breakerController interface{ setControl(BreakerControl) }

// open reports whether the breaker refuses requests now (open, or forced
// open), so that the retry layer sends no hedge into it. One atomic load
// or two; a half-open breaker answers false and lets its probes decide,
// and so does one in shadow mode, which refuses nothing.
func (b *breakerLayer) open() bool {
	if b.shadow {
		return false
	}
	c := BreakerControl(b.control.Load())
	return c == BreakerForceOpen || (c != BreakerForceClosed && b.holdUntil.Load() != 0)
}

// The breaker in a fleet (see Fleet): it publishes its window's counts
// and its trips, adopts the other pods' trips, and adds their counts to
// its own. Only a host's own breaker has a fleet; a route's has none.

// applyFleet weighs another pod's trip, or keeps its counts (fleetMember).
func (b *breakerCore) applyFleet(u FleetUpdate, now time.Time) bool {
	switch u.Kind {
	case FleetBreakerOpen:
		return b.adoptOpen(u, now)
	case FleetBreakerClosed:
		return b.endAdopted(u, now)
	case FleetBreakerCounts:
		kept := b.peers.Set(u.From, breakerCounts(u), u.Until, now)
		switch {
		case u.Failures+u.Slow > 0:
			// Another pod fails: if this one is answered, it says so.
			b.answer(now)
		case answering(breakerCounts(u)):
			b.endContradicted(u.From, now)
		}
		return kept
	}
	return false
}

// fleetAnswerEvery spaces the counts a pod shares in answer to another
// pod's failures or trip (answer): the news that the host answers it.
const fleetAnswerEvery = time.Second

// fleetWeigh is what a host's breaker weighs another pod's trip against
// (see Fleet): its own latest outcomes, a trip it declined, the holds it
// adopted in a row, and the probes it sends through an adopted hold.
type fleetWeigh struct {
	// lastOK is when this pod's last attempt to the host that succeeded
	// ended (unix ns), okLast says no attempt has failed or been slow
	// since, and oks counts the attempts that succeeded.
	lastOK atomic.Int64
	okLast atomic.Bool
	oks    atomic.Uint64
	// answeredAt is when the counts were last shared in answer (unix ns).
	answeredAt atomic.Int64
	// probes spaces the probes through an adopted hold as a local trip
	// spaces its own (breakerprobe.go).
	probes breakerProbes
	// hasDeclined says declined holds a trip: one load on each failure.
	hasDeclined atomic.Bool
	// Under adoptMu: the latest trip declined (a failure of this pod's
	// own adopts it), the holds adopted in a row, and oks at the last.
	declined FleetUpdate
	run      int
	runOKs   uint64
	// ownLast says the last failure the window counted was this pod's
	// own (ownFailure). Under winMu.
	ownLast bool
}

// errVerdictOwnUnanswered is an unanswered attempt whose failure is this
// pod's own (ownFailure): the breaker counts it as errVerdictUnanswered,
// and the fleet is not told of it.
var errVerdictOwnUnanswered = errors.New("bulwark: unanswered call, the caller's own failure")

// weighOutcome notes an attempt's verdict v (err its error) as this pod's
// latest evidence of the host, adopts a trip it declined when v is a
// failure, and returns v, or errVerdictOwnUnanswered for a failure that is
// this pod's own. Without a Fleet it returns v and does nothing.
func (b *breakerCore) weighOutcome(v, err error) error {
	if b.fleet == nil {
		return v
	}
	now := time.Now()
	switch v {
	case nil:
		b.weigh.lastOK.Store(now.UnixNano())
		b.weigh.oks.Add(1)
		b.weigh.okLast.Store(true)
		return nil
	case errVerdictIgnored:
		return v
	}
	b.weigh.okLast.Store(false)
	if b.weigh.hasDeclined.Load() {
		b.adoptDeclined(now)
	}
	if (v == errVerdictUnanswered || v == errVerdictTimeout) && b.ownFailure(err, now) {
		return errVerdictOwnUnanswered
	}
	return v
}

// splitOwn is isSuccessful's view of a verdict: an own failure is an
// unanswered one, and own reports it was this pod's own. It notes whether
// the last failure was. Under winMu.
func (b *breakerCore) splitOwn(v error) (_ error, own bool) {
	if v == errVerdictOwnUnanswered {
		v, own = errVerdictUnanswered, true
	}
	if v != nil && v != errVerdictIgnored {
		b.weigh.ownLast = own
	}
	return v, own
}

// ownFailure reports an unanswered attempt that says more about this pod
// than about the host: a DNS failure (the name was never sent anywhere:
// this pod's resolver answered), or a failed dial (refused, unreachable,
// timed out before a connection) while another pod's latest counts show
// the host answering it: the path from here is what failed.
func (b *breakerCore) ownFailure(err error, now time.Time) bool {
	if _, ok := errors.AsType[*net.DNSError](err); ok {
		return true
	}
	if oe, ok := errors.AsType[*net.OpError](err); ok && oe.Op == "dial" {
		return b.peersAnswer("", now)
	}
	return false
}

// answering reports counts that show the host answering the pod that
// published them: calls, none failed or slow.
func answering(c window.Counts) bool {
	return c[winCalls] > 0 && c[winFailures] == 0 && c[winSlow] == 0
}

// peersAnswer reports that some other pod than except has fresh counts
// that show the host answering it.
func (b *breakerCore) peersAnswer(except string, now time.Time) bool {
	return b.peers.Match(except, now, answering)
}

// ownAnswers reports that this pod's latest attempt to the host succeeded,
// within fleetFresh of now.
func (b *breakerCore) ownAnswers(now time.Time) bool {
	return b.weigh.okLast.Load() && now.UnixNano()-b.weigh.lastOK.Load() <= int64(fleetFresh)
}

// answer shares this pod's counts when its own latest attempt succeeded,
// at most every fleetAnswerEvery: another pod fails or tripped, and the
// pods weighing that learn that the host answers this one.
func (b *breakerCore) answer(now time.Time) {
	if b.fleet == nil || b.shadow.Load() || !b.ownAnswers(now) {
		return
	}
	last := b.weigh.answeredAt.Load()
	if now.UnixNano()-last < int64(fleetAnswerEvery) || !b.weigh.answeredAt.CompareAndSwap(last, now.UnixNano()) {
		return
	}
	b.shareCounts()
}

// adoptOpen weighs another pod's trip u: when this pod's own latest
// attempt succeeded, or a third pod's counts show the host answering, the
// trip is contradicted, and it is declined (kept: a failure of this pod's
// own adopts it; adoptDeclined); otherwise it is adopted (adopt).
func (b *breakerCore) adoptOpen(u FleetUpdate, now time.Time) bool {
	if b.ownAnswers(now) || b.peersAnswer(u.From, now) {
		b.adoptMu.Lock()
		if u.Until.After(b.weigh.declined.Until) {
			b.weigh.declined = u
			b.weigh.hasDeclined.Store(true)
		}
		b.adoptMu.Unlock()
		if b.fleet != nil {
			b.fleet.declined()
		}
		b.answer(now)
		return false
	}
	return b.adopt(u, now)
}

// adoptDeclined adopts the trip declined last, if its time runs still:
// this pod's own attempt has just failed.
func (b *breakerCore) adoptDeclined(now time.Time) {
	b.adoptMu.Lock()
	u := b.weigh.declined
	b.weigh.declined = FleetUpdate{}
	b.weigh.hasDeclined.Store(false)
	b.adoptMu.Unlock()
	if u.Until.After(now) {
		b.adopt(u, now)
	}
}

// adopt holds the breaker open until u.Until and a grace, but never longer
// than this pod's own breaker would hold for as many trips in a row as it
// has adopted holds in a row (since its last success): OpenFor doubled for
// each, capped at MaxOpenFor. Through the hold it sends spaced probes, as
// a local trip does, and one that succeeds ends it (endAdoptedByProbe).
// The local state machine is left as it is, so when the hold ends the
// pod's own breaker decides again. A hold at least as long already in
// place stands: a refusal still costs one atomic load.
func (b *breakerCore) adopt(u FleetUpdate, now time.Time) bool {
	b.winMu.Lock()
	openFor, maxOpen := b.openFor, b.maxOpen // Update may retune them
	b.winMu.Unlock()
	b.adoptMu.Lock()
	run, oks := b.weigh.run, b.weigh.oks.Load()
	if oks != b.weigh.runOKs {
		run = 0 // a success since the last adopted hold: a new run
	}
	until := u.Until.Add(min(fleetProbeGrace, u.Until.Sub(now)/4))
	if cap := now.Add(openCeil(openFor, maxOpen, run+1)); until.After(cap) {
		until = cap
	}
	un := until.UnixNano()
	for {
		cur := b.holdUntil.Load()
		if cur >= un {
			b.adoptMu.Unlock()
			return false
		}
		// The error first, so that a refusal that sees the hold names its end.
		b.openErr.Store(&BreakerOpenError{Host: b.e.host, ProbeAt: until})
		if b.holdUntil.CompareAndSwap(cur, un) {
			break
		}
	}
	from := CircuitClosed
	if b.adopted.until != 0 || b.probes.gate.Load() {
		from = CircuitOpen
	}
	running := b.adopted.until != 0
	b.adopted = adoptedHold{until: un, from: u.From, gen: u.Generation}
	b.weigh.run, b.weigh.runOKs = run+1, oks
	if running {
		b.weigh.probes.extend(until.Sub(now), now) // the spacing runs on
	} else {
		b.weigh.probes.trip(until.Sub(now), now)
	}
	b.adoptMu.Unlock()
	time.AfterFunc(until.Sub(now), func() {
		b.holdUntil.CompareAndSwap(un, 0)
		b.adoptMu.Lock()
		if b.adopted.until == un {
			b.adopted = adoptedHold{}
			b.weigh.probes.closed()
		}
		b.adoptMu.Unlock()
	})
	// The counts that led to this verdict are spent; those showing the
	// host answering another pod did not lead to it, and keep this pod's
	// own failures its own (ownFailure).
	b.peers.ResetExcept(answering)
	b.e.rep.logger.Info("bulwark: circuit breaker open by the fleet", "host", b.e.host, "until", until)
	b.hist.add(BreakerChange{At: now, From: from, To: CircuitOpen, Reason: "another pod tripped"})
	return true
}

// openCeil is the longest open time of the n-th trip in a row: OpenFor
// doubled n-1 times, capped at maxOpen (openTime's, before its random cut).
func openCeil(openFor, maxOpen time.Duration, n int) time.Duration {
	if s := n - 1; s < 62 && openFor <= maxOpen>>s {
		return openFor << s
	}
	return maxOpen
}

// adoptedHold is a hold adopted from another pod: its end (unix ns, as
// holdUntil) and the verdict's source.
type adoptedHold struct {
	until int64
	from  string
	gen   uint64
}

// endAdopted ends the hold adopted from c's pod and generation when that
// pod's breaker closed (FleetBreakerClosed): its half-open round found the
// host answering, so the hold would only refuse calls the host can take.
// Any other hold stands: one adopted since from another pod (a later trip,
// a longer hold), one of this pod's own trip (its probes decide), and a
// forced control's. The pod's own breaker then decides, as at the end of
// the hold's time.
func (b *breakerCore) endAdopted(c FleetUpdate, now time.Time) bool {
	if BreakerControl(b.control.Load()) != BreakerAuto || b.probes.gate.Load() {
		return false
	}
	b.adoptMu.Lock()
	a := b.adopted
	if a.from != c.From || a.gen != c.Generation {
		b.adoptMu.Unlock()
		return false
	}
	b.adoptMu.Unlock()
	return b.endHold(a.until, now, "the pod that tripped closed again")
}

// endContradicted ends an adopted hold when another pod than the one it
// came from publishes counts that show the host answering it.
func (b *breakerCore) endContradicted(from string, now time.Time) bool {
	if BreakerControl(b.control.Load()) != BreakerAuto || b.probes.gate.Load() {
		return false
	}
	b.adoptMu.Lock()
	a := b.adopted
	b.adoptMu.Unlock()
	if a.from == from {
		return false
	}
	return b.endHold(a.until, now, "another pod's calls succeed")
}

// endAdoptedByProbe ends the adopted hold, which a spaced probe's success
// contradicted (one adopted while the probe was out too), and tells the
// other pods the host answers.
func (b *breakerCore) endAdoptedByProbe(now time.Time) {
	b.adoptMu.Lock()
	hold := b.adopted.until
	b.adoptMu.Unlock()
	if b.endHold(hold, now, "a spaced probe succeeded") {
		b.answer(now)
	}
}

// endHold ends the adopted hold that ends at until, for why, and reports
// whether it did. The swap fails when the hold is no longer that one (a
// local trip or a later hold replaced it, or its time ran out).
func (b *breakerCore) endHold(until int64, now time.Time, why string) bool {
	b.adoptMu.Lock()
	if until == 0 || b.adopted.until != until || !b.holdUntil.CompareAndSwap(until, 0) {
		b.adoptMu.Unlock()
		return false
	}
	from := b.adopted.from
	b.adopted = adoptedHold{}
	b.weigh.probes.closed()
	b.adoptMu.Unlock()
	b.e.rep.logger.Info("bulwark: circuit breaker hold by the fleet ended: "+why, "host", b.e.host, "pod", from)
	b.hist.add(BreakerChange{At: now, From: CircuitOpen, To: b.heldState(), Reason: why})
	return true
}

// publishOpen shares a local trip, and remembers it was shared so that its
// close is (publishClosed); s is the window behind the trip. A trip whose
// last failure was this pod's own (ownFailure) is shared only if the
// window without its own failures would have tripped too: the fleet is
// not told of what is wrong with this pod. Under gobreaker's mutex and
// winMu: the hand-off does not block.
func (b *breakerCore) publishOpen(until time.Time, trips int, s window.Counts) {
	if b.fleet == nil || b.shadow.Load() {
		return
	}
	if b.weigh.ownLast && !b.due(shared(s)) {
		return
	}
	b.published = uint64(trips)
	b.fleet.publish(FleetUpdate{Kind: FleetBreakerOpen, Host: b.e.host, Until: until, Generation: b.published})
}

// shared is a window's counts without this pod's own failures: what the
// fleet is told of.
func shared(s window.Counts) window.Counts {
	own := s[winOwn]
	s[winCalls], s[winFailures], s[winOwn] = s[winCalls]-own, s[winFailures]-own, 0
	return s
}

// publishClosed shares that the breaker closed after a trip it shared: the
// pods holding the host open by that trip resume (endAdopted) instead of
// waiting out an open time the host no longer needs. Under gobreaker's
// mutex and winMu.
func (b *breakerCore) publishClosed(now time.Time) {
	if b.fleet == nil || b.published == 0 {
		return
	}
	b.fleet.publish(FleetUpdate{Kind: FleetBreakerClosed, Host: b.e.host, Until: now.Add(fleetClosedFor), Generation: b.published})
	b.published = 0
}

// shareCounts queues the window's counts for the fleet. Under winMu, or
// none of the breaker's locks: the hand-off does not block.
func (b *breakerCore) shareCounts() {
	if b.fleet != nil {
		b.fleet.countsChanged(b)
	}
}

// counts is the update that publishes b's window as it is now, without
// this pod's own failures (countsSource).
func (b *breakerCore) counts() FleetUpdate {
	b.winMu.Lock()
	s := shared(b.win.Sum(b.pos()))
	b.winMu.Unlock()
	return FleetUpdate{Kind: FleetBreakerCounts, Host: b.e.host, Until: time.Now().Add(fleetCountsFor),
		Calls: s[winCalls], Failures: s[winFailures], Slow: s[winSlow]}
}

// countsQueued is the breaker's flag for fleetLink.countsChanged
// (countsSource).
func (b *breakerCore) countsQueued() *atomic.Bool { return &b.queued }

// breakerCounts is a FleetBreakerCounts update as a breaker window's counts.
func breakerCounts(u FleetUpdate) window.Counts {
	var c window.Counts
	c[winCalls], c[winFailures], c[winSlow] = u.Calls, u.Failures, u.Slow
	return c
}

// fleetTrip trips a closed breaker before a call when the other pods'
// counts, with its own, already meet the trip condition: without it, a
// pod whose peers' failures crossed the threshold would still send its
// next call and trip on that call's failure, one call more per pod. The
// call is then refused, as by any open breaker. A pod whose own latest
// attempt succeeded is not stopped (the counts are weighed as a trip is,
// see Fleet): its next failure lets them count. It costs one atomic load
// while no other pod has published counts for the host (a healthy host).
func (b *breakerLayer) fleetTrip() bool {
	if b.fleet == nil || !b.peers.Any() || b.ownAnswers(time.Now()) {
		return false
	}
	b.winMu.Lock()
	due := b.cbState == gobreaker.StateClosed && b.due(b.peers.Add(b.win.Sum(b.pos()), time.Now()))
	b.winMu.Unlock()
	if !due {
		return false
	}
	// A failure that is no call (isSuccessful does not count it) makes
	// gobreaker ask readyToTrip, which sees what was just seen.
	_, _ = b.cb.Execute(func() (struct{}, error) { return struct{}{}, errVerdictFleet })
	if b.pending.Load() {
		b.flush()
	}
	return b.holdUntil.Load() != 0
}

// The breaker's recent history, for Snapshot: its last state changes with
// why each happened, and the window as it was at its last trip. None of it
// is on the request path: it is written only when the state changes.

// BreakerChange is one state change of a host's breaker, as
// BreakerSnapshot reports it.
type BreakerChange struct {
	// At is when it changed, From and To its states before and after (a
	// manual control shows as the state it forces).
	At       time.Time
	From, To CircuitState
	// Reason is why, in a few words: the rule that tripped it ("failure
	// rate 60 % ≥ 50 %", "slow-call rate …", "the fleet's counts", "10
	// unanswered attempts in a row", "ReadyToTrip"), "open time over", "a
	// spaced probe succeeded" (one sent while open, which ended the open
	// time early, or an adopted hold), "a probe failed or was slow",
	// "every probe succeeded", "another pod tripped", "the pod that
	// tripped closed again" or "another pod's calls succeed" (the fleet's
	// hold ended), or the control set ("control force-open", "control
	// auto").
	Reason string
	// Calls, Failures and Slow are what the breaker's own window held just
	// before the change (a trip empties it); zero for a change that the
	// window had no part in (a control, the fleet's trip).
	Calls, Failures, Slow int64
}

// breakerHistory keeps a breaker's last maxBreakerEvents changes, in a
// ring, and its last trip apart. Its own lock: it is written under
// gobreaker's mutex (noteStateChange), and read by Snapshot.
type breakerHistory struct {
	mu       sync.Mutex
	ring     [maxBreakerEvents]BreakerChange
	n        int // changes recorded in all; ring[(n-1)%len] is the last
	lastTrip BreakerChange
	tripped  bool
}

func (h *breakerHistory) add(c BreakerChange) {
	h.mu.Lock()
	h.ring[h.n%len(h.ring)] = c
	h.n++
	if c.To == CircuitOpen && c.Calls > 0 {
		h.lastTrip, h.tripped = c, true
	}
	h.mu.Unlock()
}

// read returns the changes, oldest first, and the last trip (nil: none).
func (h *breakerHistory) read() ([]BreakerChange, *BreakerChange) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []BreakerChange
	for i := max(h.n-len(h.ring), 0); i < h.n; i++ {
		out = append(out, h.ring[i%len(h.ring)])
	}
	if !h.tripped {
		return out, nil
	}
	t := h.lastTrip
	return out, &t
}

// noteStateChange is gobreaker's OnStateChange hook: it reads why the
// state changes and what the window holds before onStateChange empties it,
// has onStateChange do its work, and records the change. Under
// gobreaker's mutex, as onStateChange.
func (b *breakerCore) noteStateChange(name string, from, to gobreaker.State) {
	c := BreakerChange{At: time.Now(), From: circuitState(from), To: circuitState(to)}
	b.winMu.Lock()
	s := b.win.Sum(b.pos())
	c.Calls, c.Failures, c.Slow = s[winCalls], s[winFailures], s[winSlow]
	c.Reason = b.whyLocked(from, to, s, c.At)
	b.winMu.Unlock()
	b.onStateChange(name, from, to)
	b.hist.add(c)
}

// whyLocked says why the breaker moves from from to to, its own window
// holding s. A trip is explained by the first of readyToTrip's rules that
// holds (due decides the rates, as there). Under winMu.
func (b *breakerCore) whyLocked(from, to gobreaker.State, s window.Counts, now time.Time) string {
	switch {
	case to == gobreaker.StateHalfOpen:
		return b.probeEndedWhy()
	case to == gobreaker.StateClosed:
		return "every probe succeeded"
	case from == gobreaker.StateHalfOpen:
		return "a probe failed or was slow"
	}
	n := float64(s[winCalls])
	switch {
	case b.due(s) && float64(s[winFailures])/n >= b.failRate:
		return fmt.Sprintf("failure rate %.0f %% ≥ %.0f %%", 100*float64(s[winFailures])/n, 100*b.failRate)
	case b.due(s):
		return fmt.Sprintf("slow-call rate %.0f %% ≥ %.0f %%", 100*float64(s[winSlow])/n, 100*b.slowRate)
	case b.due(b.peers.Add(s, now)):
		return "the fleet's counts"
	case b.maxConsec > 0 && b.unans >= b.maxConsec:
		return strconv.FormatInt(b.unans, 10) + " unanswered attempts in a row"
	case b.userTrip != nil:
		return "ReadyToTrip"
	}
	return "tripped"
}

// noteControl records a change of the manual control from old to c.
func (b *breakerCore) noteControl(old, c BreakerControl) {
	state := func(c BreakerControl) CircuitState {
		switch c {
		case BreakerForceOpen:
			return CircuitOpen
		case BreakerForceClosed:
			return CircuitClosed
		}
		return b.heldState()
	}
	b.hist.add(BreakerChange{At: time.Now(), From: state(old), To: state(c), Reason: "control " + c.String()})
}

// heldState is the breaker's state left to itself, read without asking
// gobreaker (which could move it): open while an open time holds, else
// the state gobreaker last reported.
func (b *breakerCore) heldState() CircuitState {
	if b.holdUntil.Load() != 0 {
		return CircuitOpen
	}
	b.winMu.Lock()
	defer b.winMu.Unlock()
	return circuitState(b.cbState)
}

// spacedProbe sends req as a spaced probe of an open breaker, when one is
// due (see breakerProbes): ok reports that it was sent, and then resp and
// err are its outcome. A success ends the open time at once; the
// half-open round that follows decides whether the breaker closes. A
// failure changes nothing: the open time runs on.
func (b *breakerLayer) spacedProbe(req *http.Request, c call) (resp *http.Response, err error, ok bool) {
	// The retry layer's reading of the clock, when it just took one: no
	// layer between waits, and a refusal, what an open breaker mostly
	// does, then reads no clock of its own.
	now := c.sent
	if now.IsZero() {
		now = time.Now()
	}
	hold := b.holdUntil.Load()
	// In shadow mode too, so that it behaves as an enforcing breaker would.
	if hold == 0 {
		return nil, nil, false
	}
	// A local trip's probes, or else an adopted hold's (fleet.go): the
	// latter while the local ones are spent (a half-open round under the
	// hold) too.
	local := b.probes.spaced(now.UnixNano())
	if !local && !b.weigh.probes.spaced(now.UnixNano()) {
		return nil, nil, false
	}
	resp, err = b.next.roundTrip(req, c)
	if b.weighOutcome(b.verdict(c.judge(resp, err), time.Since(now)), err) == nil {
		if local {
			b.probes.answered()
			b.endedByProbe(hold)
		} else {
			b.endAdoptedByProbe(now)
		}
	}
	return resp, err, true
}

// endedByProbe ends the open time hold, which a spaced probe's success
// cut short, and notes it for the breaker's history: on the page, an
// open breaker that moves to half-open early reads as the dependency
// answering a probe, not as an open time that ran out. A timer or a
// fleet's hold that replaced hold first wins, and nothing is noted.
func (b *breakerCore) endedByProbe(hold int64) {
	if b.holdUntil.CompareAndSwap(hold, 0) {
		b.probeEnded.Store(true)
	}
}

// probeEndedWhy is the reason of an open → half-open change: a spaced
// probe's success noted by endedByProbe since the trip, or the open time
// run out. It takes the note, so the next open period starts without one.
func (b *breakerCore) probeEndedWhy() string {
	if b.probeEnded.Swap(false) {
		return "a spaced probe succeeded"
	}
	return "open time over"
}

// breakerControls is the Transport's ControlBreaker, which it embeds: the
// host is checked and made canonical here, and apply (the Transport's)
// records the control and hands it to the host's breakers.
type breakerControls struct {
	apply func(name string, c BreakerControl)
}

// ControlBreaker sets a manual override on the breaker of host, given as
// "host:port" (case does not matter; the port is required): BreakerForceOpen
// refuses every request to it, BreakerForceClosed lets every request
// through uncounted, and BreakerAuto hands the decision back to the
// breaker. The override applies to the host over every scheme, now and to
// state created later (after an eviction too), until it is set back to
// BreakerAuto. It has no effect on a host whose policy disables the
// breaker. It sets the breakers of the host's routes (Config.Routes) too.
// An invalid host or control is an error.
func (t *breakerControls) ControlBreaker(host string, c BreakerControl) error {
	if c > BreakerForceClosed {
		return fmt.Errorf("bulwark: ControlBreaker(%q, %v): unknown control", host, c)
	}
	h, port, err := net.SplitHostPort(host)
	if err != nil || h == "" || port == "" {
		return fmt.Errorf("bulwark: ControlBreaker(%q): want \"host:port\"", host)
	}
	name := net.JoinHostPort(strings.ToLower(h), port)
	t.apply(name, c)
	return nil
}
