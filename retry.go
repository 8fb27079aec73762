package bulwark

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bulwark-http/bulwark/internal/latency"
	"github.com/bulwark-http/bulwark/internal/peers"
	"github.com/bulwark-http/bulwark/internal/window"
	"github.com/hashicorp/go-retryablehttp"
	"golang.org/x/time/rate"
)

// Package defaults for Retry.
const (
	DefaultMaxAttempts   = 3
	maxAttemptsLimit     = 10 // the most Retry.MaxAttempts may be
	DefaultRetryBase     = 100 * time.Millisecond
	DefaultRetryCap      = 10 * time.Second
	DefaultMaxRetryAfter = 30 * time.Second

	// The retry budget's defaults are Finagle's and Linkerd's: retries may
	// add 20 % to the requests of the last 10 s, and at least 10 retries a
	// second are allowed however light the traffic, unless gRPC's retry
	// throttle holds (see Budget).
	DefaultBudgetRatio        = 0.2
	DefaultBudgetWindow       = 10 * time.Second
	DefaultBudgetMinPerSecond = 10
)

// Jitter selects how a retry's wait is randomised, so that clients that
// failed together do not retry together. The formulas are those of AWS's
// "Exponential Backoff And Jitter", with n the number of the retry counted
// from 0 and exp = min(Cap, Base × 2ⁿ):
//
//	Full:          random(0, exp)
//	Equal:         exp/2 + random(0, exp/2)
//	Decorrelated:  min(Cap, random(Base, 3 × previous wait)), the first previous wait being Base
//	None:          exp
//
// A retry must leave the host's recent median latency (at least 10 ms) to
// answer in before the call's deadline. When the deadline leaves room for
// only part of the range, the wait is drawn from that part, which leaves
// the host's recent p99 latency and 5 ms for a late timer (Full:
// random(0, room)); a range wholly beyond the room (None's, Equal's above
// its half, Decorrelated's above Base) means no retry.
//
// The zero value inherits, then means Full.
type Jitter uint8

// The Jitter strategies.
const (
	JitterFull Jitter = iota + 1
	JitterEqual
	JitterDecorrelated
	JitterNone
)

// String returns the strategy's name: "Full", "Equal", "Decorrelated",
// "None", or "default" for the zero value.
func (j Jitter) String() string {
	switch j {
	case 0:
		return "default"
	case JitterFull:
		return "Full"
	case JitterEqual:
		return "Equal"
	case JitterDecorrelated:
		return "Decorrelated"
	case JitterNone:
		return "None"
	}
	return fmt.Sprintf("Jitter(%d)", uint8(j))
}

