package bulwark

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-retryablehttp"
	"golang.org/x/time/rate"
)

// NoRetryHeader is the response header by which a server says "do not retry
// this": a load-shedding server sets it on the 503s it answers when
// overloaded, so that only one layer of a deep stack retries instead of
// every layer multiplying the load. Any value counts. bulwark's retry layer
// never retries a response that carries it.
const NoRetryHeader = "Bulwark-No-Retry"

// Package defaults for Retry.
const (
	DefaultMaxAttempts   = 3
	MaxAttemptsLimit     = 10 // the most Retry.MaxAttempts may be
	DefaultRetryBase     = 100 * time.Millisecond
	DefaultRetryCap      = 10 * time.Second
	DefaultMaxRetryAfter = 30 * time.Second

	// The retry budget's defaults are Finagle's and Linkerd's: retries may
	// add 20 % to the requests of the last 10 s, and at least 10 retries a
	// second are allowed however light the traffic.
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
// The zero value inherits, then means Full.
type Jitter uint8

// The Jitter strategies.
const (
	Full Jitter = iota + 1
	Equal
	Decorrelated
	None
)

func (j Jitter) String() string {
	switch j {
	case 0:
		return "default"
	case Full:
		return "Full"
	case Equal:
		return "Equal"
	case Decorrelated:
		return "Decorrelated"
	case None:
		return "None"
	}
	return fmt.Sprintf("Jitter(%d)", uint8(j))
}

// Retry configures layer 4, which sends a failed request again, and layer 5,
// pushback, which obeys a host's Retry-After for every request to it.
//
// A request is sent again only if it is safe to send twice (an idempotent
// method or an Idempotency-Key, and a body that can be replayed: see
// KeyPOST and BufferBody), its outcome is worth another try (a transport
// error that is not permanent, 429, 502, 503, 504, or bulwark's own attempt
// timeout), attempts are left, the wait fits before the call's deadline, and
// the host's retry budget has room.
type Retry struct {
	// MaxAttempts is the most times one call is sent, the first included:
	// 1 means never retry. It may not exceed MaxAttemptsLimit (New refuses a
	// larger value rather than clamping it, so a typo is seen). Zero
	// inherits from Default, then DefaultMaxAttempts.
	MaxAttempts int

	// Base and Cap shape the backoff: the wait before retry n (from 0) grows
	// as Base × 2ⁿ up to Cap, then Jitter randomises it. Cap may not be below
	// Base. Zero inherits from Default, then DefaultRetryBase, and for Cap
	// DefaultRetryCap (or Base, if that is larger).
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
	// (at most MaxBufferBody). A longer body is sent once. Zero inherits from
	// Default, then means never buffer: such a body is sent once.
	BufferBody int64

	// CheckRetry, if not nil, replaces bulwark's judgement of whether an
	// outcome (a response or an error) is worth another try, so that
	// go-retryablehttp users can bring their policy. Only its bool is used:
	// the caller always gets the last attempt's response or error. bulwark's
	// other checks still apply first and after it: a request that is not
	// safe to replay, the caller's cancellation, an open breaker, a full
	// bulkhead, a pushback pause, NoRetryHeader, MaxAttempts, the deadline
	// and the budget. Nil inherits from Default, then bulwark's own rule.
	CheckRetry retryablehttp.CheckRetry

	// Backoff, if not nil, computes each wait instead of Base, Cap and
	// Jitter; it is called with Base, Cap, the retry's number from 0 and the
	// response (nil after an error). A valid Retry-After still takes
	// precedence, as does a pushback pause. Nil inherits from Default, then
	// bulwark's own backoff.
	Backoff retryablehttp.Backoff

	// NoPushback turns off layer 5 for this upstream: a Retry-After then
	// delays only the retry of the request that got it, not other requests
	// to the host. Inherited from Default OR-wise. Disabled does not turn
	// pushback off: a host that asks for quiet gets it even from callers
	// that do not retry.
	NoPushback bool

	// Disabled turns off retries (layer 4) for this upstream: every request
	// is sent once. An upstream inherits Disabled from Default; it cannot
	// turn back on what Default disabled.
	Disabled bool
}

// Budget is the per-host retry budget: over a sliding Window, retries may
// not exceed Ratio × the calls made, except that MinPerSecond retries a
// second are always allowed (a floor for hosts with too little traffic for
// the ratio to mean anything).
//
// The algorithm: calls and retries are counted in ten buckets of Window/10
// each, so the window slides in tenths. A retry is allowed if, counting it,
// retries in the window stay within Ratio × calls in the window. Otherwise
// it may come from the floor: a token bucket (golang.org/x/time/rate) of
// MinPerSecond a second with a burst of one second's worth, used only while
// retries in the window stay within MinPerSecond × Window. Retries funded
// by the floor count against the ratio too, so the floor is a minimum, not
// an addition: under a sustained outage with heavy traffic, retries
// approach Ratio × calls and no more.
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

	// Disabled turns the budget off: only MaxAttempts bounds retries.
	// Inherited from Default OR-wise.
	Disabled bool
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
	r.KeyPOST = r.KeyPOST || parent.KeyPOST
	r.NoPushback = r.NoPushback || parent.NoPushback
	r.Disabled = r.Disabled || parent.Disabled
	r.Budget = r.Budget.inherit(parent.Budget)
	return r
}

