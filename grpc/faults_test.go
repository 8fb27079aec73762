package bulwarkgrpc_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/bulwark-http/bulwark"
)

func hang(ctx context.Context, _ int, _ *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	<-ctx.Done()
	return nil, status.FromContextError(ctx.Err()).Err()
}

// A host that hangs: each attempt ends at the attempt bound, which the
// server gets as its grpc-timeout, and the caller gets DEADLINE_EXCEEDED
// that is bulwark's timeout.
func TestHangAttemptBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEcho()
		var mu sync.Mutex
		var deadlines []time.Duration
		e.on(mGet, func(ctx context.Context, n int, in *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
			d, _ := ctx.Deadline()
			mu.Lock()
			deadlines = append(deadlines, time.Until(d))
			mu.Unlock()
			return hang(ctx, n, in)
		})
		cfg := bulwark.Config{Default: bulwark.Policy{
			Timeout: bulwark.Timeout{Attempt: 100 * time.Millisecond, Total: time.Second},
			Retry:   bulwark.Retry{MaxAttempts: 3, Base: time.Millisecond, Cap: time.Millisecond},
		}}
		s := serveBuf(t, e, cfg)
		start := time.Now()
		_, err := s.call(t.Context(), mGet, "x")
		if status.Code(err) != codes.DeadlineExceeded || !errors.Is(err, bulwark.ErrAttemptTimeout) {
			t.Fatalf("Get on a hung host: %v (code %v), want DEADLINE_EXCEEDED that is ErrAttemptTimeout", err, status.Code(err))
		}
		if n := e.count(mGet); n != 3 {
			t.Fatalf("server got %d attempts, want 3", n)
		}
		mu.Lock()
		defer mu.Unlock()
		for i, d := range deadlines {
			if d > 100*time.Millisecond || d < 90*time.Millisecond {
				t.Errorf("attempt %d reached the server with %v left, want the attempt bound, 100ms", i+1, d)
			}
		}
		if el := time.Since(start); el > 400*time.Millisecond {
			t.Errorf("call took %v, want three bounded attempts", el)
		}
		if h := s.host(t); h.Calls.TimedOut != 1 {
			t.Errorf("Snapshot calls %+v, want one timed out", h.Calls)
		}
	})
}

// The call's own deadline is the total: no attempt outlives it.
func TestCallDeadlineIsTotal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEcho()
		e.on(mGet, hang)
		s := serveBuf(t, e, bulwark.Config{Default: bulwark.Policy{Timeout: bulwark.Timeout{Attempt: time.Second}}})
		ctx, cancel := context.WithTimeout(t.Context(), 250*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := s.call(ctx, mGet, "x")
		if status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("Get: %v, want DEADLINE_EXCEEDED", err)
		}
		if el := time.Since(start); el != 250*time.Millisecond {
			t.Fatalf("call ended after %v, want the caller's 250ms", el)
		}
	})
}

// A slow host: a call that answers late, within the bound, succeeds.
func TestSlowWithinBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEcho()
		e.on(mGet, func(_ context.Context, _ int, in *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
			time.Sleep(50 * time.Millisecond)
			return &testpb.SimpleResponse{Payload: in.GetPayload()}, nil
		})
		s := serveBuf(t, e, bulwark.Config{Default: bulwark.Policy{Timeout: bulwark.Timeout{Attempt: 200 * time.Millisecond}}})
		if out, err := s.call(t.Context(), mGet, "slow"); err != nil || string(out.GetPayload().GetBody()) != "slow" {
			t.Fatalf("Get = %v, %v", out, err)
		}
		if n := e.count(mGet); n != 1 {
			t.Fatalf("server got %d calls, want 1", n)
		}
	})
}

// RESOURCE_EXHAUSTED with grpc-retry-pushback-ms pauses the host: the
// next call within the pause is refused locally, as RESOURCE_EXHAUSTED
// that is ErrPushback, and after it the host is called again.
func TestPushbackPausesHost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEcho()
		e.on(mPost, func(ctx context.Context, _ int, _ *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
			_ = grpc.SetTrailer(ctx, metadata.Pairs("grpc-retry-pushback-ms", "500"))
			return nil, status.Error(codes.ResourceExhausted, "slow down")
		})
		s := serveBuf(t, e, bulwark.Config{})
		if _, err := s.call(t.Context(), mPost, "x"); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("Post: %v, want the server's RESOURCE_EXHAUSTED", err)
		}
		if h := s.host(t); h.Pushback == nil || !h.Pushback.Until.After(time.Now()) {
			t.Fatalf("pushback after a 500 ms pushback: %+v, want the host paused", h.Pushback)
		}
		_, err := s.call(t.Context(), mGet, "x")
		if status.Code(err) != codes.ResourceExhausted || !errors.Is(err, bulwark.ErrPushback) {
			t.Fatalf("Get in the pause: %v, want RESOURCE_EXHAUSTED that is ErrPushback", err)
		}
		if n := e.count(mGet); n != 0 {
			t.Fatalf("server got %d calls during the pause", n)
		}
		time.Sleep(600 * time.Millisecond)
		if _, err := s.call(t.Context(), mGet, "x"); err != nil {
			t.Fatalf("Get after the pause: %v", err)
		}
	})
}

