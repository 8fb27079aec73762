package bulwarkgrpc

import (
	"context"
	"io"
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
	"google.golang.org/protobuf/types/known/emptypb"
)

// ReplayBuffer is how many bytes of a stream's sent messages are kept to
// replay on a new attempt: grpc-go's own retry buffer's default (its
// grpc.MaxRetryRPCBufferSize, 256 KiB). A stream that sends more is
// committed to its attempt and never replayed.
const ReplayBuffer = 256 << 10

// StreamClientInterceptor returns an interceptor that sends each stream's
// establishment through t's layers, as the package doc describes: the
// breaker, bulkhead, retries and attempt bound judge the stream until it
// is established, and the stream holds its bulkhead slot until it ends.
// Install it with grpc.WithStreamInterceptor.
func StreamClientInterceptor(t *bulwark.Transport) grpc.StreamClientInterceptor {
	c := &client{t: t}
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		s := &stream{
			ctx: ctx, desc: desc, cc: cc, method: method, streamer: streamer, opts: opts,
			changed: make(chan struct{}), overflowed: make(chan struct{}), established: make(chan struct{}),
		}
		// Each attempt needs the messages sent so far; one that cannot be
		// sized cannot be kept within the buffer's bound.
		c.prepare(&s.request, &s.url, ctx, cc, method, true)
		s.caller = &s.request
		go s.establish(t)
		return s, nil
	}
}

// stream is one client stream: the caller's grpc.ClientStream, and the
// sender of its attempts for Transport.RoundTripVia.
//
// Until it is established, what the caller sends is kept (up to
// ReplayBuffer bytes) and sent on the attempt under way; a new attempt
// replays it first. Established, the stream is its last attempt's.
type stream struct {
	ctx      context.Context // the caller's
	desc     *grpc.StreamDesc
	cc       *grpc.ClientConn
	method   string
	streamer grpc.Streamer
	opts     []grpc.CallOption
	caller   *http.Request // &request
	request  http.Request
	url      url.URL

	mu         sync.Mutex
	cur        grpc.ClientStream // the attempt under way, once its sends are replayed
	inflight   bool              // an attempt is under way (cur may not be set yet)
	changed    chan struct{}     // closed and replaced when cur changes or the stream is established
	sent       []any
	size       int
	over       bool          // more than ReplayBuffer sent: never replayed
	overflowed chan struct{} // closed when over is set
	closeSent  bool
	closedOn   grpc.ClientStream // the attempt closeSent was given to
	attempts   []*streamAttempt

	established chan struct{} // closed when final and err are set
	final       grpc.ClientStream
	err         error
	body        io.Closer   // the stack's response, closed when the stream ends
	stop        func() bool // unregisters end from the caller's context
	endOnce     sync.Once
}

type streamAttempt struct {
	resp *http.Response
	cs   grpc.ClientStream
	err  error
}

// establish sends the stream through the layers and records its outcome.
func (s *stream) establish(t *bulwark.Transport) {
	resp, err := t.RoundTripVia(s, s.caller)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sent = nil // no attempt replays it any more
	defer close(s.established)
	defer s.wake()
	if err != nil {
		s.err = callError(err)
		return
	}
	var a *streamAttempt
	for _, x := range s.attempts {
		if x.resp == resp {
			a = x
		}
	}
	switch {
	case a == nil:
		_ = resp.Body.Close()
		s.err = status.Errorf(codes.Unavailable, "bulwark: %s answered by a fallback with HTTP %d, which carries no gRPC stream", s.method, resp.StatusCode)
	case a.err != nil:
		_ = resp.Body.Close()
		s.err = a.err
	default:
		s.final, s.body = a.cs, resp.Body
		if s.closeSent && s.closedOn != a.cs {
			// The caller closed its side after the attempt returned
			// (established once the buffer overflowed) and before this:
			// its CloseSend found no attempt to give it to, and the
			// server would wait for the end of the stream for good.
			// Nothing else calls the stream now: the caller has closed
			// its side, and its next CloseSend waits for established.
			_ = a.cs.CloseSend()
			s.closedOn = a.cs
		}
		// A caller that cancels the stream rather than read it to its end
		// ends it too.
		s.stop = context.AfterFunc(s.ctx, s.end)
	}
}

