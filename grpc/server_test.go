package bulwarkgrpc

import (
	"context"
	"io"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/bulwark-http/bulwark/server"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// blockSize is the SimpleRequest.ResponseSize that makes the scripted
// handler block until the test's gate opens.
const blockSize = 1

// gatedService answers a unary call at once, or, when the request's
// ResponseSize is blockSize, once gate is closed (or the call's context
// ends); entered receives a value as each blocking call starts.
func gatedService(gate <-chan struct{}, entered chan<- struct{}) *testService {
	return &testService{unary: func(ctx context.Context, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
		if req.GetResponseSize() == blockSize {
			if entered != nil {
				entered <- struct{}{}
			}
			select {
			case <-gate:
			case <-ctx.Done():
				return nil, status.FromContextError(ctx.Err()).Err()
			}
		}
		return &testpb.SimpleResponse{}, nil
	}}
}

func withPriority(ctx context.Context, p string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "bulwark-priority", p)
}

func newShedder(t *testing.T, cfg server.ShedConfig) *server.Shedder {
	t.Helper()
	s, err := server.NewShedder(http.NotFoundHandler(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// callResult is one unary call's outcome and trailer.
type callResult struct {
	err     error
	trailer metadata.MD
}

func callUnary(ctx context.Context, c testpb.TestServiceClient, size int32) callResult {
	var tr metadata.MD
	_, err := c.UnaryCall(ctx, &testpb.SimpleRequest{ResponseSize: size}, grpc.Trailer(&tr))
	return callResult{err, tr}
}

func unaryAsync(ctx context.Context, c testpb.TestServiceClient, size int32) <-chan callResult {
	ch := make(chan callResult, 1)
	go func() { ch <- callUnary(ctx, c, size) }()
	return ch
}

// checkShed checks a refusal by the interceptor: RESOURCE_EXHAUSTED, the
// don't-retry and pushback trailers, the reason and priority, and the
// RetryInfo detail.
func checkShed(t *testing.T, what string, r callResult, reason, prio string) {
	t.Helper()
	if code := status.Code(r.err); code != codes.ResourceExhausted {
		t.Errorf("%s: code %v (%v), want ResourceExhausted", what, code, r.err)
		return
	}
	want := map[string]string{"bulwark-no-retry": "1", "grpc-retry-pushback-ms": "1000", "bulwark-shed-reason": reason, "bulwark-shed-priority": prio}
	for k, v := range want {
		if got := r.trailer.Get(k); len(got) != 1 || got[0] != v {
			t.Errorf("%s: trailer %s = %q, want %q", what, k, got, v)
		}
	}
	checkRetryInfo(t, what, r.err)
}

// checkRetryInfo checks that a refusal carries google.rpc.RetryInfo with
// the Shedder's Retry-After (the package default, 1 s).
func checkRetryInfo(t *testing.T, what string, err error) {
	t.Helper()
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			if got := ri.GetRetryDelay().AsDuration(); got != server.DefaultShedRetryAfter {
				t.Errorf("%s: RetryInfo delay %v, want %v", what, got, server.DefaultShedRetryAfter)
			}
			return
		}
	}
	t.Errorf("%s: no RetryInfo detail in %v", what, err)
}

// TestServerShedsByPriority: the Shedder in front of a gRPC server sheds
// by the priority the metadata names, as in front of an HTTP handler: two
// low calls hold both workers, a third waits in the queue; a fourth low
// call finds no room and is refused by the tap before its message is
// read; a high call takes the queued low call's place, and that one is
// refused as displaced, with the interceptor's trailers; when the workers
// free up, the high call is served.
func TestServerShedsByPriority(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate, entered := make(chan struct{}), make(chan struct{}, 8)
		s := newShedder(t, server.ShedConfig{Workers: 2, Queue: 1, ReservedCritical: -1})
		c := testpb.NewTestServiceClient(serveBufconn(t, gatedService(gate, entered), ServerOptions(ServerConfig{Shedder: s})...))
		ctx := t.Context()
		low, high := withPriority(ctx, "low"), withPriority(ctx, "high")

		held := []<-chan callResult{unaryAsync(low, c, blockSize), unaryAsync(low, c, blockSize)}
		<-entered
		<-entered
		queued := unaryAsync(low, c, blockSize)
		synctest.Wait()
		if st := s.Stats(); st.InFlight != 2 || st.Queued != 1 {
			t.Fatalf("in flight %d, queued %d; want 2 and 1", st.InFlight, st.Queued)
		}

		tapped := callUnary(low, c, 0)
		if code := status.Code(tapped.err); code != codes.ResourceExhausted {
			t.Fatalf("low call with the queue full: %v, want ResourceExhausted", tapped.err)
		}
		checkRetryInfo(t, "refused by the tap", tapped.err)
		if len(tapped.trailer.Get("bulwark-no-retry")) != 0 {
			t.Errorf("refused by the tap, trailer %v: the tap sends a status alone, so the interceptor did this", tapped.trailer)
		}

		first := unaryAsync(high, c, 0)
		checkShed(t, "the queued low call, displaced", <-queued, "displaced", "low")
		close(gate)
		if r := <-first; r.err != nil {
			t.Errorf("the high call: %v, want served", r.err)
		}
		for _, h := range held {
			if r := <-h; r.err != nil {
				t.Errorf("a held low call: %v, want served", r.err)
			}
		}
		st := s.Stats()
		if st.InFlight != 0 || st.Served[bulwark.PriorityLow] != 2 || st.Served[bulwark.PriorityHigh] != 1 ||
			st.Shed[server.ShedQueueFull][bulwark.PriorityLow] != 1 || st.Shed[server.ShedDisplaced][bulwark.PriorityLow] != 1 || st.ShedTotal() != 2 {
			t.Errorf("stats %+v: want 2 low and 1 high served, one low refused queue_full (the tap), one displaced", st)
		}
	})
}