// Retry configures the retry layer, which sends a failed request again, and
// the pushback layer, which obeys a host's Retry-After for every request to
// it. After an attempt, the call is sent again only if all of these hold,
// checked in this order, and then after the wait of rule 5:
//  1. The outcome may change with another try: a transport error that is
//     not permanent, bulwark's own attempt timeout, or 408, 429, 500, 502,
//     503 or 504 (see DefaultClassify); CheckRetry, when set, decides.
//  2. The request is safe to send twice: an idempotent method or an
//     Idempotency-Key, and a body that can be replayed (see KeyPOST and
//     BufferBody).
//  3. Nobody said stop: not the caller, nor a layer below that refused on
//     purpose (an open breaker, a full bulkhead, a pushback pause), nor the
//     server (NoRetryHeader, Envoy's and gRPC's signals, an SDK's
//     x-should-retry: false), nor a retrying client above that marks the
//     request (see AttemptHeader): retries happen at one layer.
//  4. Fewer than MaxAttempts attempts were sent.
//  5. The wait, and the host's median latency after it, fit before the
//     call's deadline. The wait is a valid Retry-After (up to MaxRetryAfter),
//     else the backoff (see Jitter; at most 10 ms after a refused
//     connection), and at least the host's pushback pause.
//  6. The host's Budget has room: last, so a refused retry spends nothing.
//
// Otherwise the caller gets the last attempt's outcome as it came. See
// docs/design.md, "Retry".
type Retry struct {
	// MaxAttempts is the most times one call is sent, the first included:
	// 1 means never retry. It may not exceed 10 (New refuses a
	// larger value rather than clamping it, so a typo is seen). Zero
	// inherits from Default, then DefaultMaxAttempts.
	MaxAttempts int

	// Base and Cap shape the backoff: the wait before retry n (from 0) grows
	// as Base × 2ⁿ up to Cap, then Jitter randomises it. Cap may not be below
	// Base. Zero inherits from Default, then DefaultRetryBase, and for Cap
	// DefaultRetryCap (or Base, if that is larger). After a connection
	// the host refused the wait is at most 10 ms: nothing reached the host,
	// and a dead host should be judged in a few calls, not seconds.
	Base, Cap time.Duration

	// MaxRetryAfter caps the wait a 429 or 503 response's Retry-After asks
	// for, both the retry's own wait and the pause of the whole host. Zero
	// inherits from Default, then DefaultMaxRetryAfter.
	MaxRetryAfter time.Duration

	// Jitter randomises each wait; see Jitter. Zero inherits from Default,
	// then Full.
	Jitter Jitter

	// Budget caps retries per host relative to requests, so that retries
	// cannot multiply the load on a host that is failing.
	Budget Budget

	// KeyPOST makes POST requests without an Idempotency-Key (or
	// X-Idempotency-Key) retryable by sending them with an Idempotency-Key
	// of 26 random characters, the same on every attempt. Turn it on only
	// for upstreams that collapse requests with the same key, since a
	// server that ignores the key may act on a POST twice. Inherited from
	// Default OR-wise.
	KeyPOST bool

	// BufferBody lets a request whose body has no GetBody be retried by
	// reading up to this many bytes of it into memory before the first send
	// (at most 64 MiB). A longer body is sent once. Zero inherits from
	// Default, then means never buffer: such a body is sent once.
	BufferBody int64

	// CheckRetry, if not nil, replaces bulwark's judgement of whether an
	// outcome (a response or an error) is worth another try, so that
	// go-retryablehttp users can bring their policy, with the meaning
	// go-retryablehttp's Client.Do gives it: the bool decides whether to
	// retry, and a non-nil error is what the caller gets if the call ends
	// after that attempt, for whatever reason (the bool, MaxAttempts, the
	// deadline, the budget), in place of its response, which is drained
	// and closed; a call that goes on to another attempt forgets it. As
	// http.Client would, bulwark hands the policy a transport error
	// wrapped in a *url.Error (so that DefaultRetryPolicy sees certificate,
	// scheme and header errors as it expects). Where bulwark differs:
	// when the policy says retry but no attempt is left and it returned no
	// error, the caller gets the last response, as a plain client would
	// have returned it, where go-retryablehttp returns a "giving up"
	// error. bulwark's other checks still apply first and after it: a
	// request that is not safe to replay, the caller's cancellation, an
	// open breaker, a full bulkhead, a pushback pause, NoRetryHeader,
	// MaxAttempts, the deadline and the budget. Nil inherits from Default,
	// then bulwark's own rule (the Verdict of Policy.Classify).
	CheckRetry retryablehttp.CheckRetry

	// PrepareRetry, if not nil, is called before each retry is sent,
	// after its wait, with the request about to be sent: a copy of the
	// attempt's own (header, URL and trailer included; its body is the
	// one GetBody made), so it may change it (sign it again, refresh a
	// token) and the caller's request is never touched. An error it
	// returns ends the call: the caller gets a *RetryError wrapping it
	// (errors.Is and errors.As see it) and the attempt is not sent. It is
	// go-retryablehttp's PrepareRetry. Hedges, copies of the first attempt
	// sent beside it within its round, are not retries and do not call
	// it. Nil inherits from Default, then means the retry is sent as the
	// first attempt was.
	PrepareRetry func(req *http.Request) error

	// Backoff, if not nil, computes each wait instead of Base, Cap and
	// Jitter; it is called with Base, Cap, the retry's number from 0 and the
	// response (nil after an error). A valid Retry-After still takes
	// precedence, as does a pushback pause. Nil inherits from Default, then
	// bulwark's own backoff.
	Backoff retryablehttp.Backoff

	// OnRetry, if not nil, is called before each retry's wait, on the
	// caller's goroutine and outside any lock, with the request being
	// retried (the caller's: treat it as read-only; PrepareRetry is the
	// hook that may change a retry) and what the retry is about. Nil
	// inherits from Default, then means no hook.
	OnRetry func(req *http.Request, ev RetryEvent)

	// NoPushback turns off the pushback layer for this upstream: a Retry-After then
	// delays only the retry of the request that got it, not other requests
	// to the host. Inherited from Default OR-wise. Disabled does not turn
	// pushback off: a host that asks for quiet gets it even from callers
	// that do not retry.
	NoPushback bool

	// Disabled turns off retries for this upstream: every request is sent
	// once, whatever its outcome. With Hedge on, the hedges of a call's
	// first round still go out (and spend from Budget, which Disabled does
	// not turn off), but no round follows it. An upstream inherits
	// Disabled from Default unless it sets Enabled.
	Disabled bool

	// Enabled turns retries back on for an upstream whose Default set
	// Disabled. Setting both is an error.
	Enabled bool
}

// RetryEvent is what Retry.OnRetry is told of a retry about to be made.
type RetryEvent struct {
	Host     string // "host:port"
	Upstream string // the Upstreams key, or "default"
	// Attempt is the number of the attempt about to be sent: 2 for the
	// first retry.
	Attempt int
	// Wait is how long bulwark waits before sending it; FromRetryAfter
	// reports that the server set it: its Retry-After, or gRPC's
	// grpc-retry-pushback-ms.
	Wait           time.Duration
	FromRetryAfter bool
	// StatusCode is the failed attempt's status, zero after an error; Err
	// is its error, nil after a response.
	StatusCode int
	Err        error
}

// Budget is the per-host retry budget. A retry (or a hedge) that Retry's
// other rules allow is sent only if
//  1. gRPC's retry throttle (gRFC A6) holds more than 5 of its 10 tokens: a
//     call whose first attempt failed takes one, one that succeeded gives
//     back Ratio of one, and one whose outcome is ignored (a 4xx other
//     than 429, a 501) neither; and
//  2. counting it, the retries in the window stay within Ratio × the calls
//     in the window, or else the floor has a token for it: a token bucket
//     (golang.org/x/time/rate) of MinPerSecond a second with a burst of
//     ⌈MinPerSecond⌉, used while the window's retries stay within
//     MinPerSecond × Window. Retries the floor funds count against the
//     ratio too.
//
// The window is ten buckets of Window/10; a call counts when its first
// attempt ends, in the bucket of its start (or the newest, if that is
// later), and calls decided at the same instant are judged in an order of
// their own. So five failed calls in a row stop every retry and hedge
// until successes earn the tokens back, and a host that fails more than
// Ratio ÷ (1 + Ratio) of its calls (17 % at the default) for long is sent
// each call once.
//
// With Config.Fleet, the ratio and the floor bound the whole fleet's
// retries (MinPerSecond is then the fleet's floor); the throttle stays each
// pod's own, and a route's budget stays local.
// See docs/design.md, "Retry budget".
type Budget struct {
	// Ratio is the most retries per call over the window, in (0, 1]. Zero
	// inherits from Default, then DefaultBudgetRatio.
	Ratio float64

	// Window is how far back calls and retries are counted, at least 100 ms.
	// Zero inherits from Default, then DefaultBudgetWindow.
	Window time.Duration

	// MinPerSecond is the floor, in retries a second. Zero inherits from
	// Default, then DefaultBudgetMinPerSecond; a negative value means no
	// floor.
	MinPerSecond float64

	// Disabled turns the budget off: only MaxAttempts bounds retries. An
	// upstream inherits Disabled from Default unless it sets Enabled.
	Disabled bool

	// Enabled turns the budget back on for an upstream whose Default set
	// Disabled. Setting both is an error.
	Enabled bool
}

