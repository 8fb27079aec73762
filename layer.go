package bulwark

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bulwark-http/bulwark/internal/learn"
)

// layer is one layer of a host's stack. Every layer of bulwark implements
// it, and each wraps the next; the router, the Transport, is the one
// http.RoundTripper the caller sees. A layer gets the call's state as an
// argument instead of from the request's context, so the caller's request
// travels down unchanged to the attempt layer, which makes the one copy an
// attempt needs.
type layer interface {
	roundTrip(req *http.Request, c call) (*http.Response, error)
}

// call is what the layers of one call share, handed down by value: the
// bound Timeout.Total set, the number of the attempt under way, the
// instances it was sent to, the attempt's handle, and how outcomes are
// judged. Its types are declared here, beside it, so that the layers that
// fill it in and the layers that read it need not know each other.
type call struct {
	// start is when the call began, read once by the router: the total
	// deadline counts from it and the retry budget counts the call at it.
	start time.Time
	// total is when Timeout.Total ends, zero when the call has no such
	// bound of bulwark's or the caller's deadline comes first. A layer that
	// waits (retry backoff, bulkhead queue, rate limit) never waits past it.
	total time.Time
	// attempt is the number of the attempt being sent, from 1, set by the
	// retry layer; zero when no retry layer runs.
	attempt int
	// above is what the request's headers say of a retrying client above
	// bulwark (sdk.go), read once by the router: a request that client
	// will send again is sent once here, and bounded by bulwark's
	// Timeout only where the policy sets it.
	above above
	// sent is when the retry layer sent this attempt: start for the first
	// (nothing waits before it, unless its body was buffered), a clock
	// reading for a later one or a hedge; zero when no retry layer runs. A layer below that times the
	// attempt and does not wait itself reads it instead of the clock.
	sent time.Time
	// ownHeader reports that req.Header is this attempt's private copy,
	// made by the attempt layer, so a layer below may add to it in place.
	ownHeader bool
	// tried is the balancer's record of the instances this call was sent
	// to; nil unless the host is balanced (the retry layer makes it).
	tried *triedSet
	// slot, when not nil, is where the attempt layer leaves the cancel of
	// the attempt's context, so that the retry layer can end a hedge's
	// loser; hedge marks an attempt sent beside another (its span says so).
	slot  *attemptSlot
	hedge bool
	// classify is the call's policy's Policy.Classify, set by the router;
	// nil is DefaultClassify. It travels with the call rather than with a
	// layer, so that every layer the call passes through judges it alike,
	// a host's shared ones (balancer, bulkhead) under a route's policy
	// included, and so that a layer Update keeps whole judges the calls of
	// the new stack by the new policy.
	classify Classifier
	// sendAt, when not nil, is where the attempt layer notes when it sent
	// the attempt, past the bulkhead's queue: the breaker times a slow
	// call from there, since a wait in bulwark's own queue says nothing of
	// the host.
	sendAt *sendClock
	// below, when not nil, holds the notes the retry layer makes for the
	// incoming request's CallRecord until the fallback layer above knows
	// whether it answered for the call: a failure a fallback answered is
	// not the service's failure from below (see noteBelow).
	below *heldNotes
	// via, when not nil, sends each attempt in place of the base
	// (Transport.RoundTripVia).
	via http.RoundTripper
}

// heldNotes is one call's notes for a CallRecord, held by the fallback
// layer; it takes one from heldNotesPool for each call and puts it back
// when the call returns. Only the call's own goroutine writes it (the
// retry loop), so it needs no atomic.
type heldNotes struct{ what uint32 }

var heldNotesPool = sync.Pool{New: func() any { return new(heldNotes) }}

// noteBelow notes what, a failure the tier below dealt with, for the
// incoming request's CallRecord that ctx carries: held for the fallback
// layer when the call has one, at once otherwise.
func (c call) noteBelow(ctx context.Context, what uint32) {
	if c.below != nil {
		c.below.what |= what
		return
	}
	noteBelow(ctx, what)
}

// sendClock is one attempt's send time, as call.sendAt carries it. The
// breaker takes one from sendClocks for each attempt and puts it back when
// the attempt returns, so that timing costs no allocation.
type sendClock struct{ at time.Time }

var sendClocks = sync.Pool{New: func() any { return new(sendClock) }}

// judge is what the call's classifier makes of an outcome: every layer
// that judges one asks here.
func (c call) judge(resp *http.Response, err error) judged {
	return judge(c.classify, resp, err)
}

