package bulwarkgrpc

import (
	"context"
	"io"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/test/bufconn"
)

// testService is grpc-go's interop TestService with its unary call
// scripted by the test; FullDuplexCall echoes until the client closes.
type testService struct {
	testpb.UnimplementedTestServiceServer
	unary func(ctx context.Context, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error)
	// stream, when not nil, serves FullDuplexCall instead of the echo.
	stream func(stream testpb.TestService_FullDuplexCallServer) error
}

func (s *testService) UnaryCall(ctx context.Context, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	return s.unary(ctx, req)
}

func (s *testService) FullDuplexCall(stream testpb.TestService_FullDuplexCallServer) error {
	if s.stream != nil {
		return s.stream(stream)
	}
	for {
		if _, err := stream.Recv(); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
		if err := stream.Send(&testpb.StreamingOutputCallResponse{}); err != nil {
			return err
		}
	}
}

// serveBufconn serves svc with opts on an in-memory listener and returns
// a client connected to it, both stopped when the test (or the synctest
// bubble's function) ends.
func serveBufconn(t testing.TB, svc testpb.TestServiceServer, opts ...grpc.ServerOption) *grpc.ClientConn {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	return serveOn(t, lis, func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }, "passthrough:///bufnet", svc, opts...)
}

// serveTCP serves svc on 127.0.0.1 and returns a client connected to it.
func serveTCP(t testing.TB, svc testpb.TestServiceServer, opts ...grpc.ServerOption) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveOn(t, lis, nil, lis.Addr().String(), svc, opts...)
}

func serveOn(t testing.TB, lis net.Listener, dial func(context.Context, string) (net.Conn, error), target string,
	svc testpb.TestServiceServer, opts ...grpc.ServerOption) *grpc.ClientConn {
	t.Helper()
	srv := grpc.NewServer(opts...)
	testpb.RegisterTestServiceServer(srv, svc)
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(lis)
	}()
	dopts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if dial != nil {
		dopts = append(dopts, grpc.WithContextDialer(dial))
	}
	cc, err := grpc.NewClient(target, dopts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cc.Close()
		srv.Stop()
		<-done
	})
	return cc
}
