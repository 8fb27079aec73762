package bulwarkgrpc_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/bulwark-http/bulwark"
	bulwarkgrpc "github.com/bulwark-http/bulwark/grpc"
)

func fail(c codes.Code) func(context.Context, int, *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	return func(context.Context, int, *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
		return nil, status.Error(c, "scripted "+c.String())
	}
}

// failFirst fails the first n calls with c, then echoes.
func failFirst(n int, c codes.Code) func(context.Context, int, *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	return func(_ context.Context, i int, in *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
		if i <= n {
			return nil, status.Error(c, "scripted "+c.String())
		}
		return &testpb.SimpleResponse{Payload: in.GetPayload()}, nil
	}
}

// fastRetry retries at once, so the tests over TCP wait for nothing.
var fastRetry = bulwark.Config{Default: bulwark.Policy{Retry: bulwark.Retry{Base: time.Microsecond, Cap: time.Microsecond}}}

func TestUnaryAnswers(t *testing.T) {
	s := serveTCP(t, newEcho(), bulwark.Config{})
	out, err := s.call(t.Context(), mGet, "hello")
	if err != nil || string(out.GetPayload().GetBody()) != "hello" {
		t.Fatalf("Get = %v, %v; want hello", out, err)
	}
	if h := s.host(t); h.Calls.Calls != 1 || h.Calls.Succeeded != 1 {
		t.Fatalf("Snapshot calls = %+v, want 1 succeeded", h.Calls)
	}
}

// The outcome of each code as the package doc's table says: whether the
// call is sent again (for a method safe to repeat), and whether the host
// is charged with it.
func TestStatusTable(t *testing.T) {
	for _, tc := range []struct {
		code    codes.Code
		retried bool
		failure bool
	}{
		{codes.Unavailable, true, true},
		{codes.DeadlineExceeded, true, true},
		{codes.ResourceExhausted, true, true},
		{codes.Internal, false, true},
		{codes.Unknown, false, true},
		{codes.DataLoss, false, true},
		{codes.InvalidArgument, false, false},
		{codes.NotFound, false, false},
		{codes.PermissionDenied, false, false},
		{codes.Unauthenticated, false, false},
		{codes.FailedPrecondition, false, false},
		{codes.Unimplemented, false, false},
	} {
		t.Run(tc.code.String(), func(t *testing.T) {
			e := newEcho()
			e.on(mGet, fail(tc.code))
			s := serveTCP(t, e, fastRetry)
			_, err := s.call(t.Context(), mGet, "x")
			if status.Code(err) != tc.code {
				t.Fatalf("Get: %v, want code %v", err, tc.code)
			}
			if n := e.count(mGet); (n > 1) != tc.retried {
				t.Errorf("server got %d calls; retried = %v, want %v", n, n > 1, tc.retried)
			}
			h := s.host(t)
			if failed := h.Calls.Failed > 0; failed != tc.failure {
				t.Errorf("Snapshot calls %+v: failure = %v, want %v", h.Calls, failed, tc.failure)
			}
			if !tc.failure && h.Breaker.Failures != 0 {
				t.Errorf("breaker window %+v counts a caller's error", h.Breaker)
			}
		})
	}
}

func TestUnavailableBlipRetried(t *testing.T) {
	e := newEcho()
	e.on(mGet, failFirst(2, codes.Unavailable))
	s := serveTCP(t, e, fastRetry)
	out, err := s.call(t.Context(), mGet, "hi")
	if err != nil || string(out.GetPayload().GetBody()) != "hi" {
		t.Fatalf("Get = %v, %v; want hi after two UNAVAILABLE", out, err)
	}
	if n := e.count(mGet); n != 3 {
		t.Fatalf("server got %d calls, want 3", n)
	}
}

// A method whose descriptor declares no idempotency level is sent once,
// unless its metadata carries an idempotency key.
func TestNonIdempotentSentOnce(t *testing.T) {
	e := newEcho()
	e.on(mPost, fail(codes.Unavailable))
	s := serveTCP(t, e, fastRetry)
	if _, err := s.call(t.Context(), mPost, "x"); status.Code(err) != codes.Unavailable {
		t.Fatalf("Post: %v, want UNAVAILABLE", err)
	}
	if n := e.count(mPost); n != 1 {
		t.Fatalf("Post sent %d times, want once", n)
	}
	ctx := metadata.AppendToOutgoingContext(t.Context(), "idempotency-key", "k1")
	e.on(mPost, failFirst(2, codes.Unavailable))
	if _, err := s.call(ctx, mPost, "x"); err != nil {
		t.Fatalf("Post with an idempotency key: %v, want it retried to success", err)
	}
	if n := e.count(mPost); n != 1+2 {
		t.Fatalf("Post with a key sent %d times in all, want 1 + 2", n-1)
	}
}

