package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/bulwark-http/bulwark"
	bulwarkgrpc "github.com/bulwark-http/bulwark/grpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// The slow tax service of tuesday.go, called over gRPC: the same checkout
// service, the same offered load and sickness, with tax a gRPC server and
// checkout's tax call a unary call on a channel, plain (grpc-go's
// defaults: no deadline) or with bulwark's client interceptor over a
// Transport with zero config.

// tuesdayGRPCSpec is the scenario's entry in the registry.
var tuesdayGRPCSpec = spec{
	key:   "tuesday-grpc",
	title: "1b. The slow dependency over gRPC: tax answers on a gRPC channel and gets slow",
	blurb: "the same slow tax service, called over gRPC: a plain channel beside one with bulwark's client interceptor at zero config",
	run:   func(l *lab, ctx context.Context) (*scenario, error) { return l.tuesdayOver(ctx, true) },
	verdict: func(sc *scenario) string {
		p, b := sc.runs[0].metrics, sc.runs[1].metrics
		return fmt.Sprintf("while tax was slow, bulwark's gRPC interceptor with zero config kept GET /orders at %s ok (plain channel: %s) and let %.0f calls reach the sick tax service (plain: %.0f); POST /checkout, which has no fallback here, was %s ok (plain: %s).",
			pctSp(b["orders_sick"]), pctSp(p["orders_sick"]), b["tax_sick"], p["tax_sick"], pctSp(b["checkout_sick"]), pctSp(p["checkout_sick"]))
	},
}

// grpcIntro says what differs from the HTTP runs.
const grpcIntro = "tax is a gRPC server (one unary method); checkout calls it on a channel: plain (no deadline, grpc-go's default) or with bulwark's client interceptor over a Transport with zero config, and no fallback: a failed tax call is a failed checkout"

// grpcRunNames names a gRPC run.
func grpcRunNames(r *tuesdayRun) (name, short string, notes []string) {
	if !r.protected {
		return "plain gRPC channel (no deadline)", "plain", nil
	}
	return "gRPC channel with bulwark's client interceptor, zero config", "bulwark",
		[]string{"nothing set: the Transport behind the interceptor has an empty Config; the attempt timeout and the breaker's slow-call threshold are learned from tax's own healthy latency.", r.learnedNote()}
}

// taxRater is the tax service's one method, as grpc.ServiceDesc wants
// its handler type: an interface.
type taxRater interface {
	rate(ctx context.Context) (*wrapperspb.StringValue, error)
}

// taxMethod is the tax service's full method name.
const taxMethod = "/lab.Tax/Rate"

// taxServiceDesc describes the tax service by hand, as generated code
// would (an empty request, the rate as a string), so the lab needs no
// .proto file and no code generator.
var taxServiceDesc = grpc.ServiceDesc{
	ServiceName: "lab.Tax",
	HandlerType: (*taxRater)(nil),
	Methods: []grpc.MethodDesc{{MethodName: "Rate", Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
		if err := dec(new(emptypb.Empty)); err != nil {
			return nil, err
		}
		call := func(ctx context.Context, _ any) (any, error) { return srv.(taxRater).rate(ctx) }
		if icpt == nil {
			return call(ctx, nil)
		}
		return icpt(ctx, nil, &grpc.UnaryServerInfo{Server: srv, FullMethod: taxMethod}, call)
	}}},
}

// grpcTax is one run's tax service over gRPC.
type grpcTax struct {
	r    *tuesdayRun
	s    settings
	stop chan struct{}
}

func (t *grpcTax) rate(ctx context.Context) (*wrapperspb.StringValue, error) {
	d := t.r.taxDelay(t.s, time.Now())
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return wrapperspb.String("0.0825"), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-t.stop:
		return nil, context.Canceled
	}
}

// startGRPCTax starts the tax service over gRPC and the channel checkout
// calls it on: plain, or with bulwark's interceptor at zero config.
func (r *tuesdayRun) startGRPCTax(s settings, _ time.Duration) (stop func(), err error) {
	var ln net.Listener
	if inMemory != nil {
		ln = inMemory.listen()
	} else if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		return nil, err
	}
	r.taxHost = ln.Addr().String()
	tax := &grpcTax{r: r, s: s, stop: make(chan struct{})}
	srv := grpc.NewServer()
	srv.RegisterService(&taxServiceDesc, tax)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(ln)
	}()
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if inMemory != nil {
		opts = append(opts, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return inMemory.dial(ctx, "tcp", addr)
		}))
	}
	if r.protected {
		if r.bulwark, err = bulwark.New(bulwark.Config{}); err != nil {
			close(tax.stop)
			srv.Stop()
			<-served
			return nil, err
		}
		opts = append(opts, grpc.WithChainUnaryInterceptor(bulwarkgrpc.UnaryClientInterceptor(r.bulwark)))
	}
	conn, err := grpc.NewClient("passthrough:///"+r.taxHost, opts...)
	if err != nil {
		close(tax.stop)
		srv.Stop()
		<-served
		return nil, err
	}
	r.taxConn = conn
	return func() {
		close(tax.stop)
		conn.Close()
		srv.Stop()
		<-served
	}, nil
}

// callGRPCTax asks the tax service for its rate over gRPC, as callTax
// does over HTTP: 200 and the rate, or the call's error.
func (r *tuesdayRun) callGRPCTax(ctx context.Context) (code int, rate []byte, fallback string, err error) {
	out := new(wrapperspb.StringValue)
	if err := r.taxConn.Invoke(ctx, taxMethod, new(emptypb.Empty), out); err != nil {
		return 0, nil, "", err
	}
	return http.StatusOK, []byte(out.GetValue()), "", nil
}
