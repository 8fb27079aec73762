package bulwarkgrpc_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bulwark-http/bulwark"
	bulwarkgrpc "github.com/bulwark-http/bulwark/grpc"
	"github.com/bulwark-http/bulwark/server"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"
)

// TestShedReadByClient: bulwark's client hears a Shedder's refusal
// whichever half of the server half made it, the interceptor (trailers)
// or the tap (a status alone, with details): it does not retry it though
// the method is safe to repeat (Get, NO_SIDE_EFFECTS), and pauses the
// host for the wait it asks for, so the next call of that priority is
// refused locally (bulwark.ErrPushback) without reaching the server; the
// pause ends after the wait.
func TestShedReadByClient(t *testing.T) {
	for _, tap := range []bool{false, true} {
		name := "interceptor"
		if tap {
			name = "tap"
		}
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				gate := make(chan struct{})
				e := newEcho()
				e.on(mGet, func(ctx context.Context, n int, in *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
					if n == 1 {
						<-gate // the first call holds the one worker
					}
					return &testpb.SimpleResponse{}, nil
				})
				s, err := server.NewShedder(http.NotFoundHandler(), server.ShedConfig{Workers: 1, Queue: -1, ReservedCritical: -1})
				if err != nil {
					t.Fatal(err)
				}
				cfg := bulwarkgrpc.ServerConfig{Shedder: s}
				opts := []grpc.ServerOption{grpc.UnaryInterceptor(bulwarkgrpc.UnaryServerInterceptor(cfg))}
				if tap {
					opts = bulwarkgrpc.ServerOptions(cfg)
				}
				cc, _ := dialGTier(t, startGTier(t, "shed.test:443", e, opts...))
				call := func() error { return cc.Invoke(t.Context(), mGet, &testpb.SimpleRequest{}, new(testpb.SimpleResponse)) }

				held := make(chan error, 1)
				go func() { held <- call() }()
				synctest.Wait()
				if st := s.Stats(); st.InFlight != 1 {
					t.Fatalf("in flight %d, want the first call holding the worker", st.InFlight)
				}
				if err := call(); status.Code(err) != codes.ResourceExhausted {
					t.Fatalf("call beside the held worker: %v, want ResourceExhausted", err)
				}
				if got := s.Stats().ShedTotal(); got != 1 {
					t.Errorf("the Shedder refused %d calls, want 1: the client retried its refusal", got)
				}
				err = call()
				if status.Code(err) != codes.ResourceExhausted || !errors.Is(err, bulwark.ErrPushback) {
					t.Errorf("call during the pause: %v, want ResourceExhausted matching bulwark.ErrPushback", err)
				}
				if got := s.Stats().ShedTotal(); got != 1 {
					t.Errorf("the Shedder refused %d calls, want 1: the paused call reached it", got)
				}
				close(gate)
				if err := <-held; err != nil {
					t.Fatalf("held call: %v", err)
				}
				synctest.Wait()
				sleepPast(server.DefaultShedRetryAfter)
				if err := call(); err != nil {
					t.Errorf("call after the pause: %v, want served", err)
				}
			})
		})
	}
}

// sleepPast sleeps d and a millisecond more, in the bubble's time.
func sleepPast(d time.Duration) { time.Sleep(d + time.Millisecond) }

// TestRetryRankedByShedder: a retry by bulwark's client reaches the
// server's Shedder as a retry (the attempt's number travels as
// bulwark-attempt metadata), which ranks it behind first attempts, and
// its priority (bulwark.WithPriority) as the priority it is served at.
func TestRetryRankedByShedder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEcho()
		e.on(mGet, func(ctx context.Context, n int, in *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
			if n == 1 {
				return nil, status.Error(codes.Unavailable, "blip")
			}
			return &testpb.SimpleResponse{}, nil
		})
		s, err := server.NewShedder(http.NotFoundHandler(), server.ShedConfig{Workers: 4})
		if err != nil {
			t.Fatal(err)
		}
		cc, _ := dialGTier(t, startGTier(t, "retry.test:443", e, bulwarkgrpc.ServerOptions(bulwarkgrpc.ServerConfig{Shedder: s})...))
		ctx := bulwark.WithPriority(t.Context(), bulwark.PriorityLow)
		if err := cc.Invoke(ctx, mGet, &testpb.SimpleRequest{}, new(testpb.SimpleResponse)); err != nil {
			t.Fatalf("call: %v, want the retry to succeed", err)
		}
		st := s.Stats()
		if e.count(mGet) != 2 || st.Served[bulwark.PriorityLow] != 2 || st.ServedRetries != 1 {
			t.Errorf("%d attempts reached the handler; the Shedder served %d low, %d of them retries; want 2, 2, 1", e.count(mGet), st.Served[bulwark.PriorityLow], st.ServedRetries)
		}
	})
}