func (b Budget) inherit(parent Budget) Budget {
	b.Ratio = cmp.Or(b.Ratio, parent.Ratio)
	b.Window = cmp.Or(b.Window, parent.Window)
	b.MinPerSecond = cmp.Or(b.MinPerSecond, parent.MinPerSecond)
	b.Disabled = b.Disabled || parent.Disabled
	return b
}

func (r Retry) withDefaults() Retry {
	r.MaxAttempts = cmp.Or(r.MaxAttempts, DefaultMaxAttempts)
	r.Base = cmp.Or(r.Base, DefaultRetryBase)
	r.Cap = cmp.Or(r.Cap, max(DefaultRetryCap, r.Base))
	r.MaxRetryAfter = cmp.Or(r.MaxRetryAfter, DefaultMaxRetryAfter)
	r.Jitter = cmp.Or(r.Jitter, Full)
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
	case r.MaxAttempts > MaxAttemptsLimit:
		return fieldError("Retry.MaxAttempts", r.MaxAttempts, fmt.Sprintf("must be ≤ %d", MaxAttemptsLimit))
	case r.Base < 0:
		return fieldError("Retry.Base", r.Base, "must be ≥ 0")
	case r.Cap < r.Base:
		return fieldError("Retry.Cap", r.Cap, "must be ≥ Retry.Base ("+r.Base.String()+")")
	case r.MaxRetryAfter < 0:
		return fieldError("Retry.MaxRetryAfter", r.MaxRetryAfter, "must be ≥ 0")
	case r.Jitter > None:
		return fieldError("Retry.Jitter", r.Jitter, "unknown jitter")
	case r.BufferBody < 0 || r.BufferBody > MaxBufferBody:
		return fieldError("Retry.BufferBody", r.BufferBody, fmt.Sprintf("must be in [0, %d]", MaxBufferBody))
	case !(r.Budget.Ratio > 0 && r.Budget.Ratio <= 1):
		return fieldError("Retry.Budget.Ratio", r.Budget.Ratio, "must be in (0, 1]")
	case r.Budget.Window < 100*time.Millisecond:
		return fieldError("Retry.Budget.Window", r.Budget.Window, "must be ≥ 100ms")
	case math.IsNaN(r.Budget.MinPerSecond) || math.IsInf(r.Budget.MinPerSecond, 0):
		return fieldError("Retry.Budget.MinPerSecond", r.Budget.MinPerSecond, "must be a finite number")
	}
	return nil
}

// retryShared is the retry layers' state that belongs to the Transport
// rather than to one host.
type retryShared struct {
	// randN returns a uniform number in [0, n) for n > 0; nil means
	// math/rand/v2. Tests replace it.
	randN func(n int64) int64
	// sleep waits d or until ctx ends, returning ctx's error then; nil
	// means a real timer (which testing/synctest fakes). Tests with an
	// injected clock replace it.
	sleep func(ctx context.Context, d time.Duration) error

	ignoredRetryAfter atomic.Uint64
}

func (s *retryShared) rand(n int64) int64 {
	if n <= 0 {
		return 0
	}
	if s.randN != nil {
		return s.randN(n)
	}
	return rand.Int64N(n)
}

