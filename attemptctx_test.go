package bulwark

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// These tests hold attemptCtx to the semantics its doc comment promises:
// those of context.WithDeadline(parent, deadline) whose cancel is bodyEnd,
// up to differences that scheduling alone could explain. Every test that
// involves time runs in a synctest bubble, so that the clock is fake and
// the deadlines are exact: none of them sleeps for real.

// actxClosed reports whether ch is closed, without blocking.
func actxClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// newActx returns an attemptCtx with parent and a deadline d from now (the
// fake clock's now, inside a bubble).
func newActx(parent context.Context, d time.Duration) *attemptCtx {
	c := new(attemptCtx)
	c.init(parent, time.Now().Add(d), nil)
	return c
}

type actxKey struct{}

func TestAttemptCtxDeadlineAndValue(t *testing.T) {
	parent := context.WithValue(context.Background(), actxKey{}, "v")
	dl := time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC)
	c := new(attemptCtx)
	c.init(parent, dl, nil)

	got, ok := c.Deadline()
	if !ok || !got.Equal(dl) {
		t.Errorf("Deadline() = %v, %v; want %v, true", got, ok, dl)
	}
	if v := c.Value(actxKey{}); v != "v" {
		t.Errorf("Value(actxKey{}) = %v; want the parent's value %q", v, "v")
	}
	if v := c.Value("absent"); v != nil {
		t.Errorf("Value(absent) = %v; want nil", v)
	}
	// Values must also reach contexts derived from it, through it.
	child, cancel := context.WithCancel(c)
	defer cancel()
	if v := child.Value(actxKey{}); v != "v" {
		t.Errorf("derived Value(actxKey{}) = %v; want %q", v, "v")
	}
	// String shows in the String of contexts derived from it.
	if s := c.String(); !strings.HasPrefix(s, "bulwark.attemptCtx(deadline ") {
		t.Errorf("String() = %q", s)
	}
}

func TestAttemptCtxErrAfterDeadlineWithoutDone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const d = time.Second
		c := newActx(context.Background(), d)
		if err := c.Err(); err != nil {
			t.Fatalf("Err() at start = %v; want nil", err)
		}
		time.Sleep(d - time.Nanosecond)
		if err := c.Err(); err != nil {
			t.Fatalf("Err() just before the deadline = %v; want nil", err)
		}
		// At the deadline itself, as with WithDeadline, it has passed. No
		// Done was called, so nothing is armed: Err must see it on its own.
		time.Sleep(time.Nanosecond)
		if err := c.Err(); err != context.DeadlineExceeded {
			t.Fatalf("Err() at the deadline = %v; want DeadlineExceeded", err)
		}
		if c.armed.Load() {
			t.Error("Err alone armed the context")
		}
		// A Done called after the end must return a channel already closed.
		if !actxClosed(c.Done()) {
			t.Error("Done() after the deadline returned an open channel")
		}
		if d1, d2 := c.Done(), c.Done(); d1 != d2 {
			t.Error("successive Done calls returned different channels")
		}
		if err := c.Err(); err != context.DeadlineExceeded {
			t.Errorf("Err() later = %v; want DeadlineExceeded", err)
		}
	})
}

func TestAttemptCtxDoneAfterDeadlineWithoutErr(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// The first call of all is Done, past the deadline: its channel
		// must be closed as it is returned.
		c := newActx(context.Background(), time.Second)
		time.Sleep(2 * time.Second)
		if !actxClosed(c.Done()) {
			t.Error("Done() past the deadline returned an open channel")
		}
		if err := c.Err(); err != context.DeadlineExceeded {
			t.Errorf("Err() = %v; want DeadlineExceeded", err)
		}
	})
}

func TestAttemptCtxDoneClosesAtDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const d = time.Second
		parent, cancel := context.WithCancel(context.Background())
		defer cancel()
		c := newActx(parent, d)
		done := c.Done()
		if done == nil {
			t.Fatal("Done() = nil")
		}
		if !c.armed.Load() {
			t.Fatal("Done did not arm the context")
		}
		if c.Done() != done {
			t.Error("successive Done calls returned different channels")
		}
		time.Sleep(d - time.Nanosecond)
		synctest.Wait()
		if actxClosed(done) {
			t.Fatal("Done closed before the deadline")
		}
		if err := c.Err(); err != nil {
			t.Fatalf("Err() before the deadline = %v", err)
		}
		// Wait on the channel itself (not Err, which would end it by its
		// own clock check): the timer must close it at the deadline.
		start := time.Now()
		<-done
		if waited := time.Since(start); waited != time.Nanosecond {
			t.Errorf("Done closed %v after the last sleep; want 1ns (at the deadline)", waited)
		}
		if err := c.Err(); err != context.DeadlineExceeded {
			t.Errorf("Err() after Done closed = %v; want DeadlineExceeded", err)
		}
		cancel()
		synctest.Wait()
		if err := c.Err(); err != context.DeadlineExceeded {
			t.Errorf("Err() after a later parent cancel = %v; want DeadlineExceeded (first end wins)", err)
		}
	})
}

func TestAttemptCtxParentCanceled(t *testing.T) {
	t.Run("BeforeDone", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			parent, cancel := context.WithCancel(context.Background())
			c := newActx(parent, time.Hour)
			cancel()
			// Err sees the parent's cancellation without any Done.
			if err := c.Err(); err != context.Canceled {
				t.Fatalf("Err() = %v; want Canceled", err)
			}
			if !actxClosed(c.Done()) {
				t.Error("Done() after the parent's cancel (seen by Err) returned an open channel")
			}
		})
	})
	t.Run("BeforeDoneNoErr", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			// Done is the first call, on a parent already cancelled: the
			// channel may close asynchronously (as for a parent that is not
			// a standard context), but it must close, before the deadline.
			parent, cancel := context.WithCancel(context.Background())
			c := newActx(parent, time.Hour)
			cancel()
			done := c.Done()
			synctest.Wait()
			if !actxClosed(done) {
				t.Fatal("Done did not close for a parent cancelled before it")
			}
			if err := c.Err(); err != context.Canceled {
				t.Errorf("Err() = %v; want Canceled", err)
			}
		})
	})
	t.Run("AfterDone", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			parent, cancel := context.WithCancel(context.Background())
			defer cancel()
			c := newActx(parent, time.Hour)
			done := c.Done()
			time.Sleep(time.Minute)
			synctest.Wait()
			if actxClosed(done) {
				t.Fatal("Done closed before anything ended it")
			}
			cancel()
			synctest.Wait()
			if !actxClosed(done) {
				t.Fatal("Done did not close when the parent was cancelled")
			}
			if err := c.Err(); err != context.Canceled {
				t.Errorf("Err() = %v; want Canceled", err)
			}
			// The deadline, passing later, changes nothing.
			time.Sleep(2 * time.Hour)
			if err := c.Err(); err != context.Canceled {
				t.Errorf("Err() past the deadline = %v; want Canceled (first end wins)", err)
			}
		})
	})
	t.Run("ParentDeadline", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			// A parent whose own deadline comes first ends the attempt
			// with the parent's error, DeadlineExceeded.
			parent, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			c := newActx(parent, time.Hour)
			done := c.Done()
			time.Sleep(time.Second)
			synctest.Wait()
			if !actxClosed(done) {
				t.Fatal("Done did not close at the parent's deadline")
			}
			if err := c.Err(); err != context.DeadlineExceeded {
				t.Errorf("Err() = %v; want DeadlineExceeded", err)
			}
		})
	})
	t.Run("Cause", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			// Documented: Cause is the parent's cause when it has one.
			cause := errors.New("caller gave up")
			parent, cancel := context.WithCancelCause(context.Background())
			c := newActx(parent, time.Hour)
			cancel(cause)
			if err := c.Err(); err != context.Canceled {
				t.Errorf("Err() = %v; want Canceled", err)
			}
			if got := context.Cause(c); got != cause {
				t.Errorf("Cause() = %v; want the parent's cause %v", got, cause)
			}
		})
	})
	t.Run("CauseOwnDeadline", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			// The parent lives and has no cause: Cause is Err.
			parent, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			c := newActx(parent, time.Second)
			if got := context.Cause(c); got != nil {
				t.Errorf("Cause() before the end = %v; want nil", got)
			}
			time.Sleep(time.Second)
			if got := context.Cause(c); got != context.DeadlineExceeded {
				t.Errorf("Cause() = %v; want DeadlineExceeded", got)
			}
		})
	})
}

