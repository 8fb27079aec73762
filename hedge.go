package bulwark

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bulwark-http/bulwark/internal/latency"
)

// Package defaults for Hedge.
const (
	defaultMaxHedges = 1
	maxHedgesLimit   = 3 // the most Hedge.MaxHedges may be
	// latencyPeriod is how long each of a host's two latency sketches
	// collects before the older is cleared: the estimate covers the last
	// 5 to 10 s.
	latencyPeriod = 5 * time.Second
	// defaultLatencyQuantile is the tail quantile a host's latency tracker
	// keeps when hedging does not name one.
	defaultLatencyQuantile = 0.99
)

// Hedge configures hedged requests: when an attempt has not answered
// after a delay, the retry layer sends the same request again beside it
// (a hedge), takes the first answer that is not worth retrying, and
// cancels the others. It cuts the long tail of a host whose slowness is
// per request, not per host (Dean and Barroso, "The Tail at Scale").
//
// Hedges are attempts like retries: only a request safe to send twice is
// hedged (see Retry); each counts toward Retry.MaxAttempts (raised to 1 +
// MaxHedges when lower), takes a token from the retry Budget, and carries
// its own deadline header and Bulwark-Attempt. No hedge is sent while the
// host's breaker is open, its pushback pause runs, its bulkhead is nine
// tenths full, its Throttle refuses, or its median latency no longer fits
// before the deadline. A cancelled loser counts neither as a failure nor
// as slow, and the call returns once its losers have, so no body or slot
// outlives it (with Config.BaseIgnoresContext, a loser is abandoned and
// holds its slot until its base returns). Hedges go in a call's first
// round only; if all of it fails, retries follow one at a time (none with
// Retry.Disabled). The round's outcome is then the failure from the host
// that came back last (a refusal below, such as an open breaker, only when
// no attempt reached the host; Polly returns the primary's).
//
// Hedging is off unless Delay or Quantile is set. It needs the attempt
// timeout (Timeout not disabled), whose context cancels a loser.
type Hedge struct {
	// Delay is a fixed wait before a hedge. Zero inherits from Default;
	// set Quantile instead for a delay that follows the host.
	Delay time.Duration

	// Quantile, in (0, 1), takes the delay from the host's recent latency
	// (the last 5 to 10 s, measured online): 0.99 hedges an attempt slower
	// than 99 % of recent ones. Until the host has answered 20 times no
	// hedge is sent. Zero inherits from Default, then means a fixed Delay.
	// Setting both Delay and Quantile is an error.
	Quantile float64

	// MinDelay is the floor under a Quantile delay, so that a host whose
	// every answer is fast is not hedged on noise. Zero inherits from
	// Default, then means no floor.
	MinDelay time.Duration

	// MaxHedges is the most hedges one call sends, at most 3; each waits
	// the delay after the one before. Zero inherits from Default, then 1.
	MaxHedges int

	// Disabled turns hedging off for this upstream. An upstream inherits
	// Disabled from Default unless it sets Enabled.
	Disabled bool

	// Enabled turns hedging back on for an upstream whose Default set
	// Disabled. Setting both is an error.
	Enabled bool
}

func (h Hedge) enabled() bool { return !h.Disabled && (h.Delay > 0 || h.Quantile > 0) }

func (h Hedge) inherit(parent Hedge) Hedge {
	if h.Delay == 0 && h.Quantile == 0 {
		h.Delay, h.Quantile = parent.Delay, parent.Quantile
	}
	h.MinDelay = cmp.Or(h.MinDelay, parent.MinDelay)
	h.MaxHedges = cmp.Or(h.MaxHedges, parent.MaxHedges)
	h.Disabled = inheritOff(h.Disabled, h.Enabled, parent.Disabled)
	return h
}

func (h Hedge) withDefaults() Hedge {
	h.MaxHedges = cmp.Or(h.MaxHedges, defaultMaxHedges)
	return h
}

// validate refuses a bad Hedge; timeoutOff is whether the policy's Timeout
// is disabled, which a hedge cannot do without.
func (h Hedge) validate(timeoutOff bool) error {
	switch {
	case h.Delay < 0:
		return fieldError("Hedge.Delay", h.Delay, "must be ≥ 0")
	case h.MinDelay < 0:
		return fieldError("Hedge.MinDelay", h.MinDelay, "must be ≥ 0")
	case h.Quantile != 0 && !(h.Quantile > 0 && h.Quantile < 1):
		return fieldError("Hedge.Quantile", h.Quantile, "must be in (0, 1)")
	case h.Delay > 0 && h.Quantile > 0:
		return fieldError("Hedge.Quantile", h.Quantile, "conflicts with Hedge.Delay ("+h.Delay.String()+")")
	case h.MaxHedges < 1 || h.MaxHedges > maxHedgesLimit:
		return fieldError("Hedge.MaxHedges", h.MaxHedges, fmt.Sprintf("must be in [1, %d]", maxHedgesLimit))
	case h.enabled() && timeoutOff:
		return fieldError("Hedge.Enabled", true, "needs Timeout: a hedge's loser is cancelled through its attempt's context")
	}
	return nil
}

