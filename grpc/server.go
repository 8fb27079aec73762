package bulwarkgrpc

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/bulwark-http/bulwark/internal/wire"
	"github.com/bulwark-http/bulwark/server"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"google.golang.org/protobuf/types/known/durationpb"
)

// The metadata keys the server half reads and writes: the HTTP headers of
// the same names (gRPC metadata keys are lower case).
var (
	// mdNoRetry is the trailer by which a service says "do not retry
	// this": "below" on a failure passed up (bulwark.NoRetryFromBelow), "1"
	// on a Shedder's refusal, as bulwark.NoRetryHeader on HTTP.
	mdNoRetry       = strings.ToLower(bulwark.NoRetryHeader)
	mdShedPriority  = strings.ToLower(bulwark.ShedPriorityHeader)
	mdShedReason    = strings.ToLower(server.ShedReasonHeader)
	mdEnvoyDeadline = "x-envoy-expected-rq-timeout-ms"
)

// mdPushback is gRFC A6's server pushback trailer: the milliseconds a
// client should wait before it tries again.
const mdPushback = "grpc-retry-pushback-ms"

// ServerConfig configures the server interceptors. The zero value caps
// each call's deadline at server.DefaultMaxDeadline, marks failures passed
// up from below, and sheds nothing.
type ServerConfig struct {
	// Shedder, when not nil, admits each call as it admits an HTTP
	// request (server.Shedder.Admit): a unary call holds a worker while its
	// handler runs, a stream for its whole life, and a call it refuses is
	// answered RESOURCE_EXHAUSTED with grpc-retry-pushback-ms. One Shedder
	// may serve a service's HTTP handler and its gRPC server together, with
	// one pool of workers. Nil means no shedding.
	Shedder *server.Shedder

	// Deadline caps the call's deadline as server.DeadlineHandler caps an
	// HTTP request's: Max (zero means server.DefaultMaxDeadline) bounds the
	// deadline grpc-go set from grpc-timeout, and bulwark's deadline key
	// (Header, lower-cased; empty means bulwark.DefaultDeadlineHeader) and
	// x-envoy-expected-rq-timeout-ms are read from the metadata; the
	// soonest wins. OnMalformed hears of a key present but ignored.
	Deadline server.DeadlineOptions
}

// serverHalf is a ServerConfig with its defaults applied.
type serverHalf struct {
	shed        *server.Shedder
	max         time.Duration
	header      string
	onMalformed func(string)
}

func newServerHalf(cfg ServerConfig) *serverHalf {
	h := &serverHalf{shed: cfg.Shedder, max: cfg.Deadline.Max, header: strings.ToLower(cfg.Deadline.Header), onMalformed: cfg.Deadline.OnMalformed}
	if h.max <= 0 {
		h.max = server.DefaultMaxDeadline
	}
	if h.header == "" {
		h.header = strings.ToLower(bulwark.DefaultDeadlineHeader)
	}
	return h
}

// UnaryServerInterceptor returns the server half for unary calls. For each
// call, in this order:
//   - the deadline: the soonest of the context's (grpc-go sets it from
//     grpc-timeout), bulwark's deadline key and Envoy's, capped at
//     cfg.Deadline.Max;
//   - the Shedder, if any: the call waits for a worker within that
//     deadline, at the priority its metadata says (bulwark-priority, as
//     the HTTP header; without it, bulwark.WithPriority on the context,
//     else a POST's: high), retries behind first attempts
//     (bulwark-attempt, grpc-previous-rpc-attempts). A refusal is
//     RESOURCE_EXHAUSTED, with trailers grpc-retry-pushback-ms (the
//     Shedder's Retry-After), bulwark-no-retry "1", bulwark-shed-reason
//     and bulwark-shed-priority, and a google.rpc.RetryInfo detail;
//   - a bulwark.CallRecord on the handler's context: when the handler
//     fails with a code that stands for a 5xx or 429 (UNAVAILABLE,
//     RESOURCE_EXHAUSTED, INTERNAL, UNKNOWN, DATA_LOSS, DEADLINE_EXCEEDED,
//     UNIMPLEMENTED) after a bulwark call it made with that context failed
//     in a way the tier below dealt with, the answer carries the trailer
//     bulwark-no-retry "below" (bulwark.NoRetryFromBelow's rules), so a
//     bulwark client above neither retries it nor counts it against this
//     service.
//
// A shed call gets RESOURCE_EXHAUSTED, not UNAVAILABLE, which gRPC clients
// retry at once (see docs/design.md, "gRPC"); one whose caller gave up or
// whose deadline passed while it waited gets CANCELLED or
// DEADLINE_EXCEEDED.
func UnaryServerInterceptor(cfg ServerConfig) grpc.UnaryServerInterceptor {
	h := newServerHalf(cfg)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		var resp any
		err := h.serve(ctx, info.FullMethod, func(md metadata.MD) { _ = grpc.SetTrailer(ctx, md) }, func(ctx context.Context) (err error) {
			resp, err = handler(ctx, req)
			return err
		})
		return resp, err
	}
}