func TestAttemptCtxBodyEnd(t *testing.T) {
	t.Run("WithoutDone", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c := newActx(context.Background(), time.Second)
			c.bodyEnd()
			if err := c.Err(); err != context.Canceled {
				t.Fatalf("Err() = %v; want Canceled", err)
			}
			if !actxClosed(c.Done()) {
				t.Error("Done() after bodyEnd returned an open channel")
			}
		})
	})
	t.Run("AfterDone", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			const d = time.Second
			parent, cancel := context.WithCancel(context.Background())
			defer cancel()
			c := newActx(parent, d)
			done := c.Done()
			if !c.armed.Load() {
				t.Fatal("Done did not arm the context")
			}
			c.bodyEnd()
			// Closed synchronously, as a cancel func closes its context.
			if !actxClosed(done) {
				t.Fatal("Done still open after bodyEnd returned")
			}
			if err := c.Err(); err != context.Canceled {
				t.Fatalf("Err() = %v; want Canceled", err)
			}
			// First end wins: neither the deadline nor the parent, nor a
			// second bodyEnd, changes the error.
			c.bodyEnd()
			time.Sleep(2 * d)
			cancel()
			synctest.Wait()
			if err := c.Err(); err != context.Canceled {
				t.Errorf("Err() after the deadline and parent cancel = %v; want Canceled", err)
			}
			if c.Done() != done {
				t.Error("Done changed channel after the end")
			}
		})
	})
	t.Run("AfterDeadline", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			// bodyEnd after the deadline ended it changes nothing: a
			// deadline error must not turn into Canceled.
			c := newActx(context.Background(), time.Second)
			done := c.Done()
			time.Sleep(time.Second)
			synctest.Wait()
			c.bodyEnd()
			if err := c.Err(); err != context.DeadlineExceeded {
				t.Errorf("Err() = %v; want DeadlineExceeded", err)
			}
			if !actxClosed(done) {
				t.Error("Done open after the end")
			}
		})
	})
}

func TestAttemptCtxDerivedWithCancel(t *testing.T) {
	t.Run("Deadline", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			const d = time.Second
			c := newActx(context.Background(), d)
			child, cancel := context.WithCancel(c)
			defer cancel()
			// WithCancel calls Done, which arms std for the child to
			// attach to (see TestAttemptCtxDerivedAttachesToStd).
			if !c.armed.Load() {
				t.Fatal("WithCancel did not arm the context")
			}
			time.Sleep(d - time.Nanosecond)
			synctest.Wait()
			if actxClosed(child.Done()) {
				t.Fatal("child done before the deadline")
			}
			time.Sleep(time.Nanosecond)
			synctest.Wait()
			if !actxClosed(child.Done()) {
				t.Fatal("child not done at the deadline")
			}
			if err := child.Err(); err != context.DeadlineExceeded {
				t.Errorf("child.Err() = %v; want DeadlineExceeded", err)
			}
			if err := context.Cause(child); err != context.DeadlineExceeded {
				t.Errorf("Cause(child) = %v; want DeadlineExceeded", err)
			}
		})
	})
	t.Run("BodyEnd", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c := newActx(context.Background(), time.Hour)
			child, cancel := context.WithCancel(c)
			defer cancel()
			c.bodyEnd()
			// As with a standard parent's cancel, the child is cancelled
			// by the time bodyEnd returns.
			if !actxClosed(child.Done()) {
				t.Fatal("child not done when bodyEnd returned")
			}
			if err := child.Err(); err != context.Canceled {
				t.Errorf("child.Err() = %v; want Canceled", err)
			}
		})
	})
	t.Run("Parent", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			parent, pcancel := context.WithCancel(context.Background())
			c := newActx(parent, time.Hour)
			child, cancel := context.WithCancel(c)
			defer cancel()
			pcancel()
			synctest.Wait()
			if !actxClosed(child.Done()) {
				t.Fatal("child not done after the parent's cancel")
			}
			if err := child.Err(); err != context.Canceled {
				t.Errorf("child.Err() = %v; want Canceled", err)
			}
		})
	})
	t.Run("ChildCancelFirst", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			// A child cancelled first ends itself, not the attempt.
			c := newActx(context.Background(), time.Hour)
			child, cancel := context.WithCancel(c)
			cancel()
			if err := c.Err(); err != nil {
				t.Errorf("a child's cancel ended its parent: Err() = %v", err)
			}
			if err := child.Err(); err != context.Canceled {
				t.Errorf("child.Err() = %v; want Canceled", err)
			}
			c.bodyEnd()
		})
	})
	t.Run("AfterEnd", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			// Derived from an attempt already past its deadline (no call
			// yet): the child must be born done.
			c := newActx(context.Background(), time.Second)
			time.Sleep(time.Second)
			child, cancel := context.WithCancel(c)
			defer cancel()
			if !actxClosed(child.Done()) {
				t.Fatal("child of an ended attempt not done")
			}
			if err := child.Err(); err != context.DeadlineExceeded {
				t.Errorf("child.Err() = %v; want DeadlineExceeded", err)
			}
		})
	})
	t.Run("WithDeadlineLater", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			// A later deadline below cannot extend the attempt's.
			const d = time.Second
			c := newActx(context.Background(), d)
			child, cancel := context.WithTimeout(c, time.Hour)
			defer cancel()
			if dl, _ := child.Deadline(); !dl.Equal(time.Now().Add(d)) {
				t.Errorf("child deadline %v; want the attempt's", dl)
			}
			time.Sleep(d)
			synctest.Wait()
			if err := child.Err(); err != context.DeadlineExceeded {
				t.Errorf("child.Err() = %v; want DeadlineExceeded", err)
			}
		})
	})
}