// pushbackFirst answers the first call RESOURCE_EXHAUSTED with the
// grpc-retry-pushback-ms values vs, then echoes.
func pushbackFirst(vs ...string) func(context.Context, int, *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	return func(ctx context.Context, n int, in *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
		if n == 1 {
			_ = grpc.SetTrailer(ctx, metadata.MD{"grpc-retry-pushback-ms": vs})
			return nil, status.Error(codes.ResourceExhausted, "slow down")
		}
		return &testpb.SimpleResponse{Payload: in.GetPayload()}, nil
	}
}

// notPaused fails the test if s's host is paused at now.
func notPaused(t *testing.T, s *served) {
	t.Helper()
	if h := s.host(t); h.Pushback != nil && h.Pushback.Until.After(time.Now()) {
		t.Errorf("host paused until %v, want no pause", h.Pushback.Until)
	}
}

// A grpc-retry-pushback-ms that does not parse as gRFC A6 reads it stops
// the retry and is counted once in Snapshot.RetryAfterIgnored, whatever
// makes it bad: two values (which contradict each other), a sign, a
// letter. It pauses no one.
func TestPushbackMalformed(t *testing.T) {
	for _, vs := range [][]string{{"300", "400"}, {"+300"}, {"abc"}} {
		t.Run(strings.Join(vs, ","), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEcho()
				e.on(mGet, pushbackFirst(vs...))
				s := serveBuf(t, e, fastRetry)
				if _, err := s.call(t.Context(), mGet, "x"); status.Code(err) != codes.ResourceExhausted {
					t.Fatalf("Get: %v, want the server's RESOURCE_EXHAUSTED", err)
				}
				if n := e.count(mGet); n != 1 {
					t.Errorf("server got %d calls, want one: no retry", n)
				}
				if n := s.t.Snapshot().RetryAfterIgnored; n != 1 {
					t.Errorf("RetryAfterIgnored = %d, want 1", n)
				}
				notPaused(t, s)
			})
		})
	}
}

// A pushback over a day is a valid gRFC A6 pushback, waited within
// Retry.MaxRetryAfter before the retry, and counted as nothing ignored;
// but it pauses no other call, as a Retry-After-Ms over a day would not.
func TestPushbackOverADay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEcho()
		e.on(mGet, pushbackFirst("86400001"))
		cfg := bulwark.Config{Default: bulwark.Policy{Retry: bulwark.Retry{Base: time.Microsecond, Cap: time.Microsecond, MaxRetryAfter: 2 * time.Second}}}
		s := serveBuf(t, e, cfg)
		start := time.Now()
		done := make(chan error)
		go func() { _, err := s.call(t.Context(), mGet, "x"); done <- err }()
		time.Sleep(100 * time.Millisecond)
		if _, err := s.call(t.Context(), mPost, "x"); err != nil {
			t.Errorf("Post while Get waits out its pushback: %v, want it answered", err)
		}
		notPaused(t, s)
		if err := <-done; err != nil {
			t.Fatalf("Get: %v, want it retried to success", err)
		}
		if el := time.Since(start); el != 2*time.Second {
			t.Errorf("Get took %v, want the retry after MaxRetryAfter, 2s", el)
		}
		if n := e.count(mGet); n != 2 {
			t.Errorf("server got %d calls, want 2", n)
		}
		if n := s.t.Snapshot().RetryAfterIgnored; n != 0 {
			t.Errorf("RetryAfterIgnored = %d, want 0", n)
		}
	})
}

// A full bulkhead refuses as RESOURCE_EXHAUSTED that is ErrBulkheadFull.
func TestBulkheadFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEcho()
		release := make(chan struct{})
		e.on(mGet, func(_ context.Context, _ int, in *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
			<-release
			return &testpb.SimpleResponse{}, nil
		})
		s := serveBuf(t, e, bulwark.Config{Default: bulwark.Policy{Bulkhead: bulwark.Bulkhead{MaxConcurrent: 1}}})
		done := make(chan error)
		go func() { _, err := s.call(t.Context(), mGet, "x"); done <- err }()
		synctest.Wait()
		_, err := s.call(t.Context(), mPost, "x")
		if status.Code(err) != codes.ResourceExhausted || !errors.Is(err, bulwark.ErrBulkheadFull) {
			t.Fatalf("Post beside a call holding the one slot: %v, want RESOURCE_EXHAUSTED that is ErrBulkheadFull", err)
		}
		close(release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
}

// A dead host (nothing listens): UNAVAILABLE with no connection to carry
// it, unanswered as a refused connection is, so the breaker opens after a
// few calls (ConsecutiveFailures), after which calls are refused locally.
func TestDeadHostTrips(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := serveBuf(t, newEcho(), bulwark.Config{})
		s.stop()
		var refused, unavailable int
		for range 20 {
			_, err := s.call(t.Context(), mGet, "x")
			switch {
			case errors.Is(err, bulwark.ErrBreakerOpen):
				refused++
			case status.Code(err) == codes.Unavailable:
				unavailable++
			default:
				t.Fatalf("Get on a dead host: %v", err)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if refused == 0 || unavailable > 5 {
			t.Fatalf("%d refused, %d UNAVAILABLE, want the breaker open after a few calls", refused, unavailable)
		}
		if h := s.host(t); h.Breaker.State != bulwark.CircuitOpen && h.Breaker.State != bulwark.CircuitHalfOpen {
			t.Fatalf("breaker %v, want open", h.Breaker.State)
		}
	})
}

