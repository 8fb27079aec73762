package bulwark

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bulwark-http/bulwark/internal/fifo"
	"github.com/bulwark-http/bulwark/internal/limit"
	"golang.org/x/time/rate"
)

// defaultAdaptiveMax is the ceiling of an adaptive limit when
// Bulkhead.MaxConcurrent is zero. It is generous on purpose: the adaptive
// limit starts there and comes down when latency says the host is
// queueing, so a host that slows down under load gets fewer requests at
// once (see Bulkhead).
const defaultAdaptiveMax = 1000

// defaultMinConcurrent is the floor of an adaptive limit (the package
// default, or one set with Bulkhead.Adaptive) when Bulkhead.MinConcurrent
// is zero (or MaxConcurrent, if that is less). Ten in flight are never
// refused: lower floors refused a healthy host's calls on the noise of a
// heavy-tailed latency. A host with fewer than ten workers gets up to ten
// requests at once with the package defaults: set MaxConcurrent (or
// MinConcurrent) for it. See docs/design.md, "Bulkhead".
const defaultMinConcurrent = 10

// defaultHeadroom is how far above the peak in flight the package default
// adaptive limit decays to.
const defaultHeadroom = 2

// softFor is how long after the last window that showed queueing the
// package default limit stays enforced; past it, a request over the limit
// is admitted and the limit rises to what is in flight (limit.Config.Soft).
const softFor = time.Second

// ErrRateLimited reports that the host's client-side rate limit
// (Bulkhead.Rate) had no token for the request before its deadline, so the
// request was not sent. A *RateLimitError matches it and ErrBulkheadFull.
var ErrRateLimited = errors.New("bulwark: client-side rate limit reached")

