package bench

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
)

// ctxBase answers from memory like stubBase, but treats the request the way
// net/http's Transport does, so that work a stack defers until someone
// looks at the context or the headers is paid here as it would be on the
// wire. What it mirrors of Transport.roundTrip and persistConn:
//
//   - a context.WithCancelCause of the request's context per request, which
//     attaches it to the parent (and makes a lazy parent materialise);
//   - its Done channel taken at once, as roundTrip's "already cancelled?"
//     check and persistConn.roundTrip's wait both take it, and a request
//     whose context is already done refused with its cause;
//   - while the body is open, the read loop's watch on that context: here
//     without a goroutine, as a check on each Read, so a cancelled context
//     fails the body as it would on a connection;
//   - every header key and value written out (into a pooled buffer, as the
//     transport writes into its connection's buffer);
//   - the request body closed;
//   - the derived context cancelled once the body is read to EOF or closed,
//     as the read loop does when the exchange is over.
//
// It is safe for concurrent use: its only shared state is a sync.Pool.
type ctxBase struct{}

var headerBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

func (ctxBase) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancelCause(req.Context())
	done := ctx.Done()
	select {
	case <-done:
		if req.Body != nil {
			req.Body.Close()
		}
		err := context.Cause(ctx)
		cancel(err)
		return nil, err
	default:
	}
	bp := headerBufs.Get().(*[]byte)
	buf := (*bp)[:0]
	for k, vs := range req.Header {
		for _, v := range vs {
			buf = append(buf, k...)
			buf = append(buf, ": "...)
			buf = append(buf, v...)
			buf = append(buf, "\r\n"...)
		}
	}
	*bp = buf
	headerBufs.Put(bp)
	if req.Body != nil {
		req.Body.Close()
	}
	body := &ctxBody{ctx: ctx, done: done, cancel: cancel}
	body.r.Reset("ok")
	return &http.Response{
		Status: "200 OK", StatusCode: http.StatusOK,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{}, Body: body, ContentLength: 2, Request: req,
	}, nil
}

// ctxBody is ctxBase's response body: it fails once the request's context
// is done, and cancels that context at EOF or Close.
type ctxBody struct {
	r      strings.Reader
	ctx    context.Context
	done   <-chan struct{}
	cancel context.CancelCauseFunc
}

func (b *ctxBody) Read(p []byte) (int, error) {
	if b.r.Len() == 0 {
		b.cancel(nil)
		return 0, io.EOF
	}
	select {
	case <-b.done:
		return 0, context.Cause(b.ctx)
	default:
	}
	return b.r.Read(p)
}

func (b *ctxBody) Close() error {
	b.cancel(nil)
	return nil
}