// TestServerRefusalCodes, on 127.0.0.1: with its one worker held, a
// Shedder without a queue refuses a unary call and a stream
// RESOURCE_EXHAUSTED with the trailers, through the interceptors alone
// and through the tap; a call whose deadline passes while it waits gets
// DEADLINE_EXCEEDED, as its caller sees it.
func TestServerRefusalCodes(t *testing.T) {
	for _, tap := range []bool{false, true} {
		name := "interceptors"
		if tap {
			name = "tap"
		}
		t.Run(name, func(t *testing.T) {
			gate, entered := make(chan struct{}), make(chan struct{}, 1)
			s := newShedder(t, server.ShedConfig{Workers: 1, Queue: -1, ReservedCritical: -1})
			cfg := ServerConfig{Shedder: s}
			opts := []grpc.ServerOption{grpc.UnaryInterceptor(UnaryServerInterceptor(cfg)), grpc.StreamInterceptor(StreamServerInterceptor(cfg))}
			if tap {
				opts = ServerOptions(cfg)
			}
			c := testpb.NewTestServiceClient(serveTCP(t, gatedService(gate, entered), opts...))
			ctx := t.Context()
			held := unaryAsync(ctx, c, blockSize)
			<-entered

			r := callUnary(ctx, c, 0)
			st, err := c.FullDuplexCall(ctx)
			if err != nil {
				t.Fatal(err)
			}
			_, serr := st.Recv()
			if tap {
				for what, err := range map[string]error{"unary": r.err, "stream": serr} {
					if code := status.Code(err); code != codes.ResourceExhausted {
						t.Errorf("%s: %v, want ResourceExhausted", what, err)
					}
					checkRetryInfo(t, what, err)
				}
			} else {
				checkShed(t, "unary", r, "queue_full", "high")
				checkShed(t, "stream", callResult{serr, st.Trailer()}, "queue_full", "high")
			}
			if got := s.Stats().ShedTotal(); got != 2 {
				t.Errorf("%d refusals counted, want 2", got)
			}
			close(gate)
			if r := <-held; r.err != nil {
				t.Errorf("held call: %v", r.err)
			}
		})
	}
}

// TestServerQueueDeadline: a call queued behind a busy worker whose
// deadline (here bulwark's key) passes while it waits is refused
// DEADLINE_EXCEEDED, and its handler never runs.
func TestServerQueueDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate, entered := make(chan struct{}), make(chan struct{}, 2)
		s := newShedder(t, server.ShedConfig{Workers: 1, Queue: 1, ReservedCritical: -1, MaxQueueWait: time.Second})
		c := testpb.NewTestServiceClient(serveBufconn(t, gatedService(gate, entered), ServerOptions(ServerConfig{Shedder: s})...))
		held := unaryAsync(t.Context(), c, blockSize)
		<-entered
		// The caller's own deadline is 50 ms; bulwark's key says 40 ms,
		// so the server's bound ends the wait first (at the caller's
		// 50 ms its cancel and the server's timer would race).
		ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(t.Context(), "bulwark-timeout-ms", "40"), 50*time.Millisecond)
		defer cancel()
		start := time.Now()
		r := callUnary(ctx, c, blockSize)
		if code := status.Code(r.err); code != codes.DeadlineExceeded || time.Since(start) != 40*time.Millisecond {
			t.Errorf("queued past its deadline: %v after %v, want DeadlineExceeded after 40ms", r.err, time.Since(start))
		}
		synctest.Wait()
		if got := s.Stats().Shed[server.ShedWaitedTooLong][bulwark.PriorityHigh]; got != 1 {
			t.Errorf("waited_too_long refusals %d, want 1 (%+v)", got, s.Stats())
		}
		close(gate)
		<-held
		if len(entered) != 0 {
			t.Errorf("the expired call's handler ran")
		}
	})
}

