package bulwarkgrpc

import (
	"context"
	"net/http"
	"testing"

	"github.com/bulwark-http/bulwark/server"
	"google.golang.org/grpc"
	testpb "google.golang.org/grpc/interop/grpc_testing"
)

// BenchmarkServerHalf: a unary call over bufconn to a server without the
// server half ("bare"), with it and no Shedder, and with a Shedder: what
// the server half adds to a call, paired in one run.
func BenchmarkServerHalf(b *testing.B) {
	s, err := server.NewShedder(http.NotFoundHandler(), server.ShedConfig{Workers: 1000})
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		opts []grpc.ServerOption
	}{
		{"bare", nil},
		{"deadline+record", ServerOptions(ServerConfig{})},
		{"deadline+record+shedder", ServerOptions(ServerConfig{Shedder: s})},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c := testpb.NewTestServiceClient(serveBufconn(b, gatedService(nil, nil), bc.opts...))
			ctx, cancel := context.WithTimeout(context.Background(), 100000*1e9)
			defer cancel()
			req := &testpb.SimpleRequest{}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.UnaryCall(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
