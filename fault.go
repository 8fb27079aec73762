package bulwark

import (
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// FaultHeader names bulwark's fault headers, after Envoy's x-envoy-fault-*.
// An injected abort's response carries it, with the value "abort", so that
// a reader can tell it from a real answer of the upstream. With
// Fault.AllowHeaders set, three request headers named from it trigger a
// fault:
//   - Bulwark-Fault-Delay adds a latency before the attempt is sent: a Go
//     duration ("250ms"), at most Fault's bound on durations;
//   - Bulwark-Fault-Abort answers the attempt with this status (200..599)
//     without sending it;
//   - Bulwark-Fault-Reset, with any value, fails the attempt with a
//     connection reset without sending it.
//
// A header trigger always fires; it is not drawn at a rate. Without
// AllowHeaders they are ignored (and counted as refused), so a caller
// cannot inject faults into a Transport whose operator did not ask for it.
const FaultHeader = "Bulwark-Fault"

// The request headers that trigger a fault (see FaultHeader).
const (
	faultDelayHeader = FaultHeader + "-Delay"
	faultAbortHeader = FaultHeader + "-Abort"
	faultResetHeader = FaultHeader + "-Reset"
)

// Fault injects faults into attempts, for chaos tests and game days: added
// latency, an answer without sending, a connection reset. Each is drawn at
// its own rate for every attempt, or triggered by the Bulwark-Fault-*
// request headers when AllowHeaders is set. The zero value injects nothing,
// and with nothing to inject the fault layer is not in the stack at all.
//
// The layer sits at the attempt, below the attempt deadline and the attempt
// span, just above the base: the retry, breaker, pushback and fallback
// layers see an injected fault as a real one, an injected delay counts
// against the attempt's deadline, and the attempt's span carries a
// bulwark.fault attribute ("delay", "abort", "reset"). Every injection is
// also counted in the bulwark.faults metric, by kind; header triggers that
// are refused are counted there as "refused".
type Fault struct {
	// Disabled turns fault injection off, whatever Default says; Enabled
	// undoes a Default's Disabled. Fault is off unless a rate is set or
	// AllowHeaders is.
	Disabled, Enabled bool

	// Delay is the latency added to an attempt before it is sent, with
	// probability DelayRate (0..1). The wait ends early when the attempt's
	// context ends. Zero Delay or DelayRate inherit; zero after inheritance
	// means no drawn delay.
	Delay     time.Duration
	DelayRate float64

	// AbortStatus (200..599) answers an attempt without sending it, with
	// probability AbortRate (0..1): an empty body, FaultHeader set, and
	// for 429 and 503 no Retry-After. Zero inherits; zero after
	// inheritance means no drawn abort.
	AbortStatus int
	AbortRate   float64

	// ResetRate (0..1) fails an attempt without sending it with a
	// connection reset: a *net.OpError wrapping ECONNRESET, which bulwark
	// classifies as a transient transport error. Zero inherits.
	ResetRate float64

	// AllowHeaders lets the Bulwark-Fault-* request headers trigger faults
	// (Bulwark-Fault-Delay, -Abort and -Reset; see FaultHeader). Inherited
	// OR-wise from Default.
	AllowHeaders bool

	// Seed seeds the layer's random source, so that a run injects the same
	// faults in the same order for the same sequence of attempts (tests use
	// it). Zero inherits; zero after inheritance means a random seed.
	Seed uint64
}

func (f Fault) inherit(parent Fault) Fault {
	if f.Delay == 0 {
		f.Delay = parent.Delay
	}
	if f.DelayRate == 0 {
		f.DelayRate = parent.DelayRate
	}
	if f.AbortStatus == 0 {
		f.AbortStatus = parent.AbortStatus
	}
	if f.AbortRate == 0 {
		f.AbortRate = parent.AbortRate
	}
	if f.ResetRate == 0 {
		f.ResetRate = parent.ResetRate
	}
	if f.Seed == 0 {
		f.Seed = parent.Seed
	}
	f.AllowHeaders = f.AllowHeaders || parent.AllowHeaders
	f.Disabled = inheritOff(f.Disabled, f.Enabled, parent.Disabled)
	return f
}

func (f Fault) validate() error {
	for _, r := range []struct {
		field string
		v     float64
	}{{"Fault.DelayRate", f.DelayRate}, {"Fault.AbortRate", f.AbortRate}, {"Fault.ResetRate", f.ResetRate}} {
		if !(r.v >= 0 && r.v <= 1) { // NaN too
			return fieldError(r.field, r.v, "must be in [0, 1]")
		}
	}
	switch {
	case f.Delay < 0:
		return fieldError("Fault.Delay", f.Delay, "must be ≥ 0")
	case f.AbortStatus != 0 && (f.AbortStatus < 200 || f.AbortStatus > 599):
		return fieldError("Fault.AbortStatus", f.AbortStatus, "must be in 200..599")
	case f.AbortRate > 0 && f.AbortStatus == 0:
		return fieldError("Fault.AbortRate", f.AbortRate, "needs Fault.AbortStatus")
	}
	return nil
}

// enabled reports whether the layer has anything to do.
func (f Fault) enabled() bool {
	return !f.Disabled && (f.AllowHeaders || (f.Delay > 0 && f.DelayRate > 0) || f.AbortRate > 0 || f.ResetRate > 0)
}

// The kinds of fault, as the span attribute and the metric name them.
const (
	faultDelay   = "delay"
	faultAbort   = "abort"
	faultReset   = "reset"
	faultRefused = "refused" // a header trigger without AllowHeaders
)

// faultLayer injects the faults of a Fault policy into the attempts that
// pass through it.
type faultLayer struct {
	next   layer
	p      Fault
	e      env
	counts *faultCounts // the host's, shared by its fault layers

	mu  sync.Mutex // rand.Rand is not safe for concurrent use
	rnd *rand.Rand
}

// newFault makes the fault layer of p over next; it counts what it injects
// in counts, the host's (nil: its own).
func newFault(next layer, p Fault, e env, counts *faultCounts) *faultLayer {
	seed := p.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	if counts == nil {
		counts = new(faultCounts)
	}
	counts.on.Store(true)
	return &faultLayer{next: next, p: p, e: e, counts: counts, rnd: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// FaultSnapshot is what fault injection did on a host since its state was
// made: the faults injected, by kind, and the header triggers refused.
type FaultSnapshot struct {
	// Injected counts the faults injected, drawn at a rate or triggered by
	// a header; FromHeaders counts, of those, the ones a Bulwark-Fault-*
	// header asked for (with Fault.AllowHeaders).
	Injected, FromHeaders FaultCounts
	// HeadersRefused counts attempts whose Bulwark-Fault-* headers were
	// ignored because the policy does not set AllowHeaders. A growing count
	// means callers try to inject faults that this Transport does not let
	// them.
	HeadersRefused uint64
}

// FaultCounts counts faults by kind: delays added, answers given without
// sending (aborts), connection resets.
type FaultCounts struct {
	Delays, Aborts, Resets uint64
}

// faultCounts is one host's FaultSnapshot in the making, shared by every
// fault layer of the host.
type faultCounts struct {
	on                    atomic.Bool // a fault layer was built
	injected, fromHeaders [3]atomic.Uint64
	refused               atomic.Uint64
}

// Indexes into faultCounts's arrays.
const (
	iDelay = iota
	iAbort
	iReset
)

func (f *faultCounts) snapshot() *FaultSnapshot {
	if f == nil || !f.on.Load() {
		return nil
	}
	counts := func(a *[3]atomic.Uint64) FaultCounts {
		return FaultCounts{Delays: a[iDelay].Load(), Aborts: a[iAbort].Load(), Resets: a[iReset].Load()}
	}
	return &FaultSnapshot{Injected: counts(&f.injected), FromHeaders: counts(&f.fromHeaders), HeadersRefused: f.refused.Load()}
}

// draw reports whether an event of probability rate happens. A rate of
// zero draws nothing, so the sequence of a run with one kind of fault does
// not depend on the other kinds' being configured.
func (f *faultLayer) draw(rate float64) bool {
	if rate <= 0 {
		return false
	}
	f.mu.Lock()
	x := f.rnd.Float64()
	f.mu.Unlock()
	return x < rate
}

func (f *faultLayer) roundTrip(req *http.Request, c call) (*http.Response, error) {
	delay, abort, reset := f.fromHeaders(req, c)
	// What the headers asked for, so the counts can tell it from a draw.
	hDelay, hAbort, hReset := delay > 0, abort != 0, reset
	if !reset && f.draw(f.p.ResetRate) {
		reset = true
	}
	if abort == 0 && f.draw(f.p.AbortRate) {
		abort = f.p.AbortStatus
	}
	if delay == 0 && f.p.Delay > 0 && f.draw(f.p.DelayRate) {
		delay = f.p.Delay
	}
	ctx := req.Context()
	if delay > 0 {
		f.injected(req, faultDelay, iDelay, hDelay)
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			closeBody(req)
			return nil, doneError(ctx)
		}
	}
	switch {
	case reset:
		f.injected(req, faultReset, iReset, hReset)
		closeBody(req)
		return nil, &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	case abort != 0:
		f.injected(req, faultAbort, iAbort, hAbort)
		closeBody(req)
		return &http.Response{
			Status: strconv.Itoa(abort) + " " + http.StatusText(abort), StatusCode: abort,
			Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header: http.Header{FaultHeader: {faultAbort}}, Body: http.NoBody, Request: req,
		}, nil
	}
	return f.next.roundTrip(req, c)
}

// fromHeaders reads the header triggers. Refused triggers are counted, and
// so are allowed ones when injected. The headers are removed from an
// attempt's own copy of the header so that the upstream does not see them;
// a shared one is left as it is, since a RoundTripper must not change its
// caller's request.
func (f *faultLayer) fromHeaders(req *http.Request, c call) (delay time.Duration, abort int, reset bool) {
	h := req.Header
	d, a, r := h[faultDelayHeader], h[faultAbortHeader], h[faultResetHeader]
	if d == nil && a == nil && r == nil {
		return 0, 0, false
	}
	if c.ownHeader {
		delete(h, faultDelayHeader)
		delete(h, faultAbortHeader)
		delete(h, faultResetHeader)
	}
	if !f.p.AllowHeaders {
		f.counts.refused.Add(1)
		f.e.rep.faultInjected(req.Context(), faultRefused)
		return 0, 0, false
	}
	if len(d) > 0 {
		if v, err := time.ParseDuration(strings.TrimSpace(d[0])); err == nil && v > 0 {
			delay = min(v, maxPolicyDuration)
		}
	}
	if len(a) > 0 {
		if v, err := strconv.Atoi(strings.TrimSpace(a[0])); err == nil && v >= 200 && v <= 599 {
			abort = v
		}
	}
	return delay, abort, r != nil
}

// injected marks the attempt's span and counts the fault (i indexes
// faultCounts; header: a header trigger asked for it).
func (f *faultLayer) injected(req *http.Request, kind string, i int, header bool) {
	f.counts.injected[i].Add(1)
	if header {
		f.counts.fromHeaders[i].Add(1)
	}
	if span := trace.SpanFromContext(req.Context()); span.IsRecording() {
		span.SetAttributes(keyFault.String(kind))
	}
	f.e.rep.faultInjected(req.Context(), kind)
}