func (r Retry) inherit(parent Retry) Retry {
	r.MaxAttempts = cmp.Or(r.MaxAttempts, parent.MaxAttempts)
	r.Base = cmp.Or(r.Base, parent.Base)
	r.Cap = cmp.Or(r.Cap, parent.Cap)
	r.MaxRetryAfter = cmp.Or(r.MaxRetryAfter, parent.MaxRetryAfter)
	r.Jitter = cmp.Or(r.Jitter, parent.Jitter)
	r.BufferBody = cmp.Or(r.BufferBody, parent.BufferBody)
	if r.CheckRetry == nil {
		r.CheckRetry = parent.CheckRetry
	}
	if r.Backoff == nil {
		r.Backoff = parent.Backoff
	}
	if r.OnRetry == nil {
		r.OnRetry = parent.OnRetry
	}
	if r.PrepareRetry == nil {
		r.PrepareRetry = parent.PrepareRetry
	}
	r.KeyPOST = r.KeyPOST || parent.KeyPOST
	r.NoPushback = r.NoPushback || parent.NoPushback
	r.Disabled = inheritOff(r.Disabled, r.Enabled, parent.Disabled)
	r.Budget = r.Budget.inherit(parent.Budget)
	return r
}

func (b Budget) inherit(parent Budget) Budget {
	b.Ratio = cmp.Or(b.Ratio, parent.Ratio)
	b.Window = cmp.Or(b.Window, parent.Window)
	b.MinPerSecond = cmp.Or(b.MinPerSecond, parent.MinPerSecond)
	b.Disabled = inheritOff(b.Disabled, b.Enabled, parent.Disabled)
	return b
}

func (r Retry) withDefaults() Retry {
	r.MaxAttempts = cmp.Or(r.MaxAttempts, DefaultMaxAttempts)
	r.Base = cmp.Or(r.Base, DefaultRetryBase)
	r.Cap = cmp.Or(r.Cap, max(DefaultRetryCap, r.Base))
	r.MaxRetryAfter = cmp.Or(r.MaxRetryAfter, DefaultMaxRetryAfter)
	r.Jitter = cmp.Or(r.Jitter, JitterFull)
	if r.Budget.Ratio == 0 {
		r.Budget.Ratio = DefaultBudgetRatio
	}
	if r.Budget.Window == 0 {
		r.Budget.Window = DefaultBudgetWindow
	}
	if r.Budget.MinPerSecond == 0 {
		r.Budget.MinPerSecond = DefaultBudgetMinPerSecond
	}
	return r
}

func (r Retry) validate() error {
	switch {
	case r.MaxAttempts < 1:
		return fieldError("Retry.MaxAttempts", r.MaxAttempts, "must be ≥ 1")
	case r.MaxAttempts > maxAttemptsLimit:
		return fieldError("Retry.MaxAttempts", r.MaxAttempts, fmt.Sprintf("must be ≤ %d", maxAttemptsLimit))
	case r.Base < 0:
		return fieldError("Retry.Base", r.Base, "must be ≥ 0")
	case r.Cap < r.Base:
		return fieldError("Retry.Cap", r.Cap, "must be ≥ Retry.Base ("+r.Base.String()+")")
	case r.MaxRetryAfter < 0:
		return fieldError("Retry.MaxRetryAfter", r.MaxRetryAfter, "must be ≥ 0")
	case r.Jitter > JitterNone:
		return fieldError("Retry.Jitter", r.Jitter, "unknown jitter")
	case r.BufferBody < 0 || r.BufferBody > maxBufferBody:
		return fieldError("Retry.BufferBody", r.BufferBody, fmt.Sprintf("must be in [0, %d]", maxBufferBody))
	case !(r.Budget.Ratio > 0 && r.Budget.Ratio <= 1):
		return fieldError("Retry.Budget.Ratio", r.Budget.Ratio, "must be in (0, 1]")
	case r.Budget.Window < 100*time.Millisecond:
		return fieldError("Retry.Budget.Window", r.Budget.Window, "must be ≥ 100ms")
	case math.IsNaN(r.Budget.MinPerSecond) || math.IsInf(r.Budget.MinPerSecond, 0):
		return fieldError("Retry.Budget.MinPerSecond", r.Budget.MinPerSecond, "must be a finite number")
	case r.Budget.MinPerSecond > maxFloorPerSecond:
		return fieldError("Retry.Budget.MinPerSecond", r.Budget.MinPerSecond, fmt.Sprintf("must be ≤ %d", maxFloorPerSecond))
	}
	return nil
}

// maxFloorPerSecond bounds the budget's floor, so that its token bucket's
// burst stays a sane integer.
const maxFloorPerSecond = 1_000_000

// RetryError reports a call that failed after bulwark retried it, or that
// the retry budget kept from being retried. It wraps the last attempt's
// error (and ErrRetryBudget when Budget is set), so errors.Is and errors.As
// see through it. A call sent once and not stopped by the budget returns
// its error unwrapped.
type RetryError struct {
	Attempts int   // how many times the call was sent
	Budget   bool  // a retry was due but the budget was spent
	Err      error // the last attempt's error
}