// minSendTime is the least time left for which a request is still sent.
// Below it the answer would arrive after the caller stopped waiting, so the
// attempt fails at once with ErrDeadlineTooShort instead of loading the
// upstream with work nobody will read.
const minSendTime = 10 * time.Millisecond

// deadline is the instant the call must be over by: the sooner of the
// request context's deadline and Total's.
func (c call) deadline(req *http.Request) (time.Time, bool) {
	d, ok := req.Context().Deadline()
	return c.end(d, ok)
}

// end is deadline for a request whose context's deadline is d (if ok),
// read already.
func (c call) end(d time.Time, ok bool) (time.Time, bool) {
	if !c.total.IsZero() && (!ok || c.total.Before(d)) {
		return c.total, true
	}
	return d, ok
}

// attemptSlot is one attempt's handle, made by the retry layer when it
// hedges and filled in by the attempt layer: it holds the cancel of the
// attempt's context, so that a hedge's loser can be ended whichever
// goroutine runs it (a stop that comes first is applied as soon as the
// cancel arrives), and it lets the attempt's one timer send the hedge.
type attemptSlot struct {
	mu      sync.Mutex
	cancel  context.CancelCauseFunc
	stopped bool
	// The hedge this attempt's timer sends after delay (zero: none), and
	// whether it did: arm is slotIdle until the attempt layer arms it,
	// then taken by the timer or disarmed by the attempt's answer,
	// whichever comes first. The retry layer's hedger is the firer; the
	// attempt layer knows it only as that.
	run   firer
	delay time.Duration
	arm   atomic.Uint32
}

// The states of attemptSlot.arm.
const (
	slotIdle uint32 = iota
	slotArmed
	slotTaken
	slotDisarmed
)

func (s *attemptSlot) set(cancel context.CancelCauseFunc) {
	s.mu.Lock()
	stopped := s.stopped
	s.cancel = cancel
	s.mu.Unlock()
	if stopped {
		cancel(errHedgeLost)
	}
}

func (s *attemptSlot) stop() {
	s.mu.Lock()
	s.stopped = true
	cancel := s.cancel
	s.mu.Unlock()
	if cancel != nil {
		cancel(errHedgeLost)
	}
}

// errHedgeLost is the cause a losing attempt is cancelled with. It wraps
// context.Canceled, so the one classification reads the loser's outcome as
// a cancellation: ignored by the breaker and the balancer, neither a
// failure nor a slow call.
var errHedgeLost error = &wrapError{msg: "bulwark: hedge lost to another attempt", err: context.Canceled}

// firer sends the hedge an attempt's timer is armed for.
type firer interface{ fire() }

// maxTried is how many instances a call remembers having tried; a retry
// avoids them. Four covers the default three attempts with room to spare;
// past it the oldest is forgotten.
const maxTried = 4

// triedSet is the instances one call was sent to, so that a retry goes to
// another one: the last maxTried of them.
type triedSet struct {
	mu  sync.Mutex // hedges of one call pick concurrently
	ids [maxTried]uint32
	n   uint8
}

func (t *triedSet) lock() {
	if t != nil {
		t.mu.Lock()
	}
}

func (t *triedSet) unlock() {
	if t != nil {
		t.mu.Unlock()
	}
}

// has reports whether the call already sent to instance id. t may be nil.
func (t *triedSet) has(id uint32) bool {
	if t == nil {
		return false
	}
	for i := 0; i < min(int(t.n), maxTried); i++ {
		if t.ids[i] == id {
			return true
		}
	}
	return false
}

// mark records a send to instance id. t may be nil.
func (t *triedSet) mark(id uint32) {
	if t == nil {
		return
	}
	t.ids[int(t.n)%maxTried] = id
	if t.n < 255 {
		t.n++
	}
}

// env is what a layer knows of the host it serves: its name and upstream
// label for errors and logs, and the reporter its observations go to. Time
// is time.Now for every layer (tests run in testing/synctest bubbles), so
// that gobreaker's clock and ours are one.
type env struct {
	host     string // "host:port", lower-case, port always present
	scheme   string
	upstream string    // the Upstreams key, or "default"
	rep      *reporter // never nil
	// learned is the host's healthy latency, which the attempt deadline
	// and the breaker learn their bounds from; nil: nothing is learned.
	learned *learned
	// deadlines counts the host's attempts refused for too little time
	// left and abandoned (attemptLayer); nil: not counted.
	deadlines *deadlineCounts
	// passedUp counts the host's answers that pass a failure up from
	// below (NoRetryFromBelow), which no layer counts against it: the
	// attempt span's layer counts each attempt's; nil: not counted.
	passedUp *atomic.Uint64
}