// Bulkhead bounds how much of the caller one upstream host may hold. Every
// host has its own bulkhead, keyed like http.Transport's connection pools
// by scheme, host and port; hosts never share slots, and a policy set for
// a "host" key gives each of that host's ports a bulkhead of its own.
//
// The contract, with the limit in force (BulkheadSnapshot.Limit):
//  1. A request is admitted at once while fewer than the limit are in
//     flight and nobody waits.
//  2. Otherwise, if fewer than MaxQueue wait, it waits in arrival order
//     (requests arriving at the same instant in an order of their own) for
//     at most MaxWait and never past the call's deadline less the minimum
//     worth sending, and takes the slot of the first request to end; else,
//     or when its wait runs out, it is refused with ErrBulkheadFull.
//  3. The limit is MaxConcurrent, or with Adaptive a value that moves
//     within [MinConcurrent, MaxConcurrent] as latency says the host
//     queues or not.
//  4. The package default (MaxConcurrent zero) is adaptive and soft: while
//     no window of the last second has shown the host queueing, a request
//     past the limit is admitted and the limit rises to what is in flight,
//     up to 1,000 in flight.
//
// A slot is held from admission until the response body is read to EOF,
// fails while reading, or is closed, or until the attempt fails. A caller
// that never closes a body keeps its slot, as it would keep the
// connection. Rate, when set, is checked before a slot is taken.
type Bulkhead struct {
	// MaxConcurrent is how many requests to one host may be in flight at
	// once: a fixed limit, or an adaptive limit's ceiling when Adaptive is
	// set. Zero inherits from Default, then the package default: an
	// adaptive limit from 10 up to 1,000. Size a fixed limit from the
	// host's latency and your share of the caller's capacity, as Nygard's
	// Release It! sizes bulkheads: a slow dependency should be able to
	// strand only its own share.
	MaxConcurrent int

	// Adaptive makes the limit learn from latency, within MinConcurrent and
	// MaxConcurrent, per host (per instance under Endpoints), after Netflix's
	// concurrency-limits and Envoy's adaptive_concurrency: when a short
	// window's mean latency is more than 25 % above a slowly rising baseline
	// (or an attempt timed out, or got 429 or 503), the limit comes down to
	// what the host completes a second × the baseline; while requests use
	// the limit and see no queue it probes upward by 1, doubling each window
	// in a row; while they use less it decays toward 1.1 × their peak. It
	// starts at MaxConcurrent. The queue (MaxQueue) still applies to
	// requests past the limit. Set MaxConcurrent without Adaptive for a
	// fixed limit.
	//
	// Adaptive is on whenever MaxConcurrent is zero after inheritance, and
	// that package default limit is soft (rule 4 above): it binds only for a
	// second after a window showed the host queueing, and idle it decays
	// toward twice the peak in flight. See docs/design.md, "Bulkhead".
	Adaptive bool

	// MinConcurrent is an adaptive limit's floor. Zero inherits from
	// Default, then 10 (at most MaxConcurrent). Ignored
	// for a fixed limit.
	MinConcurrent int

	// MaxQueue is how many requests may wait, in arrival order, for a slot
	// when all MaxConcurrent are taken; one more is refused with
	// ErrBulkheadFull at once. Zero inherits from Default, then 0: a full
	// bulkhead refuses immediately, which is the point of a bulkhead. Keep
	// it short. (Because zero inherits, an upstream cannot set 0 to undo a
	// Default queue.)
	MaxQueue int

	// MaxWait is how long a queued request may wait for a slot before it is
	// refused with ErrBulkheadFull. Whatever it says, a wait never outlasts
	// the call's deadline (the context's or Timeout.Total's, less the
	// minimum worth sending), and a waiter whose context ends leaves at once.
	// Zero inherits from Default, then 0: the call's deadline is the only
	// bound, since the caller's patience is what a queue must not outlast.
	MaxWait time.Duration

	// Rate, when positive, limits requests to the host to Rate a second on
	// the client side (golang.org/x/time/rate's token bucket), before a slot
	// is taken. A request without a token waits for one only if its turn
	// comes before the call's deadline (less the minimum worth sending);
	// otherwise it fails at once with a *RateLimitError. A request the
	// bulkhead then refuses keeps the token it took. Zero inherits from
	// Default, then no rate limit.
	//
	// The limit follows the host's word when it advertises a tighter one: a
	// response's rate-limit policy (RateLimit-Policy of the IETF draft,
	// `"name";q=100;w=60`, or its earlier form `100;w=60`, which
	// RateLimit-Limit and X-RateLimit-Limit also carry) sets the rate to
	// quota ÷ window seconds, the tightest of its policies, never above
	// Rate; a later policy at or above Rate restores Rate, and a response
	// without one changes nothing. A zero quota, a window of zero or past a
	// day, and malformed values are ignored and counted in
	// Snapshot.RetryAfterIgnored. Without Rate, no rate limit is made up
	// from the headers. (A spent quota, remaining 0 until a reset, pauses
	// the host in the pushback layer instead; see Retry.)
	Rate float64

	// Burst is how many requests may go at once above the steady Rate (the
	// bucket's size). Zero inherits from Default, then 1: requests are spaced
	// evenly, 1/Rate apart. Ignored when Rate is zero.
	Burst int

	// FleetRate, when positive, is a quota the host gives the whole fleet:
	// every process whose Config.Fleet implements FleetLeaser (redisfleet
	// does) and sets the same FleetRate for the host sends it, together,
	// at most FleetRate requests a second. Each process spends tokens
	// leased ahead of need from a fleet-wide token bucket (FleetLeaser), so
	// a request never waits on the store: one without a token is refused
	// at once with a *RateLimitError, as Rate refuses one. Until its first
	// lease, and while the store is unreachable, a process answers alone:
	// from Rate's limiter when Rate is set, otherwise at its share of the
	// quota as the last lease counted the processes (all of it, before
	// any), unless FleetFailClosed is set. It applies with Rate, not
	// instead of it. Zero inherits from Default, then no fleet quota. Set
	// without a Config.Fleet that implements FleetLeaser it is an error.
	FleetRate float64

	// FleetFailClosed refuses the requests a FleetRate quota cannot vouch
	// for, while the store is unreachable and before the first lease,
	// rather than answering locally: for a quota whose excess costs more
	// (a bill, a ban) than a refused request. An upstream inherits it from
	// Default (it is or-ed).
	FleetFailClosed bool

	// Shadow runs the bulkhead in shadow mode: it takes slots, queues and
	// takes rate-limit tokens as it would, and reports each refusal it
	// would make (the bulwark.shadow.rejections metric, a
	// "bulwark.shadow_rejected" span event, BulkheadSnapshot.WouldReject),
	// but sends the request anyway, holding no slot, so what it counts is
	// what an enforcing bulkhead would count on the same traffic. A
	// request still waits in the queue (or for its rate-limit turn) as
	// long as an enforcing one would. An upstream inherits Shadow from
	// Default (it is or-ed).
	Shadow bool

	// Disabled turns off this layer for the upstream: no concurrency bound,
	// no queue and no rate limit. An upstream inherits Disabled from
	// Default unless it sets Enabled.
	Disabled bool

	// Enabled turns the bulkhead back on for an upstream whose Default set
	// Disabled. Setting both is an error.
	Enabled bool

	// pkgDefault marks the package default adaptive limit (set by
	// withDefaults): soft, decaying toward twice the peak in flight.
	pkgDefault bool
}

