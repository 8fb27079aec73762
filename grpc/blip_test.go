//go:build soak

package bulwarkgrpc_test

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/bulwark-http/bulwark"
	bulwarkgrpc "github.com/bulwark-http/bulwark/grpc"
)

// TestBlip offers 400 calls/s of a method safe to repeat for 6 s to a host
// that answers UNAVAILABLE from 2 s to 4 s, in virtual time, and measures
// the host's load during the blip ÷ the calls offered in it, and the share
// of calls begun from 200 ms after the blip that succeed: a plain channel,
// grpc-go's own retry without and with retryThrottling, and bulwark at
// zero config. Run: cd grpc && go test -tags soak -run TestBlip -v .
func TestBlip(t *testing.T) {
	const retry = `"retryPolicy":{"maxAttempts":3,"initialBackoff":"0.1s","maxBackoff":"1s","backoffMultiplier":2,"retryableStatusCodes":["UNAVAILABLE"]}`
	sc := `{"methodConfig":[{"name":[{"service":"bulwark.test.Echo"}],` + retry + `}]}`
	scThrottled := `{"methodConfig":[{"name":[{"service":"bulwark.test.Echo"}],` + retry + `}],"retryThrottling":{"maxTokens":10,"tokenRatio":0.1}}`
	for _, tc := range []struct {
		name    string
		bulwark bool
		sc      string
	}{
		{"plain channel", false, ""},
		{"grpc-go retry", false, sc},
		{"grpc-go retry + retryThrottling", false, scThrottled},
		{"bulwark, zero config", true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				load, ok, okAtEnd := blip(t, tc.bulwark, tc.sc)
				t.Logf("%-32s load ÷ offered during the blip %.2f; ok from 200 ms after it %.2f %% (from its end %.2f %%)", tc.name, load, 100*ok, 100*okAtEnd)
			})
		})
	}
}

func blip(t *testing.T, protect bool, sc string) (load, ok, okAtEnd float64) {
	const (
		rate      = 400
		run       = 6 * time.Second
		blipStart = 2 * time.Second
		blipEnd   = 4 * time.Second
	)
	start := time.Now()
	var during atomic.Int64
	e := newEcho()
	e.on(mGet, func(_ context.Context, _ int, in *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
		el := time.Since(start)
		time.Sleep(2 * time.Millisecond)
		if el >= blipStart && el < blipEnd {
			during.Add(1)
			return nil, status.Error(codes.Unavailable, "blip")
		}
		return &testpb.SimpleResponse{Payload: in.GetPayload()}, nil
	})
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	srv.RegisterService(&echoDesc, e)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
	}
	if sc != "" {
		opts = append(opts, grpc.WithDefaultServiceConfig(sc))
	}
	if protect {
		tr, err := bulwark.New(bulwark.Config{})
		if err != nil {
			t.Fatal(err)
		}
		opts = append(opts, grpc.WithUnaryInterceptor(bulwarkgrpc.UnaryClientInterceptor(tr)))
	}
	cc, err := grpc.NewClient("passthrough:///echo.test:443", opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cc.Close(); srv.Stop(); <-done }()

	var wg sync.WaitGroup
	var offeredBlip, after, afterOK, atEnd, atEndOK atomic.Int64
	tick := time.NewTicker(time.Second / rate)
	defer tick.Stop()
	for time.Since(start) < run {
		<-tick.C
		at := time.Since(start)
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			err := cc.Invoke(ctx, mGet, &testpb.SimpleRequest{}, new(testpb.SimpleResponse))
			if at >= blipStart && at < blipEnd {
				offeredBlip.Add(1)
			}
			if at >= blipEnd {
				atEnd.Add(1)
				if err == nil {
					atEndOK.Add(1)
				}
			}
			if at >= blipEnd+200*time.Millisecond {
				after.Add(1)
				if err == nil {
					afterOK.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return float64(during.Load()) / float64(offeredBlip.Load()), float64(afterOK.Load()) / float64(after.Load()),
		float64(atEndOK.Load()) / float64(atEnd.Load())
}
