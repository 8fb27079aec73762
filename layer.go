package bulwark

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// stage is one layer of a host's stack. Every layer of bulwark implements
// it, and each wraps the next; the router, the Transport, is the one
// http.RoundTripper the caller sees. A layer gets the call's state as an
// argument instead of from the request's context, so the caller's request
// travels down unchanged to the attempt layer, which makes the one copy an
// attempt needs.
type stage interface {
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
}

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
}

// baseStage adapts the base http.RoundTripper, and holds it to the
// contract that the layers above rely on: a response or an error, never
// both, never neither.
type baseStage struct{ rt http.RoundTripper }

func (b baseStage) roundTrip(req *http.Request, _ call) (*http.Response, error) {
	if req.Body != nil && req.Body != http.NoBody {
		// The attempt's own copy, so that a failure to read the body is
		// known for the request's fault by its type (sendBody).
		r2 := *req
		r2.Body = sendBody{req.Body}
		req = &r2
	}
	resp, err := b.rt.RoundTrip(req)
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