func TestAttemptCtxContextAfterFunc(t *testing.T) {
	t.Run("RunsAfterEnd", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			const d = time.Second
			c := newActx(context.Background(), d)
			var ran atomic.Int32
			stop := context.AfterFunc(c, func() { ran.Add(1) })
			time.Sleep(d - time.Nanosecond)
			synctest.Wait()
			if ran.Load() != 0 {
				t.Fatal("f ran before the end")
			}
			time.Sleep(time.Nanosecond)
			synctest.Wait()
			if n := ran.Load(); n != 1 {
				t.Fatalf("f ran %d times after the deadline; want 1", n)
			}
			if stop() {
				t.Error("stop after f ran = true; want false")
			}
			c.bodyEnd()
			synctest.Wait()
			if n := ran.Load(); n != 1 {
				t.Errorf("f ran %d times in all; want 1", n)
			}
		})
	})
	t.Run("StopBeforeEnd", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c := newActx(context.Background(), time.Second)
			var ran atomic.Int32
			stop := context.AfterFunc(c, func() { ran.Add(1) })
			if !stop() {
				t.Error("stop before the end = false; want true")
			}
			if stop() {
				t.Error("second stop = true; want false")
			}
			c.bodyEnd()
			time.Sleep(2 * time.Second)
			synctest.Wait()
			if n := ran.Load(); n != 0 {
				t.Errorf("f ran %d times after stop; want 0", n)
			}
		})
	})
	t.Run("AfterEnd", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c := newActx(context.Background(), time.Second)
			c.bodyEnd()
			// f blocks until we release it: were it run on our goroutine,
			// AfterFunc would never return, and synctest would report the
			// bubble deadlocked. A second run would close ran twice.
			release, ran := make(chan struct{}), make(chan struct{})
			stop := context.AfterFunc(c, func() {
				<-release
				close(ran)
			})
			if stop() {
				t.Error("stop after the end = true; want false")
			}
			close(release)
			synctest.Wait()
			if !actxClosed(ran) {
				t.Error("f did not run for a registration after the end")
			}
		})
	})
	t.Run("AfterDeadlineNoDone", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			// Past the deadline, with nothing called yet: AfterFunc must
			// notice the end (through Done) and run f.
			c := newActx(context.Background(), time.Second)
			time.Sleep(time.Second)
			var ran atomic.Int32
			stop := context.AfterFunc(c, func() { ran.Add(1) })
			synctest.Wait()
			if n := ran.Load(); n != 1 {
				t.Errorf("f ran %d times; want 1", n)
			}
			if stop() {
				t.Error("stop = true; want false")
			}
			if err := c.Err(); err != context.DeadlineExceeded {
				t.Errorf("Err() = %v; want DeadlineExceeded", err)
			}
		})
	})
	t.Run("StopOneOfThree", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			const d = time.Second
			c := newActx(context.Background(), d)
			var ran [3]atomic.Int32
			var stops [3]func() bool
			for i := range ran {
				stops[i] = context.AfterFunc(c, func() { ran[i].Add(1) })
			}
			// Stopping the middle one must leave the others in place.
			if !stops[1]() {
				t.Fatal("stop before the end = false; want true")
			}
			if stops[1]() {
				t.Error("second stop = true; want false")
			}
			time.Sleep(d)
			synctest.Wait()
			for i, want := range []int32{1, 0, 1} {
				if n := ran[i].Load(); n != want {
					t.Errorf("f%d ran %d times; want %d", i, n, want)
				}
			}
			for _, i := range []int{0, 2} {
				if stops[i]() {
					t.Errorf("stop %d after f ran = true; want false", i)
				}
			}
			c.bodyEnd()
			synctest.Wait()
			for i, want := range []int32{1, 0, 1} {
				if n := ran[i].Load(); n != want {
					t.Errorf("after bodyEnd, f%d ran %d times; want %d", i, n, want)
				}
			}
		})
	})
	t.Run("FMayCallBack", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			// f runs with no lock of c's held: it may call back into c
			// (Err, Done, another AfterFunc) and into its own stop.
			c := newActx(context.Background(), time.Hour)
			var got error
			var stop func() bool
			stop = context.AfterFunc(c, func() {
				got = c.Err()
				_ = c.Done()
				_ = context.AfterFunc(c, func() {})
				if stop() {
					t.Error("stop from within f = true; want false")
				}
			})
			c.bodyEnd()
			synctest.Wait()
			if got != context.Canceled {
				t.Errorf("Err() from f = %v; want Canceled", got)
			}
		})
	})
}