func (b Bulkhead) inherit(parent Bulkhead) Bulkhead {
	b.MaxConcurrent = cmp.Or(b.MaxConcurrent, parent.MaxConcurrent)
	b.MinConcurrent = cmp.Or(b.MinConcurrent, parent.MinConcurrent)
	b.Adaptive = b.Adaptive || parent.Adaptive
	b.MaxQueue = cmp.Or(b.MaxQueue, parent.MaxQueue)
	b.MaxWait = cmp.Or(b.MaxWait, parent.MaxWait)
	b.Rate = cmp.Or(b.Rate, parent.Rate)
	b.Burst = cmp.Or(b.Burst, parent.Burst)
	b.FleetRate = cmp.Or(b.FleetRate, parent.FleetRate)
	b.FleetFailClosed = b.FleetFailClosed || parent.FleetFailClosed
	b.Shadow = b.Shadow || parent.Shadow
	b.Disabled = inheritOff(b.Disabled, b.Enabled, parent.Disabled)
	return b
}

func (b Bulkhead) withDefaults() Bulkhead {
	switch {
	case b.MaxConcurrent == 0 && !b.Adaptive:
		// The package default: adaptive and soft (see Adaptive).
		b.Adaptive, b.pkgDefault = true, true
		b.MaxConcurrent = defaultAdaptiveMax
		b.MinConcurrent = cmp.Or(b.MinConcurrent, defaultMinConcurrent)
	case b.Adaptive:
		b.MaxConcurrent = cmp.Or(b.MaxConcurrent, defaultAdaptiveMax)
		b.MinConcurrent = cmp.Or(b.MinConcurrent, min(defaultMinConcurrent, b.MaxConcurrent))
	}
	if b.Rate > 0 && b.Burst == 0 {
		b.Burst = 1
	}
	return b
}

func (b Bulkhead) validate() error {
	switch {
	case b.MaxConcurrent < 0:
		return fieldError("Bulkhead.MaxConcurrent", b.MaxConcurrent, "must be ≥ 0")
	case b.MinConcurrent < 0:
		return fieldError("Bulkhead.MinConcurrent", b.MinConcurrent, "must be ≥ 0")
	case b.Adaptive && b.MinConcurrent > b.MaxConcurrent:
		return fieldError("Bulkhead.MinConcurrent", b.MinConcurrent, "must be ≤ MaxConcurrent")
	case b.MaxQueue < 0:
		return fieldError("Bulkhead.MaxQueue", b.MaxQueue, "must be ≥ 0")
	case b.MaxWait < 0:
		return fieldError("Bulkhead.MaxWait", b.MaxWait, "must be ≥ 0")
	case b.Rate < 0 || math.IsNaN(b.Rate) || math.IsInf(b.Rate, 0):
		return fieldError("Bulkhead.Rate", b.Rate, "must be a finite number ≥ 0")
	case b.Burst < 0:
		return fieldError("Bulkhead.Burst", b.Burst, "must be ≥ 0")
	case b.FleetRate < 0 || math.IsNaN(b.FleetRate) || math.IsInf(b.FleetRate, 0) || b.FleetRate > maxFleetRate:
		return fieldError("Bulkhead.FleetRate", b.FleetRate, fmt.Sprintf("must be a finite number in [0, %d]", maxFleetRate))
	}
	return nil
}