// A route with Retry.KeyPOST marks its methods safe: each attempt carries
// the same generated idempotency key as metadata, for the server to
// collapse duplicates.
func TestRouteKeyMarksSafe(t *testing.T) {
	e := newEcho()
	e.on(mPost, failFirst(1, codes.Unavailable))
	cfg := fastRetry
	cfg.Routes = map[string]bulwark.Policy{"/bulwark.test.Echo/": {Retry: bulwark.Retry{KeyPOST: true, Base: time.Microsecond, Cap: time.Microsecond}}}
	s := serveTCP(t, e, cfg)
	if _, err := s.call(t.Context(), mPost, "x"); err != nil {
		t.Fatalf("Post under a KeyPOST route: %v", err)
	}
	if n := e.count(mPost); n != 2 {
		t.Fatalf("Post sent %d times, want 2", n)
	}
	e.mu.Lock()
	key := e.meta[mPost]
	e.mu.Unlock()
	if len(key) != 1 || key[0] == "" {
		t.Fatalf("the server saw idempotency-key %q, want the generated key", key)
	}
}

// bulwark's own refusals reach the caller as statuses, and errors.Is still
// finds the sentinel.
func TestBreakerOpenIsUnavailable(t *testing.T) {
	e := newEcho()
	s := serveTCP(t, e, bulwark.Config{})
	if err := s.t.ControlBreaker(s.authority, bulwark.BreakerForceOpen); err != nil {
		t.Fatal(err)
	}
	_, err := s.call(t.Context(), mGet, "x")
	if status.Code(err) != codes.Unavailable || !errors.Is(err, bulwark.ErrBreakerOpen) {
		t.Fatalf("Get with the breaker open: %v (code %v), want UNAVAILABLE that is ErrBreakerOpen", err, status.Code(err))
	}
	if n := e.count(mGet); n != 0 {
		t.Fatalf("server got %d calls through an open breaker", n)
	}
}

