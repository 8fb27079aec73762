package bulwark

import (
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// PushbackError is the error for a request refused, without being sent,
// because its host answered an earlier request with 429 or 503 and a
// Retry-After that has not yet run out: any such answer, or a
// server.Shedder's refusal of the request's priority or a more important
// one (see ShedPriorityHeader). It matches ErrPushback.
type PushbackError struct {
	Host  string    // "host:port"
	Until time.Time // when the host said it will have room again
}

func (e *PushbackError) Error() string {
	return ErrPushback.Error() + ": " + e.Host + " until " + e.Until.UTC().Format(time.RFC3339Nano)
}

// Unwrap returns ErrPushback.
func (e *PushbackError) Unwrap() error { return ErrPushback }

func (e *PushbackError) refusalKind() kind { return kindPushback }

// pushbackLayer pauses a host: a 429 or 503 with a valid Retry-After
// pauses every request to the host until the time the server named, capped
// at Retry.MaxRetryAfter, and so does a response whose rate-limit fields
// say a quota is spent until a reset (fields.go reads them). During the
// pause requests fail at once with a *PushbackError; a request that a
// retrying client above will resend waits the pause out instead, when it
// ends before the call's deadline (waitOut). A Shedder's refusal that names
// its priority (ShedPriorityHeader) pauses only that priority and less
// important ones, each until its own time.
//
// It also sends a priority set with WithPriority upstream as PriorityHeader,
// so that the server's Shedder sees what the client's pushback saw.
type pushbackLayer struct {
	next    layer
	e       env
	max     time.Duration
	ignored *atomic.Uint64 // the Transport's count of ignored Retry-After values
	fleet   fleetPublisher // where a pause is shared; nil without a Fleet
	// The pauses, shared with the pushback layer of a stack Update builds
	// for the same host, so a pause outlives a policy change.
	*pauses
}

// pauses is a host's pushback state.
type pauses struct {
	// paused is the pause of the whole host, nil before the first. The
	// error value is made once per pause, so rejecting costs no allocation.
	paused atomic.Pointer[PushbackError]
	// tiers[p] is the pause a Shedder's refusals of priority p asked for,
	// nil when there is none: it holds back requests of priority p and
	// less important ones.
	tiers [NumPriorities]atomic.Pointer[PushbackError]
	mu    sync.Mutex // serialises writers of paused and tiers
	// refused counts the requests a pause held back, across Updates.
	refused atomic.Uint64
	// What another pod's pause is weighed against (see Fleet): when this
	// pod's latest answer from the host without 429 or 503 came (unix
	// ns), okLast saying no 429 or 503 came since, okPrio that request's
	// priority (a Shedder's pause of a less important one is not
	// contradicted by it), and answers counting
	// every answer (a pause adopted ends its chain until the next).
	lastOK  atomic.Int64
	okLast  atomic.Bool
	okPrio  atomic.Int32 // the priority of the request answered so
	answers atomic.Uint64
	// Under mu, by slot (tiers, then the whole host): the pause adopted
	// from another pod, and the pause declined (adopted at this pod's own
	// 429 or 503 while it runs).
	adopted  [NumPriorities + 1]fleetPause
	declined [NumPriorities + 1]time.Time
}

// fleetPause is a run of pauses adopted from other pods back to back: the
// pause in force (its error value), when the run began, and the answers
// this pod had then.
type fleetPause struct {
	e       *PushbackError
	start   time.Time
	answers uint64
}

func newPushback(next layer, max time.Duration, e env, ignored *atomic.Uint64) *pushbackLayer {
	return &pushbackLayer{next: next, e: e, max: max, ignored: ignored, pauses: new(pauses)}
}

func (p *pushbackLayer) roundTrip(req *http.Request, c call) (*http.Response, error) {
	return p.pass(p.next, req, c)
}

// pass is the pushback layer over next: its own layer below, or a route's
// (see sharedLayer), so that the routes of a host share its pauses.
func (p *pushbackLayer) pass(next layer, req *http.Request, c call) (*http.Response, error) {
	prio, fromContext := requestPriority(req)
	if e := p.pausedFor(prio); e != nil && !p.waitOut(req, c, prio, e) {
		p.refused.Add(1)
		p.e.rep.rejected(req.Context(), layerPushback)
		closeBody(req)
		return nil, e
	}
	if fromContext {
		// Unless the header is there, unreadable (it would have won):
		// then it is sent as the caller wrote it.
		if _, set := req.Header[PriorityHeader]; !set {
			// A copy: a RoundTripper must not change its caller's request. The
			// value is the copy's own, since a layer below may write to it.
			req = req.Clone(req.Context())
			req.Header[PriorityHeader] = []string{priorityNames[prio]}
		}
	}
	resp, err := next.roundTrip(req, c)
	if err != nil {
		return resp, err
	}
	p.obeyRateLimit(resp) // ratelimit.go: a spent quota, on any status
	if p.fleet != nil {
		p.weighAnswer(resp.StatusCode, prio)
	}
	if !pushbackStatus(resp.StatusCode) {
		return resp, err
	}
	now := time.Now()
	if d, ok := retryAfter(resp, now, p.ignored); ok && d > 0 {
		until := now.Add(min(d, p.max))
		if tier, ok := shedPriority(resp.Header); ok {
			if p.pauseIn(&p.tiers[tier], until) {
				p.publishPause(until, true, tier)
			}
		} else if p.pauseIn(&p.paused, until) {
			p.publishPause(until, false, 0)
		}
	}
	return resp, nil
}

// maxPauseWaits bounds how many pauses, one extending another, a request
// waits out before it is refused.
const maxPauseWaits = 4

// waitOut waits until the pause e ends, for a request that a retrying
// client above will resend (call.above, sdk.go), and reports whether the
// host is no longer paused for it. Refused, such a request would only
// spend one of that client's tries: its own backoff, shorter than a
// pause renewed by other callers' 429s, sends it again into the pause,
// and the client gives up having sent the host less than it would have
// alone. Waited out, it goes no sooner than the host asked, as the client
// itself would have waited had it seen the answer. A pause that ends past
// the call's deadline is refused at once, as are other requests.
func (p *pushbackLayer) waitOut(req *http.Request, c call, prio Priority, e *PushbackError) bool {
	if c.above == aboveNone {
		return false
	}
	ctx := req.Context()
	for range maxPauseWaits {
		if dl, ok := c.deadline(req); ok && e.Until.After(dl) {
			return false
		}
		tm := time.NewTimer(time.Until(e.Until))
		select {
		case <-ctx.Done():
			tm.Stop()
			return false
		case <-tm.C:
		}
		if e = p.pausedFor(prio); e == nil {
			return true
		}
	}
	return false
}

// shedPriority reads the priority a Shedder's refusal names. Anything but
// one valid name counts as none, so the whole host pauses: a refusal that
// cannot be read is obeyed as fully as anyone else's.
func shedPriority(h http.Header) (Priority, bool) {
	if v := h[ShedPriorityHeader]; len(v) == 1 {
		return parsePriority(trimOWS(v[0]))
	}
	return 0, false
}

func (p *pushbackLayer) pausedUntil(req *http.Request) time.Time {
	prio, _ := requestPriority(req)
	if e := p.pausedFor(prio); e != nil {
		return e.Until
	}
	return time.Time{}
}

// pausedFor returns the pause a request of priority prio is held by now,
// or nil: the host's, or a Shedder's of prio or a more important priority,
// whichever lasts longest. A host that never asked for a pause costs an
// atomic load per slot looked at, without reading the clock.
func (p *pushbackLayer) pausedFor(prio Priority) *PushbackError {
	var now time.Time
	e := p.pausedIn(&p.paused, &now)
	for q := range prio.clamp() + 1 {
		if te := p.pausedIn(&p.tiers[q], &now); te != nil && (e == nil || te.Until.After(e.Until)) {
			e = te
		}
	}
	return e
}

// pausedIn returns the pause in slot if it is in force now, or nil. It
// reads the clock into *now only when there is a pause to compare, and at
// most once for several slots. The first request to see a pause over
// clears it and reports the end.
func (p *pushbackLayer) pausedIn(slot *atomic.Pointer[PushbackError], now *time.Time) *PushbackError {
	e := slot.Load()
	if e == nil {
		return nil
	}
	if now.IsZero() {
		*now = time.Now()
	}
	if now.Before(e.Until) {
		return e
	}
	// A new pause stored meanwhile makes the swap fail: it stays.
	if slot.CompareAndSwap(e, nil) {
		p.e.rep.pushbackChanged(false, e.Until)
	}
	return nil
}

// pauseIn extends the pause in slot to until; a shorter Retry-After
// arriving later (from a request already in flight) does not cut the pause
// short. It reports whether the pause was extended.
func (p *pushbackLayer) pauseIn(slot *atomic.Pointer[PushbackError], until time.Time) bool {
	p.mu.Lock()
	e := slot.Load()
	if e != nil && !until.After(e.Until) {
		p.mu.Unlock()
		return false
	}
	slot.Store(&PushbackError{Host: p.e.host, Until: until})
	p.mu.Unlock()
	// Reported (and logged) outside the lock, and only when a pause starts:
	// a pause lengthened by a later Retry-After is the same pause.
	if e == nil || !e.Until.After(time.Now()) {
		p.e.rep.pushbackChanged(true, until)
	}
	return true
}

// PushbackSnapshot is a host's pauses, as Snapshot reports it.
type PushbackSnapshot struct {
	// Until is when the host said it will have room again, for every
	// request; zero, or a time past, when no such pause is in force.
	Until time.Time
	// Tiers[p] is when a server.Shedder's refusal of priority p ends, which
	// holds back requests of priority p and less important ones; zero when
	// none.
	Tiers [NumPriorities]time.Time
	// Refused is how many requests a pause has held back since the host's
	// state was made.
	Refused uint64
}

// snapshot is the pushback's piece of Snapshot.
func (p *pushbackLayer) snapshot() *PushbackSnapshot {
	s := &PushbackSnapshot{Refused: p.refused.Load()}
	if e := p.paused.Load(); e != nil {
		s.Until = e.Until
	}
	for i := range p.tiers {
		if e := p.tiers[i].Load(); e != nil {
			s.Tiers[i] = e.Until
		}
	}
	return s
}

// The pushback in a fleet (see Fleet): a pause one pod is asked for
// pauses the others too, weighed as a breaker's trip is: it holds a pod
// that has no answer of its own saying otherwise, for one pause at most
// between two of its own answers.

// applyFleet weighs another pod's pause (fleetMember).
func (p *pushbackLayer) applyFleet(u FleetUpdate, now time.Time) bool {
	return u.Kind == FleetPushback && p.adoptPause(u, now)
}

// slotOf is the slot of a pause: a Shedder's tier, or the whole host.
func (p *pushbackLayer) slotOf(shed bool, prio Priority) (*atomic.Pointer[PushbackError], int) {
	if shed {
		return &p.tiers[prio], int(prio)
	}
	return &p.paused, int(NumPriorities)
}

// adoptPause weighs another pod's pause u. A pod whose own latest answer
// from the host, within fleetFresh, had no 429 or 503 declines it: the
// host has room for this pod, and the pause is kept until its end (capped
// at MaxRetryAfter) for this pod's own 429 or 503 to adopt (weighAnswer).
// Otherwise the host is paused as a local Retry-After would pause it,
// capped at MaxRetryAfter from the first pause of a run adopted back to
// back; once that run ended, no pause is adopted again before this pod's
// next answer from the host (which weighs it). So a chain of pauses from
// one pod holds another for MaxRetryAfter at most before it sends again.
func (p *pushbackLayer) adoptPause(u FleetUpdate, now time.Time) bool {
	until := u.Until
	if cap := now.Add(p.max); until.After(cap) {
		until = cap
	}
	slot, i := p.slotOf(u.Shed, u.Priority)
	answers := p.answers.Load()
	p.mu.Lock()
	if p.hasRoomFor(u, now) {
		if until.After(p.declined[i]) {
			p.declined[i] = until
		}
		p.mu.Unlock()
		if p.fleet != nil {
			p.fleet.declined()
		}
		return false
	}
	run := p.adopted[i]
	switch {
	case run.e != nil && now.Before(run.e.Until) && slot.Load() == run.e:
		// A later pause of a run in force: the run's start bounds it.
		if cap := run.start.Add(p.max); until.After(cap) {
			until = cap
		}
	case run.e != nil && run.answers == answers:
		// The run ended and this pod has not been answered since.
		p.mu.Unlock()
		return false
	default:
		run = fleetPause{start: now, answers: answers}
	}
	p.mu.Unlock()
	if !p.pauseIn(slot, until) {
		return false
	}
	p.mu.Lock()
	if e := slot.Load(); e != nil && e.Until.Equal(until) {
		run.e = e
		p.adopted[i] = run
	}
	p.mu.Unlock()
	return true
}

// hasRoomFor reports whether this pod's own latest answer from the host,
// within fleetFresh of now, had no 429 or 503 (for a shedding pause u, at
// u's priority or above): the host has room for this pod, which declines u.
func (p *pushbackLayer) hasRoomFor(u FleetUpdate, now time.Time) bool {
	return p.okLast.Load() && now.UnixNano()-p.lastOK.Load() <= int64(fleetFresh) &&
		(!u.Shed || Priority(p.okPrio.Load()) >= u.Priority)
}

// weighAnswer notes this pod's own answer from the host, of status code
// to a request of priority prio, as its latest evidence of the pauses
// other pods publish: an answer below 500 and not 429 ends each pause
// adopted from them that would have held the request (the host had room
// for it), and a 429 or 503 adopts the pauses it declined.
func (p *pushbackLayer) weighAnswer(code int, prio Priority) {
	now := time.Now()
	p.answers.Add(1)
	switch {
	case code >= 500 && !pushbackStatus(code):
		p.okLast.Store(false) // no word on room either way
		return
	case !pushbackStatus(code):
		p.lastOK.Store(now.UnixNano())
		p.okPrio.Store(int32(prio.clamp()))
		p.okLast.Store(true)
		var ended []time.Time
		p.mu.Lock()
		for i := range p.adopted {
			if i < int(NumPriorities) && Priority(i) > prio.clamp() {
				continue // a tier this request was not held by
			}
			slot, _ := p.slotOf(i < int(NumPriorities), Priority(min(i, int(NumPriorities)-1)))
			if e := p.adopted[i].e; e != nil && slot.CompareAndSwap(e, nil) {
				p.adopted[i] = fleetPause{}
				ended = append(ended, e.Until)
			}
		}
		p.mu.Unlock()
		for _, until := range ended {
			p.e.rep.pushbackChanged(false, until) // logged outside the lock
		}
		return
	}
	p.okLast.Store(false)
	var adopt [NumPriorities + 1]time.Time
	p.mu.Lock()
	adopt, p.declined = p.declined, [NumPriorities + 1]time.Time{}
	p.mu.Unlock()
	for i, until := range adopt {
		if until.After(now) {
			slot, _ := p.slotOf(i < int(NumPriorities), Priority(min(i, int(NumPriorities)-1)))
			p.pauseIn(slot, until)
		}
	}
}

// publishPause shares a local Retry-After pause.
func (p *pushbackLayer) publishPause(until time.Time, shed bool, prio Priority) {
	if p.fleet == nil {
		return
	}
	p.fleet.publish(FleetUpdate{Kind: FleetPushback, Host: p.e.host, Until: until, Shed: shed, Priority: prio})
}

// obeyRateLimit pauses the host, as a Retry-After does and capped the same
// way, when resp says its quota is spent until a reset; a malformed field
// is counted in the Transport's ignored count.
func (p *pushbackLayer) obeyRateLimit(resp *http.Response) {
	h := resp.Header
	if h == nil {
		return
	}
	_, a := h[hdrRateLimit]
	_, b := h[hdrRLRemaining]
	_, c := h[hdrXRLRemaining]
	if !a && !b && !c {
		return
	}
	now := time.Now()
	d, res := rateLimitPause(h, now)
	switch {
	case res == retryAfterIgnored:
		if p.ignored != nil {
			p.ignored.Add(1)
		}
	case res == retryAfterValid && d > 0:
		p.pauseIn(&p.paused, now.Add(min(d, p.max)))
	}
}

// keepFrom takes the pauses of prev, the old stack's pushback layer (nil:
// none), whatever the policy: they are the host's word, not the policy's.
func (p *pushbackLayer) keepFrom(prev *pushbackLayer) {
	if prev != nil {
		p.pauses = prev.pauses
	}
}

// show hands Snapshot the pauses (shower).
func (p *pushbackLayer) show(put func(any)) { put(p.snapshot()) }
