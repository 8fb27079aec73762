package bulwarkgrpc

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bulwark-http/bulwark"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
)

// request is the HTTP/2 POST a gRPC call is, as the layers see it: POST
// http://<authority>/<pkg.Service>/<Method>, the call's context, its
// outgoing metadata as headers (text keys only: bulwark reads no binary
// metadata, and a binary value is no valid header value), and no body
// (the message travels beside, in the sender). safe marks it as safe to
// send twice, by an empty Idempotency-Key unless the metadata has one;
// once marks it sent once by bulwark because grpc-go retries it itself;
// unkeyed drops the metadata's idempotency keys (a call bulwark must send
// once whatever it carries).
//
// It fills in req and u, which the caller's call state holds, so that a
// call allocates no request of its own.
func request(req *http.Request, u *url.URL, ctx context.Context, authority, method string, safe, once, unkeyed bool) {
	var h http.Header
	if md, ok := metadata.FromOutgoingContext(ctx); ok && len(md) > 0 {
		h = make(http.Header, len(md)+1)
		for k, vs := range md {
			if strings.HasSuffix(k, "-bin") || strings.HasPrefix(k, ":") || !validValues(vs) {
				continue
			}
			ck := http.CanonicalHeaderKey(k)
			switch {
			case ck == bulwark.DefaultDeadlineHeader:
				// The attempt layer's to write (attemptContext reads it): a
				// caller's would bound attempts the layer does not.
				continue
			case unkeyed && (ck == bulwark.IdempotencyKeyHeader || ck == "X-Idempotency-Key"):
				continue
			}
			h[ck] = vs
		}
		if _, ok := h[bulwark.IdempotencyKeyHeader]; safe && !ok {
			h[bulwark.IdempotencyKeyHeader] = emptyKey
		}
		if once {
			// grpc-go's retryPolicy retries the call inside each attempt: a
			// retrying client, which bulwark leaves the retries to (one layer).
			h[bulwark.AttemptHeader] = firstAttempt
		}
	} else {
		switch {
		case safe:
			h = safeHeader
		case once:
			h = onceHeader
		default:
			h = noHeader
		}
	}
	*u = url.URL{Scheme: "http", Host: authority, Path: method}
	r := http.Request{
		Method: http.MethodPost, URL: u,
		Proto: "HTTP/2.0", ProtoMajor: 2,
		Header: h, Body: http.NoBody, Host: authority,
	}
	// WithContext is the only way to set a request's context; its copy
	// does not escape, and is copied into req.
	*req = *r.WithContext(ctx)
}

// The headers of calls without metadata, shared by all of them: the layers
// never change a request's header in place (the RoundTripper contract;
// they copy it first), and the length and capacity of each value keep an
// append from writing into it. A call with metadata has a map of its own.
var (
	emptyKey     = []string{""}
	firstAttempt = []string{"1"}
	noHeader     = http.Header{}
	safeHeader   = http.Header{bulwark.IdempotencyKeyHeader: emptyKey}
	onceHeader   = http.Header{bulwark.AttemptHeader: firstAttempt}
)

// validValues reports whether every value is one net/http would write
// (no control byte but tab), so that a metadata value bulwark cannot carry
// is left out rather than failing the call.
func validValues(vs []string) bool {
	for _, v := range vs {
		for i := 0; i < len(v); i++ {
			if c := v[i]; c < ' ' && c != '\t' || c == 0x7f {
				return false
			}
		}
	}
	return true
}

// added is what the layers wrote into an attempt's header that the call's
// own request does not carry, as metadata pairs for the attempt's gRPC
// call: the idempotency key the retry layer gave it (Retry.KeyPOST), the
// priority the pushback layer read from the context (PriorityHeader), the
// trace context the span layer injected, the attempt's number from the
// second on. Not the deadline header: grpc-timeout carries the deadline.
// Nil, allocating nothing, when the layers wrote nothing else.
func added(req, caller *http.Request) []string {
	var kv []string
	for k, vs := range req.Header {
		if len(vs) != 1 || k == bulwark.DefaultDeadlineHeader {
			continue
		}
		if cv, ok := caller.Header[k]; ok && len(cv) == 1 && cv[0] == vs[0] {
			continue
		}
		switch {
		case vs[0] == "" && k == bulwark.IdempotencyKeyHeader:
			continue // the marker of a method safe to repeat
		case vs[0] == "1" && k == bulwark.AttemptHeader:
			continue // the first attempt: as if unnumbered
		case !validValues(vs):
			continue
		}
		kv = append(kv, strings.ToLower(k), vs[0])
	}
	return kv
}

// channels remembers what each channel's calls share: its authority. The
// map is bounded by the channels a process makes, each a long-lived
// object; it holds the target strings, not the channels. last is the
// channel seen last, which spares most calls the target string that
// CanonicalTarget builds anew on each call.
type channels struct {
	authority sync.Map // target → authority
	last      atomic.Pointer[channelAuthority]
}

type channelAuthority struct {
	cc        *grpc.ClientConn
	authority string
}