func TestAttemptCtxConcurrent(t *testing.T) {
	// Each round ends the attempt a different way; every goroutine races
	// the others on one attemptCtx. Under -race this checks the locking;
	// in the bubble, a lost wake-up shows as a deadlock, not a hang.
	for _, end := range []string{"deadline", "bodyEnd", "parent"} {
		t.Run(end, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const (
					d = time.Millisecond
					n = 64
				)
				parent, pcancel := context.WithCancel(context.Background())
				defer pcancel()
				c := newActx(parent, d)
				var (
					wg         sync.WaitGroup
					registered atomic.Int32
					ran        atomic.Int32
					stopped    atomic.Int32
					twice      atomic.Bool
				)
				dones := make([]<-chan struct{}, n)
				children := make([]context.Context, n)
				for i := range n {
					// Spread the calls over the attempt's life, before and
					// after its end.
					at := time.Duration(i) * d / (n / 2)
					wg.Go(func() {
						time.Sleep(at)
						switch i % 5 {
						case 0:
							dones[i] = c.Done()
							<-dones[i]
						case 1:
							for c.Err() == nil {
								time.Sleep(d / 10)
							}
						case 2:
							registered.Add(1)
							var once atomic.Bool
							stop := context.AfterFunc(c, func() {
								if once.Swap(true) {
									twice.Store(true)
								}
								ran.Add(1)
							})
							if i%10 == 2 && stop() {
								stopped.Add(1)
							}
						case 3:
							child, cancel := context.WithCancel(c)
							children[i] = child
							if i%10 == 3 {
								cancel()
							} else {
								defer cancel()
								<-child.Done()
							}
						case 4:
							switch {
							case end == "bodyEnd" && i >= n/4:
								c.bodyEnd()
							case end == "parent" && i >= n/4:
								pcancel()
							}
							dones[i] = c.Done()
						}
					})
				}
				wg.Wait()
				synctest.Wait()

				err := c.Err()
				if err == nil {
					t.Fatal("Err() = nil after the end")
				}
				// The first bodyEnd or parent cancel (goroutine 19, at
				// 19/32 of d) comes before the deadline.
				want := context.Canceled
				if end == "deadline" {
					want = context.DeadlineExceeded
				}
				if err != want {
					t.Errorf("Err() = %v; want %v", err, want)
				}
				for i, ch := range dones {
					if ch == nil {
						continue
					}
					if ch != c.Done() {
						t.Errorf("goroutine %d got a Done channel of its own", i)
					}
					if !actxClosed(ch) {
						t.Errorf("goroutine %d's Done channel is open", i)
					}
				}
				for i, child := range children {
					if child != nil && child.Err() == nil {
						t.Errorf("derived context %d not done", i)
					}
				}
				if twice.Load() {
					t.Error("an AfterFunc f ran twice")
				}
				// stop reports true exactly when it kept f from running.
				if r, s, g := ran.Load(), stopped.Load(), registered.Load(); r+s != g {
					t.Errorf("AfterFunc: %d ran + %d stopped != %d registered", r, s, g)
				}
			})
		})
	}
}