func (s *retryShared) wait(ctx context.Context, d time.Duration) error {
	if s.sleep != nil {
		return s.sleep(ctx, d)
	}
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

// retryRT is layer 4, per host: it sends a call up to MaxAttempts times,
// waiting between attempts, when the request is safe to replay and the
// outcome is worth another try. It sits outside the pushback, breaker and
// bulkhead layers, so a waiting retry holds no permit and every attempt is
// seen by the breaker.
type retryRT struct {
	next       http.RoundTripper
	t          *Transport
	hs         *hostState
	max        int
	base, cap  time.Duration
	maxRA      time.Duration
	jitter     Jitter
	keyPOST    bool
	bufferBody int64
	check      retryablehttp.CheckRetry
	backoff    retryablehttp.Backoff
	budget     *retryBudget // nil: no budget
}

func newRetryRT(next http.RoundTripper, hs *hostState) *retryRT {
	p := hs.policy.Retry
	r := &retryRT{
		next: next, t: hs.t, hs: hs, max: p.MaxAttempts, base: p.Base, cap: p.Cap,
		maxRA: p.MaxRetryAfter, jitter: p.Jitter, keyPOST: p.KeyPOST, bufferBody: p.BufferBody,
		check: p.CheckRetry, backoff: p.Backoff,
	}
	if !p.Budget.Disabled {
		r.budget = newRetryBudget(p.Budget)
		hs.budget = r.budget
	}
	return r
}

// verdict is the outcome of one retry decision.
type verdict uint8

const (
	giveUp verdict = iota
	retryAgain
	budgetSpent
)

func (r *retryRT) RoundTrip(req *http.Request) (*http.Response, error) {
	return r.roundTripCall(req, nil)
}

func (r *retryRT) roundTripCall(req *http.Request, st *callState) (*http.Response, error) {
	if st == nil {
		// Used on its own: the state is in the context, or made here.
		req, st = withCall(req, r.t)
	}
	ctx := req.Context()
	first, replayable, err := r.prepare(req)
	if err != nil {
		return nil, err
	}
	if r.budget != nil {
		r.budget.call(r.callStart(st))
	}
	cur := first
	prevWait := r.base // Decorrelated jitter's "previous sleep" before the first
	for attempt := 1; ; attempt++ {
		st.attempt = attempt
		resp, err := sendCall(r.next, cur, st)
		var fromRA bool
		v, wait := r.decide(ctx, st, replayable, attempt, resp, err, &prevWait, &fromRA)
		if v == budgetSpent {
			r.hs.rejected(ctx, layerBudget)
		}
		if v != retryAgain {
			return r.finish(attempt, resp, err, v == budgetSpent)
		}
		next, gerr := replay(first)
		if gerr != nil {
			// Nothing to send: the caller gets this attempt's result.
			return r.finish(attempt, resp, err, false)
		}
		// The event, the metrics and the Debug log line of the retry.
		r.hs.retryScheduled(ctx, attempt+1, wait, retryReason(resp, err), fromRA)
		// Drained and closed before the wait, so the connection is back
		// in the pool while we sleep.
		discard(resp)
		werr := r.t.retry.wait(ctx, wait)
		st.staleClock()
		if werr != nil {
			closeBody(next)
			return nil, &RetryError{Attempts: attempt, Err: doneError(ctx)}
		}
		cur = next
	}
}

// callStart is when the call began, in unix nanoseconds: before the first
// attempt, the shared reading is still the router's, so that the success
// path reads no clock of its own (on some virtual machines a clock read
// costs more than the rest of this layer).
func (r *retryRT) callStart(st *callState) int64 {
	return st.clock(r.t).UnixNano()
}

// finish hands the caller the last attempt's outcome: a response untouched,
// or an error that says how many attempts were made.
func (r *retryRT) finish(attempts int, resp *http.Response, err error, budget bool) (*http.Response, error) {
	if err == nil {
		return resp, nil
	}
	if attempts == 1 && !budget {
		return nil, err
	}
	return nil, &RetryError{Attempts: attempts, Budget: budget, Err: err}
}

// decide is the retry decision after attempt number attempt: a list of
// checks in a fixed order, the first that applies settling it. It returns
// how long to wait when the verdict is retryAgain, and sets *fromRA when
// that wait is the server's Retry-After.
func (r *retryRT) decide(ctx context.Context, st *callState, replayable bool, attempt int, resp *http.Response, err error, prevWait *time.Duration, fromRA *bool) (verdict, time.Duration) {
	// 0. A success is final (unless the user's CheckRetry judges it).
	if err == nil && resp.StatusCode < 400 && r.check == nil {
		return giveUp, 0
	}
	// 1. A request that is not safe to send twice is never sent twice,
	// whatever happened to it: a lost response to a POST may hide a charge.
	if !replayable {
		return giveUp, 0
	}
	// 2. The caller gave up (cancelled, or its own deadline passed).
	if ctx.Err() != nil {
		return giveUp, 0
	}
	// 3. A layer below refused on purpose: an open breaker, a full bulkhead
	// or a host's pushback pause is the answer, not a failure to try again,
	// and retrying it would only spin.
	if err != nil && (errors.Is(err, ErrBreakerOpen) || errors.Is(err, ErrBulkheadFull) || errors.Is(err, ErrPushback)) {
		return giveUp, 0
	}
	// 4. The server said not to retry: it is shedding load and wants only
	// one layer of the stack to try again.
	if resp != nil {
		if _, ok := resp.Header[NoRetryHeader]; ok {
			return giveUp, 0
		}
	}
	// 5. Only outcomes another try may change: the user's CheckRetry, or
	// retryableOutcome.
	if r.check != nil {
		if ok, _ := r.check(ctx, resp, err); !ok {
			return giveUp, 0
		}
	} else if !retryableOutcome(resp, err) {
		return giveUp, 0
	}
	// 6. Attempts exhausted.
	if attempt >= r.max {
		return giveUp, 0
	}
	// 7. How long to wait: a valid Retry-After on 429 or 503 replaces the
	// backoff (the server knows when it will have room; guessing is worse),
	// and a pause of the whole host lengthens any wait.
	now := r.t.now()
	wait, fromServer := time.Duration(0), false
	if resp != nil {
		// Pushback, when on, has parsed this header and counted it already.
		if d, ok := r.t.retryAfter(resp, now, r.hs.pushback == nil); ok {
			wait, fromServer = min(d, r.maxRA), true
		}
	}
	if !fromServer {
		wait = r.backoffWait(attempt-1, resp, prevWait)
	}
	if pb := r.hs.pushback; pb != nil {
		if e := pb.paused.Load(); e != nil && e.Until.After(now) {
			wait = max(wait, e.Until.Sub(now))
		}
	}
	// 8. The deadline: a wait that would end past it, or leave too little
	// time to send, means returning the last outcome now rather than
	// sleeping into a timeout and losing the response we have.
	if dl, ok := callDeadline(ctx, st); ok && now.Add(wait+minSendTime).After(dl) {
		return giveUp, 0
	}
	// 9. The budget, last, so that no token is spent on a retry another
	// check would refuse.
	if r.budget != nil && !r.budget.withdraw(now) {
		return budgetSpent, 0
	}
	*fromRA = fromServer
	return retryAgain, wait
}

// backoffWait is the wait before retry n (from 0) when the server named none.
func (r *retryRT) backoffWait(n int, resp *http.Response, prevWait *time.Duration) time.Duration {
	if r.backoff != nil {
		return max(r.backoff(r.base, r.cap, n, resp), 0)
	}
	exp := r.cap
	if n < 62 && r.base <= r.cap>>n {
		exp = r.base << n
	}
	rs := &r.t.retry
	switch r.jitter {
	case None:
		return exp
	case Equal:
		half := exp / 2
		return half + time.Duration(rs.rand(int64(half)+1))
	case Decorrelated:
		hi := r.cap
		if p := max(*prevWait, r.base); p <= r.cap/3 {
			hi = 3 * p
		}
		d := min(r.cap, r.base+time.Duration(rs.rand(int64(hi-r.base)+1)))
		*prevWait = d
		return d
	default: // Full
		return time.Duration(rs.rand(int64(exp) + 1))
	}
}

// retryableOutcome is bulwark's rule for whether another try may change an
// outcome. Responses: 429, 502, 503 and 504 (500 may be a bug that a retry
// repeats, and other 4xx answers will not change). Errors: see
// retryableError.
func retryableOutcome(resp *http.Response, err error) bool {
	if err != nil {
		return retryableError(err)
	}
	switch resp.StatusCode {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// retryableError classifies a transport error by its type, never its text:
// bulwark's own attempt timeout is retried; other deadline and cancellation
// errors (including ErrDeadlineTooShort) are not, there being no time left;
// certificate and TLS protocol errors and a host that does not exist are
// permanent. Anything else (a refused or reset connection, an EOF on a
// reused connection, a DNS timeout) is transient.
//
// Redirect loops are http.Client's business, above the Transport: each hop
// is a call of its own and its errors never reach this layer. Unsupported
// schemes are never retried (see prepare).
func retryableError(err error) bool {
	if errors.Is(err, ErrAttemptTimeout) {
		return true
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var (
		cve *tls.CertificateVerificationError
		rhe tls.RecordHeaderError
		ale tls.AlertError
		uae x509.UnknownAuthorityError
		hne x509.HostnameError
		cie x509.CertificateInvalidError
		sre x509.SystemRootsError
		cvr x509.ConstraintViolationError
		dns *net.DNSError
	)
	switch {
	case errors.As(err, &cve), errors.As(err, &rhe), errors.As(err, &ale),
		errors.As(err, &uae), errors.As(err, &hne), errors.As(err, &cie),
		errors.As(err, &sre), errors.As(err, &cvr):
		return false
	case errors.As(err, &dns) && dns.IsNotFound:
		return false
	}
	return true
}

// budgetBuckets is how many slices the budget window is counted in.
const budgetBuckets = 10

// retryBudget is a host's Budget: see its documentation for the algorithm.
// It is safe for concurrent use.
type retryBudget struct {
	ratio    float64
	width    int64         // nanoseconds per bucket
	floorMax float64       // the most floor-funded retries a window may hold
	floor    *rate.Limiter // nil: no floor

	mu         sync.Mutex
	epoch      int64 // the newest bucket's number: unix nanoseconds / width
	calls      [budgetBuckets]int64
	retries    [budgetBuckets]int64
	sumC, sumR int64
	started    bool
}

func newRetryBudget(b Budget) *retryBudget {
	rb := &retryBudget{ratio: b.Ratio, width: int64(b.Window / budgetBuckets)}
	if b.MinPerSecond > 0 {
		rb.floorMax = b.MinPerSecond * b.Window.Seconds()
		rb.floor = rate.NewLimiter(rate.Limit(b.MinPerSecond), max(1, int(math.Ceil(b.MinPerSecond))))
	}
	return rb
}

// advance moves the window so that its newest bucket holds now, emptying
// the buckets it slides past. A clock that steps back counts into the
// newest bucket.
func (b *retryBudget) advance(now int64) int {
	e := now / b.width
	if !b.started {
		b.epoch, b.started = e, true
	}
	if n := e - b.epoch; n > 0 {
		if n >= budgetBuckets {
			b.calls, b.retries = [budgetBuckets]int64{}, [budgetBuckets]int64{}
			b.sumC, b.sumR = 0, 0
		} else {
			for i := int64(1); i <= n; i++ {
				j := ((b.epoch+i)%budgetBuckets + budgetBuckets) % budgetBuckets
				b.sumC -= b.calls[j]
				b.sumR -= b.retries[j]
				b.calls[j], b.retries[j] = 0, 0
			}
		}
		b.epoch = e
	}
	return int((b.epoch%budgetBuckets + budgetBuckets) % budgetBuckets)
}

// call records a call (its first attempt) made at now, in unix nanoseconds.
func (b *retryBudget) call(now int64) {
	b.mu.Lock()
	i := b.advance(now)
	b.calls[i]++
	b.sumC++
	b.mu.Unlock()
}

// remaining reports how many retries the budget would allow at now, for
// its gauge: the room under the ratio or, if larger, the floor's.
func (b *retryBudget) remaining(now time.Time) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance(now.UnixNano())
	room := int64(b.ratio*float64(b.sumC)) - b.sumR
	if b.floor != nil {
		room = max(room, min(int64(b.floor.TokensAt(now)), int64(b.floorMax)-b.sumR))
	}
	return max(room, 0)
}

// withdraw takes one retry from the budget, reporting whether there was room.
func (b *retryBudget) withdraw(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	i := b.advance(now.UnixNano())
	r := float64(b.sumR + 1)
	ok := r <= b.ratio*float64(b.sumC) ||
		(b.floor != nil && r <= b.floorMax && b.floor.AllowN(now, 1))
	if ok {
		b.retries[i]++
		b.sumR++
	}
	return ok
}