func (e *RetryError) Error() string {
	if e.Budget {
		return fmt.Sprintf("bulwark: failed after %d attempts (retry budget spent): %v", e.Attempts, e.Err)
	}
	return fmt.Sprintf("bulwark: failed after %d attempts: %v", e.Attempts, e.Err)
}

// Unwrap returns the last attempt's error, and ErrRetryBudget if the budget
// stopped the retries.
func (e *RetryError) Unwrap() []error {
	if e.Budget {
		return []error{ErrRetryBudget, e.Err}
	}
	return []error{e.Err}
}

// retryLayer sends a call up to MaxAttempts times, waiting between
// attempts, when the request is safe to replay and the outcome is worth
// another try. It sits outside the pushback, breaker and bulkhead layers,
// so a waiting retry holds no permit and every attempt is seen by the
// breaker.
type retryLayer struct {
	next     layer
	e        env
	pause    pauser         // the host's pushback; nil when off
	ignored  *atomic.Uint64 // Retry-After values ignored, when pushback does not count them
	hostile  *atomic.Uint64 // malformed grpc-retry-pushback-ms values: always counted
	randN    func(int64) int64
	balanced bool // the host is balanced: each call gets a tried set
	max      int
	// noRetry is Retry.Disabled on a policy that hedges: the layer is
	// there for the hedges of the first round, and no round follows it.
	noRetry    bool
	base, cap  time.Duration
	maxRA      time.Duration
	jitter     Jitter
	keyPOST    bool
	bufferBody int64
	check      retryablehttp.CheckRetry
	backoff    retryablehttp.Backoff
	onRetry    func(*http.Request, RetryEvent)
	// prepareRetry is Retry.PrepareRetry: nil, none.
	prepareRetry func(*http.Request) error
	budget       *retryBudget // nil: no budget
	hedge        *hedger      // nil: no hedging
	// lat is the host's recent latency: the hedge delay's quantile, and
	// the median a retry or hedge must fit before the deadline.
	lat *latency.Tracker
}

func newRetry(next layer, p Retry, e env, pause pauser, ignored *atomic.Uint64, randN func(int64) int64, balanced bool) *retryLayer {
	r := &retryLayer{
		next: next, e: e, pause: pause, randN: randN, balanced: balanced,
		max: p.MaxAttempts, base: p.Base, cap: p.Cap, maxRA: p.MaxRetryAfter, jitter: p.Jitter,
		keyPOST: p.KeyPOST, bufferBody: p.BufferBody, check: p.CheckRetry, backoff: p.Backoff, onRetry: p.OnRetry,
		noRetry: p.Disabled, prepareRetry: p.PrepareRetry,
	}
	if pause == nil {
		// With pushback on, it parses Retry-After first and counts the bad
		// ones; without it, this layer does.
		r.ignored = ignored
	}
	r.hostile = ignored
	if !p.Budget.Disabled {
		r.budget = newRetryBudget(p.Budget)
	}
	r.lat = latency.New(defaultLatencyQuantile, latencyPeriod)
	return r
}

// verdict is the outcome of one retry decision.
type verdict uint8

const (
	giveUp verdict = iota
	retryAgain
	budgetSpent
)

func (r *retryLayer) roundTrip(req *http.Request, c call) (*http.Response, error) {
	ctx := req.Context()
	first, replayable, err := r.prepare(req, c)
	if err != nil {
		return nil, err
	}
	// The first attempt leaves at the call's start, unless its body was
	// just read into memory, which may have taken a while.
	firstSent := c.start
	if r.bufferBody > 0 && !bodyReplayable(req) {
		firstSent = time.Now()
	}
	if r.balanced {
		c.tried = new(triedSet)
	}
	cur := first
	prevWait := r.base // Decorrelated jitter's "previous sleep" before the first
	for attempt := 1; ; attempt++ {
		c.attempt = attempt
		c.sent = firstSent
		resp, n, k, err := r.round(cur, req, &c, replayable)
		attempt = n
		if attempt == 1 && refusedBelow(k) {
			// A first attempt refused on purpose is the call's outcome
			// as it stands (decide's step 3): the host saw nothing for
			// the budget to count, and nothing is left to decide. The
			// commonest call of an outage takes this path.
			return nil, err
		}
		// Judged once: the budget, decide and the record read the same
		// verdict, and a user's classifier is called once per attempt.
		j := judgeKind(c.classify, k, resp, err)
		if c.attempt == 1 && r.budget != nil && reached(j.k) {
			// The budget counts calls that reached the host: one refused
			// here by an open breaker or a pause is no request of its.
			r.budget.call(c.start, j.v.Outcome)
		}
		d := r.decide(req, c, replayable, attempt, j, resp, err, &prevWait)
		if d.v != retryAgain {
			return r.end(ctx, &c, attempt, d, j, resp, err)
		}
		next, gerr := replay(first)
		if gerr != nil {
			// Nothing to send: the caller gets this attempt's result.
			return r.finish(attempt, resp, err, false)
		}
		r.announce(ctx, req, attempt, d, resp, err)
		// Drained and closed before the wait, so the connection is back
		// in the pool while we sleep.
		discard(resp)
		if next, err = r.await(ctx, next, attempt, d.wait); err != nil {
			return nil, err
		}
		cur = next
	}
}

// round sends one round of the call: attempt number c.attempt, and in the
// first round the hedges beside it, if any; a later attempt's send time
// goes in c.sent. n is the number of the last attempt sent, k the
// outcome's kind.
func (r *retryLayer) round(cur, req *http.Request, c *call, replayable bool) (resp *http.Response, n int, k kind, err error) {
	if c.attempt == 1 && r.hedge != nil && replayable {
		resp, n, err = r.hedged(cur, req, *c)
		return resp, n, classify(resp, err), err
	}
	if c.attempt > 1 {
		c.sent = time.Now()
	}
	start := c.sent
	resp, err = r.next.roundTrip(cur, *c)
	k = classify(resp, err)
	r.record(k, start)
	return resp, c.attempt, k, err
}