// BulkheadFullError reports a request the host's bulkhead refused: every
// slot was taken and the queue was full, or the queue wait ran out. It
// matches ErrBulkheadFull. One value is made per host and returned for every
// refusal, so refusing allocates nothing; do not modify it.
type BulkheadFullError struct {
	Host string // "host:port"
}

func (e *BulkheadFullError) Error() string { return "bulwark: bulkhead full for " + e.Host }

// Unwrap returns ErrBulkheadFull.
func (e *BulkheadFullError) Unwrap() error { return ErrBulkheadFull }

func (e *BulkheadFullError) refusalKind() kind { return kindBulkheadFull }

// RateLimitError reports a request the host's client-side rate limit
// refused because its turn would come too late for its deadline. It matches
// ErrRateLimited and also ErrBulkheadFull: like a full bulkhead it is a local
// refusal of a request that was never sent, so code that falls back or
// backs off on one does the same on the other. One value is made per host
// and shared; do not modify it.
type RateLimitError struct {
	Host string // "host:port"
}

func (e *RateLimitError) Error() string { return "bulwark: rate limit reached for " + e.Host }

// Unwrap returns ErrRateLimited and ErrBulkheadFull.
func (e *RateLimitError) Unwrap() []error { return []error{ErrRateLimited, ErrBulkheadFull} }

// bulkheadLayer is per host (per instance when balanced), just outside the
// attempt deadline, so a slot covers exactly one attempt and a retry's
// backoff holds none. The semaphore and its FIFO are hand-written, not
// golang.org/x/sync/semaphore's: the layer needs a queue cap with an
// immediate refusal, counts to observe, and release at body end without a
// closure per request. With a queue, the slot count changes under the
// queue's mutex, so a release handing its slot to the first waiter cannot
// race with that waiter giving up; without one, a CAS counter does.
type bulkheadLayer struct {
	next          layer
	rep           *reporter
	name          string
	max           int
	lim           *limit.Gradient // nil: the limit is max, fixed
	minConcurrent int
	reported      atomic.Int64 // the limit last reported to rep
	maxQueue      int
	maxWait       time.Duration
	limiter       *rate.Limiter // nil: no rate limit
	rate          float64       // Bulkhead.Rate, the most the limiter allows
	quota         *fleetQuota   // nil: no fleet quota (fleetquota.go)
	// following is the rate (float64 bits) the limiter was last set to
	// after an advertised policy; ignored counts the policies ignored as
	// malformed (the Transport's count, Snapshot.RetryAfterIgnored).
	following atomic.Uint64
	followMu  sync.Mutex // serialises changes of the limiter's rate
	ignored   *atomic.Uint64
	full      *BulkheadFullError
	limited   *RateLimitError
	shadow    bool
	// wouldReject counts the refusals of a bulkhead in shadow mode.
	wouldReject atomic.Uint64
	refusals    atomic.Uint64 // full or rate limited, since the state was made

	// inFlight is the number of slots held, including ones handed to
	// waiters. Without a queue (MaxQueue 0, the default) it is the whole
	// state, taken and given back with atomics alone, so the common
	// configuration never contends on a lock. With a queue it changes only
	// under mu, where the queue is, so hand-offs stay race-free.
	inFlight atomic.Int64

	mu    sync.Mutex
	queue fifo.List[slotWaiter, *slotWaiter] // the waiters
}

// slotWaiter is one queued request. granted and the links are guarded by the
// bulkhead's mu; ready is closed once, by the releaser that grants it.
type slotWaiter struct {
	ready   chan struct{}
	granted bool
	links   fifo.Links[slotWaiter]
}

func (w *slotWaiter) FIFOLinks() *fifo.Links[slotWaiter] { return &w.links }