// HedgeSnapshot is a host's hedging counts since the Transport was made.
type HedgeSnapshot struct {
	// Sent is the hedges sent, Won those whose answer the caller got.
	Sent, Won uint64
	// Skipped counts hedges that were due but not sent, by reason.
	Skipped HedgeSkips
	// Delay is the delay a hedge would wait now; zero while a Quantile
	// delay has too few samples.
	Delay time.Duration
}

// HedgeSkips counts hedges not sent, by what stopped them.
type HedgeSkips struct {
	Budget   uint64 // the retry budget was spent, or its retry throttle held
	Deadline uint64 // the host's median latency no longer fitted
	Breaker  uint64 // the breaker was open
	Pushback uint64 // the host had asked for a pause
	Bulkhead uint64 // every bulkhead slot was held
	Throttle uint64 // the client-side throttle was refusing requests
}

// Why a hedge was skipped.
const (
	skipNone uint8 = iota
	skipBudget
	skipDeadline
	skipBreaker
	skipPushback
	skipBulkhead
	skipThrottle
)

var skipLabels = [...]string{"", "skipped_budget", "skipped_deadline", "skipped_breaker", "skipped_pushback", "skipped_bulkhead", "skipped_throttle"}

// opener is the breaker as the retry layer sees it: is it refusing now?
type opener interface{ open() bool }

// filler is the bulkhead as the retry layer sees it: is every slot held?
type filler interface{ isFull() bool }

// shedder is the client-side throttle as the retry layer sees it: is it
// refusing some requests now? A host whose accept ratio has fallen that
// far is overloaded or failing; a hedge would add load where the throttle
// is taking it off, and the throttle might refuse the hedge anyway.
type shedder interface{ shedding() bool }

// hedger is a host's hedging state, in the retry layer.
type hedger struct {
	fixed    time.Duration // a fixed delay; zero: from the quantile
	minDelay time.Duration
	max      int
	breaker  opener  // nil: no breaker
	bulkhead filler  // nil: none (or a balanced upstream's, per instance)
	throttle shedder // nil: no throttle

	sent, won atomic.Uint64
	skipped   [len(skipLabels)]atomic.Uint64

	pool sync.Pool // *hedgeRun whose timer never fired
}

func newHedger(p Hedge, breaker opener, bulkhead filler, throttle shedder) *hedger {
	h := &hedger{fixed: p.Delay, minDelay: p.MinDelay, max: p.MaxHedges, breaker: breaker, bulkhead: bulkhead, throttle: throttle}
	h.pool.New = func() any { return &hedgeRun{done: make(chan struct{}, 1)} }
	return h
}

// delay is the wait before a hedge now; false: no hedge (too few samples).
func (h *hedger) delay(lat *latency.Tracker) (time.Duration, bool) {
	if h.fixed > 0 {
		return h.fixed, true
	}
	q, ok := lat.Quantile()
	return max(q, h.minDelay), ok
}

// hedgeRun is the first round of one hedged call: the first attempt, sent
// on the caller's goroutine, and the hedges its timer sends beside it.
// When no hedge fires it is reused through the hedger's pool, so the round
// allocates nothing.
type hedgeRun struct {
	r     *retryLayer
	req   *http.Request // the caller's
	first *http.Request // what replay copies
	c     call
	delay time.Duration

	mu       sync.Mutex
	closed   bool // the first attempt returned: no more hedges
	launched int  // hedges sent
	pending  int  // attempts under way
	won      bool
	winner   int // 0: the first attempt, i: hedge i
	final    bool
	resp     *http.Response // the winner's, or the best failure so far
	err      error
	reached  bool // resp/err came from the host
	// panicked is what a hedge's attempt panicked with, on the timer's
	// goroutine: the caller panics with it once the round is over, as it
	// would had its own attempt panicked.
	panicked any
	slots    [1 + maxHedgesLimit]attemptSlot
	done     chan struct{} // receives once final is set
}