// StreamServerInterceptor returns the server half for streams, as
// UnaryServerInterceptor does for unary calls. A stream the Shedder admits
// holds its worker for its whole life, until its handler returns: a
// long-lived stream is a worker taken for as long as it lasts, so a
// service whose streams outlive a request's patience should give them a
// Shedder (or a Classify priority) of their own, or none, rather than let
// them starve its unary calls. The deadline cap applies to the stream's
// context as to a unary call's.
func StreamServerInterceptor(cfg ServerConfig) grpc.StreamServerInterceptor {
	h := newServerHalf(cfg)
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return h.serve(ss.Context(), info.FullMethod, ss.SetTrailer, func(ctx context.Context) error {
			return handler(srv, &serverStream{ServerStream: ss, ctx: ctx})
		})
	}
}

// serve runs one call's handler, run, under the server half: the
// deadline capped, the Shedder's admission (a refusal's trailers set
// through setTrailer), and the call record, whose mark on a failure passed
// up is set through setTrailer too.
func (h *serverHalf) serve(ctx context.Context, method string, setTrailer func(metadata.MD), run func(context.Context) error) error {
	ctx, cancel := h.deadline(ctx)
	if cancel != nil {
		defer cancel()
	}
	if h.shed != nil {
		// The whole metadata only for the Shedder's request: it is a copy.
		md, _ := metadata.FromIncomingContext(ctx)
		release, err := h.shed.Admit(shedRequest(ctx, method, md))
		if err != nil {
			return h.refused(ctx, err, setTrailer)
		}
		defer release()
	}
	var rec bulwark.CallRecord
	err := run(rec.Attach(ctx))
	if err != nil && passedUp(&rec, err) {
		setTrailer(passUpTrailer)
	}
	return err
}

// TapHandle returns a tap.ServerInHandle that refuses, before the call's
// message is read or decoded, a call s would refuse at once for want of
// room (server.Shedder.Precheck): under overload the refusals then cost
// the server no decoding. It never queues nor takes a worker (grpc-go runs
// it on the connection's reader, where it must not block); the
// interceptors still admit every call it lets by. grpc-go sends a tap's
// refusal as a status alone, without trailers: it is RESOURCE_EXHAUSTED
// with what the interceptors' trailers say as details, a
// google.rpc.RetryInfo (the wait) and a google.rpc.ErrorInfo of domain
// "bulwark", reason "SHED" (bulwark-no-retry, bulwark-shed-priority,
// bulwark-shed-reason as its metadata), which bulwark's client reads as
// it reads the trailers.
// Install it with grpc.InTapHandle, beside interceptors given the same
// Shedder.
func TapHandle(s *server.Shedder) tap.ServerInHandle {
	return func(ctx context.Context, info *tap.Info) (context.Context, error) {
		if err := s.Precheck(shedRequest(ctx, info.FullMethodName, info.Header)); err != nil {
			return ctx, shedStatus(err).Err()
		}
		return ctx, nil
	}
}

// ServerOptions returns the server options that install the server half:
// both interceptors, and TapHandle when cfg has a Shedder. grpc-go allows
// one tap per server: a server with a tap of its own installs the
// interceptors alone (grpc.ChainUnaryInterceptor,
// grpc.ChainStreamInterceptor).
func ServerOptions(cfg ServerConfig) []grpc.ServerOption {
	opts := []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(UnaryServerInterceptor(cfg)),
		grpc.ChainStreamInterceptor(StreamServerInterceptor(cfg)),
	}
	if cfg.Shedder != nil {
		opts = append(opts, grpc.InTapHandle(TapHandle(cfg.Shedder)))
	}
	return opts
}

