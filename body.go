package bulwark

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync/atomic"
)

// bodyEnder is work that must run once when a response body is finished:
// read to EOF, failed while reading, or closed. Layers register it with
// onBodyEnd. It is an interface rather than a func so that a layer can hand
// over a pointer it already holds without a closure per request.
type bodyEnder interface{ bodyEnd() }

// maxEnders is how many layers can hang work on one body before a second
// wrapper is needed: attempt, span, balancer and bulkhead fit.
const maxEnders = 4

// body is the one response-body wrapper of the stack. Every layer that must
// act when the caller is done with a response adds its work to the same
// wrapper, so a response costs one allocation however many layers watch it.
// The work runs exactly once, in registration order (innermost layer first),
// at the first of EOF, a read error, or Close.
type body struct {
	rc io.ReadCloser
	// guard, when set, is the attempt layer's watch over each read: it
	// bounds how long a read may wait and names the bound that cut one.
	guard  readGuard
	done   atomic.Bool
	n      int32
	enders [maxEnders]bodyEnder
	// stop unregisters watch's hook from the caller's context; nil when
	// none is registered. Set before the caller has the body.
	stop func() bool
	// closed: rc is closed (Close, or the caller's context done).
	closed atomic.Bool
}

func (b *body) Read(p []byte) (int, error) {
	var n int
	var err error
	if g := b.guard; g != nil {
		n, err = g.read(b.rc, p)
	} else {
		n, err = b.rc.Read(p)
	}
	if err != nil {
		b.finish()
	}
	return n, err
}

func (b *body) Close() error {
	var err error
	if b.closed.CompareAndSwap(false, true) {
		err = b.rc.Close()
	}
	b.finish()
	return err
}

func (b *body) finish() {
	if b.stop != nil {
		b.stop()
	}
	b.end()
}

// watch makes the body's work run when ctx, the caller's, is done too, if
// that comes first: a caller that cancels its request and never closes the
// body has left it as surely as one that closed it, and net/http's
// Transport frees the connection then; the work (a bulkhead slot, an
// instance's count in flight, the span) must not wait for a Close that
// never comes. The host's body is closed first, as net/http's Transport
// closes the connection on that cancel, so that a slot given back is not
// still held by a base that ignores its context. Called once, by the
// Transport, when every layer has added its work, before the caller has
// the body. A context that is never done costs nothing; another costs
// context.AfterFunc's registration (3 allocations).
func (b *body) watch(ctx context.Context) {
	if ctx.Done() == nil || b.done.Load() {
		return
	}
	b.stop = context.AfterFunc(ctx, b.abandon)
}

// abandon closes the host's body and runs the work: the caller's context
// is done. A Close already closing the host's body runs the work itself
// once it has, so a slot is not given back while the host still holds it.
func (b *body) abandon() {
	if !b.done.Load() && b.closed.CompareAndSwap(false, true) {
		_ = b.rc.Close()
		b.end()
	}
}

// end runs the body's work once; it also ends a wrapper b wraps (the
// work of more layers than one wrapper holds).
func (b *body) end() {
	if !b.done.CompareAndSwap(false, true) {
		return
	}
	for i := int32(0); i < b.n; i++ {
		b.enders[i].bodyEnd()
		b.enders[i] = nil
	}
}

// readGuard reads from a body on the reader's behalf (see body.guard).
type readGuard interface {
	read(r io.Reader, p []byte) (int, error)
}

// rwBody keeps io.Writer for 101 Switching Protocols responses, whose Body
// net/http documents as an io.ReadWriteCloser the caller may type-assert.
type rwBody struct{ body }

func (b *rwBody) Write(p []byte) (int, error) { return b.rc.(io.Writer).Write(p) }

// onBodyEnd arranges for e to run once when resp's body is finished, and
// returns the wrapper that will run it (nil when e ran at once). If the body
// is already bulwark's wrapper with room left, e joins it; otherwise the
// body is wrapped. A nil or http.NoBody body has nothing to read, so e runs
// now. It must be called before resp is handed to an outer layer, and never
// on a body whose reading has started.
func onBodyEnd(resp *http.Response, e bodyEnder) *body { return onBodyEndIn(resp, e, nil) }

// watchBody arranges for the work on resp's body, if it is bulwark's
// wrapper, to run when ctx is done too (body.watch).
func watchBody(ctx context.Context, resp *http.Response) {
	switch rb := resp.Body.(type) {
	case *body:
		rb.watch(ctx)
	case *rwBody:
		rb.watch(ctx)
	}
}

// onBodyEndIn is onBodyEnd with w, a zero wrapper the caller owns, to use
// when the body needs one, rather than a new allocation; w may be nil. The
// attempt layer keeps one in each attempt's own struct, which lives as long
// as the body anyway: on a call whose first attempt is its last, that is
// one allocation fewer per call.
func onBodyEndIn(resp *http.Response, e bodyEnder, w *body) *body {
	switch rb := resp.Body.(type) {
	case nil:
		e.bodyEnd()
		return nil
	case *body:
		if rb.n < maxEnders && !rb.done.Load() {
			rb.enders[rb.n] = e
			rb.n++
			return rb
		}
	case *rwBody:
		if rb.n < maxEnders && !rb.done.Load() {
			rb.enders[rb.n] = e
			rb.n++
			return &rb.body
		}
	}
	if resp.Body == http.NoBody {
		e.bodyEnd()
		return nil
	}
	if _, ok := resp.Body.(io.Writer); ok && resp.StatusCode == http.StatusSwitchingProtocols {
		w := &rwBody{body{rc: resp.Body, n: 1}}
		w.enders[0] = e
		resp.Body = w
		return &w.body
	}
	if w == nil {
		w = new(body)
	}
	w.rc, w.n, w.enders[0] = resp.Body, 1, e
	resp.Body = w
	return w
}

// maxDrain bounds how much of a discarded response bulwark reads so that its
// connection can go back to the pool; past it, closing is cheaper than
// reading.
const maxDrain = 4 << 10

// discard drains a response that will not reach the caller (up to maxDrain)
// and closes it, which also runs its body-end work.
func discard(resp *http.Response) {
	if resp == nil || resp.Body == nil {
		return
	}
	_, _ = io.CopyN(io.Discard, resp.Body, maxDrain)
	_ = resp.Body.Close()
}

// closeBody closes a request body on the paths where bulwark rejects a
// request without handing it to the base, as the RoundTripper contract asks.
func closeBody(req *http.Request) {
	if req.Body != nil && req.Body != http.NoBody {
		_ = req.Body.Close()
	}
}

// lateAttempt is the error of an attempt its caller stopped waiting for
// while the layers below still run it (the attempt layer's, with
// Config.BaseIgnoresContext): work a layer above holds for the attempt
// (a bulkhead slot, an instance's count in flight) waits for its return.
type lateAttempt interface {
	error
	afterReturn(e bodyEnder)
}

// afterReturn runs e once the attempt that failed with err has returned:
// at once, unless err is a lateAttempt.
func afterReturn(err error, e bodyEnder) {
	if l, ok := errors.AsType[lateAttempt](err); ok {
		l.afterReturn(e)
		return
	}
	e.bodyEnd()
}