// newBulkhead builds the bulkhead p describes for a host, or for one
// instance of a balanced upstream; name ("host:port") goes in its errors,
// and its refusals go to rep.
func newBulkhead(next layer, p Bulkhead, name string, rep *reporter, ignored *atomic.Uint64) *bulkheadLayer {
	b := &bulkheadLayer{
		next:     next,
		rep:      rep,
		name:     name,
		max:      p.MaxConcurrent,
		maxQueue: p.MaxQueue,
		maxWait:  p.MaxWait,
		full:     &BulkheadFullError{Host: name},
		limited:  &RateLimitError{Host: name},
		shadow:   p.Shadow,
	}
	if p.Adaptive {
		b.minConcurrent = max(1, p.MinConcurrent)
		b.reported.Store(int64(p.MaxConcurrent))
		// Validated: 1 ≤ MinConcurrent ≤ MaxConcurrent.
		c := limit.Config{Min: max(1, p.MinConcurrent), Max: p.MaxConcurrent}
		if p.pkgDefault {
			// A drop-in for http.DefaultClient must not refuse a healthy
			// upstream's bursts: a soft limit, enforced only while the
			// host queues, decaying toward twice the recent peak.
			c.Headroom = defaultHeadroom
			c.Soft = softFor
		}
		b.lim, _ = limit.New(c)
	}
	if p.Rate > 0 {
		b.limiter = rate.NewLimiter(rate.Limit(p.Rate), p.Burst)
		b.rate, b.ignored = p.Rate, ignored
		b.following.Store(math.Float64bits(p.Rate))
	}
	return b
}

func (b *bulkheadLayer) roundTrip(req *http.Request, c call) (*http.Response, error) {
	return b.pass(b.next, req, c)
}

// pass holds a slot of this bulkhead for an attempt sent through next: its
// own layer below, or a route's (see sharedLayer), so that the routes of a
// host share the host's slots.
func (b *bulkheadLayer) pass(next layer, req *http.Request, c call) (*http.Response, error) {
	if b.quota != nil && !b.quota.take(time.Now(), b.limiter != nil) {
		if !b.refuse(req, b.limited) {
			return nil, b.limited
		}
	} else if b.limiter != nil {
		if err := b.waitRate(req, c); err != nil {
			if b.refuse(req, err) {
				return next.roundTrip(req, c)
			}
			return nil, err
		}
	}
	if err := b.acquire(req, c); err != nil {
		if b.refuse(req, err) {
			return next.roundTrip(req, c)
		}
		return nil, err
	}
	return b.hold(next, req, c)
}

// refuse settles a refusal err of the bulkhead's: true when, in shadow
// mode, the request goes through all the same; else the refusal is counted
// and the request's body closed.
func (b *bulkheadLayer) refuse(req *http.Request, err error) bool {
	if b.shadowed(req, err) {
		return true
	}
	b.refused(req, err)
	closeBody(req)
	return false
}

// hold sends the attempt through next on the slot acquired for it, and
// releases the slot when the attempt is over: at once on an error, else
// when the response's body is.
func (b *bulkheadLayer) hold(next layer, req *http.Request, c call) (*http.Response, error) {
	returned := false
	defer func() {
		if !returned {
			// The layer below panicked: the slot must not be lost with it.
			b.release()
		}
	}()
	var start time.Time
	if b.lim != nil {
		// The retry layer's reading of when it sent the attempt saves a
		// clock reading (some 70 ns on a VM), unless this bulkhead may
		// have made it wait (a queue, a rate limit).
		start = c.sent
		if start.IsZero() || b.maxQueue > 0 || b.limiter != nil {
			start = time.Now()
		}
	}
	resp, err := next.roundTrip(req, c)
	returned = true
	if b.lim != nil {
		b.sample(start, resp, c.judge(resp, err))
	}
	if b.limiter != nil && err == nil {
		b.followPolicy(resp.Header)
	}
	if err != nil {
		// An attempt abandoned at its deadline keeps its slot until its
		// base returns: a host that ignores the deadline still has no
		// more than its share.
		afterReturn(err, b)
		return nil, err
	}
	// The bulkhead itself is the bodyEnder: registering a pointer we hold
	// costs nothing, where a closure would allocate on every request.
	onBodyEnd(resp, b)
	return resp, nil
}

