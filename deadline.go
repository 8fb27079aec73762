package bulwark

import (
	"cmp"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// NoDeadlineHeader, as Timeout.Header, turns deadline propagation off for
// an upstream: neither the deadline header nor AttemptHeader is sent, which
// suits third-party APIs. The deadlines themselves still apply.
const NoDeadlineHeader = "-"

// DefaultTotalTimeout is Timeout.Total's package default. A timeout is a
// capacity decision: this is a generous bound.
const DefaultTotalTimeout = 30 * time.Second

// attemptCeiling is the most an attempt timeout bulwark learns from a host
// may be (see Timeout.Attempt), and the timeout while it has not learned
// one yet.
const attemptCeiling = 10 * time.Second

// deadlineMargin is taken off the time left before it is written into the
// deadline header: the response still has to travel back, so the server
// should give up slightly before the client does.
const deadlineMargin = 5 * time.Millisecond

// Timeout bounds how long a call and each of its attempts may take, and
// names the header that tells the upstream how long it has.
//
// What a drop-in for http.DefaultClient should not do is cut a long,
// healthy response: a body streamed for a minute is read whole with the
// package defaults. So Attempt bounds the wait for response headers, and
// BodyIdle the wait of any one read of the body; the body as a whole is
// bounded only by a Total set explicitly (in this policy or in Default) and
// by the caller's context. A read cut by one of them fails with an error
// that matches ErrAttemptTimeout or ErrTotalTimeout.
type Timeout struct {
	// Total bounds the whole call: every attempt and every wait between
	// them. Zero inherits from Default, then DefaultTotalTimeout, which
	// bounds the call until its final response headers; a Total set here
	// or in Default bounds the reading of the final body too, like
	// http.Client.Timeout. A caller's context deadline that comes sooner
	// wins. The default does not bound a request that a retrying client
	// above marks (see Attempt) when its context carries a deadline (that
	// client's timeout); one without a deadline keeps the default, so a
	// hung host is still cut off beneath an SDK that sets no timeout. A
	// Total set bounds every request.
	Total time.Duration

	// Attempt bounds one attempt, from sending until its response headers
	// arrive. It may not exceed Total. Zero inherits from Default, then
	// means learned: each host's timeout follows its own healthy latency,
	// as TCP's retransmission timer follows the round trip (RFC 6298).
	//
	// The learned bounds: a host's baseline is the p99.9 of the attempts
	// Policy.Classify called a success, over the current and the previous
	// five-minute period, taken at the 200th success and every 32nd after,
	// and moving by at most ×2 per five minutes. A first attempt's timeout
	// is 3 × the baseline, at least 50 ms, at most 10 s and
	// Total; each retry doubles it up to the same ceiling; before the 200th
	// success it is the ceiling. The p99.9 is read to within 1/16 (16
	// histogram buckets per doubling). HostSnapshot.Learned shows it. It
	// does not bound a request that a retrying client above marks (see
	// AttemptHeader): that client bounds it. A set Attempt is obeyed as set
	// (the baseline is still learned, for Breaker.SlowCall), and one below
	// 10 ms is still sent. See docs/design.md, "Learned bounds".
	Attempt time.Duration

	// BodyIdle bounds how long one read of a response body may wait for a
	// byte, so a stalled stream fails instead of holding its caller, its
	// connection and its bulkhead slot for good. Zero inherits from Default,
	// then the policy's Attempt; a negative value means no bound.
	BodyIdle time.Duration

	// Header is the request header that carries the time left, in
	// milliseconds: the smaller of the context deadline, Total's deadline and
	// Attempt, less a 5 ms margin, recomputed for every attempt.
	// NoDeadlineHeader sends no deadline header and no AttemptHeader. Empty
	// inherits from Default, then DefaultDeadlineHeader.
	// server.DeadlineHandler reads it on the server side.
	Header string

	// Disabled turns off both deadline layers for this upstream: no timeout
	// beyond the caller's context and no deadline header. An upstream
	// inherits Disabled from Default unless it sets Enabled.
	Disabled bool

	// Enabled turns the deadline layers back on for an upstream whose
	// Default set Disabled. Setting both is an error.
	Enabled bool

	// totalSet records that Total was given, not defaulted: only then does
	// it bound the body.
	totalSet bool
	// learn records that Attempt was not given: then Attempt is the
	// ceiling of the learned timeout.
	learn bool
}

func (t Timeout) inherit(parent Timeout) Timeout {
	t.Total = cmp.Or(t.Total, parent.Total)
	t.Attempt = cmp.Or(t.Attempt, parent.Attempt)
	t.BodyIdle = cmp.Or(t.BodyIdle, parent.BodyIdle)
	t.Header = cmp.Or(t.Header, parent.Header)
	t.Disabled = inheritOff(t.Disabled, t.Enabled, parent.Disabled)
	return t
}

func (t Timeout) validate() error {
	switch {
	case t.Total < 0:
		return fieldError("Timeout.Total", t.Total, "must be ≥ 0")
	case t.Attempt < 0:
		return fieldError("Timeout.Attempt", t.Attempt, "must be ≥ 0")
	case t.Total > 0 && t.Attempt > t.Total:
		return fieldError("Timeout.Attempt", t.Attempt, "must not exceed Timeout.Total ("+t.Total.String()+")")
	case t.Header != "" && t.Header != NoDeadlineHeader && !validHeaderName(t.Header):
		return fieldError("Timeout.Header", strconv.Quote(t.Header), "not a valid header name")
	}
	return nil
}

func (t Timeout) withDefaults() Timeout {
	t.totalSet = t.Total > 0
	t.learn = t.Attempt == 0
	t.Total = cmp.Or(t.Total, DefaultTotalTimeout)
	t.Attempt = cmp.Or(t.Attempt, min(attemptCeiling, t.Total))
	t.BodyIdle = cmp.Or(t.BodyIdle, t.Attempt)
	t.Header = cmp.Or(t.Header, DefaultDeadlineHeader)
	if t.Header != NoDeadlineHeader {
		t.Header = http.CanonicalHeaderKey(t.Header)
	}
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

// totalLayer starts the clock on Timeout.Total. It sets no timer of its
// own: the bound goes in the call state, every attempt's context is bounded
// by it (attemptLayer) and so is every wait between attempts.
type totalLayer struct {
	next  layer
	total time.Duration
	set   bool // Total was given, not the default
}

func (d *totalLayer) roundTrip(req *http.Request, c call) (*http.Response, error) {
	if c.above != aboveNone && !d.set {
		// A call that a retrying client above sends again, with a
		// deadline of that client's, is that client's to bound (sdk.go).
		// Without one it keeps the default: a header anyone can send
		// must not lift the bound on a hung host.
		if _, ok := req.Context().Deadline(); ok {
			return d.next.roundTrip(req, c)
		}
	}
	end := c.start.Add(d.total)
	if cd, ok := req.Context().Deadline(); !ok || end.Before(cd) {
		// Else the caller's deadline comes first: nothing to add.
		c.total = end
	}
	return d.next.roundTrip(req, c)
}

// attemptLayer is the innermost of bulwark's deadline work: it bounds one
// attempt's wait for headers by the sooner of Total's end and Attempt,
// bounds each read of its body, refuses to send when too little time is
// left, and writes the per-attempt headers (time left and attempt number)
// on the attempt's copy of the request.
type attemptLayer struct {
	next      layer
	attempt   time.Duration
	attemptMs string        // deadlineValue(attempt), the usual first attempt's header value
	idle      time.Duration // ≤ 0: reads are not bounded
	bodyTotal bool          // Total bounds the body (it was set explicitly)
	header    string        // empty: no per-attempt headers
	rep       *reporter
	// learned is the host's healthy latency: every attempt's success is
	// recorded in it, and, when learn is set (Attempt was not), the
	// attempt's bound is learned from it, attempt being its ceiling.
	learned *learned
	learn   bool
	// learnedMs caches the deadline header's value for the learned first
	// attempt's timeout, which changes far less often than calls come.
	learnedMs atomic.Pointer[headerValue]
	// counts are the host's (env.deadlines): refusals for too little time
	// left, attempts abandoned; nil: not counted.
	counts *deadlineCounts
	// abandon runs each attempt in a goroutine of its own, which the
	// caller leaves behind at the attempt's deadline (Config.BaseIgnoresContext).
	abandon bool
}

// headerValue is a deadline header's value for a time left of left.
type headerValue struct {
	left time.Duration
	ms   string
}

func newAttemptLayer(next layer, t Timeout, rep *reporter, l *learned) *attemptLayer {
	a := &attemptLayer{next: next, attempt: t.Attempt, idle: t.BodyIdle, bodyTotal: t.totalSet, rep: rep, learned: l, learn: t.learn && l != nil}
	if t.Header != NoDeadlineHeader {
		a.header = t.Header
		a.attemptMs = deadlineValue(t.Attempt)
	}
	return a
}

// deadlineValue is the deadline header's value for a time left of left:
// whole milliseconds, less deadlineMargin for the time the request takes to
// arrive.
func deadlineValue(left time.Duration) string {
	// At least 1: an attempt with less than the margin left (an Attempt
	// set that short) still tells the server a deadline, not a past one.
	return strconv.FormatInt(max(int64((left-deadlineMargin)/time.Millisecond), 1), 10)
}

// unboundedAttempt is an attempt's bound when bulwark sets none of its
// own: longer than any context a caller can mean.
const unboundedAttempt = 100 * 365 * 24 * time.Hour

// The bounds an attempt's timer enforces, as *wrapError so that they fit an
// atomic.Pointer.
var (
	errAttemptTimeout = ErrAttemptTimeout.(*wrapError)
	errTotalTimeout   = ErrTotalTimeout.(*wrapError)
)

func (a *attemptLayer) roundTrip(req *http.Request, c call) (*http.Response, error) {
	ctx := req.Context()
	if err := ctx.Err(); err != nil {
		closeBody(req)
		return nil, doneError(ctx)
	}
	now := time.Now()
	if c.sendAt != nil {
		c.sendAt.at = now
	}
	b, ok := a.bounds(ctx, &c, now)
	if !ok {
		closeBody(req)
		a.rep.rejected(ctx, layerDeadline)
		if a.counts != nil {
			a.counts.tooShort.Add(1)
		}
		return nil, ErrDeadlineTooShort
	}
	r := a.start(ctx, &c, now, &b)
	out, own := a.request(req, r, &c, &b)
	if own {
		c.ownHeader = true
	}
	return a.send(r, out, c, now)
}

// attemptBounds is what bounds one attempt, as attemptLayer.bounds works
// it out.
type attemptBounds struct {
	// bound is the attempt's own: Attempt, or the learned timeout;
	// unbounded marks one bulwark does not set (a retrying client above).
	bound     time.Duration
	unbounded bool
	// ours is when the wait for headers ends: bound's end, or Total's if
	// sooner; limit names which.
	ours  time.Time
	limit *wrapError
	// left is the time to ours, or to the caller's deadline if sooner: the
	// deadline header's value.
	left time.Duration
}

// bounds works out the attempt's bounds at now; ok is false when too
// little time is left to send it at all.
func (a *attemptLayer) bounds(ctx context.Context, c *call, now time.Time) (b attemptBounds, ok bool) {
	b.bound = a.attempt
	if a.learn {
		if c.above != aboveNone {
			// The learned timeout is the timer of bulwark's own retries,
			// as TCP's is of its retransmissions: a call that a client
			// above will send again is bounded by that client (its
			// context) and by what the policy sets, so that a long
			// computation on a host of quick calls is not cut at their
			// p99.9 on each of that client's tries (sdk.go).
			b.bound, b.unbounded = unboundedAttempt, true
		} else {
			b.bound, _ = a.learned.timeout(c.attempt, a.attempt)
		}
	}
	b.ours, b.limit = now.Add(b.bound), errAttemptTimeout
	if !c.total.IsZero() && c.total.Before(b.ours) {
		b.ours, b.limit = c.total, errTotalTimeout
	}
	b.left = b.ours.Sub(now)
	cd, hasCD := ctx.Deadline()
	if hasCD && cd.Before(b.ours) {
		b.left = cd.Sub(now)
	}
	// Too little time is judged against the call's deadline (the
	// caller's, or Total's end), not the attempt's own bound: nobody waits
	// for an answer past the former, while an Attempt set below
	// minSendTime is the policy's choice of a short wait, sent as chosen.
	// Judged by left, such a policy would send nothing at all.
	if end, ok := c.end(cd, hasCD); ok && end.Sub(now) < minSendTime {
		return b, false
	}
	return b, true
}

// start makes the attempt's run: its context, and its one timer, which
// first sends the call's hedge when one is due before the attempt's bound.
func (a *attemptLayer) start(ctx context.Context, c *call, now time.Time, b *attemptBounds) *attemptRun {
	r := &attemptRun{idle: a.idle, parent: ctx}
	if a.bodyTotal {
		r.bodyUntil = c.total
	}
	r.ctx, r.cancel = context.WithCancelCause(ctx)
	r.limit.Store(b.limit)
	wait := b.ours.Sub(now)
	if s := c.slot; s != nil {
		s.set(r.cancel)
		if s.delay > 0 && s.delay < wait {
			// The attempt's one timer first fires at the hedge delay, to
			// send a hedge, then bounds the attempt: no second timer.
			r.hedge, r.until = s, b.ours
			s.arm.Store(slotArmed)
			wait = s.delay
		}
	}
	if r.hedge != nil {
		// Under hmu: a short delay may fire before the assignment.
		r.hmu.Lock()
		r.timer = time.AfterFunc(wait, r.expire)
		r.hmu.Unlock()
	} else {
		r.timer = time.AfterFunc(wait, r.expire)
	}
	return r
}

// request is the attempt's request under its context; own reports that its
// header is the attempt's own copy, with the per-attempt headers written.
func (a *attemptLayer) request(req *http.Request, r *attemptRun, c *call, b *attemptBounds) (out *http.Request, own bool) {
	// No deadline header when the attempt is unbounded: a request a
	// retrying client above marks, with no deadline of its own (sdk.go).
	own = a.header != "" && !(b.unbounded && b.left == b.bound)
	switch {
	case a.abandon:
		// An abandoned attempt's base may read its request after the
		// caller has it back and changes it: a copy of its own, URL and
		// header included (the body is the base's to close, as ever).
		out = req.Clone(r.ctx)
	case own:
		out = req.WithContext(r.ctx)
		out.Header = cloneHeader(req.Header)
	default:
		out = req.WithContext(r.ctx)
	}
	if !own {
		return out, false
	}
	vals := r.vals[:]
	vals[0] = a.deadlineMs(b, c.attempt)
	out.Header[a.header] = vals[0:1:1]
	if c.attempt > 0 && c.above == aboveNone {
		// A client above numbers its own tries (another bulwark's
		// Bulwark-Attempt is kept as it sent it).
		vals[1] = strconv.Itoa(c.attempt)
		out.Header[AttemptHeader] = vals[1:2:2]
	}
	return out, true
}

// deadlineMs is the deadline header's value for attempt number attempt:
// Attempt's, or the learned first attempt's, cached; else worked out.
func (a *attemptLayer) deadlineMs(b *attemptBounds, attempt int) string {
	left := b.left
	if left == a.attempt {
		return a.attemptMs
	}
	if h := a.learnedMs.Load(); h != nil && h.left == left {
		return h.ms
	}
	if left == b.bound && attempt <= 1 {
		h := &headerValue{left: left, ms: deadlineValue(left)}
		a.learnedMs.Store(h)
		return h.ms
	}
	return deadlineValue(left)
}

// send passes the attempt to the layers below (from a goroutine of its own
// when it may be abandoned) and ties the end of its run to its response
// body's.
func (a *attemptLayer) send(r *attemptRun, out *http.Request, c call, now time.Time) (*http.Response, error) {
	returned := false
	defer func() {
		if !returned {
			// The layer below panicked: end the attempt, and let the panic go on.
			r.bodyEnd()
		}
	}()
	var resp *http.Response
	var err error
	if a.abandon {
		resp, err = r.guarded(a.next, out, c)
		if _, ok := err.(*abandonedError); ok && a.counts != nil {
			a.counts.abandoned.Add(1)
		}
	} else {
		resp, err = a.next.roundTrip(out, c)
	}
	returned = true
	r.stopTimer()
	a.learned.record(c, now, resp, err)
	if err != nil {
		err = r.cut(err)
		r.bodyEnd()
		return nil, err
	}
	// The attempt's context must outlive RoundTrip: the body is read under
	// it. It ends when the caller is done with the body.
	if w := onBodyEndIn(resp, r, &r.body); w != nil && (r.idle > 0 || !r.bodyUntil.IsZero()) && w.guard == nil {
		w.guard = r
	}
	return resp, nil
}

// attemptRun is one attempt's context and the one timer that bounds it:
// first the wait for headers, then each read of the body.
type attemptRun struct {
	parent context.Context
	ctx    context.Context
	cancel context.CancelCauseFunc
	timer  *time.Timer
	limit  atomic.Pointer[wrapError] // the bound the timer enforces now
	idle   time.Duration
	// bodyUntil is Total's end when it bounds the body; zero: it does not.
	bodyUntil time.Time
	// The attempt's header values and its response-body wrapper live
	// here, in the attempt's one allocation.
	vals [2]string
	body body
	// hedge, when not nil, is the hedge this attempt's timer sends first,
	// until is then the attempt's bound; hmu orders the timer's re-arming
	// for that bound before the attempt's Stop.
	hedge *attemptSlot
	until time.Time
	hmu   sync.Mutex
}

// expire is the timer's work: end the attempt, naming the bound; or, the
// first time when a hedge is armed, send the hedge and wait for the bound.
func (r *attemptRun) expire() {
	if s := r.hedge; s != nil {
		r.hmu.Lock()
		if s.arm.CompareAndSwap(slotArmed, slotTaken) {
			left := time.Until(r.until)
			if left > 0 {
				r.timer.Reset(left)
			}
			r.hmu.Unlock()
			if left > 0 {
				s.run.fire()
				return
			}
		} else {
			r.hmu.Unlock()
		}
	}
	r.cancel(r.limit.Load())
}

// stopTimer stops the timer once the attempt has its answer, disarming a
// hedge not yet sent.
func (r *attemptRun) stopTimer() {
	if s := r.hedge; s != nil {
		r.hmu.Lock()
		s.arm.CompareAndSwap(slotArmed, slotDisarmed)
		r.timer.Stop()
		r.hmu.Unlock()
		return
	}
	r.timer.Stop()
}

// cut names bulwark's bound in err, when one of ours ended the attempt and
// the caller's own context had not.
func (r *attemptRun) cut(err error) error {
	if r.parent.Err() != nil {
		return err
	}
	if lim, ok := context.Cause(r.ctx).(*wrapError); ok && (lim == errAttemptTimeout || lim == errTotalTimeout) {
		if errors.Is(err, lim) {
			// net/http returns the context's cause itself: it names the
			// bound already.
			return err
		}
		return &timeoutError{limit: lim, cause: err}
	}
	return err
}

// read is one read of the attempt's body under the idle bound (and Total's
// end, when it bounds the body).
func (r *attemptRun) read(rc io.Reader, p []byte) (int, error) {
	d, limit, bounded := r.idle, errAttemptTimeout, r.idle > 0
	if !r.bodyUntil.IsZero() {
		if left := time.Until(r.bodyUntil); !bounded || left < d {
			d, limit = left, errTotalTimeout
		}
	}
	r.limit.Store(limit)
	r.timer.Reset(max(d, 0))
	n, err := rc.Read(p)
	r.timer.Stop()
	if err != nil && err != io.EOF {
		err = r.cut(err)
	}
	return n, err
}

// bodyEnd ends the attempt: when the caller is done with the body, or when
// the attempt failed.
func (r *attemptRun) bodyEnd() {
	r.timer.Stop()
	r.cancel(context.Canceled)
}

// An attempt whose base ignores its context can only be left behind, as
// Hystrix's thread isolation leaves a command to its thread. With
// Config.BaseIgnoresContext the attempt layer runs the layers below in a
// goroutine of their own and returns when the attempt's context ends; the
// goroutine drains and closes the late response and hands back the
// attempt's bulkhead slot, so such a host holds no more slots than its
// bulkhead has.

// The states of lateRun.state.
const (
	lateRunning   uint32 = iota
	lateReturned         // the base returned while the caller waited
	lateAbandoned        // the caller left; the goroutine finishes alone
)

// lateRun is an attempt run in a goroutine of its own (attemptRun.guarded).
type lateRun struct {
	done  chan struct{} // closed when the base returned to a waiting caller
	state atomic.Uint32
	resp  *http.Response
	err   error
	// panicked is a panic of the layers below, handed to the caller.
	panicked any
	// The work to run when an abandoned attempt's base returns at last,
	// as a body's: the layers above add to it (afterReturn).
	mu     sync.Mutex
	over   bool
	enders [maxEnders]bodyEnder
	n      int
}

// guarded sends req through next in a goroutine and waits for its answer
// or for the end of the attempt's context, whichever comes first. In the
// second case the attempt is abandoned: its error is an *abandonedError
// over the context's cause, which the attempt layer names as usual
// (ErrAttemptTimeout, ErrTotalTimeout, the caller's own).
func (r *attemptRun) guarded(next layer, req *http.Request, c call) (*http.Response, error) {
	// Its own allocation rather than a field of attemptRun: the attempts
	// of a base that honours its context should not carry it.
	l := &lateRun{done: make(chan struct{})}
	go l.run(next, req, c)
	select {
	case <-l.done:
	case <-r.ctx.Done():
		if l.state.CompareAndSwap(lateRunning, lateAbandoned) {
			return nil, &abandonedError{err: context.Cause(r.ctx), late: l}
		}
		<-l.done // it returned meanwhile: its answer stands
	}
	if l.panicked != nil {
		panic(l.panicked)
	}
	return l.resp, l.err
}

// errBaseGoexit is an attempt whose goroutine the layers below ended
// with runtime.Goexit.
var errBaseGoexit = errors.New("bulwark: the base ended its goroutine (runtime.Goexit) without an answer")

// run is the attempt's goroutine.
func (l *lateRun) run(next layer, req *http.Request, c call) {
	returned := false
	defer func() {
		if returned {
			return
		}
		// The layers below panicked: a waiting caller gets the panic; an
		// abandoned attempt's goes on here, as any goroutine's would.
		p := recover()
		if l.state.CompareAndSwap(lateRunning, lateReturned) {
			l.panicked = p
			if p == nil {
				// runtime.Goexit below (a test's t.FailNow in its base):
				// no panic to hand over, and never (nil, nil).
				l.err = errBaseGoexit
			}
			close(l.done)
			return
		}
		l.finish()
		panic(p)
	}()
	resp, err := next.roundTrip(req, c)
	returned = true
	l.resp, l.err = resp, err
	if l.state.CompareAndSwap(lateRunning, lateReturned) {
		close(l.done)
		return
	}
	// Nobody will read it: drained and closed, as a discarded response
	// is, so its connection goes back to the pool.
	discard(resp)
	l.finish()
}

// finish runs the work the layers above left for the attempt's return.
func (l *lateRun) finish() {
	l.mu.Lock()
	l.over = true
	n := l.n
	l.mu.Unlock()
	for i := range n {
		l.enders[i].bodyEnd()
		l.enders[i] = nil
	}
}

// afterReturn arranges for e to run once the abandoned attempt's base has
// returned: now, if it has.
func (l *lateRun) afterReturn(e bodyEnder) {
	l.mu.Lock()
	if !l.over && l.n < maxEnders {
		l.enders[l.n] = e
		l.n++
		l.mu.Unlock()
		return
	}
	l.mu.Unlock()
	e.bodyEnd()
}

// abandonedError is an attempt the caller stopped waiting for while its
// base still ran (Config.BaseIgnoresContext). It wraps the cause that
// ended the attempt's context, so errors.Is sees the attempt's timeout;
// a layer above that holds something for the attempt lets it go by
// afterReturn, when the base really returns.
type abandonedError struct {
	err  error
	late *lateRun
}

func (e *abandonedError) Error() string {
	return e.err.Error() + " (attempt abandoned: its base still runs)"
}

func (e *abandonedError) Unwrap() error { return e.err }

func (e *abandonedError) afterReturn(w bodyEnder) { e.late.afterReturn(w) }
