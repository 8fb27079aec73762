package bulwarkgrpc_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/bulwark-http/bulwark"
	bulwarkgrpc "github.com/bulwark-http/bulwark/grpc"
)

var (
	watchDesc  = &grpc.StreamDesc{StreamName: "Watch", ServerStreams: true}
	uploadDesc = &grpc.StreamDesc{StreamName: "Upload", ClientStreams: true}
)

// watch opens a Watch stream asking for n messages, held open when hold.
func (s *served) watch(ctx context.Context, n int32, hold bool) (grpc.ClientStream, error) {
	cs, err := s.cc.NewStream(ctx, watchDesc, mWatch)
	if err != nil {
		return nil, err
	}
	if err := cs.SendMsg(&testpb.SimpleRequest{ResponseSize: n, FillUsername: hold, Payload: &testpb.Payload{Body: []byte("w")}}); err != nil {
		return nil, err
	}
	return cs, cs.CloseSend()
}

// recvAll reads a stream to its end: the messages and the final error
// (nil for io.EOF).
func recvAll(cs grpc.ClientStream) (int, error) {
	n := 0
	for {
		if err := cs.RecvMsg(new(testpb.SimpleResponse)); err != nil {
			if err == io.EOF {
				return n, nil
			}
			return n, err
		}
		n++
	}
}

// upload sends chunks of size bytes on an Upload stream and returns the
// server's answer.
func (s *served) upload(ctx context.Context, chunks, size int) (*testpb.SimpleResponse, error) {
	cs, err := s.cc.NewStream(ctx, uploadDesc, mUpload)
	if err != nil {
		return nil, err
	}
	// One message, reused as grpc-go allows once SendMsg returns: chunk i
	// is size bytes of the letter i%26.
	msg := &testpb.SimpleRequest{Payload: &testpb.Payload{}}
	for i := range chunks {
		msg.Payload.Body = []byte(strings.Repeat(string(rune('a'+i%26)), size))
		if err := cs.SendMsg(msg); err != nil {
			return nil, err
		}
	}
	if err := cs.CloseSend(); err != nil {
		return nil, err
	}
	out := new(testpb.SimpleResponse)
	if err := cs.RecvMsg(out); err != nil {
		return nil, err
	}
	return out, nil
}

func TestServerStream(t *testing.T) {
	e := newEcho()
	s := serveTCP(t, e, bulwark.Config{})
	cs, err := s.watch(t.Context(), 5, false)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := recvAll(cs); n != 5 || err != nil {
		t.Fatalf("Watch: %d messages, %v; want 5, nil", n, err)
	}
	if h := s.host(t); h.Calls.Succeeded != 1 || h.Bulkhead.InFlight != 0 {
		t.Fatalf("after the stream: calls %+v, bulkhead %+v; want 1 succeeded, no slot held", h.Calls, h.Bulkhead)
	}
}

// A stream's establishment is retried for a method safe to repeat, its
// sent messages replayed.
func TestServerStreamRetried(t *testing.T) {
	e := newEcho()
	e.on(mWatch, failFirst(1, codes.Unavailable))
	s := serveTCP(t, e, fastRetry)
	cs, err := s.watch(t.Context(), 3, false)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := recvAll(cs); n != 3 || err != nil {
		t.Fatalf("Watch: %d messages, %v; want 3 after one UNAVAILABLE", n, err)
	}
	if n := e.count(mWatch); n != 2 {
		t.Fatalf("server got %d streams, want 2", n)
	}
}

// A client stream within the replay buffer is replayed on a new attempt.
func TestClientStreamReplayed(t *testing.T) {
	e := newEcho()
	e.on(mUpload, failFirst(1, codes.Unavailable))
	s := serveTCP(t, e, fastRetry)
	out, err := s.upload(t.Context(), 10, 1000)
	var want strings.Builder
	for i := range 10 {
		want.WriteString(strings.Repeat(string(rune('a'+i)), 1000))
	}
	if err != nil || string(out.GetPayload().GetBody()) != want.String() {
		t.Fatalf("Upload: %d bytes back, %v; want the 10 chunks replayed as sent", len(out.GetPayload().GetBody()), err)
	}
	if n := e.count(mUpload); n != 2 {
		t.Fatalf("server got %d streams, want 2", n)
	}
}

