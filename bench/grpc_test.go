package bench

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/failsafe-go/failsafe-go/circuitbreaker"
	"github.com/failsafe-go/failsafe-go/failsafegrpc"
	"github.com/failsafe-go/failsafe-go/retrypolicy"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/test/bufconn"

	"github.com/bulwark-http/bulwark"
	bulwarkgrpc "github.com/bulwark-http/bulwark/grpc"
)

// grpcServer answers UnaryCall with the request's payload.
type grpcServer struct {
	testgrpc.UnimplementedTestServiceServer
}

func (grpcServer) UnaryCall(_ context.Context, in *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	return &testgrpc.SimpleResponse{Payload: in.GetPayload()}, nil
}

// grpcChannel is a channel over bufconn to a grpcServer, with opts.
func grpcChannel(b *testing.B, opts ...grpc.DialOption) testgrpc.TestServiceClient {
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	testgrpc.RegisterTestServiceServer(srv, grpcServer{})
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	cc, err := grpc.NewClient("passthrough:///bench.test:443", opts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cc.Close(); srv.Stop(); <-done })
	return testgrpc.NewTestServiceClient(cc)
}

// BenchmarkGRPCUnary is the cost of a unary call over bufconn whose first
// attempt succeeds, paired in one run: a bare channel; bulwark at zero
// config; bulwark with retry and breaker only (the policies failsafegrpc
// is given); failsafe-go's failsafegrpc with a retry policy and a circuit
// breaker.
func BenchmarkGRPCUnary(b *testing.B) {
	in := &testgrpc.SimpleRequest{Payload: &testgrpc.Payload{Body: []byte("x")}}
	run := func(b *testing.B, c testgrpc.TestServiceClient) {
		ctx := context.Background()
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			if _, err := c.UnaryCall(ctx, in); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("bare", func(b *testing.B) { run(b, grpcChannel(b)) })
	b.Run("bulwark", func(b *testing.B) {
		t, err := bulwark.New(bulwark.Config{})
		if err != nil {
			b.Fatal(err)
		}
		run(b, grpcChannel(b, grpc.WithUnaryInterceptor(bulwarkgrpc.UnaryClientInterceptor(t))))
	})
	b.Run("bulwark-retry+breaker", func(b *testing.B) {
		t, err := bulwark.New(bulwark.Config{Default: bulwark.Policy{
			Timeout:  bulwark.Timeout{Disabled: true},
			Bulkhead: bulwark.Bulkhead{Disabled: true},
		}})
		if err != nil {
			b.Fatal(err)
		}
		run(b, grpcChannel(b, grpc.WithUnaryInterceptor(bulwarkgrpc.UnaryClientInterceptor(t))))
	})
	b.Run("failsafegrpc-retry+breaker", func(b *testing.B) {
		rp := retrypolicy.NewBuilder[any]().WithMaxAttempts(3).WithBackoff(10*time.Millisecond, time.Second).Build()
		cb := circuitbreaker.NewBuilder[any]().WithFailureThresholdRatio(50, 100).WithDelay(time.Second).Build()
		run(b, grpcChannel(b, grpc.WithUnaryInterceptor(failsafegrpc.NewUnaryClientInterceptor[any](rp, cb))))
	})
}
