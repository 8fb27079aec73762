package bulwark

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// spanLayer makes one CLIENT span per attempt, injects the attempt's
// trace context into the outgoing request, and measures the attempt's
// duration. It sits between the attempt deadline (which may already have
// copied the header) and the base, so that it measures the exchange itself.
type spanLayer struct {
	next layer
	e    env
}

func newSpanLayer(next layer, e env) *spanLayer { return &spanLayer{next: next, e: e} }

// attemptObs is one attempt's observation, finished when its body is; it is
// the only allocation spanLayer makes, and only when something is on.
type attemptObs struct {
	rep     *reporter
	span    trace.Span // nil: not tracing
	start   time.Time  // zero: not metering
	outcome string
	carrier lazyHeader
}

func (r *spanLayer) roundTrip(req *http.Request, c call) (*http.Response, error) {
	state := r.e.rep.o.state.Load()
	if state == 0 {
		resp, err := r.next.roundTrip(req, c)
		r.countPassedUp(resp)
		return resp, err
	}
	out, a := r.begin(req, &c, state)
	returned := false
	defer func() {
		if !returned {
			// The layer below panicked: end the span with it.
			a.outcome = outcomeError
			a.bodyEnd()
		}
	}()
	resp, err := r.next.roundTrip(out, c)
	returned = true
	if err != nil {
		a.outcome = attemptOutcome(c.judge(nil, err))
		if a.span != nil {
			a.span.SetAttributes(semconv.ErrorTypeKey.String(errorType(a.outcome, err)))
			a.span.SetStatus(codes.Error, safeError(err))
		}
		a.bodyEnd()
		return nil, err
	}
	r.countPassedUp(resp)
	a.outcome = attemptOutcome(c.judge(resp, nil))
	if a.span != nil {
		a.span.SetAttributes(semconv.HTTPResponseStatusCodeKey.Int(resp.StatusCode))
		if resp.StatusCode >= 400 {
			a.span.SetAttributes(semconv.ErrorTypeKey.String(strconv.Itoa(resp.StatusCode)))
			a.span.SetStatus(codes.Error, "")
		}
	}
	onBodyEnd(resp, a)
	return resp, nil
}

// begin starts the attempt's observation as state says: its span, its
// trace context in the request to send (out), its clock.
func (r *spanLayer) begin(req *http.Request, c *call, state uint32) (out *http.Request, a *attemptObs) {
	o := r.e.rep.o
	ctx := req.Context()
	a = &attemptObs{rep: r.e.rep}
	out = req
	if state&obsTracing != 0 {
		ctx, a.span = o.tracer.Start(ctx, spanName(req.Method),
			trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(r.attrs(req, c.attempt, c.hedge)...))
		out = req.WithContext(ctx)
	}
	var prop propagation.TextMapPropagator
	if state&obsPropagating != 0 {
		prop = o.prop
	}
	if prop != nil {
		a.carrier = lazyHeader{h: req.Header, owned: c.ownHeader}
		prop.Inject(ctx, &a.carrier)
		if !c.ownHeader && a.carrier.owned {
			// Copied on write: the copy needs a request of its own.
			if out == req {
				out = req.WithContext(ctx)
			}
			out.Header = a.carrier.h
		}
	}
	if state&obsMetering != 0 {
		a.start = time.Now()
	}
	return out, a
}

// countPassedUp counts an attempt answered with a failure passed up from
// below: here, where every attempt passes, whatever a fallback or a hedge
// above makes of it.
func (r *spanLayer) countPassedUp(resp *http.Response) {
	if resp != nil && r.e.passedUp != nil && (resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests) &&
		classify(resp, nil) == kindPassedUp {
		r.e.passedUp.Add(1)
	}
}

// bodyEnd finishes the attempt: its span and its duration.
func (a *attemptObs) bodyEnd() {
	if !a.start.IsZero() {
		d := time.Since(a.start)
		a.rep.o.attemptDuration.Record(context.Background(), d.Seconds(), a.rep.labels(keyOutcome, a.outcome).rec...)
	}
	if a.span != nil {
		a.span.End()
	}
}

// attemptOutcome is the bulwark.outcome of one attempt. A deadline that
// ends an attempt in flight is a timeout from the attempt's point of view,
// whoever set it; the error reaches this layer before the attempt layer
// tells bulwark's bound (ErrAttemptTimeout) from the caller's, and the
// call's outcome (bulwark.requests) keeps that distinction.
func attemptOutcome(j judged) string {
	out := j.label()
	if out == outcomeDeadline {
		return outcomeTimeout
	}
	return out
}

// errorType is the error.type attribute of a failed attempt: a fixed word
// for bulwark's classes, else the semantic conventions' _OTHER, never the
// error text.
func errorType(outcome string, err error) string {
	if outcome != outcomeError {
		return outcome
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return outcomeTimeout
	}
	return semconv.ErrorTypeOther.Value.AsString()
}

// attrs are an attempt span's start attributes.
func (r *spanLayer) attrs(req *http.Request, attemptNo int, hedge bool) []attribute.KeyValue {
	kv := make([]attribute.KeyValue, 0, 8)
	kv = append(kv, methodAttr(req.Method))
	if req.Method != "" && spanName(req.Method) == "HTTP" {
		kv = append(kv, semconv.HTTPRequestMethodOriginalKey.String(req.Method))
	}
	kv = append(kv,
		semconv.ServerAddressKey.String(req.URL.Hostname()),
		semconv.URLFullKey.String(redactURL(req.URL)),
		keyUpstream.String(r.e.upstream))
	if rt := r.e.rep.route; rt != "" {
		kv = append(kv, keyRoute.String(rt))
	}
	if p := r.e.rep.port; p > 0 {
		kv = append(kv, semconv.ServerPortKey.Int(p))
	}
	if attemptNo > 0 {
		kv = append(kv, keyAttempt.Int(attemptNo))
	}
	if attemptNo > 1 {
		kv = append(kv, semconv.HTTPRequestResendCountKey.Int(attemptNo-1))
	}
	if hedge {
		// A hedge runs beside the attempt before it rather than after it.
		kv = append(kv, keyHedge.String("hedge"))
	}
	return kv
}

// lazyHeader is the propagator's carrier: it copies the header on the
// first write unless it is already a private copy, so a propagator that
// has nothing to inject costs no copy.
type lazyHeader struct {
	h     http.Header
	owned bool
}

func (c *lazyHeader) Get(key string) string { return c.h.Get(key) }

func (c *lazyHeader) Set(key, value string) {
	if !c.owned {
		c.h = cloneHeader(c.h)
		c.owned = true
	}
	c.h.Set(key, value)
}

func (c *lazyHeader) Keys() []string {
	keys := make([]string, 0, len(c.h))
	for k := range c.h {
		keys = append(keys, k)
	}
	return keys
}