// A client stream that sent more than the buffer holds is never replayed:
// sent once, its failure the caller's.
func TestClientStreamPastBufferSentOnce(t *testing.T) {
	e := newEcho()
	e.on(mUpload, failFirst(1, codes.Unavailable))
	s := serveTCP(t, e, fastRetry)
	const chunk = 16 << 10
	_, err := s.upload(t.Context(), bulwarkgrpc.ReplayBuffer/chunk+2, chunk)
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("Upload past the buffer: %v, want the server's UNAVAILABLE", err)
	}
	if n := e.count(mUpload); n != 1 {
		t.Fatalf("server got %d streams, want 1", n)
	}
}

// A client stream that overflows the buffer is established at once, while
// its caller may still be sending: a CloseSend that comes after its
// attempt returned, before the layers above hand the stream over, still
// reaches the server, which answers once it has read the whole stream. A
// Classify that waits holds the layers in that moment.
func TestClientStreamPastBufferCloseSendInHandover(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEcho()
		inHandover, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		cfg := bulwark.Config{Default: bulwark.Policy{Classify: func(resp *http.Response, err error) bulwark.Verdict {
			once.Do(func() {
				close(inHandover)
				<-release
			})
			return bulwark.DefaultClassify(resp, err)
		}}}
		s := serveBuf(t, e, cfg)
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		cs, err := s.cc.NewStream(ctx, uploadDesc, mUpload)
		if err != nil {
			t.Fatal(err)
		}
		body := bytes.Repeat([]byte("u"), bulwarkgrpc.ReplayBuffer)
		if err := cs.SendMsg(&testpb.SimpleRequest{Payload: &testpb.Payload{Body: body}}); err != nil {
			t.Fatal(err)
		}
		<-inHandover // the attempt has returned the stream as established
		err = cs.CloseSend()
		close(release)
		if err != nil {
			t.Fatal(err)
		}
		out := new(testpb.SimpleResponse)
		if err := cs.RecvMsg(out); err != nil || len(out.GetPayload().GetBody()) != len(body) {
			t.Fatalf("Upload past the buffer: %d bytes back, %v; want the %d sent", len(out.GetPayload().GetBody()), err, len(body))
		}
		if n := e.count(mUpload); n != 1 {
			t.Fatalf("server got %d streams, want 1", n)
		}
	})
}

// An open breaker refuses a stream as UNAVAILABLE that is ErrBreakerOpen.
func TestStreamBreakerOpen(t *testing.T) {
	e := newEcho()
	s := serveTCP(t, e, bulwark.Config{})
	if err := s.t.ControlBreaker(s.authority, bulwark.BreakerForceOpen); err != nil {
		t.Fatal(err)
	}
	cs, err := s.watch(t.Context(), 1, false)
	if err == nil {
		_, err = recvAll(cs)
	}
	if status.Code(err) != codes.Unavailable || !errors.Is(err, bulwark.ErrBreakerOpen) {
		t.Fatalf("Watch with the breaker open: %v, want UNAVAILABLE that is ErrBreakerOpen", err)
	}
	if n := e.count(mWatch); n != 0 {
		t.Fatalf("server got %d streams", n)
	}
}

// A stream holds its bulkhead slot until it ends.
func TestStreamHoldsSlot(t *testing.T) {
	e := newEcho()
	s := serveTCP(t, e, bulwark.Config{Default: bulwark.Policy{Bulkhead: bulwark.Bulkhead{MaxConcurrent: 1}}})
	ctx, cancel := context.WithCancel(t.Context())
	cs, err := s.watch(ctx, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.RecvMsg(new(testpb.SimpleResponse)); err != nil {
		t.Fatal(err)
	}
	_, err = s.call(t.Context(), mGet, "x")
	if status.Code(err) != codes.ResourceExhausted || !errors.Is(err, bulwark.ErrBulkheadFull) {
		t.Fatalf("Get beside an open stream holding the one slot: %v, want RESOURCE_EXHAUSTED that is ErrBulkheadFull", err)
	}
	cancel()
	if _, err := recvAll(cs); status.Code(err) != codes.Canceled {
		t.Fatalf("the cancelled stream ended with %v, want CANCELED", err)
	}
	if _, err := s.call(t.Context(), mGet, "x"); err != nil {
		t.Fatalf("Get after the stream ended: %v", err)
	}
}