// authorityOf is the authority cc's calls carry, which keys their
// upstream in Config.Upstreams: the endpoint of the channel's canonical
// target ("dns:///api.internal:443" → "api.internal:443"), as grpc-go
// derives it for its resolvers, "localhost" for a unix socket. A channel
// made with grpc.WithAuthority sends that authority on the wire, but is
// keyed here by its target's endpoint.
func (ch *channels) authorityOf(cc *grpc.ClientConn) string {
	if l := ch.last.Load(); l != nil && l.cc == cc {
		return l.authority
	}
	target := cc.CanonicalTarget()
	if a, ok := ch.authority.Load(target); ok {
		ch.last.Store(&channelAuthority{cc, a.(string)})
		return a.(string)
	}
	a := "localhost"
	if u, err := url.Parse(target); err == nil && u.Scheme != "unix" && u.Scheme != "unix-abstract" {
		a = strings.TrimPrefix(u.Path, "/")
		if a == "" {
			a = u.Opaque
		}
	}
	ch.authority.Store(target, a)
	ch.last.Store(&channelAuthority{cc, a})
	return a
}

// methods remembers, by full method name, whether a method's descriptor
// says it is safe to repeat. Bounded: past maxMethods names it asks the
// registry each time.
type methods struct {
	mu   sync.RWMutex
	safe map[string]bool
}

const maxMethods = 4096

// safe reports whether method ("/pkg.Service/Method") is declared in
// protoregistry.GlobalFiles with idempotency_level NO_SIDE_EFFECTS or
// IDEMPOTENT.
func (m *methods) isSafe(method string) bool {
	m.mu.RLock()
	s, ok := m.safe[method]
	m.mu.RUnlock()
	if ok {
		return s
	}
	s = declaredSafe(method)
	m.mu.Lock()
	if m.safe == nil {
		m.safe = make(map[string]bool)
	}
	if len(m.safe) < maxMethods {
		m.safe[method] = s
	}
	m.mu.Unlock()
	return s
}

func declaredSafe(method string) bool {
	svc, name, ok := strings.Cut(strings.TrimPrefix(method, "/"), "/")
	if !ok {
		return false
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		return false
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return false
	}
	md := sd.Methods().ByName(protoreflect.Name(name))
	if md == nil {
		return false
	}
	opts, ok := md.Options().(*descriptorpb.MethodOptions)
	if !ok {
		return false
	}
	switch opts.GetIdempotencyLevel() {
	case descriptorpb.MethodOptions_NO_SIDE_EFFECTS, descriptorpb.MethodOptions_IDEMPOTENT:
		return true
	}
	return false
}

// grpcRetries reports whether cc's service config gives method a
// retryPolicy, so that grpc-go retries it below bulwark. A channel reads
// its service config only once its resolver answers: on a channel not yet
// connected, it waits for that (within ctx), as the call itself would wait
// for the channel, so that a fresh channel's first calls are not retried
// or hedged at two layers.
func grpcRetries(ctx context.Context, cc *grpc.ClientConn, method string) bool {
	if hasRetryPolicy(cc, method) {
		return true
	}
	for s := cc.GetState(); s == connectivity.Idle || s == connectivity.Connecting; s = cc.GetState() {
		cc.Connect()
		if !cc.WaitForStateChange(ctx, s) {
			break
		}
	}
	return hasRetryPolicy(cc, method)
}

// hasRetryPolicy reports whether cc's service config, as far as cc has
// read it, gives method a retryPolicy.
func hasRetryPolicy(cc *grpc.ClientConn, method string) bool {
	return cc.GetMethodConfig(method).RetryPolicy != nil
}

// attemptContext is the context an attempt's gRPC call is made with: the
// attempt's own, with the deadline its deadline header tells the server
// (bulwark's attempt layer bounds an attempt with a timer of its own, not
// a context deadline, and writes what is left, less a margin for the
// network, in that header), so that the server's grpc-timeout is the
// attempt's bound. A policy whose Timeout.Header names another header, or
// NoDeadlineHeader, leaves the server the caller's deadline.
func attemptContext(req *http.Request) (context.Context, context.CancelFunc) {
	ctx := req.Context()
	v := req.Header[bulwark.DefaultDeadlineHeader]
	if len(v) != 1 {
		return ctx, func() {}
	}
	ms, err := strconv.ParseInt(v[0], 10, 64)
	if err != nil || ms <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, time.Duration(ms)*time.Millisecond)
}

// ended reports whether a gRPC call that failed with st ended with ctx,
// its attempt's context: ctx is done, or st is DEADLINE_EXCEEDED and ctx's
// deadline has passed (the server, told that deadline, may answer before
// the client's own timer fires).
func ended(ctx context.Context, st *status.Status) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && st.Code() == codes.DeadlineExceeded && !time.Now().Before(d)
}

// attemptEnd is the error of an attempt whose gRPC call ended with its
// context: the attempt context's own, once it ends. The deadline
// attemptContext adds comes a margin before the attempt layer's bound, and
// the layer tells its own timeout from the caller's end by that context,
// so the attempt waits the margin out (the attempt's context always ends:
// the header is written only for a bounded attempt).
func attemptEnd(ctx context.Context) error {
	<-ctx.Done()
	return ctx.Err()
}