// end ends the call after attempt number attempt, whose outcome was judged
// j, as d, a verdict other than retryAgain, says.
func (r *retryLayer) end(ctx context.Context, c *call, attempt int, d decision, j judged, resp *http.Response, err error) (*http.Response, error) {
	if d.v == giveUp && (attempt > 1 || d.late || c.above == aboveResend) && j.v.Outcome == OutcomeFailure {
		// Retried here and still failed, due for a retry the
		// deadline left no room for, or a client above's resend that
		// failed (that client retried, sdk.go): the layer above
		// should not try again (CallRecord).
		c.noteBelow(ctx, noteRetried)
	}
	if d.err != nil {
		// The call ends after an attempt the user's CheckRetry
		// returned an error for: that error is the call's, as in
		// go-retryablehttp, and the response goes.
		discard(resp)
		resp, err = nil, d.err
	}
	if d.v == budgetSpent {
		r.budget.refused.Add(1)
		r.e.rep.rejected(ctx, layerBudget)
		c.noteBelow(ctx, noteRefused)
		return r.finish(attempt, resp, err, true)
	}
	return r.finish(attempt, resp, err, false)
}

// announce reports the retry of attempt, due in d.wait: to the metrics and
// logs, and to Retry.OnRetry.
func (r *retryLayer) announce(ctx context.Context, req *http.Request, attempt int, d decision, resp *http.Response, err error) {
	r.e.rep.retryScheduled(ctx, attempt+1, d.wait, retryReason(resp, err), d.fromRA)
	if r.onRetry != nil {
		ev := RetryEvent{Host: r.e.host, Upstream: r.e.upstream, Attempt: attempt + 1, Wait: d.wait, FromRetryAfter: d.fromRA, Err: err}
		if resp != nil {
			ev.StatusCode = resp.StatusCode
		}
		r.onRetry(req, ev)
	}
}

// await waits d before the retry of attempt, then readies next, the
// request to send: with Retry.PrepareRetry's changes, when it is set. The
// error ends the call.
func (r *retryLayer) await(ctx context.Context, next *http.Request, attempt int, d time.Duration) (*http.Request, error) {
	if werr := wait(ctx, d); werr != nil {
		closeBody(next)
		return nil, &RetryError{Attempts: attempt, Err: doneError(ctx)}
	}
	if r.prepareRetry == nil {
		return next, nil
	}
	// After the wait, as go-retryablehttp calls it, so that what it signs
	// is fresh when sent; on a copy of the attempt's own, header and URL
	// included, so that the caller's request is never changed.
	next = next.Clone(ctx)
	if perr := r.prepareRetry(next); perr != nil {
		closeBody(next)
		return nil, &RetryError{Attempts: attempt, Err: fmt.Errorf("bulwark: Retry.PrepareRetry before attempt %d: %w", attempt+1, perr)}
	}
	return next, nil
}

// refusedBelow reports an outcome of kind k that a layer below chose on
// purpose: an open breaker, a full bulkhead, a host's pushback pause. It
// is the answer, not a failure to try again: retrying it would only spin.
func refusedBelow(k kind) bool {
	switch k {
	case kindBreakerOpen, kindBulkheadFull, kindPushback:
		return true
	}
	return false
}

// wait waits d or until ctx ends, returning ctx's error then.
func wait(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-tm.C:
		return nil
	}
}

// finish hands the caller the last attempt's outcome: a response untouched,
// or an error that says how many attempts were made.
func (r *retryLayer) finish(attempts int, resp *http.Response, err error, budget bool) (*http.Response, error) {
	if err == nil {
		return resp, nil
	}
	if attempts == 1 && !budget {
		return nil, err
	}
	return nil, &RetryError{Attempts: attempts, Budget: budget, Err: err}
}

// decision is what decide settled: the verdict, and for a retry its wait
// and whether the server's Retry-After set it; err is what the user's
// CheckRetry returned for the attempt, the call's error if it ends here.
type decision struct {
	v      verdict
	wait   time.Duration
	fromRA bool
	err    error
	// late is a retry that was due but did not fit before the deadline.
	late bool
}

// decide is the retry decision after attempt number attempt, whose
// outcome was judged j: a list of checks in a fixed order, the first that
// applies settling it.
func (r *retryLayer) decide(req *http.Request, c call, replayable bool, attempt int, j judged, resp *http.Response, err error, prevWait *time.Duration) decision {
	// Retries off: the layer is here for the first round's hedges, and
	// that round was the call.
	if r.noRetry {
		return decision{}
	}
	ctx := req.Context()
	// 0. A success that no other try would change is final (unless the
	// user's CheckRetry judges it).
	if j.v.Outcome == OutcomeSuccess && !j.v.Retryable && r.check == nil {
		return decision{}
	}
	// 1. A request that is not safe to send twice is never sent twice,
	// whatever happened to it: a lost response to a POST may hide a charge.
	if !replayable {
		return decision{}
	}
	// 2. The caller gave up (cancelled, or its own deadline passed).
	if ctx.Err() != nil {
		return decision{}
	}
	// 3. A layer below refused on purpose: an open breaker, a full bulkhead
	// or a host's pushback pause is the answer, not a failure to try again,
	// and retrying it would only spin.
	if refusedBelow(j.k) {
		return decision{}
	}
	// 4. The server said not to retry (see serverSaysStop).
	pushback, stop := r.serverSaysStop(resp)
	if stop {
		return decision{}
	}
	// 5. Only outcomes another try may change (see worthRetry).
	retry, cerr := r.worthRetry(ctx, req, j, resp, err)
	if !retry {
		return decision{err: cerr}
	}
	// 6. Attempts exhausted.
	if attempt >= r.max {
		return decision{err: cerr}
	}
	// 7. How long to wait (see retryWait).
	now := time.Now()
	dl, hasDL := c.deadline(req)
	d := r.retryWait(req, attempt, resp, err, pushback, prevWait, now, dl, hasDL)
	// 8. The deadline: a wait that would end past it, or leave less than
	// the host's median latency (at least minSendTime) to answer in, means
	// returning the last outcome now rather than sleeping into a timeout
	// and losing the response we have (see ownWait for the draw's room).
	if hasDL && now.Add(d.wait+r.sendTime()).After(dl) {
		return decision{err: cerr, late: true}
	}
	// 9. The budget, last, so that no token is spent on a retry another
	// check would refuse.
	if r.budget != nil && !r.budget.withdraw(now) {
		return decision{v: budgetSpent, err: cerr}
	}
	return d
}

