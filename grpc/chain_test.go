package bulwarkgrpc_test

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bulwark-http/bulwark"
	bulwarkgrpc "github.com/bulwark-http/bulwark/grpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
)

// The chain's timing, as the HTTP chain test's (server/chain_test.go):
// 200 calls a second at the top, a healthy warm-up long enough for every
// client to learn its host's latency (200 calls), a 2 s blip of
// UNAVAILABLE at the bottom, and the 4 s after it that the figures judge.
const (
	gChainRate    = 200
	gChainWarm    = 2 * time.Second
	gChainBlip    = 2 * time.Second
	gChainAfter   = 4 * time.Second
	gChainLate    = 1500 * time.Millisecond
	gChainWork    = 5 * time.Millisecond // the bottom's time to answer
	gChainHop     = time.Millisecond     // each middle service's own work
	gChainPatient = 2 * time.Second      // the top caller's deadline
)

// interceptedEchoDesc is the Echo service's Get, served through the
// server's interceptors (echoDesc's handlers skip them).
var interceptedEchoDesc = grpc.ServiceDesc{
	ServiceName: echoDesc.ServiceName,
	HandlerType: echoDesc.HandlerType,
	Methods: []grpc.MethodDesc{{MethodName: "Get", Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
		in := new(testpb.SimpleRequest)
		if err := dec(in); err != nil {
			return nil, err
		}
		call := func(ctx context.Context, req any) (any, error) {
			return srv.(*echo).answer(ctx, mGet, req.(*testpb.SimpleRequest))
		}
		if icpt == nil {
			return call(ctx, in)
		}
		return icpt(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: mGet}, call)
	}}},
}

// gTier is one gRPC service of the chain: the Echo server behind the
// server half (bulwarkgrpc.ServerOptions), on bufconn.
type gTier struct {
	name string
	echo *echo
	lis  *bufconn.Listener
}

// startGTier serves e on bufconn with opts (none: the server half with a
// zero ServerConfig).
func startGTier(t *testing.T, name string, e *echo, opts ...grpc.ServerOption) *gTier {
	t.Helper()
	if opts == nil {
		opts = bulwarkgrpc.ServerOptions(bulwarkgrpc.ServerConfig{})
	}
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(opts...)
	srv.RegisterService(&interceptedEchoDesc, e)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return &gTier{name: name, echo: e, lis: lis}
}

// dialGTier is a channel to tier through a bulwark client of its own
// (package defaults) and that client.
func dialGTier(t *testing.T, tier *gTier) (*grpc.ClientConn, *bulwark.Transport) {
	t.Helper()
	tr, err := bulwark.New(bulwark.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient("passthrough:///"+tier.name,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return tier.lis.DialContext(ctx) }),
		grpc.WithUnaryInterceptor(bulwarkgrpc.UnaryClientInterceptor(tr)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close(); tr.Close() })
	return cc, tr
}

// gChainFigures is what one run of the chain measured.
type gChainFigures struct {
	offeredBlip, bottomBlip int // top calls started, calls reaching C, during the blip
	after, afterOK          int // top calls started in the 4 s after the blip, and answered
	late, lateOK            int // of those, the ones started from 1.5 s after the blip
	retries                 [3]int64
	trips                   [3]uint64 // by client: top→A, A→B, B→C
	passedUp                [3]uint64
}