// deadlineCounts is what a host's attempt deadlines did (attemptLayer),
// for its snapshot.
type deadlineCounts struct {
	tooShort  atomic.Uint64 // refused: too little time left (ErrDeadlineTooShort)
	abandoned atomic.Uint64 // left behind at their deadline, the base still running
}

// baseLayer adapts the base http.RoundTripper, and holds it to the
// contract that the layers above rely on: a response or an error, never
// both, never neither.
type baseLayer struct{ rt http.RoundTripper }

func (b baseLayer) roundTrip(req *http.Request, c call) (*http.Response, error) {
	rt := b.rt
	if c.via != nil {
		rt = c.via
	}
	if req.Body != nil && req.Body != http.NoBody {
		// The attempt's own copy, so that a failure to read the body is
		// known for the request's fault by its type (sendBody).
		r2 := *req
		r2.Body = sendBody{req.Body}
		req = &r2
	}
	resp, err := rt.RoundTrip(req)
	switch {
	case err != nil:
		// Both: the error wins, as in net/http's Client; the response is
		// closed so that its connection is not stranded.
		if resp != nil && resp.Body != nil {
			_ = resp.Body.Close()
		}
		return nil, err
	case resp == nil:
		return nil, errNilResponse
	case resp.Body == nil:
		// As net/http's Client does, so that every layer above has a body
		// to hang its end-of-body work on.
		resp.Body = http.NoBody
	}
	return resp, nil
}

// The learned bounds. A bound the policy sets (Timeout.Attempt,
// Breaker.SlowCall) is obeyed as set; a zero one follows the host's
// healthy p99.9 (internal/learn: the successes' latency to response
// headers, moving at most ×2 per 5 minutes), clamped between
// learnedFloor and the static default, which also serves while fewer
// than learn.MinSamples successes have been seen.
const (
	// attemptFactor × the healthy p99.9 is a first attempt's learned
	// timeout, a safety factor as LogDevice's adaptive timeouts use.
	attemptFactor = 3
	// slowFactor × the healthy p99.9 is the learned slow-call threshold:
	// below the timeout, so that a host twice as slow as its worst healthy
	// answers is slow before it times out.
	slowFactor = 2
	// learnedFloor is the least learned timeout or threshold: below it a
	// pause of the caller's own (a GC, a new connection's handshake) would
	// time out a healthy host.
	learnedFloor = 50 * time.Millisecond
	// learnedCeiling is the package default attempt timeout,
	// attemptCeiling (TestLearnedBounds holds them equal; this
	// file may not name the layers' constants): the most a learned timeout
	// is with the package defaults, and the most the breaker's learned
	// hold (failingFor) is.
	learnedCeiling = 10 * time.Second
)

// learned is a host's healthy latency, shared by the layers that derive a
// bound from it (the attempt deadline, the breaker's slow calls), so that
// both follow one baseline; it is the host's, kept across Transport.Update
// as the measurement it is.
type learned struct {
	est *learn.Estimator
	// rep, set by each build of the host's stack, gets the log line of a
	// change by more than 2×; logged is the baseline it last reported.
	rep    atomic.Pointer[reporter]
	logged atomic.Int64
}

func newLearned(rep *reporter) *learned {
	l := &learned{est: learn.New(time.Now())}
	l.rep.Store(rep)
	return l
}

// record takes the outcome of an attempt sent at start, when the call's
// classifier calls it a success: an ignored outcome (the caller's cancel,
// a hedge's loser) or a failure says nothing about healthy latency. l may
// be nil.
func (l *learned) record(c call, start time.Time, resp *http.Response, err error) {
	if l == nil || !l.est.Want() || c.judge(resp, err).v.Outcome != OutcomeSuccess {
		return
	}
	now := time.Now()
	if !l.est.Record(now.Sub(start), now) {
		return
	}
	b, ok := l.est.Baseline()
	old := time.Duration(l.logged.Load())
	if !ok || old != 0 && b <= 2*old && old <= 2*b {
		return
	}
	if l.logged.CompareAndSwap(int64(old), int64(b)) {
		if rep := l.rep.Load(); rep != nil {
			rep.learnedChanged(old, b)
		}
	}
}