// serverSaysStop reports whether the response says not to retry: the
// server is shedding load, or passing up a failure below, and wants only
// one layer of the stack to try again (NoRetryHeader, or Envoy's and
// gRPC's signals: see noRetry). pushback is a gRPC pushback's delay,
// which retryWait honours. A malformed pushback is counted.
func (r *retryLayer) serverSaysStop(resp *http.Response) (pushback time.Duration, stop bool) {
	if resp == nil {
		return 0, false
	}
	stop, wait, bad := noRetry(resp.Header)
	if bad && r.hostile != nil {
		r.hostile.Add(1)
	}
	if stop {
		return 0, true
	}
	return wait, false
}

// worthRetry reports whether another try may change the outcome: the
// user's CheckRetry says so, or else the Verdict of the policy's Classify.
// CheckRetry has go-retryablehttp's meaning: its bool decides, and its
// error cerr, if any, is what the call returns should it end after this
// attempt, whichever check of decide ends it. It is handed a transport
// error wrapped in a *url.Error, as http.Client would hand it, since that
// is how go-retryablehttp's policies recognise certificate, scheme and
// header errors.
func (r *retryLayer) worthRetry(ctx context.Context, req *http.Request, j judged, resp *http.Response, err error) (retry bool, cerr error) {
	if r.check != nil {
		return r.check(ctx, resp, clientError(req, err))
	}
	return j.v.Retryable, nil
}

// retryWait is a retry's wait at now: a valid Retry-After on 429 or 503
// replaces the backoff (the server knows when it will have room; guessing
// is worse), as a gRPC pushback does; and a pause of the whole host
// lengthens any wait.
func (r *retryLayer) retryWait(req *http.Request, attempt int, resp *http.Response, err error, pushback time.Duration, prevWait *time.Duration, now, dl time.Time, hasDL bool) decision {
	d := decision{v: retryAgain}
	if resp != nil {
		if ra, ok := retryAfter(resp, now, r.ignored); ok {
			d.wait, d.fromRA = min(ra, r.maxRA), true
		}
	}
	if pushback > 0 {
		// grpc-retry-pushback-ms: at least that long, within the cap a
		// Retry-After has.
		d.wait = max(d.wait, min(pushback, r.maxRA))
		d.fromRA = true
	}
	if !d.fromRA {
		d.wait = r.ownWait(attempt, resp, err, prevWait, now, dl, hasDL)
	}
	if r.pause != nil {
		if until := r.pause.pausedUntil(req); until.After(now) {
			d.wait = max(d.wait, until.Sub(now))
		}
	}
	return d
}

// ownWait is the backoff's wait before the retry of attempt, when the
// server named none. Its draw fits the room before the deadline where the
// jitter's range allows, so a retry decide finds late is one no wait the
// policy allows would fit: a Retry-After or a pause too long, or a room
// shorter than the least wait of the jitter (Equal's half, say).
func (r *retryLayer) ownWait(attempt int, resp *http.Response, err error, prevWait *time.Duration, now, dl time.Time, hasDL bool) time.Duration {
	// The jitter draws the wait among those that leave the host's
	// median to answer in before the deadline, when some of its range
	// does: a deadline handed down from a caller that learned its
	// host's latency (45 ms, say) leaves a fast host's caller room for
	// a retry that a draw from the whole range (up to Base, 100 ms)
	// would mostly skip as late, passing a transient failure up the
	// chain that no layer retries.
	room := time.Duration(math.MaxInt64)
	if hasDL && dl.Sub(now) >= r.sendTime() {
		// The draw leaves the host's p99 to answer in, not its
		// median: a retry slower than the median, common on a host
		// whose latency spreads (10 to 30 ms, say), would otherwise
		// be cut by the deadline after a wait that fitted the
		// median. A timer that fires a little late, as on a loaded
		// machine, must not leave the retry less than it needs
		// (ErrDeadlineTooShort refuses it below minSendTime): the
		// draw keeps a margin too, down to a wait of none.
		room = max(dl.Sub(now)-r.tailTime()-retryFitMargin, 0)
	}
	wait := r.backoffWait(attempt-1, resp, prevWait, room)
	if connRefused(err) {
		// A refused connection cost the host nothing: backing off
		// spares it no work and only makes a dead host slow to judge
		// (the breaker counts each refusal, ConsecutiveFailures in a
		// row open it). A little jitter still spreads a fleet's retries.
		wait = min(wait, refusedWait)
	}
	return wait
}

// clientError is err as http.Client returns a transport error: wrapped
// in a *url.Error naming the method and the (redacted) URL, unless it is
// one already. nil stays nil.
func clientError(req *http.Request, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := err.(*url.Error); ok {
		return err
	}
	op := req.Method
	if op == "" {
		op = http.MethodGet
	}
	// http.Client's own spelling: "Get", "Post".
	op = op[:1] + strings.ToLower(op[1:])
	return &url.Error{Op: op, URL: redactURL(req.URL), Err: err}
}

