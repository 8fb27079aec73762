package bulwark

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
)

// IdempotencyKeyHeader is the request header that marks a request as safe to
// send twice whatever its method: the server uses its value to recognise and
// collapse duplicates. X-Idempotency-Key is honoured too, as net/http does.
const IdempotencyKeyHeader = "Idempotency-Key"

const xIdempotencyKeyHeader = "X-Idempotency-Key"

// maxBufferBody is the largest Retry.BufferBody New accepts: buffering is
// for small bodies, never a way to hold an upload in memory.
const maxBufferBody = 64 << 20

// idempotentMethod reports whether sending a request with method m twice
// has the effect of sending it once (RFC 9110 §9.2.2). The empty method is
// GET in net/http.
func idempotentMethod(m string) bool {
	switch m {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	return false
}

// hasIdempotencyKey reports whether h carries a key, present even if empty,
// by the same rule as net/http's own replay check.
func hasIdempotencyKey(h http.Header) bool {
	if _, ok := h[IdempotencyKeyHeader]; ok {
		return true
	}
	_, ok := h[xIdempotencyKeyHeader]
	return ok
}

// bodyReplayable reports whether req's body can be produced again for a
// second attempt.
func bodyReplayable(req *http.Request) bool {
	return req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
}

// prepare decides whether req may be sent more than once and returns the
// request to send first. It extends net/http's isReplayable: an idempotent
// method or an idempotency key, and a body that is absent or has GetBody.
// On top of that rule, and only on a copy of req:
//   - with Retry.KeyPOST, a POST without a key gets a random one, the same
//     on every attempt, so that the server can collapse the duplicates;
//   - with Retry.BufferBody, a body without GetBody is read into memory up
//     to that many bytes so that it can be replayed. A longer body is sent
//     once, its bytes read so far followed by the rest.
//
// Only http and https requests are retried: any other scheme is one the
// base may not even support, and that answer will not change. Nor is a
// request that a retrying client above will send again (call.above,
// sdk.go): retries happen at one layer, that client's.
func (r *retryLayer) prepare(req *http.Request, c call) (*http.Request, bool, error) {
	if req.URL.Scheme != "http" && req.URL.Scheme != "https" || c.above != aboveNone {
		// A client above that retries sends it again: one layer retries.
		return req, false, nil
	}
	idem := idempotentMethod(req.Method) || hasIdempotencyKey(req.Header)
	genKey := !idem && r.keyPOST && req.Method == http.MethodPost
	if !idem && !genKey {
		return req, false, nil
	}
	out := req
	if !bodyReplayable(req) {
		if r.bufferBody <= 0 || req.ContentLength > r.bufferBody {
			return req, false, nil
		}
		var ok bool
		var err error
		if out, ok, err = bufferBody(req, r.bufferBody); err != nil || !ok {
			return out, false, err
		}
	}
	if genKey {
		if out == req {
			out = shallowCopy(req)
		}
		out.Header = cloneHeader(req.Header)
		out.Header[IdempotencyKeyHeader] = []string{rand.Text()}
	}
	return out, true, nil
}

// shallowCopy copies req, sharing everything it points to, as
// Request.WithContext does.
func shallowCopy(req *http.Request) *http.Request {
	r2 := new(http.Request)
	*r2 = *req
	return r2
}

// bufferBody reads up to limit bytes of req's body. If that was all of it,
// the body is closed and a copy of req is returned with the bytes as a body
// that GetBody can make again (ok). Otherwise the copy sends the bytes read
// followed by the rest of the original body, once. A read error closes the
// body and fails the call before anything is sent.
func bufferBody(req *http.Request, limit int64) (*http.Request, bool, error) {
	buf, err := io.ReadAll(io.LimitReader(req.Body, limit+1))
	if err != nil {
		closeBody(req)
		return nil, false, fmt.Errorf("bulwark: buffering the request body: %w", err)
	}
	out := shallowCopy(req)
	if int64(len(buf)) > limit {
		out.Body = &prefixedBody{Reader: io.MultiReader(bytes.NewReader(buf), req.Body), c: req.Body}
		return out, false, nil
	}
	_ = req.Body.Close()
	if out.ContentLength <= 0 {
		out.ContentLength = int64(len(buf))
	}
	if len(buf) == 0 {
		out.Body, out.GetBody = http.NoBody, func() (io.ReadCloser, error) { return http.NoBody, nil }
		return out, true, nil
	}
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf)), nil }
	out.Body, _ = out.GetBody()
	return out, true, nil
}

// prefixedBody is a body whose first bytes were read ahead; Close closes the
// original.
type prefixedBody struct {
	io.Reader
	c io.Closer
}

func (b *prefixedBody) Close() error { return b.c.Close() }

// replay returns a copy of first with a fresh body from GetBody, keeping
// GetBody set so that an inner layer (or net/http itself) can rewind too.
func replay(first *http.Request) (*http.Request, error) {
	next := shallowCopy(first)
	if first.Body == nil || first.Body == http.NoBody {
		return next, nil
	}
	b, err := first.GetBody()
	if err != nil {
		return nil, fmt.Errorf("bulwark: GetBody for a retry: %w", err)
	}
	next.Body = b
	return next, nil
}
