package bulwarkgrpc_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"sync"
	"testing"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/bulwark-http/bulwark"
	bulwarkgrpc "github.com/bulwark-http/bulwark/grpc"
)

func TestMain(m *testing.M) {
	if err := registerEcho(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	goleak.VerifyTestMain(m)
}

// The test service, bulwark.test.Echo, declared without protoc: its
// descriptor is built here and registered in protoregistry.GlobalFiles,
// where the interceptor looks up each method's idempotency_level, and its
// server is a hand-written grpc.ServiceDesc over grpc_testing's messages.
const (
	mGet    = "/bulwark.test.Echo/Get"    // NO_SIDE_EFFECTS
	mPut    = "/bulwark.test.Echo/Put"    // IDEMPOTENT
	mPost   = "/bulwark.test.Echo/Post"   // no level: not safe to repeat
	mUpload = "/bulwark.test.Echo/Upload" // client stream, IDEMPOTENT
	mWatch  = "/bulwark.test.Echo/Watch"  // server stream, NO_SIDE_EFFECTS
)

func registerEcho() error {
	in, out := ".grpc.testing.SimpleRequest", ".grpc.testing.SimpleResponse"
	level := func(l descriptorpb.MethodOptions_IdempotencyLevel) *descriptorpb.MethodOptions {
		return &descriptorpb.MethodOptions{IdempotencyLevel: l.Enum()}
	}
	method := func(name string, o *descriptorpb.MethodOptions, client, server bool) *descriptorpb.MethodDescriptorProto {
		return &descriptorpb.MethodDescriptorProto{Name: proto.String(name), InputType: proto.String(in), OutputType: proto.String(out),
			Options: o, ClientStreaming: proto.Bool(client), ServerStreaming: proto.Bool(server)}
	}
	fdp := &descriptorpb.FileDescriptorProto{
		Name:       proto.String("bulwarkgrpc_test/echo.proto"),
		Package:    proto.String("bulwark.test"),
		Dependency: []string{testpb.File_grpc_testing_messages_proto.Path()},
		Syntax:     proto.String("proto3"),
		Service: []*descriptorpb.ServiceDescriptorProto{{
			Name: proto.String("Echo"),
			Method: []*descriptorpb.MethodDescriptorProto{
				method("Get", level(descriptorpb.MethodOptions_NO_SIDE_EFFECTS), false, false),
				method("Put", level(descriptorpb.MethodOptions_IDEMPOTENT), false, false),
				method("Post", nil, false, false),
				method("Upload", level(descriptorpb.MethodOptions_IDEMPOTENT), true, false),
				method("Watch", level(descriptorpb.MethodOptions_NO_SIDE_EFFECTS), false, true),
			},
		}},
	}
	fd, err := protodesc.NewFile(fdp, protoregistry.GlobalFiles)
	if err != nil {
		return err
	}
	return protoregistry.GlobalFiles.RegisterFile(fd)
}

// echo is the server: each method's answer comes from its script, and it
// counts the calls each method received.
type echo struct {
	mu     sync.Mutex
	script map[string]func(ctx context.Context, n int, in *testpb.SimpleRequest) (*testpb.SimpleResponse, error)
	calls  map[string]int
	meta   map[string][]string    // the last call's idempotency-key, by method
	md     map[string]metadata.MD // the last call's metadata, by method
}

type echoer interface {
	answer(context.Context, string, *testpb.SimpleRequest) (*testpb.SimpleResponse, error)
}

func newEcho() *echo {
	return &echo{script: map[string]func(context.Context, int, *testpb.SimpleRequest) (*testpb.SimpleResponse, error){}, calls: map[string]int{}, meta: map[string][]string{}, md: map[string]metadata.MD{}}
}

// on sets method's script: fn gets the call's number, from 1.
func (e *echo) on(method string, fn func(ctx context.Context, n int, in *testpb.SimpleRequest) (*testpb.SimpleResponse, error)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.script[method] = fn
}

func (e *echo) count(method string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.calls[method]
}

func (e *echo) answer(ctx context.Context, method string, in *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	e.mu.Lock()
	e.calls[method]++
	n, fn := e.calls[method], e.script[method]
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		e.meta[method] = md["idempotency-key"]
		e.md[method] = md
	}
	e.mu.Unlock()
	if fn == nil {
		return &testpb.SimpleResponse{Payload: in.GetPayload()}, nil
	}
	return fn(ctx, n, in)
}