// rand returns a uniform number in [0, n), from randN when a test set it.
func (r *retryLayer) rand(n int64) int64 {
	if n <= 0 {
		return 0
	}
	if r.randN != nil {
		return r.randN(n)
	}
	return rand.Int64N(n)
}

// backoffWait is the wait before retry n (from 0) when the server named
// none. room is the longest wait that fits before the call's deadline: a
// jitter whose range reaches below it draws from the part of its range
// that fits (the jitter's distribution given that the retry is made), so
// that a tight deadline shortens the wait rather than skipping the retry;
// a range wholly above it (None's fixed wait, Equal's half, Decorrelated's
// Base) and the user's Backoff are drawn as ever, and decide finds them late.
func (r *retryLayer) backoffWait(n int, resp *http.Response, prevWait *time.Duration, room time.Duration) time.Duration {
	if r.backoff != nil {
		return max(r.backoff(r.base, r.cap, n, resp), 0)
	}
	exp := r.cap
	if n < 62 && r.base <= r.cap>>n {
		exp = r.base << n
	}
	// draw is uniform in [lo, hi], or in [lo, room] when room falls within.
	draw := func(lo, hi time.Duration) time.Duration {
		if room >= lo && room < hi {
			hi = room
		}
		return lo + time.Duration(r.rand(int64(hi-lo)+1))
	}
	switch r.jitter {
	case JitterNone:
		return exp
	case JitterEqual:
		half := exp / 2
		return draw(half, half+half)
	case JitterDecorrelated:
		hi := r.cap
		if p := max(*prevWait, r.base); p <= r.cap/3 {
			hi = 3 * p
		}
		d := min(r.cap, draw(r.base, hi))
		*prevWait = d
		return d
	default: // JitterFull
		return draw(0, max(exp, 0))
	}
}

// retryFitMargin is kept between a retry's wait, drawn to fit before the
// deadline, and the latest wait that would fit: a wait that ends on the
// edge leaves the retry no room for a timer that fires late. Measured on
// sockets with a loaded machine (two cores shared by several test runs),
// a draw with no margin left 1 to 5 retries in 100 under minSendTime when
// sent (ErrDeadlineTooShort).
const retryFitMargin = 5 * time.Millisecond

// refusedWait is the most a retry waits after a refused connection.
const refusedWait = 10 * time.Millisecond

// budgetBuckets is how many slices the budget window is counted in.
const budgetBuckets = 10

// The budget window's counters.
const (
	budgetCalls = iota
	budgetRetries
)

// retryBudget is a host's Budget: see its documentation for the algorithm.
// It is safe for concurrent use.
type retryBudget struct {
	policy   Budget // what it was built for: it is kept while this holds
	ratio    float64
	floorMax float64       // the most floor-funded retries a window may hold
	floor    *rate.Limiter // nil: no floor

	refused atomic.Uint64 // retries refused, across Updates

	mu  sync.Mutex
	win *window.Window // positions are unix nanoseconds
	// tokens is gRFC A6's retry throttle: a call whose first attempt
	// failed takes one, one that succeeded gives back ratio, up to
	// throttleTokens; no retry or hedge is funded while at most half are
	// left, the floor's included.
	tokens float64

	// With a Fleet, the host's budget (not a route's) is the fleet's:
	// the other pods' windows count with this one's.
	fleet     fleetPublisher
	host      string
	span      time.Duration // Window
	peers     peers.Table
	queued    atomic.Bool  // counts queued for publishing (countsChanged)
	published atomic.Int64 // when its counts were last queued, unix nanoseconds
}

func newRetryBudget(b Budget) *retryBudget {
	// Window ≥ 100 ms (validated), so New cannot fail.
	w, _ := window.New(int64(b.Window), budgetBuckets)
	rb := &retryBudget{policy: b, ratio: b.Ratio, win: w, span: b.Window, tokens: throttleTokens}
	if b.MinPerSecond > 0 {
		rb.floorMax = b.MinPerSecond * b.Window.Seconds()
		rb.floor = rate.NewLimiter(rate.Limit(b.MinPerSecond), max(1, int(math.Ceil(b.MinPerSecond))))
	}
	return rb
}

// call records a call (its first attempt) made at now, whose first
// attempt's outcome was o.
func (b *retryBudget) call(now time.Time, o Outcome) {
	b.mu.Lock()
	b.win.Add(now.UnixNano(), window.Counts{budgetCalls: 1})
	switch o {
	case OutcomeFailure:
		b.tokens = max(0, b.tokens-1)
	case OutcomeSuccess:
		b.tokens = min(throttleTokens, b.tokens+b.ratio)
	}
	b.mu.Unlock()
}

// throttleTokens is the retry throttle's size, gRFC A6's example
// maxTokens. It stops the retries a window's healthy past would fund into a
// sudden outage. See docs/design.md, "Retry budget".
const throttleTokens = 10

// throttled reports whether the retry throttle holds every retry and
// hedge back. Under b.mu.
func (b *retryBudget) throttled() bool { return b.tokens <= throttleTokens/2 }

// BudgetSnapshot is a retry budget's state, as Snapshot reports it.
type BudgetSnapshot struct {
	// Calls and Retries are what the window holds now.
	Calls, Retries int64
	// FleetCalls and FleetRetries are the other pods' windows as they
	// last published them, still fresh (Config.Fleet): the budget is the
	// fleet's, and spends from their sum.
	FleetCalls, FleetRetries int64
	// Remaining is how many retries the budget would allow now, the
	// fleet's counted: the room under the ratio or, if larger, the
	// floor's; none while the retry throttle holds.
	Remaining int64
	// Refused is how many retries it has refused since the budget was built
	// (see Transport.Update for what rebuilds it).
	Refused uint64
	// ThrottleTokens is this pod's retry throttle (see Budget), out of
	// 10; Throttled reports that it holds (5 or fewer): no retry or hedge
	// is sent until successes earn tokens back, whatever Remaining the
	// window would allow.
	ThrottleTokens float64
	Throttled      bool
}