// hedged runs a call's first round and returns its outcome and how many
// attempts it sent.
func (r *retryLayer) hedged(first *http.Request, req *http.Request, c call) (*http.Response, int, error) {
	h := r.hedge
	d, ok := h.delay(r.lat)
	if !ok {
		resp, err := r.next.roundTrip(first, c)
		r.record(classify(resp, err), c.start)
		return resp, 1, err
	}
	run := h.pool.Get().(*hedgeRun)
	run.r, run.req, run.first, run.c, run.delay = r, req, first, c, d
	run.pending = 1
	run.slots[0].run, run.slots[0].delay = run, d
	c.slot = &run.slots[0]
	resp, err := r.next.roundTrip(first, c)
	r.record(classify(resp, err), c.start)
	run.mu.Lock()
	run.closed = true
	if run.launched == 0 {
		run.mu.Unlock()
		if run.slots[0].arm.Load() != slotTaken {
			// The attempt's timer never sent the hedge, and never will
			// (the attempt layer disarmed it): nothing else saw run.
			run.reset()
			h.pool.Put(run)
		}
		// Else the timer found the round closed, or is about to; run is
		// left to the collector.
		return resp, 1, err
	}
	run.mu.Unlock()
	run.finish(0, resp, err)
	<-run.done
	run.mu.Lock()
	if p := run.panicked; p != nil {
		resp := run.resp
		run.mu.Unlock()
		discard(resp)
		panic(p)
	}
	resp, err, n := run.resp, run.err, 1+run.launched
	if run.won && run.winner > 0 {
		h.won.Add(1)
		run.mu.Unlock()
		r.e.rep.hedge(req.Context(), "won")
	} else {
		run.mu.Unlock()
	}
	return resp, n, err
}

// reset readies a round no hedge touched for the pool. Field by field:
// the struct holds locks.
func (run *hedgeRun) reset() {
	run.r, run.req, run.first, run.c, run.delay = nil, nil, nil, call{}, 0
	run.closed, run.launched, run.pending, run.won, run.winner, run.final = false, 0, 0, false, 0, false
	run.resp, run.err, run.reached = nil, nil, false
	s := &run.slots[0]
	s.cancel, s.stopped, s.run, s.delay = nil, false, nil, 0
	s.arm.Store(slotIdle)
}

// fire is the work of an attempt's timer at the hedge delay: send a hedge
// if the round is still open and nothing forbids it. The hedge's own
// attempt timer sends the next, if MaxHedges allows.
func (run *hedgeRun) fire() {
	r, h := run.r, run.r.hedge
	ctx := run.req.Context()
	// All under the lock, so that the caller, once it has closed the
	// round, knows no hedge's body or budget token is still being taken.
	run.mu.Lock()
	if run.closed || run.won {
		run.mu.Unlock()
		return
	}
	if why := r.hedgeBlocked(run.req, run.c); why != skipNone {
		run.mu.Unlock()
		h.skipped[why].Add(1)
		r.e.rep.hedge(ctx, skipLabels[why])
		return
	}
	next, err := replay(run.first)
	if err != nil {
		run.mu.Unlock()
		return
	}
	run.launched++
	run.pending++
	i := run.launched
	run.mu.Unlock()
	h.sent.Add(1)
	r.e.rep.hedge(ctx, "sent")
	c := run.c
	c.attempt = run.c.attempt + i
	c.slot = &run.slots[i]
	if i < h.max {
		c.slot.run, c.slot.delay = run, run.delay
	}
	c.hedge = true
	start := time.Now()
	c.sent = start
	resp, p, err := sendRecovering(r.next, next, c)
	if p != nil {
		run.mu.Lock()
		if run.panicked == nil {
			run.panicked = p
		}
		run.mu.Unlock()
	}
	r.record(classify(resp, err), start)
	run.finish(i, resp, err)
}

// errHedgePanicked is a hedge attempt's outcome when the layer below it
// panicked; the panic itself goes to the caller (hedgeRun.panicked).
var errHedgePanicked = errors.New("bulwark: a hedge attempt panicked")

// sendRecovering sends one hedge attempt on the timer's goroutine, where a
// panic would take the process down: it returns the panic's value instead,
// the layers below having released what they held on the way out.
func sendRecovering(next layer, req *http.Request, c call) (resp *http.Response, p any, err error) {
	defer func() {
		if v := recover(); v != nil {
			resp, p, err = nil, v, errHedgePanicked
		}
	}()
	resp, err = next.roundTrip(req, c)
	return resp, nil, err
}

