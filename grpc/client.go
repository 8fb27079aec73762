package bulwarkgrpc

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"sync"

	"github.com/bulwark-http/bulwark"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// client is what an interceptor keeps across calls.
type client struct {
	t       *bulwark.Transport
	chans   channels
	methods methods
}

// prepare fills in req and u with the request for a call of method on cc
// (see request), and whether bulwark may send it more than once (see the
// package doc).
func (c *client) prepare(req *http.Request, u *url.URL, ctx context.Context, cc *grpc.ClientConn, method string, canCopy bool) {
	once := grpcRetries(ctx, cc, method)
	safe := canCopy && !once && c.methods.isSafe(method)
	// A reply bulwark cannot make afresh for each attempt would be written
	// by two at once: sent once, key or not.
	request(req, u, ctx, c.chans.authorityOf(cc), method, safe, once, !canCopy)
}

// UnaryClientInterceptor returns an interceptor that sends each unary call
// through t's layers, as the package doc describes: the policy of the
// channel's authority (or of a route matching the method), its breaker,
// bulkhead, retries and deadlines, with gRPC codes judged as the doc's
// table says. Install it with grpc.WithUnaryInterceptor, or first in
// grpc.WithChainUnaryInterceptor so that it sees each call once.
func UnaryClientInterceptor(t *bulwark.Transport) grpc.UnaryClientInterceptor {
	c := &client{t: t}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		_, isProto := reply.(proto.Message)
		u := &unary{method: method, req: req, reply: reply, cc: cc, invoker: invoker}
		u.opts, u.header, u.trailer = splitOpts(opts)
		c.prepare(&u.request, &u.url, ctx, cc, method, isProto)
		u.caller = &u.request
		resp, err := t.RoundTripVia(u, u.caller)
		if err != nil {
			if hasStatus(err) {
				return err
			}
			u.refusal = refusal{err: err, code: refusalCode(err)}
			return &u.refusal
		}
		// Ends the contexts the stack made for the call, and frees the
		// attempt's bulkhead slot if it still holds one.
		defer resp.Body.Close()
		return u.finish(resp)
	}
}

// splitOpts takes the caller's grpc.Header and grpc.Trailer options out of
// opts: each attempt gets its own, and the caller's are filled from the
// attempt whose answer it gets, so that two attempts at once never write
// to them.
func splitOpts(opts []grpc.CallOption) (rest []grpc.CallOption, header, trailer []*metadata.MD) {
	for _, o := range opts {
		switch o := o.(type) {
		case grpc.HeaderCallOption:
			header = append(header, o.HeaderAddr)
		case grpc.TrailerCallOption:
			trailer = append(trailer, o.TrailerAddr)
		default:
			rest = append(rest, o)
		}
	}
	if header == nil && trailer == nil {
		return opts, nil, nil
	}
	return rest, header, trailer
}

// unary is one unary call: the sender of its attempts (an
// http.RoundTripper for Transport.RoundTripVia) and their outcomes.
type unary struct {
	method          string
	req, reply      any
	cc              *grpc.ClientConn
	invoker         grpc.UnaryInvoker
	opts            []grpc.CallOption
	header, trailer []*metadata.MD // the caller's
	caller          *http.Request  // the request the call began as: &request

	// Held here so that a call allocates them with its state: the
	// request, its URL, and the error of a refusal.
	request http.Request
	url     url.URL
	refusal refusal

	mu       sync.Mutex
	attempts []*attempt
}

// attempt is one attempt's outcome, found again by its response.
type attempt struct {
	resp            *http.Response
	reply           any
	err             error // the attempt's status error; nil for OK
	header, trailer metadata.MD
	peer            peer.Peer // set by grpc-go once a connection carries the attempt
}

// RoundTrip sends one attempt: the invoker with the attempt's context, so
// the attempt's deadline is the grpc-timeout the server gets. Each attempt
// has its own reply (two may run at once, a hedge beside the first), and
// the caller's reply is filled from the attempt whose answer the call
// takes. A context that ended is returned as its error, for the layers to
// tell their own deadline from the caller's.
func (u *unary) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx, cancel := attemptContext(req)
	defer cancel()
	if kv := added(req, u.caller); kv != nil {
		ctx = metadata.AppendToOutgoingContext(ctx, kv...)
	}
	a := &attempt{reply: u.reply}
	if m, ok := u.reply.(proto.Message); ok {
		a.reply = m.ProtoReflect().New().Interface()
	}
	// The trailer for its pushback, the peer to tell an answer from none;
	// the header only for a caller who asked (grpc-go copies each).
	opts := append(make([]grpc.CallOption, 0, len(u.opts)+3), u.opts...)
	opts = append(opts, grpc.Trailer(&a.trailer), grpc.Peer(&a.peer))
	if u.header != nil {
		opts = append(opts, grpc.Header(&a.header))
	}
	err := u.invoker(ctx, u.method, u.req, a.reply, u.cc, opts...)
	st, ok := status.FromError(err)
	switch {
	case err != nil && ended(ctx, st):
		return nil, attemptEnd(req.Context())
	case !ok:
		return nil, err // no status: what failed is below gRPC, as a transport error is
	case st.Code() == codes.Unavailable && a.peer.Addr == nil:
		// No connection carried it (refused, none ready): unanswered, as
		// a refused connection is to an HTTP client, which the breaker's
		// ConsecutiveFailures counts.
		return nil, err
	}
	a.err, a.resp = err, response(req, st, a.trailer)
	if err != nil && (a.resp.StatusCode >= 500 || a.resp.StatusCode == http.StatusTooManyRequests) && hasRetryPolicy(u.cc, u.method) {
		// grpc-go retried it below, by the channel's retryPolicy, which
		// it may only have read once the channel resolved (after the call
		// began): retries at one layer, grpc-go's.
		a.resp.Header[bulwark.NoRetryHeader] = []string{"1"}
	}
	u.mu.Lock()
	u.attempts = append(u.attempts, a)
	u.mu.Unlock()
	return a.resp, nil
}

// finish gives the caller the outcome of the attempt resp came from: its
// status, headers and trailers, and its reply.
func (u *unary) finish(resp *http.Response) error {
	var a *attempt
	u.mu.Lock()
	for _, x := range u.attempts {
		if x.resp == resp {
			a = x
		}
	}
	u.mu.Unlock()
	if a == nil {
		// A Fallback's own response: no gRPC answer to give.
		return status.Error(codes.Unavailable, fmt.Sprintf("bulwark: %s answered by a fallback with HTTP %d, which carries no gRPC reply", u.method, resp.StatusCode))
	}
	for _, p := range u.header {
		*p = a.header
	}
	for _, p := range u.trailer {
		*p = a.trailer
	}
	if a.err != nil {
		return a.err
	}
	if a.reply != u.reply {
		m := u.reply.(proto.Message)
		proto.Reset(m)
		proto.Merge(m, a.reply.(proto.Message))
	}
	return nil
}
