package bulwarkgrpc

import (
	"context"

	"github.com/bulwark-http/bulwark"
	"google.golang.org/grpc"
)

// UnaryClientInterceptor returns an interceptor that sends each unary call
// through t's layers (see the package doc).
func UnaryClientInterceptor(t *bulwark.Transport) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return invoker(ctx, method, req, reply, cc, opts...) // skeleton: filled in next
	}
}

// StreamClientInterceptor returns an interceptor that sends each stream's
// establishment through t's layers (see the package doc).
func StreamClientInterceptor(t *bulwark.Transport) grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		return streamer(ctx, desc, cc, method, opts...) // skeleton: filled in next
	}
}