// TestServerDeadline: the handler's deadline is the soonest of
// grpc-timeout, bulwark's key and Envoy's, capped at Deadline.Max; a
// malformed key is ignored and reported; with none, the call has no
// deadline. Unary and stream alike.
func TestServerDeadline(t *testing.T) {
	const max = 2 * time.Second
	for _, tc := range []struct {
		name    string
		timeout time.Duration // the caller's context; 0 for none
		md      []string
		want    time.Duration // 0 for none
		bad     string        // the key OnMalformed hears of
	}{
		{name: "grpc-timeout", timeout: 500 * time.Millisecond, want: 500 * time.Millisecond},
		{name: "grpc-timeout capped", timeout: time.Hour, want: max},
		{name: "none", want: 0},
		{name: "bulwark key", md: []string{"bulwark-timeout-ms", "300"}, want: 300 * time.Millisecond},
		{name: "bulwark key capped", md: []string{"bulwark-timeout-ms", "36000000"}, want: max},
		{name: "envoy sooner than grpc-timeout", timeout: time.Second, md: []string{"x-envoy-expected-rq-timeout-ms", "200"}, want: 200 * time.Millisecond},
		{name: "grpc-timeout sooner than bulwark key", timeout: 100 * time.Millisecond, md: []string{"bulwark-timeout-ms", "300"}, want: 100 * time.Millisecond},
		{name: "malformed", md: []string{"bulwark-timeout-ms", "soon"}, want: 0, bad: "bulwark-timeout-ms"},
		{name: "two values", md: []string{"bulwark-timeout-ms", "300", "bulwark-timeout-ms", "400"}, want: 0, bad: "bulwark-timeout-ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var (
					mu   sync.Mutex
					seen []time.Duration // -1 for no deadline
					bad  []string
				)
				note := func(ctx context.Context) {
					d := time.Duration(-1)
					if dl, ok := ctx.Deadline(); ok {
						d = time.Until(dl)
					}
					mu.Lock()
					seen = append(seen, d)
					mu.Unlock()
				}
				svc := &testService{
					unary: func(ctx context.Context, _ *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
						note(ctx)
						return &testpb.SimpleResponse{}, nil
					},
					stream: func(st testpb.TestService_FullDuplexCallServer) error {
						note(st.Context())
						return nil
					},
				}
				cfg := ServerConfig{Deadline: server.DeadlineOptions{Max: max, OnMalformed: func(k string) {
					mu.Lock()
					bad = append(bad, k)
					mu.Unlock()
				}}}
				c := testpb.NewTestServiceClient(serveBufconn(t, svc, ServerOptions(cfg)...))
				ctx := metadata.AppendToOutgoingContext(t.Context(), tc.md...)
				if tc.timeout > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tc.timeout)
					defer cancel()
				}
				if _, err := c.UnaryCall(ctx, &testpb.SimpleRequest{}); err != nil {
					t.Fatal(err)
				}
				st, err := c.FullDuplexCall(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := st.Recv(); err != io.EOF {
					t.Fatalf("stream: %v, want EOF", err)
				}
				want := tc.want
				if want == 0 {
					want = -1
				}
				for i, what := range []string{"unary", "stream"} {
					// grpc-timeout travels in whole units, so the
					// handler's deadline may be a little sooner than the
					// caller's, never later.
					if got := seen[i]; got > want || got < want-time.Millisecond || (want < 0 && got != want) {
						t.Errorf("%s: deadline in %v, want %v (-1s: none)", what, got, want)
					}
				}
				if tc.bad != "" && (len(bad) != 2 || bad[0] != tc.bad) {
					t.Errorf("OnMalformed heard %q, want %q twice", bad, tc.bad)
				}
				if tc.bad == "" && len(bad) != 0 {
					t.Errorf("OnMalformed heard %q, want nothing", bad)
				}
			})
		})
	}
}

// belowTransport is a bulwark client for a dependency below that answers
// every request with code, in memory.
func belowTransport(t *testing.T, code int) *bulwark.Transport {
	t.Helper()
	tr, err := bulwark.New(bulwark.Config{Base: roundTripFunc(func(req *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: code, Header: http.Header{}, Body: http.NoBody, Request: req}, nil
	})})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// callBelow makes one call below with the handler's context and reports