// timeout is the attempt-th attempt's learned timeout (attempt from 1; 0,
// when no retry layer numbers them, counts as 1), and whether it is
// learned: attemptFactor × the baseline, doubled for each attempt before
// it, within [learnedFloor, ceiling]. ceiling (the static default) while
// there is no baseline; l may be nil.
func (l *learned) timeout(attempt int, ceiling time.Duration) (time.Duration, bool) {
	if l == nil {
		return ceiling, false
	}
	b, ok := l.est.Baseline()
	if !ok {
		return ceiling, false
	}
	d := max(attemptFactor*b, learnedFloor)
	for i := 1; i < attempt && d < ceiling; i++ {
		d *= 2
	}
	return min(d, ceiling), true
}

// failingFor is the hold: how long a run of failed attempts must last
// before Breaker.ConsecutiveFailures counts it, and how long a rate rule
// must hold before a learned breaker trips on it. It is the third
// attempt's learned timeout (at most learnedCeiling), so the host has
// answered nothing in time for as long as a call's longest attempt waits;
// zero without a baseline. l may be nil.
// See docs/design.md, "Learned bounds".
func (l *learned) failingFor() time.Duration {
	if l == nil {
		return 0
	}
	b, ok := l.est.Baseline()
	if !ok {
		return 0
	}
	return min(4*max(attemptFactor*b, learnedFloor), learnedCeiling)
}

// slowCall is the learned slow-call threshold, within [learnedFloor,
// ceiling], and whether it is learned; ceiling while there is no baseline.
// l may be nil.
func (l *learned) slowCall(ceiling time.Duration) (time.Duration, bool) {
	if l == nil {
		return ceiling, false
	}
	b, ok := l.est.Baseline()
	if !ok {
		return ceiling, false
	}
	return min(max(slowFactor*b, learnedFloor), ceiling), true
}

// Where a bound in force comes from, as LearnedSnapshot says it.
const (
	FromSet       = "set"
	FromLearned   = "learned"
	FromColdStart = "cold start"
)

// LearnedSnapshot is what bulwark has learned of a host's healthy latency,
// and the bounds in force that follow from it.
type LearnedSnapshot struct {
	// Samples is how many healthy attempts the window (the last five to
	// ten minutes) held at its last reading; thinned to one in eight on a
	// busy host.
	Samples int64
	// HealthyP50 and HealthyP999 are the median and the p99.9 of those
	// attempts' latency to response headers; zero below 200 samples.
	HealthyP50, HealthyP999 time.Duration
	// Baseline is the p99.9 the bounds are learned from: it follows
	// HealthyP999 by at most ×2 per 5 minutes, so that an incident does
	// not teach it that slow is normal. Zero until learned.
	Baseline time.Duration
	// AttemptTimeout is a first attempt's timeout in force (a retry's
	// doubles, up to the static default), and AttemptFrom where it comes
	// from: FromSet (Timeout.Attempt), FromLearned, or FromColdStart (too
	// few samples yet: the static default); zero and empty when the
	// Timeout policy is disabled.
	AttemptTimeout time.Duration
	AttemptFrom    string
	// SlowCall is the breaker's slow-call threshold in force, and
	// SlowCallFrom where it comes from, as AttemptFrom; zero and empty
	// when the breaker is off.
	SlowCall     time.Duration
	SlowCallFrom string
}

// snapshot reads l under the host's bounds: attempt and slow are the
// policy's values, each learned or set as its flag says (attempt ≤ 0: no
// deadline layer; slow ≤ 0: no breaker).
func (l *learned) snapshot(attempt time.Duration, learnAttempt bool, slow time.Duration, learnSlow bool) *LearnedSnapshot {
	s := &LearnedSnapshot{}
	s.HealthyP50, s.HealthyP999, s.Samples = l.est.Window()
	s.Baseline, _ = l.est.Baseline()
	if attempt > 0 {
		s.AttemptTimeout, s.AttemptFrom = attempt, FromSet
	}
	if attempt > 0 && learnAttempt {
		s.AttemptFrom = FromColdStart
		if d, ok := l.timeout(1, attempt); ok {
			s.AttemptTimeout, s.AttemptFrom = d, FromLearned
		}
	}
	if slow > 0 {
		s.SlowCall, s.SlowCallFrom = slow, FromSet
		if learnSlow {
			s.SlowCallFrom = FromColdStart
			if d, ok := l.slowCall(slow); ok {
				s.SlowCall, s.SlowCallFrom = d, FromLearned
			}
		}
	}
	return s
}

// shower is a layer with a piece of Snapshot to show: it hands each piece
// (one of its own snapshot types) to put, which files it in its field of
// the host's or route's snapshot. Layers know nothing of HostSnapshot, and
// HostSnapshot nothing of layers.
type shower interface{ show(put func(piece any)) }