func (b *retryBudget) state(now time.Time) BudgetSnapshot {
	b.mu.Lock()
	defer b.mu.Unlock()
	own := b.win.Sum(now.UnixNano())
	sum := b.peers.Add(own, now)
	calls, retries := sum[budgetCalls], sum[budgetRetries]
	room := int64(b.ratio*float64(calls)) - retries
	if b.floor != nil {
		room = max(room, min(int64(b.floor.TokensAt(now)), int64(b.floorMax)-retries))
	}
	if b.throttled() {
		room = 0
	}
	return BudgetSnapshot{Calls: own[budgetCalls], Retries: own[budgetRetries], Remaining: max(room, 0),
		FleetCalls: calls - own[budgetCalls], FleetRetries: retries - own[budgetRetries],
		ThrottleTokens: b.tokens, Throttled: b.throttled()}
}

// withdraw takes one retry from the budget, reporting whether there was room.
func (b *retryBudget) withdraw(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	pos := now.UnixNano()
	sum := b.peers.Add(b.win.Sum(pos), now)
	r := float64(sum[budgetRetries] + 1)
	ok := !b.throttled() && (r <= b.ratio*float64(sum[budgetCalls]) ||
		b.floor != nil && r <= b.floorMax && b.floor.AllowN(now, 1))
	if ok {
		b.win.Add(pos, window.Counts{budgetRetries: 1})
	}
	b.shareCounts(now) // a retry spent or refused: the fleet should know
	return ok
}

// snapshot is the retry layer's pieces of Snapshot: its budget's and its
// hedger's, each nil when it has none.
func (r *retryLayer) snapshot() (budget *BudgetSnapshot, hedge *HedgeSnapshot) {
	if r.budget != nil {
		s := r.budget.state(time.Now())
		s.Refused = r.budget.refused.Load()
		budget = &s
	}
	if r.hedge != nil {
		hedge = r.hedge.snapshot(r.lat)
	}
	return budget, hedge
}

// The retry budget in a fleet (see Fleet): a host's budget (not a
// route's) spends from the sum of every pod's window.

// fleetBudgetAnswer is how often, at most, a pod that calls a host but
// does not retry publishes its budget counts while other pods' arrive: so
// that its calls, which give the fleet's ratio its room, count too,
// without a healthy host costing a publish per call.
const fleetBudgetAnswer = time.Second

// applyFleet keeps another pod's budget counts (fleetMember).
func (r *retryLayer) applyFleet(u FleetUpdate, now time.Time) bool {
	return u.Kind == FleetBudgetCounts && r.budget != nil && r.budget.fleet != nil && r.budget.adoptCounts(u, now)
}

// shareCounts queues the budget's counts for the fleet. Under b.mu: the
// hand-off does not block.
func (b *retryBudget) shareCounts(now time.Time) {
	if b.fleet == nil {
		return
	}
	b.published.Store(now.UnixNano())
	b.fleet.countsChanged(b)
}

// countsQueued is the budget's flag for fleetLink.countsChanged
// (countsSource).
func (b *retryBudget) countsQueued() *atomic.Bool { return &b.queued }

// counts is the update that publishes the budget's window as it is now
// (countsSource).
func (b *retryBudget) counts() FleetUpdate {
	now := time.Now()
	b.mu.Lock()
	s := b.win.Sum(now.UnixNano())
	b.mu.Unlock()
	return FleetUpdate{Kind: FleetBudgetCounts, Host: b.host, Until: now.Add(min(fleetCountsFor, b.span)),
		Calls: s[budgetCalls], Retries: s[budgetRetries]}
}

// adoptCounts keeps another pod's budget window, valid at most for this
// budget's window, and answers with this pod's own calls, at most every
// fleetBudgetAnswer, if it has any.
func (b *retryBudget) adoptCounts(u FleetUpdate, now time.Time) bool {
	var c window.Counts
	c[budgetCalls], c[budgetRetries] = u.Calls, u.Retries
	until := u.Until // at most fleetCountsFor from now (FleetSink.Apply)
	if cap := now.Add(b.span); until.After(cap) {
		until = cap
	}
	ok := b.peers.Set(u.From, c, until, now)
	if now.UnixNano()-b.published.Load() >= int64(fleetBudgetAnswer) {
		b.mu.Lock()
		own := b.win.Sum(now.UnixNano())
		if own[budgetCalls] > 0 {
			b.shareCounts(now)
		}
		b.mu.Unlock()
	}
	return ok
}

// pauser is what the retry layer asks of the pushback layer: until when
// the host asked callers of req's priority to stay away (zero: no pause).
type pauser interface {
	pausedUntil(req *http.Request) time.Time
}

// keepFrom takes the budget of prev, the old stack's retry layer (nil:
// none), when it was built for the same Retry.Budget.
func (r *retryLayer) keepFrom(prev *retryLayer) {
	if prev != nil && prev.budget != nil && r.budget != nil && reflect.DeepEqual(prev.budget.policy, r.budget.policy) {
		r.budget = prev.budget
	}
}

// show hands Snapshot the budget, the hedges and the recent latency
// (shower).
func (r *retryLayer) show(put func(any)) {
	budget, hedge := r.snapshot()
	put(budget)
	put(hedge)
	put(r.latency(time.Now()))
}