// whether it failed.
func callBelow(ctx context.Context, tr *bulwark.Transport, method string) bool {
	req, _ := http.NewRequestWithContext(ctx, method, "http://below.test/x", nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return true
	}
	resp.Body.Close()
	return resp.StatusCode != http.StatusOK
}

// TestServerPassUp: a handler's failure is marked passed up (trailer
// bulwark-no-retry: below) when a bulwark call it made below failed in a
// way the tier below dealt with, and its code stands for a 5xx or 429;
// not when the call below was sent once (a POST) or succeeded, nor when
// the handler's code is the caller's error. Unary and stream alike.
func TestServerPassUp(t *testing.T) {
	for _, tc := range []struct {
		name      string
		belowCode int    // the dependency's answer; 0: no call below
		method    string // of the call below
		code      codes.Code
		want      bool
	}{
		{"retried below and failed, UNAVAILABLE", 503, http.MethodGet, codes.Unavailable, true},
		{"retried below and failed, INTERNAL", 503, http.MethodGet, codes.Internal, true},
		{"retried below and failed, DEADLINE_EXCEEDED", 503, http.MethodGet, codes.DeadlineExceeded, true},
		{"retried below and failed, caller's error", 503, http.MethodGet, codes.InvalidArgument, false},
		{"sent once below (POST) and failed", 503, http.MethodPost, codes.Unavailable, false},
		{"succeeded below, own failure", 200, http.MethodGet, codes.Unavailable, false},
		{"no call below", 0, "", codes.Unavailable, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var below *bulwark.Transport
				if tc.belowCode != 0 {
					below = belowTransport(t, tc.belowCode)
				}
				fail := func(ctx context.Context) error {
					if below != nil {
						callBelow(ctx, below, tc.method)
					}
					return status.Error(tc.code, "failed")
				}
				svc := &testService{
					unary: func(ctx context.Context, _ *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
						return nil, fail(ctx)
					},
					stream: func(st testpb.TestService_FullDuplexCallServer) error { return fail(st.Context()) },
				}
				c := testpb.NewTestServiceClient(serveBufconn(t, svc, ServerOptions(ServerConfig{})...))
				r := callUnary(t.Context(), c, 0)
				st, err := c.FullDuplexCall(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				_, serr := st.Recv()
				for what, r := range map[string]callResult{"unary": r, "stream": {serr, st.Trailer()}} {
					if status.Code(r.err) != tc.code {
						t.Errorf("%s: %v, want %v", what, r.err, tc.code)
					}
					got := r.trailer.Get("bulwark-no-retry")
					if marked := len(got) == 1 && got[0] == bulwark.NoRetryFromBelow; marked != tc.want || (!tc.want && len(got) != 0) {
						t.Errorf("%s: trailer bulwark-no-retry %q, want marked %v", what, got, tc.want)
					}
				}
			})
		})
	}
}

// TestServerStreamHoldsWorker: a stream the Shedder admits holds its
// worker for its whole life: with one worker and no queue, a unary call
// is refused while a stream is open, and served once it ends.
func TestServerStreamHoldsWorker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newShedder(t, server.ShedConfig{Workers: 1, Queue: -1, ReservedCritical: -1})
		c := testpb.NewTestServiceClient(serveBufconn(t, gatedService(nil, nil), ServerOptions(ServerConfig{Shedder: s})...))
		ctx := t.Context()
		st, err := c.FullDuplexCall(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if err := st.Send(&testpb.StreamingOutputCallRequest{}); err != nil {
				t.Fatal(err)
			}
			if _, err := st.Recv(); err != nil {
				t.Fatalf("stream: %v", err)
			}
			time.Sleep(time.Second) // a long-lived stream, in the bubble's time
			if r := callUnary(ctx, c, 0); status.Code(r.err) != codes.ResourceExhausted {
				t.Fatalf("unary call beside an open stream: %v, want ResourceExhausted", r.err)
			}
		}
		st.CloseSend()
		if _, err := st.Recv(); err != io.EOF {
			t.Fatalf("stream end: %v", err)
		}
		synctest.Wait()
		if r := callUnary(ctx, c, 0); r.err != nil {
			t.Errorf("unary call after the stream ended: %v, want served", r.err)
		}
		if st := s.Stats(); st.InFlight != 0 || st.ShedTotal() != 3 {
			t.Errorf("stats %+v: want nothing in flight and 3 refusals", st)
		}
	})
}
