package server

import (
	"context"
	"net/http"

	"github.com/bulwark-http/bulwark"
)

// PassUp returns a handler that passes a failure below up the chain
// marked "do not retry": it attaches a bulwark.CallRecord to each
// request's context, and when the handler answers with a 5xx or a 429
// after a bulwark call it made with that context (or one derived from it)
// noted a failure the tier below already dealt with (see
// bulwark.NoRetryFromBelow for which), it sets bulwark.NoRetryHeader to
// bulwark.NoRetryFromBelow on the answer. A bulwark client above then
// neither retries that answer nor counts it against this service, so that
// of a chain of services exactly one layer retries and trips.
//
// DeadlineHandler does the same for a request from a bulwark client, so a
// service that uses it needs no PassUp; PassUp is for one that does not,
// or that wants every caller's answers marked. On a request that already
// carries a record it adds nothing. A handler's own NoRetryHeader is never
// replaced, and answers below 500 other than 429 are never marked. A
// Shedder attaches no record: its refusals make no call below, and the
// handler it admits notes in the record of the DeadlineHandler or PassUp
// around it.
//
// It costs one allocation per request, plus the request's copy with the
// new context, and starts no goroutine. The writer it hands the handler
// unwraps (http.ResponseController) to the server's, and flushes.
func PassUp(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if recorded(r.Context()) {
			next.ServeHTTP(w, r)
			return
		}
		pw := newPassUpWriter(w, r.Context())
		next.ServeHTTP(pw, r.WithContext(&pw.ctx))
	})
}

// newPassUpWriter makes one request's record over parent and the writer
// that reads it, in one allocation.
func newPassUpWriter(w http.ResponseWriter, parent context.Context) *passUpWriter {
	pw := &passUpWriter{w: w}
	pw.ctx.Context = pw.rec.Attach(parent)
	return pw
}

// recorded reports whether ctx already carries a CallRecord of the server
// half's: a request passes through one record, however many of its
// middlewares attach one.
func recorded(ctx context.Context) bool {
	_, ok := ctx.Value(recordProbe{}).(recordProbe)
	return ok
}

// recordProbe is the context key by which the server half finds its own
// record above: passUpWriter's context answers it.
type recordProbe struct{}

// probeCtx is the record's context as the server half hands it on: it
// answers recordProbe, and everything else as the record's.
type probeCtx struct{ context.Context }

func (c *probeCtx) Value(key any) any {
	if _, ok := key.(recordProbe); ok {
		return recordProbe{}
	}
	return c.Context.Value(key)
}

// passUpWriter is one request's record, the context that carries it, and
// the writer that reads it when the handler answers: one allocation.
type passUpWriter struct {
	rec   bulwark.CallRecord
	ctx   probeCtx
	w     http.ResponseWriter
	wrote bool
}

// noRetryFromBelow is the header value passUpWriter sets, shared: no
// allocation per answer.
var noRetryFromBelow = []string{bulwark.NoRetryFromBelow}

func (p *passUpWriter) Header() http.Header { return p.w.Header() }

func (p *passUpWriter) WriteHeader(code int) {
	if !p.wrote && code >= 200 {
		// The final status (an informational 1xx comes before it).
		p.wrote = true
		if (code >= 500 || code == http.StatusTooManyRequests) && p.rec.FailedBelow() {
			h := p.w.Header()
			if _, set := h[bulwark.NoRetryHeader]; !set {
				h[bulwark.NoRetryHeader] = noRetryFromBelow
			}
		}
	}
	p.w.WriteHeader(code)
}

func (p *passUpWriter) Write(b []byte) (int, error) {
	if !p.wrote {
		p.wrote = true // an implicit 200
	}
	return p.w.Write(b)
}

// Unwrap lets http.ResponseController reach the server's writer.
func (p *passUpWriter) Unwrap() http.ResponseWriter { return p.w }

// Flush flushes the server's writer, when it can, as handlers that assert
// http.Flusher expect.
func (p *passUpWriter) Flush() {
	if !p.wrote {
		p.wrote = true
	}
	_ = http.NewResponseController(p.w).Flush()
}