// wake tells those waiting on changed to look again; under mu.
func (s *stream) wake() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// end closes the stack's response once: the stream's bulkhead slot and the
// stack's contexts are released.
func (s *stream) end() {
	s.endOnce.Do(func() {
		s.mu.Lock()
		b, stop := s.body, s.stop
		s.mu.Unlock()
		if stop != nil {
			stop()
		}
		if b != nil {
			_ = b.Close()
		}
	})
}

// commitsAtOpen reports whether the stream is established as soon as it
// is open: a bidirectional stream, whose server may say nothing until the
// caller has, and so would never be established within an attempt's bound.
func (s *stream) commitsAtOpen() bool { return s.desc.ClientStreams && s.desc.ServerStreams }

// RoundTrip sends one attempt: it opens the stream with a context that the
// attempt's ending cancels until the stream is established, replays what
// the caller sent so far, and waits for the server's headers (or the end
// of the stream, or the replay buffer overflowing, after which no attempt
// could replay it).
func (s *stream) RoundTrip(req *http.Request) (*http.Response, error) {
	sctx, cancel := context.WithCancel(s.ctx)
	if kv := added(req, s.caller); kv != nil {
		sctx = metadata.AppendToOutgoingContext(sctx, kv...)
	}
	actx, acancel := attemptContext(req)
	defer acancel()
	stop := context.AfterFunc(actx, cancel)
	fail := func(cs grpc.ClientStream, err error) (*http.Response, error) {
		stop()
		cancel()
		st, ok := status.FromError(err)
		switch {
		case ended(actx, st):
			return nil, attemptEnd(req.Context())
		case !ok:
			return nil, err
		}
		var p *peer.Peer
		var trailer metadata.MD
		if cs != nil {
			p, _ = peer.FromContext(cs.Context())
			trailer = cs.Trailer()
		}
		if st.Code() == codes.Unavailable && (p == nil || p.Addr == nil) {
			return nil, err // unanswered: see unary.RoundTrip
		}
		resp := response(req, st, trailer)
		s.mu.Lock()
		if s.over {
			// No attempt could replay what the caller sent: this one's
			// failure is the stream's.
			resp.Header[bulwark.NoRetryHeader] = []string{"1"}
		}
		s.attempts = append(s.attempts, &streamAttempt{resp: resp, err: err})
		s.mu.Unlock()
		return resp, nil
	}
	// One attempt at a time: the caller's messages go to one stream. A
	// hedge waits for the attempt before it to end, and is ended by its
	// own context if that attempt's answer is taken.
	s.mu.Lock()
	for s.inflight {
		ch := s.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-req.Context().Done():
			stop()
			cancel()
			return nil, req.Context().Err()
		}
		s.mu.Lock()
	}
	s.inflight = true
	s.mu.Unlock()
	cs, err := s.streamer(sctx, s.desc, s.cc, s.method, s.opts...)
	if err != nil {
		s.mu.Lock()
		s.inflight = false
		s.wake()
		s.mu.Unlock()
		return fail(nil, err)
	}
	s.mu.Lock()
	for _, m := range s.sent {
		_ = cs.SendMsg(m) // a failure shows in the wait for headers
	}
	if s.closeSent {
		_ = cs.CloseSend()
		s.closedOn = cs
	}
	s.cur = cs
	s.wake()
	over := s.overflowed
	s.mu.Unlock()

	var herr error
	if !s.commitsAtOpen() {
		// Header in a goroutine of its own, left to end with the stream
		// if the buffer overflows first; it only waits on the stream,
		// which grpc-go allows beside the caller's RecvMsg.
		type header struct {
			md  metadata.MD
			err error
		}
		headers := make(chan header, 1)
		go func() {
			md, e := cs.Header()
			headers <- header{md, e}
		}()
		select {
		case h := <-headers:
			herr = h.err
			if h.md == nil && h.err == nil {
				// grpc-go's Header says nothing of a stream that ended
				// without headers: its status is RecvMsg's, and with no
				// message in such a stream there is nothing to decode.
				// The caller waits for the stream to be established
				// before it reads: no RecvMsg beside this one.
				if herr = cs.RecvMsg(new(emptypb.Empty)); herr == io.EOF {
					herr = nil
				}
			}
		case <-over:
		}
	}
	if herr == nil && !stop() {
		herr = actx.Err() // the attempt ended as the headers came
	}
	s.mu.Lock()
	s.cur, s.inflight = nil, false
	s.wake()
	s.mu.Unlock()
	if herr != nil {
		return fail(cs, herr)
	}
	resp := response(req, status.New(codes.OK, ""), nil)
	resp.Body = &streamBody{cancel: cancel}
	s.mu.Lock()
	s.attempts = append(s.attempts, &streamAttempt{resp: resp, cs: cs})
	s.mu.Unlock()
	return resp, nil
}