// A hedge answers for a slow first attempt: the caller's reply is the
// hedge's, each attempt having written its own.
func TestHedgeReply(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEcho()
		e.on(mGet, func(ctx context.Context, n int, in *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
			if n == 1 {
				select {
				case <-time.After(time.Second):
				case <-ctx.Done():
					return nil, status.FromContextError(ctx.Err()).Err()
				}
				return &testpb.SimpleResponse{Payload: &testpb.Payload{Body: []byte("first")}}, nil
			}
			return &testpb.SimpleResponse{Payload: &testpb.Payload{Body: []byte("hedge")}}, nil
		})
		s := serveBuf(t, e, bulwark.Config{Default: bulwark.Policy{Hedge: bulwark.Hedge{Delay: 20 * time.Millisecond}}})
		start := time.Now()
		out, err := s.call(t.Context(), mGet, "x")
		if err != nil || string(out.GetPayload().GetBody()) != "hedge" {
			t.Fatalf("Get = %v, %v; want the hedge's answer", out, err)
		}
		if el := time.Since(start); el > 100*time.Millisecond {
			t.Fatalf("call took %v, want the hedge's answer after about 20ms", el)
		}
	})
}

// A stream whose server sends no headers is bounded by the attempt bound
// until it is established, and re-established for a method safe to repeat;
// once established it outlives the bound.
func TestStreamEstablishmentBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEcho()
		e.on(mWatch, func(ctx context.Context, n int, in *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
			if n == 1 {
				<-ctx.Done() // no headers: hung
				return nil, status.FromContextError(ctx.Err()).Err()
			}
			time.Sleep(10 * time.Millisecond)
			return &testpb.SimpleResponse{}, nil
		})
		s := serveBuf(t, e, bulwark.Config{Default: bulwark.Policy{
			Timeout: bulwark.Timeout{Attempt: 100 * time.Millisecond},
			Retry:   bulwark.Retry{Base: time.Millisecond, Cap: time.Millisecond},
		}})
		start := time.Now()
		cs, err := s.watch(t.Context(), 2, true)
		if err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if err := cs.RecvMsg(new(testpb.SimpleResponse)); err != nil {
				t.Fatalf("Watch: %v, want the second attempt's messages", err)
			}
		}
		if el := time.Since(start); el < 100*time.Millisecond || el > 200*time.Millisecond {
			t.Errorf("established after %v, want one bound (100ms) and a retry", el)
		}
		time.Sleep(time.Second) // ten attempt bounds: the established stream stays
		if n := e.count(mWatch); n != 2 {
			t.Fatalf("server got %d streams, want 2", n)
		}
		if h := s.host(t); h.Bulkhead.InFlight != 1 {
			t.Fatalf("bulkhead %+v, want the open stream's slot held", h.Bulkhead)
		}
	})
}

// The bound bulwark learns from a gRPC host's healthy latency applies to
// each attempt, as an HTTP host's does: after enough 5 ms answers, a hung
// call is cut at the learned bound, far below the cold-start default.
func TestLearnedBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEcho()
		hung := false
		var mu sync.Mutex
		e.on(mGet, func(ctx context.Context, n int, in *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
			mu.Lock()
			h := hung
			mu.Unlock()
			if h {
				return hang(ctx, n, in)
			}
			time.Sleep(5 * time.Millisecond)
			return &testpb.SimpleResponse{}, nil
		})
		s := serveBuf(t, e, bulwark.Config{Default: bulwark.Policy{Retry: bulwark.Retry{Disabled: true}}})
		for range 300 {
			if _, err := s.call(t.Context(), mGet, "x"); err != nil {
				t.Fatal(err)
			}
		}
		l := s.host(t).Learned
		if l == nil || l.AttemptFrom != bulwark.FromLearned || l.AttemptTimeout >= time.Second {
			t.Fatalf("learned %+v after 300 answers of 5 ms, want a learned attempt bound", l)
		}
		t.Logf("learned attempt bound %v (baseline %v, %d samples)", l.AttemptTimeout, l.Baseline, l.Samples)
		mu.Lock()
		hung = true
		mu.Unlock()
		start := time.Now()
		_, err := s.call(t.Context(), mGet, "x")
		if !errors.Is(err, bulwark.ErrAttemptTimeout) || status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("hung call: %v, want DEADLINE_EXCEEDED that is ErrAttemptTimeout", err)
		}
		if el := time.Since(start); el > l.AttemptTimeout+10*time.Millisecond {
			t.Fatalf("hung call cut after %v, want the learned %v", el, l.AttemptTimeout)
		}
	})
}