// A gRPC upstream and an HTTP one, from the same Transport, side by side
// in its Snapshot; Update moves the gRPC one to its own policy.
func TestSnapshotAndUpdate(t *testing.T) {
	s := serveTCP(t, newEcho(), bulwark.Config{})
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	defer web.Close()
	resp, err := (&http.Client{Transport: s.t}).Get(web.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if _, err := s.call(t.Context(), mGet, "x"); err != nil {
		t.Fatal(err)
	}
	hosts := map[string]string{}
	for _, h := range s.t.Snapshot().Hosts {
		hosts[h.Host] = h.Upstream
	}
	webHost := web.Listener.Addr().String()
	if hosts[webHost] != "default" || hosts[s.authority] != "default" {
		t.Fatalf("Snapshot hosts %v, want both %s and %s", hosts, webHost, s.authority)
	}
	cfg := bulwark.Config{Upstreams: map[string]bulwark.Policy{s.authority: {Breaker: bulwark.Breaker{Disabled: true}}}}
	if err := s.t.Update(cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := s.call(t.Context(), mGet, "x"); err != nil {
		t.Fatal(err)
	}
	if h := s.host(t); h.Upstream != s.authority || h.Breaker != nil {
		t.Fatalf("after Update: upstream %q breaker %+v, want %q with no breaker", h.Upstream, h.Breaker, s.authority)
	}
}

// retryPolicy is a service config that gives Echo's methods grpc-go's own
// retryPolicy (3 attempts, on UNAVAILABLE): grpc-go retries them, and
// bulwark sends each call once.
const retryPolicy = `{"methodConfig":[{"name":[{"service":"bulwark.test.Echo"}],"retryPolicy":{"maxAttempts":3,"initialBackoff":"0.001s","maxBackoff":"0.001s","backoffMultiplier":1,"retryableStatusCodes":["UNAVAILABLE"]}}]}`

// With grpc-go's own retryPolicy for the method, grpc-go retries and
// bulwark sends the call once: retries at one layer.
func TestGRPCRetryPolicyOneLayer(t *testing.T) {
	e := newEcho()
	e.on(mGet, fail(codes.Unavailable))
	s := serveTCP(t, e, fastRetry, grpc.WithDefaultServiceConfig(retryPolicy))
	if _, err := s.call(t.Context(), mGet, "x"); status.Code(err) != codes.Unavailable {
		t.Fatalf("Get: %v, want UNAVAILABLE", err)
	}
	if n := e.count(mGet); n != 3 {
		t.Fatalf("server got %d calls, want grpc-go's 3 alone", n)
	}
}

// A fresh channel reads its service config only once its resolver has
// answered, after its first call began: that call is still sent once by
// bulwark, neither cut by the attempt bound learned from the host's
// healthy latency nor retried (the retryPolicy's retries are grpc-go's).
func TestGRPCRetryPolicyFreshChannel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEcho()
		var slow atomic.Bool
		e.on(mGet, func(ctx context.Context, _ int, in *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
			d := 5 * time.Millisecond
			if slow.Load() {
				d = 200 * time.Millisecond
			}
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return nil, status.FromContextError(ctx.Err()).Err()
			}
			return &testpb.SimpleResponse{Payload: in.GetPayload()}, nil
		})
		s := serveBuf(t, e, bulwark.Config{})
		for range 300 {
			if _, err := s.call(t.Context(), mGet, "x"); err != nil {
				t.Fatal(err)
			}
		}
		l := s.host(t).Learned
		if l == nil || l.AttemptFrom != bulwark.FromLearned || l.AttemptTimeout >= 200*time.Millisecond {
			t.Fatalf("learned %+v after 300 answers of 5 ms, want a learned attempt bound under 200ms", l)
		}
		slow.Store(true)
		fresh := s.channel(t, grpc.WithDefaultServiceConfig(retryPolicy))
		before := e.count(mGet)
		start := time.Now()
		out, err := fresh.call(t.Context(), mGet, "slow")
		if err != nil || string(out.GetPayload().GetBody()) != "slow" {
			t.Fatalf("Get on a fresh channel with a retryPolicy = %v, %v; want the 200ms answer, not cut by the learned %v", out, err, l.AttemptTimeout)
		}
		if n := e.count(mGet) - before; n != 1 {
			t.Fatalf("server got the call %d times, want once", n)
		}
		if el := time.Since(start); el != 200*time.Millisecond {
			t.Errorf("call took %v, want the server's 200ms", el)
		}
	})
}

// Nor is a fresh channel's first call hedged when its service config gives
// the method a retryPolicy: sent once means no hedge either.
func TestGRPCRetryPolicyFreshChannelNoHedge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEcho()
		e.on(mGet, func(ctx context.Context, _ int, in *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
			select {
			case <-time.After(150 * time.Millisecond):
			case <-ctx.Done(): // a hedge's loser, cancelled
				return nil, status.FromContextError(ctx.Err()).Err()
			}
			return &testpb.SimpleResponse{Payload: in.GetPayload()}, nil
		})
		cfg := bulwark.Config{Default: bulwark.Policy{Hedge: bulwark.Hedge{Delay: 20 * time.Millisecond}}}
		s := serveBuf(t, e, cfg, grpc.WithDefaultServiceConfig(retryPolicy))
		for i := range 2 {
			if _, err := s.call(t.Context(), mGet, "x"); err != nil {
				t.Fatalf("Get %d: %v", i+1, err)
			}
			if n := e.count(mGet); n != i+1 {
				t.Fatalf("after call %d the server got %d calls, want one each", i+1, n)
			}
		}
		if h := s.host(t).Hedge; h != nil && h.Sent != 0 {
			t.Fatalf("hedges %+v, want none sent", h)
		}
	})
}

// Policy.Classify can judge a code otherwise, reading it with Code: here
// INTERNAL is made retryable.
func TestClassifyOverride(t *testing.T) {
	e := newEcho()
	e.on(mGet, failFirst(1, codes.Internal))
	cfg := fastRetry
	cfg.Default.Classify = func(resp *http.Response, err error) bulwark.Verdict {
		if c, ok := bulwarkgrpc.Code(resp); ok && c == codes.Internal {
			return bulwark.Verdict{Outcome: bulwark.OutcomeFailure, Retryable: true}
		}
		return bulwark.DefaultClassify(resp, err)
	}
	s := serveTCP(t, e, cfg)
	if _, err := s.call(t.Context(), mGet, "x"); err != nil {
		t.Fatalf("Get: %v, want INTERNAL retried to success", err)
	}
	if n := e.count(mGet); n != 2 {
		t.Fatalf("server got %d calls, want 2", n)
	}
}

