package bulwark

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// attemptCtx is the context of one attempt (layer 8): its parent's values
// and cancellation, and a deadline of its own.
//
// It is written by hand, where context.WithDeadline would do the same job,
// because of what WithDeadline costs on every attempt: four allocations
// (the context, its timer, the timer's closure and the cancel closure) and
// a timer armed and stopped, whether or not anything below ever waits on
// the context. attemptCtx makes its channel and arms its timer the first
// time Done is called: a base that only calls Err, or nothing at all (a
// cache, a stub, a transport that fails fast), costs no timer, and the
// first attempt's attemptCtx lives inside the call's own allocation (see
// callState), so it costs none either. When a base does wait (net/http's
// Transport calls Done on every request), it costs a channel and a timer,
// still less than WithDeadline.
//
// Semantics are those of a context from WithDeadline whose cancel runs
// when the attempt ends (its body is finished, or it failed), with two
// differences that no caller can tell apart from scheduling: Err reports
// the deadline as soon as it has passed, without waiting for a timer to
// fire, and a parent's cancellation reaches Err when Err is called and
// Done's channel once Done has been called. context.Cause of an attemptCtx
// is its parent's cause, or its Err when the parent has none (as for any
// Context that is not one of the standard library's).
type attemptCtx struct {
	parent   context.Context
	deadline time.Time
	call     *callState // the call's state, for callOf below; may be nil

	// err is set once, when the attempt ends; it points at one of the
	// errRef values for the two usual errors, so ending allocates nothing.
	err atomic.Pointer[error]

	mu     sync.Mutex
	done   chan struct{} // made by the first Done; closed when the attempt ends
	timer  *time.Timer   // armed by the first Done
	stop   func() bool   // undoes the parent registration armed with the timer
	afters []*afterReg   // registered by AfterFunc, run when the attempt ends

	// Room for the one registration an attempt usually gets (net/http's
	// Transport derives one context per request), so that it costs no
	// allocation beyond its stop func.
	reg0   afterReg
	regBuf [1]*afterReg
}

// init readies c, which may be a zero attemptCtx in the call's allocation,
// for the call st (nil when there is none).
func (c *attemptCtx) init(parent context.Context, deadline time.Time, st *callState) {
	c.parent, c.deadline, c.call = parent, deadline, st
}

func (c *attemptCtx) Deadline() (time.Time, bool) { return c.deadline, true }

func (c *attemptCtx) Value(key any) any {
	if key == (callKey{}) && c.call != nil {
		return c.call
	}
	return c.parent.Value(key)
}

func (c *attemptCtx) Err() error {
	if p := c.err.Load(); p != nil {
		// end stores err before it closes done, both under mu: passing
		// through mu makes sure done is closed too before Err says so, as
		// the Context contract asks.
		c.mu.Lock()
		//lint:ignore SA2001 the empty critical section is the point
		c.mu.Unlock()
		return *p
	}
	if err := c.parent.Err(); err != nil {
		c.end(err)
	} else if !time.Now().Before(c.deadline) {
		c.end(context.DeadlineExceeded)
	} else {
		return nil
	}
	return *c.err.Load()
}

func (c *attemptCtx) Done() <-chan struct{} {
	c.mu.Lock()
	if c.done != nil {
		d := c.done
		c.mu.Unlock()
		return d
	}
	c.done = make(chan struct{})
	d := c.done
	if c.err.Load() != nil {
		close(d)
		c.mu.Unlock()
		return d
	}
	wake := c.wake
	if left := time.Until(c.deadline); left > 0 {
		c.timer = time.AfterFunc(left, wake)
	} else {
		// Past already: end now (outside the lock, which end takes), with
		// the parent's error if it ended first.
		c.mu.Unlock()
		wake()
		return d
	}
	if c.parent.Done() != nil {
		// If the parent is already done, wake runs at once in a goroutine
		// of its own, so it cannot deadlock on c.mu.
		c.stop = context.AfterFunc(c.parent, wake)
	}
	c.mu.Unlock()
	return d
}

// wake is the timer's and the parent's callback: whichever came first ends
// the attempt with its reason.
func (c *attemptCtx) wake() {
	if err := c.parent.Err(); err != nil {
		c.end(err)
		return
	}
	c.end(context.DeadlineExceeded)
}

// bodyEnd is the cancel of the attempt: it ends when the caller is done
// with the body, or when attemptRT returns an error.
func (c *attemptCtx) bodyEnd() { c.end(context.Canceled) }

// end ends the attempt with err; only the first call counts.
func (c *attemptCtx) end(err error) {
	c.mu.Lock()
	if c.err.Load() != nil {
		c.mu.Unlock()
		return
	}
	c.err.Store(errRef(err))
	if c.done != nil {
		close(c.done)
	}
	tm, stop, afters := c.timer, c.stop, c.afters
	c.timer, c.stop, c.afters = nil, nil, nil
	c.mu.Unlock()
	if tm != nil {
		tm.Stop()
	}
	if stop != nil {
		stop()
	}
	// Outside the lock: these are the cancel functions of contexts derived
	// from this one, and they call back into Err.
	for _, r := range afters {
		r.f()
	}
}

// afterReg is one AfterFunc registration.
type afterReg struct {
	c *attemptCtx
	f func()
}

// AfterFunc arranges for f to run once the attempt has ended, and returns
// a func that cancels that unless it has already happened. The context
// package uses this method, where a Context has it, to propagate
// cancellation to contexts derived from this one (net/http's Transport
// derives one on every request) without a goroutine per derived context.
// As with context.AfterFunc, f runs in a goroutine of its own if the
// attempt has already ended: the caller may hold a lock that f takes.
func (c *attemptCtx) AfterFunc(f func()) (stop func() bool) {
	c.Done() // arms the timer and the parent registration
	c.mu.Lock()
	if c.err.Load() != nil {
		c.mu.Unlock()
		go f()
		return func() bool { return false }
	}
	var r *afterReg
	if c.reg0.c == nil {
		r = &c.reg0
		c.afters = c.regBuf[:0]
	} else {
		r = new(afterReg)
	}
	r.c, r.f = c, f
	c.afters = append(c.afters, r)
	c.mu.Unlock()
	return r.stop
}

// stop removes r before it runs; false when it has run or was removed.
func (r *afterReg) stop() bool {
	c := r.c
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, x := range c.afters {
		if x == r {
			c.afters = append(c.afters[:i], c.afters[i+1:]...)
			return true
		}
	}
	return false
}

func (c *attemptCtx) String() string {
	return "bulwark.attemptCtx(deadline " + c.deadline.String() + ")"
}

// The two errors an attempt usually ends with, as values errRef can point
// at without allocating.
var (
	errRefCanceled error = context.Canceled
	errRefDeadline error = context.DeadlineExceeded
)

func errRef(err error) *error {
	switch err {
	case context.Canceled:
		return &errRefCanceled
	case context.DeadlineExceeded:
		return &errRefDeadline
	}
	// A copy, so that only this path moves a variable to the heap: taking
	// err's own address would allocate on every call.
	e := err
	return &e
}