// finish takes attempt i's outcome: the first answer not worth retrying
// wins and the others are stopped; a loser's answer is drained and closed.
func (run *hedgeRun) finish(i int, resp *http.Response, err error) {
	j := run.c.judge(resp, err)
	var drop *http.Response
	var stop bool
	run.mu.Lock()
	run.pending--
	switch {
	case run.won:
		drop = resp
	case reached(j.k) && !j.v.Retryable:
		run.won, run.winner = true, i
		drop, run.resp, run.err, run.reached = run.resp, resp, err, true
		stop = true
	case reached(j.k) || (run.resp == nil && run.err == nil):
		// A failure from the host beats a refusal by a layer below.
		drop, run.resp, run.err, run.reached = run.resp, resp, err, reached(j.k)
	default:
		drop = resp
	}
	// The round ends when every attempt has returned, the winner's and
	// the cancelled losers' alike: so every request body is closed and
	// every bulkhead slot a loser held is free when RoundTrip returns, as
	// the RoundTripper contract wants. A loser, once cancelled, returns at
	// once from any base that honours its context.
	signal := !run.final && run.closed && run.pending == 0
	if signal {
		run.final = true
	}
	n := run.launched
	run.mu.Unlock()
	if stop {
		for j := 0; j <= n; j++ {
			if j != i {
				run.slots[j].stop()
			}
		}
	}
	discard(drop)
	if signal {
		run.done <- struct{}{}
	}
}

// hedgeBlocked is why a hedge may not be sent now, or skipNone. The budget
// is asked last, so that no token is spent on a hedge another check
// refuses.
func (r *retryLayer) hedgeBlocked(req *http.Request, c call) uint8 {
	h := r.hedge
	now := time.Now()
	switch {
	case h.breaker != nil && h.breaker.open():
		return skipBreaker
	case r.pause != nil && r.pause.pausedUntil(req).After(now):
		return skipPushback
	case h.bulkhead != nil && h.bulkhead.isFull():
		return skipBulkhead
	case h.throttle != nil && h.throttle.shedding():
		return skipThrottle
	}
	if dl, ok := c.deadline(req); ok && now.Add(r.sendTime()).After(dl) {
		return skipDeadline
	}
	if r.budget != nil && !r.budget.withdraw(now) {
		return skipBudget
	}
	return skipNone
}

// sendTime is the least time an attempt needs: the host's median latency,
// or minSendTime while it is unknown or shorter.
func (r *retryLayer) sendTime() time.Duration {
	if r.lat != nil {
		if m, ok := r.lat.Median(); ok && m > minSendTime {
			return m
		}
	}
	return minSendTime
}

// tailTime is the time a retry's wait leaves it to answer in: the host's
// recent p99 latency, or sendTime when that is longer or unknown.
func (r *retryLayer) tailTime() time.Duration {
	if r.lat != nil {
		if q, ok := r.lat.Quantile(); ok {
			return max(q, r.sendTime())
		}
	}
	return r.sendTime()
}

// record adds an attempt's latency to the host's tracker, when its outcome
// says how long the host takes: an answer or a failure from the host, not a
// refusal by bulwark nor a cancellation (whose time is the canceller's).
func (r *retryLayer) record(k kind, start time.Time) {
	if r.lat == nil || !reached(k) || k == kindCanceled || k == kindDeadline || !r.lat.Want() {
		return
	}
	now := time.Now()
	r.lat.Record(now.Sub(start), now)
}

// LatencySnapshot is a host's recent latency, as the retry layer measures
// it for the hedge delay and for the deadline a retry must fit: each
// attempt the host answered or failed, from its sending to its response
// headers or its error (a refusal of bulwark's or a cancellation is not
// the host's time), over the last 5 to 10 seconds, one attempt in eight
// once a period holds a thousand. Unlike LearnedSnapshot's healthy
// latency, failures and timeouts are in it: it is how long callers wait
// now.
type LatencySnapshot struct {
	// Samples is how many attempts the quantiles rest on.
	Samples int64
	// P50, P99 and P999 are the median, the 99th and the 99.9th
	// percentiles, within 1 %; zero below 20 samples.
	P50, P99, P999 time.Duration
}

// latency is the retry layer's piece of Snapshot for the host's recent
// latency; nil while nothing was recorded in its window.
func (r *retryLayer) latency(now time.Time) *LatencySnapshot {
	if r.lat == nil {
		return nil
	}
	qs, n := r.lat.Quantiles(now, 0.5, 0.99, 0.999)
	if n == 0 {
		return nil
	}
	return &LatencySnapshot{Samples: n, P50: qs[0], P99: qs[1], P999: qs[2]}
}

func (h *hedger) snapshot(lat *latency.Tracker) *HedgeSnapshot {
	s := &HedgeSnapshot{Sent: h.sent.Load(), Won: h.won.Load(), Skipped: HedgeSkips{
		Budget:   h.skipped[skipBudget].Load(),
		Deadline: h.skipped[skipDeadline].Load(),
		Breaker:  h.skipped[skipBreaker].Load(),
		Pushback: h.skipped[skipPushback].Load(),
		Bulkhead: h.skipped[skipBulkhead].Load(),
		Throttle: h.skipped[skipThrottle].Load(),
	}}
	if d, ok := h.delay(lat); ok {
		s.Delay = d
	}
	return s
}