// serverStream is a ServerStream with the server half's context.
type serverStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *serverStream) Context() context.Context { return s.ctx }

// deadline returns ctx bounded by the call's deadline, capped, and the
// cancel of the context it made (nil when ctx already ends as soon).
func (h *serverHalf) deadline(ctx context.Context) (context.Context, context.CancelFunc) {
	now := time.Now()
	best, found := time.Duration(0), false
	had, hasDeadline := ctx.Deadline()
	if hasDeadline {
		best, found = had.Sub(now), true
	}
	for _, key := range [...]string{h.header, mdEnvoyDeadline} {
		v := metadata.ValueFromIncomingContext(ctx, key)
		if len(v) == 0 {
			continue
		}
		d, ok := wire.ParseMillis(v[0])
		if !ok || len(v) > 1 {
			// Two values for one deadline contradict each other: trust neither.
			if h.onMalformed != nil {
				h.onMalformed(key)
			}
			continue
		}
		if !found || d < best {
			best, found = d, true
		}
	}
	if !found {
		return ctx, nil
	}
	at := now.Add(min(best, h.max))
	if hasDeadline && !at.Before(had) {
		return ctx, nil
	}
	return context.WithDeadline(ctx, at)
}

// shedRequest is the request that stands for a gRPC call before a
// Shedder: a POST (which gRPC is on the wire) to the full method name,
// with the call's metadata as its header (binary values left out), so
// that a ShedConfig.Classify written for HTTP reads a gRPC call's
// priority, path and headers the same way.
func shedRequest(ctx context.Context, method string, md metadata.MD) *http.Request {
	h := make(http.Header, len(md))
	for k, v := range md {
		if !strings.HasSuffix(k, "-bin") {
			h[http.CanonicalHeaderKey(k)] = v
		}
	}
	r := &http.Request{Method: http.MethodPost, URL: &url.URL{Path: method}, RequestURI: method,
		Proto: "HTTP/2.0", ProtoMajor: 2, Header: h}
	return r.WithContext(ctx)
}

// refused is the status of a call the Shedder refused, with its trailers
// set through setTrailer.
func (h *serverHalf) refused(ctx context.Context, err error, setTrailer func(metadata.MD)) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return status.FromContextError(ctxErr).Err()
	}
	se, ok := err.(*server.ShedError)
	if !ok {
		return status.Error(codes.Internal, err.Error())
	}
	setTrailer(metadata.MD{
		mdNoRetry:      {"1"},
		mdPushback:     {strconv.FormatInt(se.RetryAfter.Milliseconds(), 10)},
		mdShedReason:   {se.Reason.String()},
		mdShedPriority: {se.Priority.String()},
	})
	return shedStatus(err).Err()
}

// shedStatus is a Shedder's refusal as a status: RESOURCE_EXHAUSTED, with
// the wait it asks for as a google.rpc.RetryInfo, and the trailers'
// don't-retry and priority as a google.rpc.ErrorInfo of domain
// shedDomain: a tap's refusal travels as a status alone, and a bulwark
// client reads them there (passup.go).
func shedStatus(err error) *status.Status {
	st := status.New(codes.ResourceExhausted, err.Error())
	if se, ok := err.(*server.ShedError); ok {
		d, derr := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(se.RetryAfter)},
			&errdetails.ErrorInfo{Reason: shedReason, Domain: shedDomain, Metadata: map[string]string{
				mdNoRetry: "1", mdShedPriority: se.Priority.String(), mdShedReason: se.Reason.String()}})
		if derr == nil {
			st = d
		}
	}
	return st
}

// The google.rpc.ErrorInfo of a Shedder's refusal.
const (
	shedDomain = "bulwark"
	shedReason = "SHED"
)

// passUpTrailer marks an answer passed up from below.
var passUpTrailer = metadata.MD{mdNoRetry: {bulwark.NoRetryFromBelow}}

// passedUp reports whether a handler's error is to be marked passed up:
// its code stands for a 5xx or 429 on HTTP (as grpc-gateway maps codes),
// the answers server.PassUp marks, and a bulwark call below failed in a
// way the tier below dealt with.
func passedUp(rec *bulwark.CallRecord, err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.ResourceExhausted, codes.Internal, codes.Unknown,
		codes.DataLoss, codes.DeadlineExceeded, codes.Unimplemented:
		return rec.FailedBelow()
	}
	return false
}
