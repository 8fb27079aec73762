package bulwarkgrpc_test

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/test/bufconn"

	"github.com/bulwark-http/bulwark"
	bulwarkgrpc "github.com/bulwark-http/bulwark/grpc"
)

// benchChannel is a channel over bufconn to an Echo server, with opts.
func benchChannel(b *testing.B, opts ...grpc.DialOption) *grpc.ClientConn {
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	srv.RegisterService(&echoDesc, newEcho())
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	cc, err := grpc.NewClient("passthrough:///echo.test:443", opts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cc.Close(); srv.Stop(); <-done })
	return cc
}

// BenchmarkUnary is the cost of a unary call over bufconn: a bare channel
// and one through bulwark at zero config, paired in one run; and an open
// breaker's refusal, which never reaches grpc-go's transport.
func BenchmarkUnary(b *testing.B) {
	in := &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte("x")}}
	run := func(b *testing.B, cc *grpc.ClientConn, wantErr bool) {
		ctx := context.Background()
		out := new(testpb.SimpleResponse)
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			if err := cc.Invoke(ctx, mGet, in, out); (err != nil) != wantErr {
				b.Fatal(err)
			}
		}
	}
	b.Run("bare", func(b *testing.B) { run(b, benchChannel(b), false) })
	b.Run("bulwark", func(b *testing.B) {
		t, err := bulwark.New(bulwark.Config{})
		if err != nil {
			b.Fatal(err)
		}
		run(b, benchChannel(b, grpc.WithUnaryInterceptor(bulwarkgrpc.UnaryClientInterceptor(t))), false)
	})
	b.Run("open-breaker", func(b *testing.B) {
		t, err := bulwark.New(bulwark.Config{})
		if err != nil {
			b.Fatal(err)
		}
		if err := t.ControlBreaker("echo.test:443", bulwark.BreakerForceOpen); err != nil {
			b.Fatal(err)
		}
		run(b, benchChannel(b, grpc.WithUnaryInterceptor(bulwarkgrpc.UnaryClientInterceptor(t))), true)
	})
}