// TestChainGRPC: three gRPC services, A → B → C, each behind the server
// half, each calling the next through bulwark's client interceptor with
// package defaults, the top caller too; Get is declared NO_SIDE_EFFECTS,
// so every tier may retry it. C answers UNAVAILABLE for 2 s. The chain
// retries at one layer: the calls reaching C during the blip are at most
// 1.3 × those offered at the top (three layers each retrying would
// multiply them); the retries above B's client are logged, not bounded:
// a timeout above is the layer's own to retry, as on HTTP. It trips at
// one layer: B's failures reach A's client, and A's the top's, marked
// passed up, and no breaker above B's client trips on them (without the
// client's reading of the mark, passup.go, every client's breaker trips
// and 85 to 87 % of top calls are answered over the 4 s after the blip);
// and it recovers as one: at least 99 % of top calls answered from 1.5 s
// after the blip ends, and 93 % over the 4 s after it, as the HTTP chain
// test asks.
func TestChainGRPC(t *testing.T) {
	var f gChainFigures
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		blipFrom, blipTo := start.Add(gChainWarm), start.Add(gChainWarm+gChainBlip)
		var bottomBlip atomic.Int64
		c := newEcho()
		c.on(mGet, func(ctx context.Context, _ int, in *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
			time.Sleep(gChainWork)
			if now := time.Now(); !now.Before(blipFrom) && now.Before(blipTo) {
				bottomBlip.Add(1)
				return nil, status.Error(codes.Unavailable, "blip")
			}
			return &testpb.SimpleResponse{}, nil
		})
		tc := startGTier(t, "c.test:443", c)
		ccBC, trBC := dialGTier(t, tc)
		middle := func(next *grpc.ClientConn) *echo {
			e := newEcho()
			e.on(mGet, func(ctx context.Context, _ int, in *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
				time.Sleep(gChainHop)
				if err := next.Invoke(ctx, mGet, in, new(testpb.SimpleResponse)); err != nil {
					return nil, status.Error(codes.Unavailable, "below failed")
				}
				return &testpb.SimpleResponse{}, nil
			})
			return e
		}
		tb := startGTier(t, "b.test:443", middle(ccBC))
		ccAB, trAB := dialGTier(t, tb)
		ta := startGTier(t, "a.test:443", middle(ccAB))
		ccTop, trTop := dialGTier(t, ta)

		var (
			wg sync.WaitGroup
			mu sync.Mutex
		)
		end := blipTo.Add(gChainAfter)
		tick := time.NewTicker(time.Second / gChainRate)
		defer tick.Stop()
		for now := time.Now(); now.Before(end); now = <-tick.C {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), gChainPatient)
				defer cancel()
				ok := ccTop.Invoke(ctx, mGet, &testpb.SimpleRequest{}, new(testpb.SimpleResponse)) == nil
				mu.Lock()
				defer mu.Unlock()
				switch {
				case now.Before(blipFrom):
				case now.Before(blipTo):
					f.offeredBlip++
				default:
					f.after++
					if ok {
						f.afterOK++
					}
					if !now.Before(blipTo.Add(gChainLate)) {
						f.late++
						if ok {
							f.lateOK++
						}
					}
				}
			})
		}
		wg.Wait()
		f.bottomBlip = int(bottomBlip.Load())
		for i, tr := range []*bulwark.Transport{trTop, trAB, trBC} {
			for _, h := range tr.Snapshot().Hosts {
				if h.Budget != nil {
					f.retries[i] += h.Budget.Retries
				}
				if h.Breaker != nil {
					f.trips[i] += h.Breaker.TotalTrips
				}
				f.passedUp[i] += h.PassedUp
			}
		}
	})
	load := float64(f.bottomBlip) / float64(f.offeredBlip)
	t.Logf("calls reaching C during the blip %.2f × offered (%d of %d); answered in the 4 s after %d of %d, from 1.5 s after %d of %d; retries (top→A, A→B, B→C) %v, trips %v, answers passed up %v",
		load, f.bottomBlip, f.offeredBlip, f.afterOK, f.after, f.lateOK, f.late, f.retries, f.trips, f.passedUp)
	if f.offeredBlip < gChainRate*int(gChainBlip/time.Second)*9/10 {
		t.Fatalf("only %d top calls offered during the blip", f.offeredBlip)
	}
	if load > 1.3 {
		t.Errorf("calls reaching C during the blip %.2f × offered, want ≤ 1.3 (retries at one layer)", load)
	}
	if f.trips[0] != 0 || f.trips[1] != 0 {
		t.Errorf("breaker trips by client (top→A, A→B, B→C) %v: want none above B's client", f.trips)
	}
	if f.passedUp[0] == 0 || f.passedUp[1] == 0 {
		t.Errorf("answers passed up (top→A, A→B, B→C) %v: want the failures passed up to both clients above B's", f.passedUp)
	}
	if s := float64(f.lateOK) / float64(f.late); s < 0.99 {
		t.Errorf("answered from 1.5 s after the blip %.1f %%, want ≥ 99 %%", 100*s)
	}
	if s := float64(f.afterOK) / float64(f.after); s < 0.93 {
		t.Errorf("answered over the 4 s after the blip %.1f %%, want ≥ 93 %%", 100*s)
	}
}