var echoDesc = grpc.ServiceDesc{
	ServiceName: "bulwark.test.Echo",
	HandlerType: (*echoer)(nil),
	Methods: []grpc.MethodDesc{
		unaryDesc("Get"), unaryDesc("Put"), unaryDesc("Post"),
	},
	Streams: []grpc.StreamDesc{
		{StreamName: "Upload", ClientStreams: true, Handler: func(srv any, ss grpc.ServerStream) error {
			e := srv.(*echo)
			var total []byte
			for {
				in := new(testpb.SimpleRequest)
				if err := ss.RecvMsg(in); err != nil {
					break
				}
				total = append(total, in.GetPayload().GetBody()...)
			}
			resp, err := e.answer(ss.Context(), mUpload, &testpb.SimpleRequest{Payload: &testpb.Payload{Body: total}})
			if err != nil {
				return err
			}
			return ss.SendMsg(resp)
		}},
		{StreamName: "Watch", ServerStreams: true, Handler: func(srv any, ss grpc.ServerStream) error {
			e := srv.(*echo)
			in := new(testpb.SimpleRequest)
			if err := ss.RecvMsg(in); err != nil {
				return err
			}
			resp, err := e.answer(ss.Context(), mWatch, in)
			if err != nil {
				return err
			}
			for range in.GetResponseSize() {
				if err := ss.SendMsg(resp); err != nil {
					return err
				}
			}
			if in.GetFillUsername() {
				<-ss.Context().Done() // held open until the caller ends it
			}
			return nil
		}},
	},
}

func unaryDesc(name string) grpc.MethodDesc {
	full := "/bulwark.test.Echo/" + name
	return grpc.MethodDesc{MethodName: name, Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
		in := new(testpb.SimpleRequest)
		if err := dec(in); err != nil {
			return nil, err
		}
		return srv.(*echo).answer(ctx, full, in)
	}}
}

// served is an Echo server with a channel to it through a Transport.
type served struct {
	echo      *echo
	stop      func() // stops the server: a dead host from then on
	t         *bulwark.Transport
	cc        *grpc.ClientConn
	authority string
	target    string
	dial      []grpc.DialOption // the channel's options: interceptors of t, dialer
}

// serveTCP serves e on 127.0.0.1 and dials it through t's interceptors.
func serveTCP(tb testing.TB, e *echo, cfg bulwark.Config, dial ...grpc.DialOption) *served {
	tb.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	return serve(tb, e, lis, lis.Addr().String(), cfg, dial...)
}

// serveBuf serves e over bufconn, as the authority "echo.test:443": for
// tests inside a synctest bubble, where nothing may touch a real socket.
func serveBuf(tb testing.TB, e *echo, cfg bulwark.Config, dial ...grpc.DialOption) *served {
	tb.Helper()
	lis := bufconn.Listen(1 << 20)
	dial = append(dial, grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	return serve(tb, e, lis, "echo.test:443", cfg, dial...)
}

func serve(tb testing.TB, e *echo, lis net.Listener, addr string, cfg bulwark.Config, dial ...grpc.DialOption) *served {
	tb.Helper()
	srv := grpc.NewServer()
	srv.RegisterService(&echoDesc, e)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t, err := bulwark.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(bulwarkgrpc.UnaryClientInterceptor(t)),
		grpc.WithStreamInterceptor(bulwarkgrpc.StreamClientInterceptor(t)),
	}, dial...)
	cc, err := grpc.NewClient("passthrough:///"+addr, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	stop := sync.OnceFunc(func() { srv.Stop(); <-done })
	tb.Cleanup(func() {
		_ = cc.Close()
		stop()
	})
	return &served{echo: e, t: t, cc: cc, authority: addr, target: "passthrough:///" + addr, dial: opts, stop: stop}
}

// channel is s with a channel of its own to the same server, through the
// same Transport, made with dial besides s's options: a fresh channel,
// not yet connected, on a host the Transport already knows.
func (s *served) channel(tb testing.TB, dial ...grpc.DialOption) *served {
	tb.Helper()
	cc, err := grpc.NewClient(s.target, append(s.dial[:len(s.dial):len(s.dial)], dial...)...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = cc.Close() })
	c := *s
	c.cc = cc
	return &c
}

// call makes a unary call of method with body as payload.
func (s *served) call(ctx context.Context, method string, body string, opts ...grpc.CallOption) (*testpb.SimpleResponse, error) {
	out := new(testpb.SimpleResponse)
	err := s.cc.Invoke(ctx, method, &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte(body)}}, out, opts...)
	return out, err
}

// host is the Snapshot entry of the channel's authority.
func (s *served) host(tb testing.TB) bulwark.HostSnapshot {
	tb.Helper()
	for _, h := range s.t.Snapshot().Hosts {
		if h.Host == s.authority {
			return h
		}
	}
	tb.Fatalf("no host %s in Snapshot", s.authority)
	return bulwark.HostSnapshot{}
}