// The caller's grpc.Header and grpc.Trailer options get the metadata of
// the attempt whose answer the call takes.
func TestCallerHeaderTrailer(t *testing.T) {
	e := newEcho()
	e.on(mGet, func(ctx context.Context, n int, in *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
		_ = grpc.SetHeader(ctx, metadata.Pairs("attempt", fmt.Sprint(n)))
		_ = grpc.SetTrailer(ctx, metadata.Pairs("done", fmt.Sprint(n)))
		if n == 1 {
			return nil, status.Error(codes.Unavailable, "first")
		}
		return &testpb.SimpleResponse{}, nil
	})
	s := serveTCP(t, e, fastRetry)
	var hdr, trl metadata.MD
	if _, err := s.call(t.Context(), mGet, "x", grpc.Header(&hdr), grpc.Trailer(&trl)); err != nil {
		t.Fatal(err)
	}
	if got := hdr.Get("attempt"); len(got) != 1 || got[0] != "2" {
		t.Errorf("header attempt = %q, want the second attempt's", got)
	}
	if got := trl.Get("done"); len(got) != 1 || got[0] != "2" {
		t.Errorf("trailer done = %q, want the second attempt's", got)
	}
}

// Routes match full method names, exactly and by service: a method's own
// route has its own breaker, judged by that method's calls alone; Update
// adds a route that then takes the method's calls.
func TestRoutesByMethod(t *testing.T) {
	e := newEcho()
	e.on(mPost, fail(codes.Internal))
	tight := bulwark.Breaker{MinCalls: 5, WindowCalls: 10}
	cfg := bulwark.Config{Routes: map[string]bulwark.Policy{"/bulwark.test.Echo/Post": {Breaker: tight}}}
	s := serveTCP(t, e, cfg)
	for range 6 {
		_, _ = s.call(t.Context(), mPost, "x")
	}
	if _, err := s.call(t.Context(), mPost, "x"); !errors.Is(err, bulwark.ErrBreakerOpen) || status.Code(err) != codes.Unavailable {
		t.Fatalf("Post after 6 INTERNAL: %v, want its route's breaker open", err)
	}
	if _, err := s.call(t.Context(), mGet, "x"); err != nil {
		t.Fatalf("Get beside the open route: %v, want it answered", err)
	}
	// A service-wide route added by Update takes Get's calls.
	cfg.Routes["/bulwark.test.Echo/"] = bulwark.Policy{Breaker: tight}
	if err := s.t.Update(cfg); err != nil {
		t.Fatal(err)
	}
	e.on(mGet, fail(codes.Internal))
	for range 6 {
		_, _ = s.call(t.Context(), mGet, "x")
	}
	var patterns []string
	for _, r := range s.host(t).Routes {
		if r.Breaker != nil && r.Breaker.State == bulwark.CircuitOpen {
			patterns = append(patterns, r.Pattern)
		}
	}
	if len(patterns) != 2 {
		t.Fatalf("open route breakers %v, want the method's and the service's", patterns)
	}
}

// What the layers write for the server half reaches it as metadata: the
// priority from the caller's context, and the attempt's number from the
// second attempt on.
func TestLayersHeadersAsMetadata(t *testing.T) {
	e := newEcho()
	e.on(mGet, failFirst(1, codes.Unavailable))
	s := serveTCP(t, e, fastRetry)
	ctx := bulwark.WithPriority(t.Context(), bulwark.PriorityLow)
	if _, err := s.call(ctx, mGet, "x"); err != nil {
		t.Fatal(err)
	}
	e.mu.Lock()
	md := e.md[mGet]
	e.mu.Unlock()
	if p := md.Get("bulwark-priority"); len(p) != 1 || p[0] == "" {
		t.Errorf("server saw bulwark-priority %q, want the caller's priority", p)
	}
	if a := md.Get("bulwark-attempt"); len(a) != 1 || a[0] != "2" {
		t.Errorf("second attempt carried bulwark-attempt %q, want 2", a)
	}
	if d := md.Get("bulwark-timeout-ms"); len(d) != 0 {
		t.Errorf("server saw bulwark-timeout-ms %q, want only grpc-timeout", d)
	}
}