// sample feeds the adaptive limit one attempt, judged j by the call's
// classifier: its latency to the response headers (a body's reading time
// is the caller's, not the host's), the slots held, and whether it was
// dropped (judged.dropped): with the default classifier, bulwark's own
// timeout, or a 429 or 503, the host saying it has too much to do.
func (b *bulkheadLayer) sample(start time.Time, resp *http.Response, j judged) {
	now := time.Now()
	if !j.k.fromHost() {
		// Refused below, or the caller gave up: nothing about the host.
		return
	}
	dropped := j.dropped(resp)
	old := b.lim.Limit()
	if l, changed := b.lim.Sample(now.UnixNano(), now.Sub(start), int(b.inFlight.Load()), dropped); changed {
		// Reported when it has moved by a quarter since last reported, so
		// the log shows the trend, not every window's step.
		if last := b.reported.Load(); 4*abs(int64(l)-last) >= last {
			b.reported.Store(int64(l))
			b.rep.limitChanged(b.name, int(last), l)
		}
		if b.maxQueue > 0 && l > old {
			b.grantWaiters()
		}
	}
}

// followPolicy sets the rate limit to the tightest policy h advertises,
// never above Rate (see Bulkhead.Rate). The common case, no policy or the
// one already followed, takes no lock.
func (b *bulkheadLayer) followPolicy(h http.Header) {
	r, res := advertisedRate(h)
	switch res {
	case retryAfterAbsent:
		return
	case retryAfterIgnored:
		if b.ignored != nil {
			b.ignored.Add(1)
		}
		return
	}
	bits := math.Float64bits(min(r, b.rate))
	if b.following.Load() == bits {
		return
	}
	b.followMu.Lock()
	defer b.followMu.Unlock()
	if b.following.Load() != bits {
		b.following.Store(bits)
		b.limiter.SetLimit(rate.Limit(math.Float64frombits(bits)))
	}
}

// admitOver reports whether a request that finds n in flight, at or past
// the limit, goes all the same: a soft adaptive limit while the host shows
// no queue (limit.Gradient.Admit), which then rises to n + 1.
func (b *bulkheadLayer) admitOver(n int64) bool {
	return b.lim != nil && b.lim.Admit(time.Now().UnixNano(), int(n))
}

// limitNow is the limit in force: the adaptive one's current value, or the
// fixed one.
func (b *bulkheadLayer) limitNow() int64 {
	if b.lim != nil {
		return int64(b.lim.Limit())
	}
	return int64(b.max)
}

// refused reports a refusal of the bulkhead's own (full, or rate limited),
// not a caller who gave up while queued.
func (b *bulkheadLayer) refused(req *http.Request, err error) {
	if err == error(b.full) || err == error(b.limited) {
		b.refusals.Add(1)
		b.rep.rejected(req.Context(), layerBulkhead)
	}
}

// shadowed reports whether a bulkhead in shadow mode lets a request it
// would have refused with err through (without a slot), and counts it. A
// caller who gave up is not the bulkhead's refusal: it ends as it would.
func (b *bulkheadLayer) shadowed(req *http.Request, err error) bool {
	if !b.shadow || (err != error(b.full) && err != error(b.limited)) {
		return false
	}
	b.wouldReject.Add(1)
	b.rep.shadowRejected(req.Context(), layerBulkhead)
	return true
}

// bodyEnd releases the slot of a response whose body is finished.
func (b *bulkheadLayer) bodyEnd() { b.release() }

// acquire takes a slot, queueing for one if the bulkhead allows it.
func (b *bulkheadLayer) acquire(req *http.Request, c call) error {
	if b.maxQueue == 0 {
		return b.take()
	}
	w, wait, bounded, err := b.enqueue(req, c)
	if w == nil {
		return err
	}
	return b.await(req.Context(), w, wait, bounded)
}

// take takes a free slot, or refuses: a bulkhead with no queue, whose
// state is the count of slots held alone, changed with atomics.
func (b *bulkheadLayer) take() error {
	for {
		n := b.inFlight.Load()
		if n >= b.limitNow() && !b.admitOver(n) {
			return b.full
		}
		if b.inFlight.CompareAndSwap(n, n+1) {
			return nil
		}
	}
}