// TestAttemptCtxMatchesWithDeadline runs scripts of events against both an
// attemptCtx and context.WithDeadline(parent, deadline) whose cancel stands
// for bodyEnd, observing both after every event. Observed that often, the
// laziness of attemptCtx has nothing to hide behind: the two must agree.
func TestAttemptCtxMatchesWithDeadline(t *testing.T) {
	const d = time.Second
	// h: half the time to the deadline passes (two reach it exactly);
	// s: a full deadline's time passes; p: the parent is cancelled;
	// b: the attempt's body ends.
	var scripts []string
	var gen func(prefix string)
	gen = func(prefix string) {
		if prefix != "" {
			scripts = append(scripts, prefix)
		}
		if len(prefix) == 3 {
			return
		}
		for _, e := range "hspb" {
			gen(prefix + string(e))
		}
	}
	gen("")
	// errOnly never calls Done until the end (lazy, no timer); doneFirst
	// calls Done before Err at each look; doneAtStart arms it at once.
	for _, mode := range []string{"errOnly", "doneFirst", "doneAtStart"} {
		for _, script := range scripts {
			t.Run(mode+"/"+script, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					parent, pcancel := context.WithCancel(context.Background())
					defer pcancel()
					dl := time.Now().Add(d)
					ref, rcancel := context.WithDeadline(parent, dl)
					defer rcancel()
					c := new(attemptCtx)
					c.init(parent, dl, nil)
					if mode == "doneAtStart" {
						c.Done()
					}
					look := func(after string) {
						t.Helper()
						synctest.Wait()
						if mode != "errOnly" {
							c.Done()
							synctest.Wait()
							if got, want := actxClosed(c.Done()), actxClosed(ref.Done()); got != want {
								t.Fatalf("after %s: Done closed %v; WithDeadline's %v", after, got, want)
							}
						}
						if got, want := c.Err(), ref.Err(); got != want {
							t.Fatalf("after %s: Err() = %v; WithDeadline's %v", after, got, want)
						}
					}
					for i, e := range script {
						switch e {
						case 'h':
							time.Sleep(d / 2)
						case 's':
							time.Sleep(d)
						case 'p':
							pcancel()
						case 'b':
							c.bodyEnd()
							rcancel()
						}
						look(script[:i+1])
					}
					if mode == "errOnly" {
						if got, want := actxClosed(c.Done()), actxClosed(ref.Done()); got != want {
							t.Errorf("at the end: Done closed %v; WithDeadline's %v", got, want)
						}
					}
					c.bodyEnd()
				})
			})
		}
	}
}

