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
// the context. attemptCtx is WithDeadline made late: the first call to Done
// makes one (std), and from then on Done, Err and Value are std's, so that
// contexts derived from it (net/http's Transport derives one per request)
// attach to std as to any standard context. Until then, Err is worked out
// from the parent and the clock. A base that never calls Done (a cache, a
// stub, a transport that fails fast) so costs no timer and, since the first
// attempt's attemptCtx lives in the call's own allocation (see callState),
// no allocation either.
//
// Semantics are those of a context from WithDeadline whose cancel runs
// when the attempt ends (its body is finished, or it failed), with one
// difference that no caller can tell apart from scheduling: before Done is
// called, Err reports the deadline as soon as it has passed, and a parent's
// cancellation when it is called. One more, which context.Cause shows:
// the cause of an attempt that ended before Done was called is its
// parent's, or its Err when the parent has none, as for any Context that
// is not the standard library's (the context package finds causes through
// a key of its own).
type attemptCtx struct {
	parent   context.Context
	deadline time.Time
	call     *callState // the call's state, for callOf below; may be nil

	// armed is set, under mu, once std and cancel are: after that they are
	// read without the lock.
	armed  atomic.Bool
	std    context.Context
	cancel context.CancelFunc

	// err is how the attempt ended before it was armed; it points at one of
	// the errRef values for the two usual errors, so ending allocates
	// nothing. Guarded by mu for writes.
	err atomic.Pointer[error]
	mu  sync.Mutex
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
	if c.armed.Load() {
		// std's, so that the context package finds std as the cancelCtx
		// to attach derived contexts to (its Done is ours).
		return c.std.Value(key)
	}
	return c.parent.Value(key)
}

func (c *attemptCtx) Done() <-chan struct{} {
	if c.armed.Load() {
		return c.std.Done()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.armed.Load() {
		if p := c.err.Load(); p != nil {
			// Ended already, with an error Err has reported: std must keep
			// to it, whatever has happened to the parent or the clock
			// since.
			c.std, c.cancel = endedCtx{c.parent, *p}, func() {}
		} else {
			c.std, c.cancel = context.WithDeadline(c.parent, c.deadline)
		}
		c.armed.Store(true)
	}
	return c.std.Done()
}

// endedCtx is the std of an attempt that ended before anything waited on
// it: done, with the error it ended with. A context derived from it is
// cancelled as it is made, since its Done is closed.
type endedCtx struct {
	context.Context
	err error
}

func (e endedCtx) Done() <-chan struct{} { return closedChan }
func (e endedCtx) Err() error            { return e.err }

// closedChan is the Done of every endedCtx.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

func (c *attemptCtx) Err() error {
	if c.armed.Load() {
		return c.std.Err()
	}
	if p := c.err.Load(); p != nil {
		return *p
	}
	if err := c.parent.Err(); err != nil {
		c.end(err)
	} else if !time.Now().Before(c.deadline) {
		c.end(context.DeadlineExceeded)
	} else {
		return nil
	}
	return c.Err()
}

// bodyEnd is the cancel of the attempt: it ends when the caller is done
// with the body, or when attemptRT returns an error.
func (c *attemptCtx) bodyEnd() {
	if !c.end(context.Canceled) {
		c.cancel()
	}
}

// end ends an attempt not yet armed with err, reporting false if it was
// armed instead (std then keeps its own account); only the first end
// counts.
func (c *attemptCtx) end(err error) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.armed.Load() {
		return false
	}
	if c.err.Load() == nil {
		c.err.Store(errRef(err))
	}
	return true
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