// enqueue takes a free slot, or queues w for one, waiting at most wait
// when bounded; w is nil when the slot was taken (err nil) or refused.
func (b *bulkheadLayer) enqueue(req *http.Request, c call) (w *slotWaiter, wait time.Duration, bounded bool, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	// A free slot goes to the queue first: taking it past waiters would
	// break FIFO order (and a releaser hands slots to waiters directly, so
	// a free slot with waiters only exists for an instant anyway).
	if n := b.inFlight.Load(); (n < b.limitNow() || b.admitOver(n)) && b.queue.Front() == nil {
		b.inFlight.Store(n + 1)
		return nil, 0, false, nil
	}
	if b.queue.Len() >= b.maxQueue {
		return nil, 0, false, b.full
	}
	if ctx := req.Context(); ctx.Err() != nil {
		return nil, 0, false, doneError(ctx)
	}
	wait, bounded = b.waitBound(req, c)
	if bounded && wait <= 0 {
		return nil, 0, false, b.full
	}
	w = &slotWaiter{ready: make(chan struct{})}
	b.queue.Push(w)
	return w, wait, bounded, nil
}

// await waits for w's slot, until ctx ends or, when bounded, wait has
// passed.
func (b *bulkheadLayer) await(ctx context.Context, w *slotWaiter, wait time.Duration, bounded bool) error {
	var timeout <-chan time.Time
	if bounded {
		tm := time.NewTimer(wait)
		defer tm.Stop()
		timeout = tm.C
	}
	var err error
	select {
	case <-w.ready:
		return nil
	case <-ctx.Done():
		err = doneError(ctx)
	case <-timeout:
		err = b.full
	}
	b.mu.Lock()
	if w.granted {
		// A releaser handed us its slot while we were giving up, so it is
		// ours. If only the wait bound ran out, use it; if the caller is
		// gone, pass it on (to the next waiter, or back to the pool).
		b.mu.Unlock()
		if err == b.full {
			return nil
		}
		b.release()
		return err
	}
	b.queue.Remove(w)
	b.mu.Unlock()
	return err
}

// waitBound is how long a waiter may queue: MaxWait, cut to the call's
// deadline less the minimum worth sending. bounded is false when neither
// applies and only the context can end the wait.
func (b *bulkheadLayer) waitBound(req *http.Request, c call) (wait time.Duration, bounded bool) {
	wait, bounded = b.maxWait, b.maxWait > 0
	if dl, ok := c.deadline(req); ok {
		if left := time.Until(dl) - minSendTime; !bounded || left < wait {
			wait, bounded = left, true
		}
	}
	return wait, bounded
}

// release returns a slot: to the first waiter if there is one (the slot
// changes hands without ever being free, so nobody can jump the queue),
// else to the pool.
func (b *bulkheadLayer) release() {
	if b.maxQueue == 0 {
		b.inFlight.Add(-1)
		return
	}
	b.mu.Lock()
	// An adaptive limit may have come down below the slots held: then the
	// slot goes back to the pool, not to a waiter.
	if w := b.queue.Front(); w != nil && b.inFlight.Load() <= b.limitNow() {
		b.queue.Remove(w)
		w.granted = true
		b.mu.Unlock()
		close(w.ready)
		return
	}
	b.inFlight.Add(-1)
	b.mu.Unlock()
}

// grantWaiters hands the slots an adaptive limit's rise freed to waiters,
// in order.
func (b *bulkheadLayer) grantWaiters() {
	for {
		b.mu.Lock()
		w := b.queue.Front()
		if w == nil || b.inFlight.Load() >= b.limitNow() {
			b.mu.Unlock()
			return
		}
		b.queue.Remove(w)
		w.granted = true
		b.inFlight.Add(1)
		b.mu.Unlock()
		close(w.ready)
	}
}