// TestAttemptCtxDonePastDeadlineCanceledParent: the parent is cancelled
// before the deadline, and nothing looks at the attempt until after it.
// WithDeadline reports Canceled here whatever the scheduling (a standard
// parent cancels its children synchronously), and so does attemptCtx's Err,
// which puts the parent first; so must Done, however it is first reached.
func TestAttemptCtxDonePastDeadlineCanceledParent(t *testing.T) {
	for _, first := range []string{"Done", "AfterFunc", "WithCancel"} {
		t.Run(first, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				parent, pcancel := context.WithCancel(context.Background())
				c := newActx(parent, time.Second)
				time.Sleep(time.Second / 2)
				pcancel()
				time.Sleep(time.Second)
				var child context.Context = c
				switch first {
				case "Done":
					c.Done()
				case "AfterFunc":
					context.AfterFunc(c, func() {})
				case "WithCancel":
					var cancel context.CancelFunc
					child, cancel = context.WithCancel(c)
					defer cancel()
				}
				synctest.Wait()
				if err := c.Err(); err != context.Canceled {
					t.Errorf("Err() = %v; want Canceled, as WithDeadline gives and as Err called first gives", err)
				}
				if err := child.Err(); err != context.Canceled {
					t.Errorf("derived Err() = %v; want Canceled", err)
				}
			})
		})
	}
}

// TestAttemptCtxErrImpliesDoneClosed: the context contract says Err is nil
// while Done is not yet closed. Once Done is called, Err is std's, and a
// cancel that has stored its error but not yet closed the channel must not
// show through it (the race the standard library fixed in cancelCtx.Err,
// golang/go#75533). This races real goroutines (no clock involved, the
// deadline is an hour away); it is a probe, not a proof.
func TestAttemptCtxErrImpliesDoneClosed(t *testing.T) {
	for i := range 20000 {
		c := newActx(context.Background(), time.Hour)
		done := c.Done()
		var wg sync.WaitGroup
		start := make(chan struct{})
		wg.Go(func() {
			<-start
			c.bodyEnd()
		})
		close(start)
		for c.Err() == nil {
		}
		if !actxClosed(done) {
			wg.Wait()
			t.Fatalf("iteration %d: Err() = %v while Done was open", i, c.Err())
		}
		wg.Wait()
	}
}

// TestAttemptCtxEndedBeforeDone: an attempt that ended before anything
// called Done keeps the error it ended with; neither the clock nor the
// parent, moving on before the first Done, can change it.
func TestAttemptCtxEndedBeforeDone(t *testing.T) {
	for _, then := range []string{"DeadlineAndParent", "Deadline"} {
		t.Run(then, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const d = time.Second
				parent, pcancel := context.WithCancel(context.Background())
				defer pcancel()
				c := newActx(parent, d)
				c.bodyEnd()
				if c.armed.Load() {
					t.Error("bodyEnd alone armed the context")
				}
				time.Sleep(2 * d)
				if then == "DeadlineAndParent" {
					pcancel()
				}
				synctest.Wait()
				if !actxClosed(c.Done()) {
					t.Fatal("Done() after bodyEnd returned an open channel")
				}
				if err := c.Err(); err != context.Canceled {
					t.Errorf("Err() = %v; want Canceled (first end wins)", err)
				}
				child, cancel := context.WithCancel(c)
				defer cancel()
				if !actxClosed(child.Done()) {
					t.Fatal("child of an ended attempt not done")
				}
				if err := child.Err(); err != context.Canceled {
					t.Errorf("child.Err() = %v; want Canceled", err)
				}
			})
		})
	}
}

// TestAttemptCtxDerivedAttachesToStd: once Done has armed std, a derived
// context is std's child as under any standard context, so an end reaches
// it before the call that ended the attempt returns. No synctest.Wait
// here: a goroutine between c and the child would leave its Err nil.
func TestAttemptCtxDerivedAttachesToStd(t *testing.T) {
	for _, end := range []string{"BodyEnd", "Parent"} {
		t.Run(end, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				parent, pcancel := context.WithCancel(context.Background())
				defer pcancel()
				c := newActx(parent, time.Hour)
				c.Done()
				child, cancel := context.WithCancel(c)
				defer cancel()
				if end == "BodyEnd" {
					c.bodyEnd()
				} else {
					pcancel()
				}
				if err := child.Err(); err != context.Canceled {
					t.Errorf("child.Err() right after the end = %v; want Canceled", err)
				}
				c.bodyEnd()
			})
		})
	}
}