// streamBody is the body of an established stream's response: closing it
// (when the stream ends) cancels the stream's context.
type streamBody struct{ cancel context.CancelFunc }

func (*streamBody) Read([]byte) (int, error) { return 0, io.EOF }

func (b *streamBody) Close() error {
	b.cancel()
	return nil
}

// wait returns the established stream, or the error that ended it.
func (s *stream) wait() (grpc.ClientStream, error) {
	select {
	case <-s.established:
	case <-s.ctx.Done():
		<-s.established // the attempt's context is the caller's child: it ends too
	}
	return s.final, s.err
}

// SendMsg sends m on the attempt under way, keeping it for a later attempt
// to replay while the buffer has room. Before the stream is established, a
// failure to send is the attempt's (its wait for headers sees it), and m
// is replayed if the stream is tried again: SendMsg then returns nil.
func (s *stream) SendMsg(m any) error {
	s.mu.Lock()
	for s.cur == nil {
		select {
		case <-s.established:
			s.mu.Unlock()
			if s.final == nil {
				return s.err // the stream's status, at once
			}
			return s.final.SendMsg(m)
		default:
		}
		ch := s.changed
		s.mu.Unlock()
		<-ch
		s.mu.Lock()
	}
	if !s.over {
		n := ReplayBuffer + 1
		if pm, ok := m.(proto.Message); ok {
			n = proto.Size(pm)
		}
		if s.size += n; s.size > ReplayBuffer {
			s.over, s.sent = true, nil
			close(s.overflowed)
		} else {
			// A copy: grpc-go lets the caller reuse m once SendMsg
			// returns, as its own retry buffer keeps the encoded bytes.
			s.sent = append(s.sent, proto.Clone(m.(proto.Message)))
		}
	}
	cs := s.cur
	s.mu.Unlock()
	_ = cs.SendMsg(m)
	return nil
}

// CloseSend closes the sending side, on the attempt under way and on any
// later one.
func (s *stream) CloseSend() error {
	s.mu.Lock()
	s.closeSent = true
	cs := s.cur
	if cs != nil {
		s.closedOn = cs
	}
	s.mu.Unlock()
	if cs != nil {
		_ = cs.CloseSend()
	}
	select {
	case <-s.established:
		if s.final != nil {
			return s.final.CloseSend()
		}
	default:
	}
	return nil
}

// RecvMsg waits for the stream to be established and receives from it;
// the stream's end (any error, io.EOF included) releases what it holds.
func (s *stream) RecvMsg(m any) error {
	cs, err := s.wait()
	if err != nil {
		return err
	}
	if err := cs.RecvMsg(m); err != nil {
		s.end()
		return err
	}
	if !s.desc.ServerStreams {
		// One answer: grpc-go reads the end of the stream with it.
		s.end()
	}
	return nil
}

func (s *stream) Header() (metadata.MD, error) {
	cs, err := s.wait()
	if err != nil {
		return nil, err
	}
	return cs.Header()
}

func (s *stream) Trailer() metadata.MD {
	select {
	case <-s.established:
		if s.final != nil {
			return s.final.Trailer()
		}
	default:
	}
	return nil
}

func (s *stream) Context() context.Context {
	select {
	case <-s.established:
		if s.final != nil {
			return s.final.Context()
		}
	default:
	}
	return s.ctx
}