// waitRate takes a rate-limit token, waiting for it only when the wait ends
// in time for the call's deadline. It runs before a slot is taken, so a
// request waiting for its turn holds no slot.
func (b *bulkheadLayer) waitRate(req *http.Request, c call) error {
	ctx := req.Context()
	// A bulkhead that would refuse anyway should not spend a token. (With
	// a queue, a waiter may leave any moment: let acquire decide.)
	if b.maxQueue == 0 && b.inFlight.Load() >= b.limitNow() {
		return b.full
	}
	now := time.Now()
	r := b.limiter.ReserveN(now, 1)
	if !r.OK() {
		return b.limited
	}
	delay := r.DelayFrom(now)
	if delay == 0 {
		return nil
	}
	if dl, ok := c.deadline(req); ok && now.Add(delay+minSendTime).After(dl) {
		// Our turn comes too late to be worth anything: give the token
		// back and fail now rather than hold the caller until it is
		// useless.
		r.CancelAt(now)
		return b.limited
	}
	tm := time.NewTimer(delay)
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil
	case <-ctx.Done():
		r.CancelAt(time.Now())
		return doneError(ctx)
	}
}

// stats reports the slots held and the requests queued.
func (b *bulkheadLayer) stats() (inFlight, queued int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return int(b.inFlight.Load()), b.queue.Len()
}

// busy reports whether requests hold slots or wait for one.
func (b *bulkheadLayer) busy() bool {
	in, queued := b.stats()
	return in > 0 || queued > 0
}

// BulkheadSnapshot is a bulkhead's state, as Snapshot reports it.
type BulkheadSnapshot struct {
	// InFlight is the number of slots held, Queued the number of requests
	// waiting for one.
	InFlight, Queued int
	// MaxConcurrent and MaxQueue are the bulkhead's limits.
	MaxConcurrent, MaxQueue int
	// Limit is the concurrency limit in force: MaxConcurrent for a fixed
	// limit, the adaptive limit's current value (between MinConcurrent and
	// MaxConcurrent) when Adaptive.
	Limit         int
	Adaptive      bool
	MinConcurrent int
	// Shadow is whether the bulkhead is in shadow mode (Bulkhead.Shadow),
	// and WouldReject how many requests it would have refused and sent
	// instead.
	Shadow      bool
	WouldReject uint64
	// Refused is how many requests it has refused, full or rate limited,
	// since the bulkhead was built (see Transport.Update for what rebuilds it).
	Refused uint64
	// Rate is the client-side rate limit in force, in requests a second:
	// Bulkhead.Rate, or the tighter quota the host advertises; 0 without
	// a rate limit.
	Rate float64
}

// snapshot is the bulkhead's piece of Snapshot, and the piece of the
// fleet quota it takes from (nil without one), which is the host's,
// shared by its bulkheads.
func (b *bulkheadLayer) snapshot() (*BulkheadSnapshot, *QuotaSnapshot) {
	s := b.state()
	s.Refused = b.refusals.Load()
	return &s, b.quota.snapshot(time.Now())
}

func (b *bulkheadLayer) state() BulkheadSnapshot {
	in, q := b.stats()
	s := BulkheadSnapshot{InFlight: in, Queued: q, MaxConcurrent: b.max, MaxQueue: b.maxQueue, Limit: int(b.limitNow()),
		Shadow: b.shadow, WouldReject: b.wouldReject.Load()}
	if b.lim != nil {
		s.Adaptive, s.MinConcurrent = true, b.minConcurrent
	}
	if b.limiter != nil {
		s.Rate = math.Float64frombits(b.following.Load())
	}
	return s
}

func abs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}

// isFull reports whether the slots a hedge may take are all held, so that
// the retry layer sends no hedge that would queue, be refused, or take a
// slot a first attempt needs: the last tenth of the slots (at least one
// when there are ten or more) is kept for calls, not hedges. A racy read:
// it is advice.
func (b *bulkheadLayer) isFull() bool {
	limit := b.limitNow() // the limit in force (adaptive or fixed)
	return b.inFlight.Load() >= limit-limit/10
}

// show hands Snapshot the bulkhead's state and its fleet quota (shower).
func (b *bulkheadLayer) show(put func(any)) {
	bh, quota := b.snapshot()
	put(bh)
	put(quota)
}
