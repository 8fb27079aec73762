package bulwark

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// histCount returns how many values histogram name holds at exactly kv.
func histCount(t *testing.T, rm metricdata.ResourceMetrics, name string, kv ...attribute.KeyValue) uint64 {
	t.Helper()
	m := findMetric(rm, name)
	if m == nil {
		return 0
	}
	want := attribute.NewSet(kv...)
	for _, dp := range m.Data.(metricdata.Histogram[float64]).DataPoints {
		if dp.Attributes.Equals(&want) {
			return dp.Count
		}
	}
	return 0
}

// seqBase answers with the statuses in turn (the last one repeated) and
// records each request's headers.
type seqBase struct {
	mu       sync.Mutex
	statuses []int
	// retryAfter, if set, is the Retry-After of every 503.
	retryAfter string
	headers    []http.Header
}

func (s *seqBase) RoundTrip(req *http.Request) (*http.Response, error) {
	closeBody(req)
	s.mu.Lock()
	n := len(s.headers)
	s.headers = append(s.headers, req.Header.Clone())
	status := s.statuses[min(n, len(s.statuses)-1)]
	s.mu.Unlock()
	h := http.Header{}
	if status == http.StatusServiceUnavailable && s.retryAfter != "" {
		h.Set("Retry-After", s.retryAfter)
	}
	return &http.Response{StatusCode: status, Header: h, Body: io.NopCloser(strings.NewReader("body")), Request: req}, nil
}

// retryOnce turns the real retry layer on in cfg's Default for at most
// two attempts, with no wait between them but a Retry-After's and no
// budget, so that a test sees exactly the attempts it counts. Pushback and
// the breaker stay as cfg has them.
func retryOnce(cfg Config) Config {
	cfg.Default.Retry = Retry{MaxAttempts: 2, NoPushback: cfg.Default.Retry.NoPushback, Backoff: noWait, Budget: Budget{Disabled: true}}
	return cfg
}

func obsGet(t *testing.T, rt http.RoundTripper, ctx context.Context, rawURL string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	return rt.RoundTrip(req)
}

var (
	upDefault = keyUpstream.String("default")
)

func TestObserveSuccess(t *testing.T) {
	k := newOtelKit(t)
	base := &seqBase{statuses: []int{200}}
	tr := mustNew(t, k.config(base))
	ctx, caller := k.caller(t.Context())

	resp, err := obsGet(t, tr, ctx, "http://tax.internal:8080/rate?zip=94103")
	if err != nil {
		t.Fatal(err)
	}
	if n := len(spansNamed(k.sr, "GET")); n != 0 {
		t.Fatalf("%d attempt spans ended before the body was read, want 0", n)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	caller.End()

	attempts := spansNamed(k.sr, "GET")
	if len(attempts) != 1 {
		t.Fatalf("got %d attempt spans, want 1", len(attempts))
	}
	s := attempts[0]
	if s.SpanKind() != trace.SpanKindClient {
		t.Errorf("attempt span kind = %v, want client", s.SpanKind())
	}
	if s.Parent().SpanID() != caller.SpanContext().SpanID() {
		t.Errorf("attempt span's parent = %v, want the caller's span %v", s.Parent().SpanID(), caller.SpanContext().SpanID())
	}
	wantAttr(t, s, "http.request.method", "GET")
	wantAttr(t, s, "server.address", "tax.internal")
	wantAttr(t, s, "server.port", int64(8080))
	wantAttr(t, s, "url.full", "http://tax.internal:8080/rate?zip=REDACTED")
	wantAttr(t, s, "http.response.status_code", int64(200))
	wantAttr(t, s, keyUpstream, "default")
	for _, key := range []attribute.Key{"error.type", "http.request.resend_count"} {
		if v, ok := attr(s, key); ok {
			t.Errorf("%s = %v on a first attempt that succeeded, want none", key, v.String())
		}
	}
	if s.Status().Code != codes.Unset {
		t.Errorf("status = %v, want unset", s.Status())
	}
	if n := len(spansNamed(k.sr, spanRequest)); n != 0 {
		t.Errorf("%d logical spans with a caller span present, want 0", n)
	}

	// The upstream sees the attempt span as its parent.
	tp := base.headers[0].Get("Traceparent")
	if !strings.Contains(tp, s.SpanContext().SpanID().String()) {
		t.Errorf("traceparent = %q, want the attempt span %s", tp, s.SpanContext().SpanID())
	}

	rm := k.collect(t)
	if got := counter(t, rm, "bulwark.requests", upDefault, keyOutcome.String("success")); got != 1 {
		t.Errorf("bulwark.requests{success} = %d, want 1", got)
	}
	if got := histCount(t, rm, "bulwark.attempt.duration", upDefault, keyOutcome.String("success")); got != 1 {
		t.Errorf("bulwark.attempt.duration{success} count = %d, want 1", got)
	}
}

// A request that gets a 503 with Retry-After: 1, is retried, and succeeds:
// two attempt spans under the caller's span, the second a resend; a retry
// event on the caller's span; both attempts and the retry in the metrics.
// In a bubble, so that the second waits its second without a real sleep.
func TestObserveRetriedThenSucceeds(t *testing.T) {
	synctest.Test(t, testObserveRetriedThenSucceeds)
}

func testObserveRetriedThenSucceeds(t *testing.T) {
	k := newOtelKit(t)
	base := &seqBase{statuses: []int{503, 200}, retryAfter: "1"}
	tr := mustNew(t, retryOnce(k.config(base)))
	const target = "http://tax.internal/rate"
	ctx, caller := k.caller(t.Context())

	resp, err := obsGet(t, tr, ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("status = %d, want 200", resp.StatusCode)
	}
	// The discarded 503's span ended when bulwark drained it.
	if n := len(spansNamed(k.sr, "GET")); n != 1 {
		t.Fatalf("%d attempt spans ended before the final body was read, want 1 (the discarded one)", n)
	}
	resp.Body.Close()
	caller.End()

	attempts := spansNamed(k.sr, "GET")
	if len(attempts) != 2 {
		t.Fatalf("got %d attempt spans, want 2", len(attempts))
	}
	first, second := attempts[0], attempts[1]
	for _, s := range attempts {
		if s.Parent().SpanID() != caller.SpanContext().SpanID() {
			t.Errorf("attempt span's parent = %v, want the caller's span", s.Parent().SpanID())
		}
	}
	wantAttr(t, first, "http.response.status_code", int64(503))
	wantAttr(t, first, "error.type", "503")
	wantAttr(t, first, keyAttempt, int64(1))
	if first.Status().Code != codes.Error {
		t.Errorf("503 attempt status = %v, want error", first.Status())
	}
	if _, ok := attr(first, "http.request.resend_count"); ok {
		t.Error("first attempt has http.request.resend_count, want none")
	}
	wantAttr(t, second, "http.response.status_code", int64(200))
	wantAttr(t, second, "http.request.resend_count", int64(1))
	wantAttr(t, second, keyAttempt, int64(2))

	// Each attempt carried its own span context.
	for i, s := range attempts {
		if got := base.headers[i].Get("Traceparent"); !strings.Contains(got, s.SpanContext().SpanID().String()) {
			t.Errorf("attempt %d traceparent = %q, want span %s", i+1, got, s.SpanContext().SpanID())
		}
	}

	callers := spansNamed(k.sr, "caller")
	if len(callers) != 1 || len(callers[0].Events()) != 1 {
		t.Fatalf("caller span events = %v, want one retry event", callers)
	}
	ev := callers[0].Events()[0]
	if ev.Name != eventRetry {
		t.Errorf("event = %q, want %q", ev.Name, eventRetry)
	}
	want := map[attribute.Key]any{keyAttempt: int64(2), keyRetryDelay: 1.0, keyRetryReason: "status_503", keyFromRetryAfter: true}
	for _, kv := range ev.Attributes {
		if w, ok := want[kv.Key]; ok && kv.Value.AsInterface() != w {
			t.Errorf("retry event %s = %v, want %v", kv.Key, kv.Value.AsInterface(), w)
		}
		delete(want, kv.Key)
	}
	if len(want) > 0 {
		t.Errorf("retry event lacks %v", want)
	}

	rm := k.collect(t)
	for _, c := range []struct {
		name string
		kv   []attribute.KeyValue
		want int64
	}{
		{"bulwark.requests", []attribute.KeyValue{upDefault, keyOutcome.String("success")}, 1},
		{"bulwark.retries", []attribute.KeyValue{upDefault, keyRetryReason.String("status_503")}, 1},
	} {
		if got := counter(t, rm, c.name, c.kv...); got != c.want {
			t.Errorf("%s%v = %d, want %d", c.name, c.kv, got, c.want)
		}
	}
	for _, c := range []struct {
		name string
		kv   []attribute.KeyValue
	}{
		{"bulwark.attempt.duration", []attribute.KeyValue{upDefault, keyOutcome.String("server_error")}},
		{"bulwark.attempt.duration", []attribute.KeyValue{upDefault, keyOutcome.String("success")}},
		{"bulwark.retry.delay", []attribute.KeyValue{upDefault}},
	} {
		if got := histCount(t, rm, c.name, c.kv...); got != 1 {
			t.Errorf("%s%v count = %d, want 1", c.name, c.kv, got)
		}
	}
}

// With no span in the caller's context, the router makes one logical span
// so that the attempts share a trace and the events land somewhere.
func TestObserveLogicalSpanWithoutCaller(t *testing.T) {
	k := newOtelKit(t)
	tr := mustNew(t, retryOnce(k.config(&seqBase{statuses: []int{503, 200}})))
	const target = "http://tax.internal/rate"

	resp, err := obsGet(t, tr, t.Context(), target)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	logical := spansNamed(k.sr, spanRequest)
	if len(logical) != 1 {
		t.Fatalf("%d logical spans, want 1", len(logical))
	}
	l := logical[0]
	if l.Parent().IsValid() {
		t.Errorf("logical span has a parent %v, want a root", l.Parent())
	}
	wantAttr(t, l, "http.response.status_code", int64(200))
	wantAttr(t, l, keyOutcome, "success")
	if len(l.Events()) != 1 || l.Events()[0].Name != eventRetry {
		t.Errorf("logical span events = %v, want the retry", l.Events())
	}
	attempts := spansNamed(k.sr, "GET")
	if len(attempts) != 2 {
		t.Fatalf("%d attempt spans, want 2", len(attempts))
	}
	for _, s := range attempts {
		if s.Parent().SpanID() != l.SpanContext().SpanID() {
			t.Errorf("attempt's parent = %v, want the logical span", s.Parent().SpanID())
		}
	}
}

// An attempt refused for want of time has no span (nothing was sent), an
// event on the caller's span and a rejection count.
func TestObserveDeadlineTooShort(t *testing.T) {
	synctest.Test(t, testObserveDeadlineTooShort)
}

func testObserveDeadlineTooShort(t *testing.T) {
	k := newOtelKit(t)
	base := &seqBase{statuses: []int{200}}
	tr := mustNew(t, k.config(base))
	// 5 ms left: under minSendTime. The bubble's clock stands still while
	// the call runs.
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Millisecond)
	defer cancel()
	ctx, caller := k.caller(ctx)

	_, err := obsGet(t, tr, ctx, "http://tax.internal/rate")
	caller.End()
	if !errors.Is(err, ErrDeadlineTooShort) {
		t.Fatalf("err = %v, want ErrDeadlineTooShort", err)
	}
	if len(base.headers) != 0 {
		t.Fatal("the base was called")
	}
	if n := len(spansNamed(k.sr, "GET")); n != 0 {
		t.Errorf("%d attempt spans for an attempt never sent, want 0", n)
	}
	evs := spansNamed(k.sr, "caller")[0].Events()
	if len(evs) != 1 || evs[0].Name != eventRejected || len(evs[0].Attributes) != 1 || evs[0].Attributes[0] != keyLayer.String(layerDeadline) {
		t.Errorf("caller span events = %v, want one %s{%s=%s}", evs, eventRejected, keyLayer, layerDeadline)
	}
	rm := k.collect(t)
	if got := counter(t, rm, "bulwark.rejections", upDefault, keyLayer.String("deadline")); got != 1 {
		t.Errorf("bulwark.rejections{deadline} = %d, want 1", got)
	}
	if got := counter(t, rm, "bulwark.requests", upDefault, keyOutcome.String("deadline_too_short")); got != 1 {
		t.Errorf("bulwark.requests{deadline_too_short} = %d, want 1", got)
	}
}

func TestRedactURL(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"http://a.test/x", "http://a.test/x"},
		{"https://user:hunter2@a.test:8443/p/q?token=s3cret&x=1&flag", "https://a.test:8443/p/q?token=REDACTED&x=REDACTED&flag"},
		{"http://a.test/p%2Fq?a=b=c&&d=", "http://a.test/p%2Fq?a=REDACTED&&d=REDACTED"},
		{"http://a.test/x?", "http://a.test/x?"},
		{"http://a.test/x#frag", "http://a.test/x"},
		{"mailto:someone@example.com", "mailto:REDACTED"},
	} {
		u, err := url.Parse(c.in)
		if err != nil {
			t.Fatal(err)
		}
		if got := redactURL(u); got != c.want {
			t.Errorf("redactURL(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// No secret from the URL reaches a span, on success or on error.
func TestObserveRedactsSpans(t *testing.T) {
	const target = "http://alice:hunter2@tax.internal/rate?token=s3cret"
	for _, c := range []struct {
		name string
		base http.RoundTripper
	}{
		{"ok", &seqBase{statuses: []int{200}}},
		{"error", roundTripFunc(func(req *http.Request) (*http.Response, error) {
			return nil, &url.Error{Op: "Get", URL: req.URL.String(), Err: errStub}
		})},
	} {
		t.Run(c.name, func(t *testing.T) {
			k := newOtelKit(t)
			tr := mustNew(t, k.config(c.base))
			resp, err := obsGet(t, tr, t.Context(), target)
			if err == nil {
				resp.Body.Close()
			}
			if len(k.sr.Ended()) != 2 {
				t.Fatalf("%d spans, want a logical and an attempt span", len(k.sr.Ended()))
			}
			for _, s := range k.sr.Ended() {
				var all strings.Builder
				all.WriteString(s.Name() + " " + s.Status().Description)
				for _, kv := range s.Attributes() {
					all.WriteString(" " + kv.Value.String())
				}
				for _, e := range s.Events() {
					all.WriteString(" " + e.Name)
					for _, kv := range e.Attributes {
						all.WriteString(" " + kv.Value.String())
					}
				}
				for _, secret := range []string{"hunter2", "alice", "s3cret"} {
					if strings.Contains(all.String(), secret) {
						t.Errorf("span %q holds %q: %s", s.Name(), secret, all.String())
					}
				}
			}
			if c.name == "error" {
				s := spansNamed(k.sr, "GET")[0]
				wantAttr(t, s, "error.type", semconvOther)
				if s.Status().Code != codes.Error || !strings.Contains(s.Status().Description, "token=REDACTED") {
					t.Errorf("status = %v, want an error naming the redacted URL", s.Status())
				}
			}
		})
	}
}

const semconvOther = "_OTHER"

// The layer keeps the RoundTripper contract with tracing and injection on,
// whether the attempt layer copied the header (Timeout on) or passed it
// through (Timeout off, or no deadline header), in which case the
// propagator's write must copy the header.
func TestObserveContract(t *testing.T) {
	for _, c := range []struct {
		name string
		to   Timeout
	}{
		{"timeout", Timeout{}},
		{"timeout off", Timeout{Disabled: true}},
		{"no deadline header", Timeout{Header: NoDeadlineHeader}},
	} {
		t.Run(c.name, func(t *testing.T) {
			k := newOtelKit(t)
			runContract(t, func(base http.RoundTripper) http.RoundTripper {
				cfg := k.config(base)
				cfg.Default.Timeout = c.to
				return mustNew(t, cfg)
			})
		})
	}
}

// injectProbe is a propagator that records, for each attempt, what the
// attempt span layer handed it: whether the carrier was already the
// attempt's own copy of the header (call.ownHeader), and which header map
// it held before and after the probe's write.
type injectProbe struct {
	mu            sync.Mutex
	owned         []bool
	before, after []http.Header
	other         int // carriers that were not bulwark's lazyHeader
}

const probeHeader = "X-Inject-Probe"

func (p *injectProbe) Inject(_ context.Context, c propagation.TextMapCarrier) {
	p.mu.Lock()
	defer p.mu.Unlock()
	lh, ok := c.(*lazyHeader)
	if !ok {
		p.other++
		return
	}
	p.owned = append(p.owned, lh.owned)
	p.before = append(p.before, lh.h)
	c.Set(probeHeader, "1")
	p.after = append(p.after, lh.h)
}

func (p *injectProbe) Extract(ctx context.Context, _ propagation.TextMapCarrier) context.Context {
	return ctx
}

func (p *injectProbe) Fields() []string { return []string{probeHeader} }

// Both directions of call.ownHeader, through the built stack: when the
// attempt layer copied the header (it writes the deadline header), the
// propagator is told so and writes into that copy, with no second copy;
// when it did not (no deadline header, or Timeout off), the propagator is
// handed the caller's header, copies it on its first write, and the
// caller's header is never written.
func TestObserveHeaderOwned(t *testing.T) {
	for _, c := range []struct {
		name   string
		to     Timeout
		retry  bool // a 503 first, retried: attempts 1 and 2
		copied bool // the attempt layer copies the header
	}{
		{"deadline header", Timeout{}, false, true},
		{"deadline header, retried", Timeout{}, true, true},
		{"no deadline header", Timeout{Header: NoDeadlineHeader}, false, false},
		{"no deadline header, retried", Timeout{Header: NoDeadlineHeader}, true, false},
		{"timeout off", Timeout{Disabled: true}, false, false},
	} {
		for _, withDeadline := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/caller deadline %v", c.name, withDeadline), func(t *testing.T) {
				var sent []http.Header // the maps themselves, not copies
				statuses := []int{200}
				if c.retry {
					statuses = []int{503, 200}
				}
				base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
					sent = append(sent, req.Header)
					return &http.Response{StatusCode: statuses[min(len(sent)-1, len(statuses)-1)], Body: http.NoBody, Request: req}, nil
				})
				var layers []string
				if !c.to.Disabled {
					layers = append(layers, "timeout")
				}
				if c.retry {
					layers = append(layers, "retry")
				}
				probe := &injectProbe{}
				tr := mustNew(t, Config{Base: base, Propagator: probe, Default: only(Policy{Timeout: c.to,
					Retry: Retry{MaxAttempts: 2, Backoff: noWait, Budget: Budget{Disabled: true}}}, layers...)})
				ctx := t.Context()
				if withDeadline {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, time.Hour)
					defer cancel()
				}
				req, _ := http.NewRequestWithContext(ctx, "GET", "http://h.test/", nil)
				req.Header.Set("Accept", "text/plain")
				callers := req.Header.Clone()
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()

				attempts := len(statuses)
				if len(sent) != attempts || len(probe.owned) != attempts || probe.other != 0 {
					t.Fatalf("%d attempts sent, %d injections into bulwark's carrier (%d into another), want %d of each",
						len(sent), len(probe.owned), probe.other, attempts)
				}
				if !reflect.DeepEqual(req.Header, callers) {
					t.Errorf("caller's header written: %v, want %v", req.Header, callers)
				}
				for i := range attempts {
					if probe.owned[i] != c.copied {
						t.Errorf("attempt %d: call.ownHeader = %v, want %v", i+1, probe.owned[i], c.copied)
					}
					if got := sent[i].Get(probeHeader); got != "1" {
						t.Errorf("attempt %d: the base saw %s = %q, want the propagator's write", i+1, probeHeader, got)
					}
					if !sameMap(sent[i], probe.after[i]) {
						t.Errorf("attempt %d: the base got another header than the one the propagator wrote", i+1)
					}
					if _, ok := sent[i][DefaultDeadlineHeader]; ok != c.copied {
						t.Errorf("attempt %d: deadline header sent %v, want %v", i+1, ok, c.copied)
					}
					if c.copied {
						// The attempt layer's copy, written into in place.
						if sameMap(probe.before[i], req.Header) {
							t.Errorf("attempt %d: ownHeader, yet the propagator was handed the caller's header", i+1)
						}
						if !sameMap(probe.after[i], probe.before[i]) {
							t.Errorf("attempt %d: the propagator copied a header the attempt layer had already copied", i+1)
						}
					} else {
						// The caller's, copied on the first write.
						if !sameMap(probe.before[i], req.Header) {
							t.Errorf("attempt %d: the propagator was handed a copy not known as one", i+1)
						}
						if sameMap(probe.after[i], req.Header) {
							t.Errorf("attempt %d: the propagator wrote into the caller's header", i+1)
						}
					}
				}
			})
		}
	}
}

// spanLayerOf walks a stack of the deadline layers down to its attempt
// span layer.
func spanLayerOf(t *testing.T, s layer) *spanLayer {
	t.Helper()
	for {
		switch l := s.(type) {
		case *totalLayer:
			s = l.next
		case *attemptLayer:
			s = l.next
		case *spanLayer:
			return l
		default:
			t.Fatalf("no spanLayer above %T", s)
			return nil
		}
	}
}

// sameMap reports whether two headers are the same map, not equal ones.
func sameMap(a, b http.Header) bool {
	const probe = "X-Bulwark-Same-Map-Probe"
	a[probe] = nil
	_, same := b[probe]
	delete(a, probe)
	return same
}

// With the globals still otel's placeholders, the layer adds no allocation
// and the observer API allocates nothing.
func TestObserveNoProvidersAllocatesNothing(t *testing.T) {
	if !isPlaceholder(otel.GetTracerProvider()) || !isPlaceholder(otel.GetMeterProvider()) || !isPlaceholder(otel.GetTextMapPropagator()) {
		t.Skip("global providers were set in this process")
	}
	// Only the deadline layers, so spanLayerOf can walk to the span layer.
	tr := mustNew(t, Config{Base: benchBase{}, Default: only(Policy{}, "timeout")})
	if tr.obs.state.Load() != 0 {
		t.Fatalf("observer on with placeholder globals: state %b", tr.obs.state.Load())
	}
	u, _ := url.Parse("http://stub.internal/x")
	hs := tr.lookup(u)
	obs := spanLayerOf(t, hs.rt)
	req, _ := http.NewRequest("GET", u.String(), nil)
	run := func(rt http.RoundTripper) float64 {
		return testing.AllocsPerRun(200, func() {
			resp, err := rt.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		})
	}
	// The span layer as the builder made it, and what it wraps: the same
	// stack without it.
	if with, without := run(layerRT{obs}), run(layerRT{obs.next}); with != without {
		t.Errorf("the attempt span layer allocates %v times with the observer, %v without", with, without)
	}
	ctx := t.Context()
	rep := hs.rep
	if n := testing.AllocsPerRun(200, func() {
		rep.retryScheduled(ctx, 2, time.Second, "status_503", true)
		rep.rejected(ctx, layerBreaker)
		rep.fallbackServed(ctx, "cached")
		rep.rejected(ctx, layerDeadline)
		rep.breakerStateChanged("closed", "open")
		rep.pushbackChanged(true, time.Time{})
	}); n != 0 {
		t.Errorf("observer API allocates %v times per call set, want 0", n)
	}
}

// With a real SDK but a caller span that is not recording, events cost
// nothing; counters are recorded with cached attribute sets.
func TestObserveSDKNonRecordingAllocs(t *testing.T) {
	k := newOtelKit(t)
	tr := mustNew(t, k.config(benchBase{}))
	u, _ := url.Parse("http://stub.internal/x")
	hs := tr.lookup(u).rep
	ctx := t.Context()
	hs.rejected(ctx, layerBulkhead) // warm the attribute cache
	hs.retryScheduled(ctx, 2, time.Second, "status_503", false)
	n := testing.AllocsPerRun(200, func() {
		hs.rejected(ctx, layerBulkhead)
		hs.retryScheduled(ctx, 2, time.Second, "status_503", false)
	})
	if n != 0 {
		t.Errorf("observer API with an SDK meter allocates %v times, want 0", n)
	}
}

// A layer passing unbounded label values cannot grow the metric's
// cardinality past maxLabelValues (+ "other") per host.
func TestObserveLabelsBounded(t *testing.T) {
	k := newOtelKit(t)
	tr := mustNew(t, k.config(benchBase{}))
	u, _ := url.Parse("http://stub.internal/x")
	hs := tr.lookup(u).rep
	for i := range 3 * maxLabelValues {
		hs.retryScheduled(t.Context(), 2, 0, "reason-"+strings.Repeat("x", i), false)
	}
	rm := k.collect(t)
	m := findMetric(rm, "bulwark.retries")
	if n := len(m.Data.(metricdata.Sum[int64]).DataPoints); n != maxLabelValues+1 {
		t.Errorf("bulwark.retries has %d series, want %d", n, maxLabelValues+1)
	}
	if got := counter(t, rm, "bulwark.retries", upDefault, keyRetryReason.String(otherLabel)); got != 2*maxLabelValues {
		t.Errorf("bulwark.retries{other} = %d, want %d", got, 2*maxLabelValues)
	}
}

// logRecorder keeps the records a logger receives.
type logRecorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.recs = append(l.recs, r.Clone())
	l.mu.Unlock()
	return nil
}
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }

func TestObserveLogs(t *testing.T) {
	var lr logRecorder
	tr := mustNew(t, Config{Base: benchBase{}, Logger: slog.New(&lr)})
	u, _ := url.Parse("http://stub.internal/x")
	hs := tr.lookup(u).rep
	hs.retryScheduled(t.Context(), 3, time.Second, "timeout", false)
	hs.breakerStateChanged("closed", "open")
	hs.pushbackChanged(true, time.Unix(1e9, 0))
	want := []struct {
		level slog.Level
		msg   string
	}{
		{slog.LevelDebug, "bulwark: retry scheduled"},
		{slog.LevelInfo, "bulwark: circuit breaker open"},
		{slog.LevelInfo, "bulwark: pushback started"},
	}
	if len(lr.recs) != len(want) {
		t.Fatalf("got %d log records, want %d", len(lr.recs), len(want))
	}
	for i, w := range want {
		r := lr.recs[i]
		if r.Level != w.level || r.Message != w.msg {
			t.Errorf("record %d = %v %q, want %v %q", i, r.Level, r.Message, w.level, w.msg)
		}
		var up string
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "upstream" {
				up = a.Value.String()
			}
			return true
		})
		if up != "default" {
			t.Errorf("record %d upstream = %q, want default", i, up)
		}
	}
}

// Providers set globally after New take effect on the next request. Run in
// a child process: otel's globals cannot be put back once set.
func TestGlobalProvidersSetAfterNew(t *testing.T) {
	if os.Getenv("BULWARK_OTEL_GLOBAL_CHILD") != "1" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestGlobalProvidersSetAfterNew$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), "BULWARK_OTEL_GLOBAL_CHILD=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !bytes.Contains(out, []byte("--- PASS: TestGlobalProvidersSetAfterNew")) {
			t.Fatalf("child: %v\n%s", err, out)
		}
		return
	}
	// In a bubble, so that touchEvery passes without a real sleep.
	synctest.Test(t, testGlobalProvidersSetAfterNew)
}

func testGlobalProvidersSetAfterNew(t *testing.T) {
	base := &seqBase{statuses: []int{200}}
	tr := mustNew(t, Config{Base: base})
	if tr.obs.state.Load() != 0 {
		t.Fatal("observer on before any global provider was set")
	}
	// A host seen before the globals are set...
	const target = "http://tax.internal/rate"
	resp, err := obsGet(t, tr, t.Context(), target)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	k := newOtelKit(t)
	otel.SetTracerProvider(k.tp)
	otel.SetMeterProvider(k.mp)
	// A composite propagator is a slice: comparing it with the placeholder
	// must not panic.
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
	// ...is observed from its first request once touchEvery has passed.
	time.Sleep(touchEvery + time.Millisecond)
	resp, err = obsGet(t, tr, t.Context(), target)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if n := len(spansNamed(k.sr, "GET")); n != 1 {
		t.Errorf("%d attempt spans after the globals were set, want 1", n)
	}
	if base.headers[0].Get("Traceparent") != "" || base.headers[1].Get("Traceparent") == "" {
		t.Errorf("traceparent before and after the globals were set: %q, %q; want none, then one",
			base.headers[0].Get("Traceparent"), base.headers[1].Get("Traceparent"))
	}
	if got := counter(t, k.collect(t), "bulwark.requests", upDefault, keyOutcome.String("success")); got != 1 {
		t.Errorf("bulwark.requests{success} = %d, want 1", got)
	}
}

// nopProcessor keeps spans recording without exporting them: the cost of
// bulwark's spans, not of an exporter.
type nopProcessor struct{}

func (nopProcessor) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (nopProcessor) OnEnd(sdktrace.ReadOnlySpan)                     {}
func (nopProcessor) Shutdown(context.Context) error                  { return nil }
func (nopProcessor) ForceFlush(context.Context) error                { return nil }

// BenchmarkObserve is BenchmarkTransport's stub/router+deadlines with
// OpenTelemetry off (the placeholder globals) and on (an SDK tracer that
// samples everything into a no-op processor, an SDK meter with a manual
// reader, the W3C propagator), with and without a caller span. The
// difference between off and sdk is the per-request cost of observing.
func BenchmarkObserve(b *testing.B) {
	b.Run("off", func(b *testing.B) {
		benchRoundTrips(b, mustNew(b, Config{Base: benchBase{}}), "http://stub.internal/x")
	})
	sdk := func(b *testing.B) Config {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithSpanProcessor(nopProcessor{}))
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		b.Cleanup(func() { _ = tp.Shutdown(context.Background()); _ = mp.Shutdown(context.Background()) })
		return Config{Base: benchBase{}, TracerProvider: tp, MeterProvider: mp, Propagator: propagation.TraceContext{}}
	}
	b.Run("sdk/no-caller-span", func(b *testing.B) {
		benchRoundTrips(b, mustNew(b, sdk(b)), "http://stub.internal/x")
	})
	b.Run("sdk/caller-span", func(b *testing.B) {
		cfg := sdk(b)
		ctx, span := cfg.TracerProvider.Tracer("bench").Start(context.Background(), "caller")
		defer span.End()
		tr := mustNew(b, cfg)
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://stub.internal/x", nil)
		req.Header.Set("Accept", "application/json")
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				resp, err := tr.RoundTrip(req)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	})
	b.Run("sdk/metrics-only", func(b *testing.B) {
		cfg := sdk(b)
		cfg.TracerProvider = tracenoop.NewTracerProvider()
		benchRoundTrips(b, mustNew(b, cfg), "http://stub.internal/x")
	})
}

// gaugeValue returns the Int64 gauge name's point for upstream.
func gaugeValue(t *testing.T, rm metricdata.ResourceMetrics, name, upstream string) (int64, bool) {
	t.Helper()
	m := findMetric(rm, name)
	if m == nil {
		return 0, false
	}
	for _, dp := range m.Data.(metricdata.Gauge[int64]).DataPoints {
		if v, _ := dp.Attributes.Value(keyUpstream); v.AsString() == upstream {
			return dp.Value, true
		}
	}
	return 0, false
}

func wantGauge(t *testing.T, rm metricdata.ResourceMetrics, name string, want int64) {
	t.Helper()
	if got, ok := gaugeValue(t, rm, name, "default"); !ok || got != want {
		t.Errorf("%s{default} = %d (present %v), want %d", name, got, ok, want)
	}
}

// eventsNamed returns the events called name on the one ended span called span.
func eventsNamed(t *testing.T, sr *tracetest.SpanRecorder, span, name string) []sdktrace.Event {
	t.Helper()
	spans := spansNamed(sr, span)
	if len(spans) != 1 {
		t.Fatalf("%d spans named %q, want 1", len(spans), span)
	}
	var out []sdktrace.Event
	for _, ev := range spans[0].Events() {
		if ev.Name == name {
			out = append(out, ev)
		}
	}
	return out
}

// wantEventAttrs checks that ev carries at least the attributes in want.
func wantEventAttrs(t *testing.T, ev sdktrace.Event, want map[attribute.Key]any) {
	t.Helper()
	for _, kv := range ev.Attributes {
		if w, ok := want[kv.Key]; ok {
			if got := kv.Value.AsInterface(); got != w {
				t.Errorf("event %s: %s = %v, want %v", ev.Name, kv.Key, got, w)
			}
		}
	}
	for key := range want {
		found := false
		for _, kv := range ev.Attributes {
			found = found || kv.Key == key
		}
		if !found {
			t.Errorf("event %s lacks %s", ev.Name, key)
		}
	}
}

// A GET answered 503 (with Retry-After: 1), 503, then 200, through the
// real retry and pushback layers, in a bubble.
func TestObserveRealRetryTwiceThenSucceeds(t *testing.T) {
	synctest.Test(t, testObserveRealRetryTwiceThenSucceeds)
}

func testObserveRealRetryTwiceThenSucceeds(t *testing.T) {
	k := newOtelKit(t)
	var logs logRecorder
	var mu sync.Mutex
	n := 0
	base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		closeBody(req)
		mu.Lock()
		n++
		i := n
		mu.Unlock()
		resp := &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok")), Request: req}
		switch i {
		case 1:
			resp.StatusCode = 503
			resp.Header.Set("Retry-After", "1")
		case 2:
			resp.StatusCode = 503
		}
		return resp, nil
	})
	var waits []time.Duration
	cfg := k.realConfig(base, Policy{Retry: Retry{OnRetry: func(_ *http.Request, ev RetryEvent) {
		waits = append(waits, ev.Wait)
	}}})
	cfg.Logger = slog.New(&logs)
	tr := mustNew(t, cfg)
	tr.randN = func(n int64) int64 { return n - 1 }
	ctx, caller := k.caller(t.Context())
	resp, err := obsGet(t, tr, ctx, "http://tax.internal/rate")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("got %v, %v; want 200", resp, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	caller.End()

	// Retry-After's 1 s, then the second backoff's full 200 ms (randN
	// answers its maximum).
	if len(waits) != 2 || waits[0] != time.Second || waits[1] != 200*time.Millisecond {
		t.Errorf("waits = %v, want [1s 200ms]", waits)
	}
	attempts := spansNamed(k.sr, "GET")
	if len(attempts) != 3 {
		t.Fatalf("%d attempt spans, want 3", len(attempts))
	}
	for i, s := range attempts {
		if s.Parent().SpanID() != caller.SpanContext().SpanID() {
			t.Errorf("attempt %d: parent %v, want the caller's span", i+1, s.Parent().SpanID())
		}
		wantAttr(t, s, keyAttempt, int64(i+1))
		if i == 0 {
			if _, ok := attr(s, "http.request.resend_count"); ok {
				t.Error("first attempt has http.request.resend_count")
			}
		} else {
			wantAttr(t, s, "http.request.resend_count", int64(i))
		}
		wantAttr(t, s, "http.response.status_code", int64([]int{503, 503, 200}[i]))
	}
	retries := eventsNamed(t, k.sr, "caller", eventRetry)
	if len(retries) != 2 {
		t.Fatalf("%d retry events, want 2", len(retries))
	}
	wantEventAttrs(t, retries[0], map[attribute.Key]any{keyAttempt: int64(2), keyRetryDelay: 1.0, keyRetryReason: "status_503", keyFromRetryAfter: true})
	wantEventAttrs(t, retries[1], map[attribute.Key]any{keyAttempt: int64(3), keyRetryDelay: 0.2, keyRetryReason: "status_503", keyFromRetryAfter: false})
	if rej := eventsNamed(t, k.sr, "caller", eventRejected); len(rej) != 0 {
		t.Errorf("rejection events %v, want none: the retry waited out the pause", rej)
	}

	rm := k.collect(t)
	if got := counter(t, rm, "bulwark.retries", upDefault, keyRetryReason.String("status_503")); got != 2 {
		t.Errorf("bulwark.retries{status_503} = %d, want 2", got)
	}
	if got := counter(t, rm, "bulwark.requests", upDefault, keyOutcome.String(outcomeSuccess)); got != 1 {
		t.Errorf("bulwark.requests{success} = %d, want 1", got)
	}
	if got := histCount(t, rm, "bulwark.retry.delay", upDefault); got != 2 {
		t.Errorf("bulwark.retry.delay count = %d, want 2", got)
	}
	if got := histCount(t, rm, "bulwark.attempt.duration", upDefault, keyOutcome.String(outcomeServerError)); got != 2 {
		t.Errorf("bulwark.attempt.duration{server_error} count = %d, want 2", got)
	}
	// Two retries taken from the floor's burst of 10, refilled over the
	// 1.2 s waited.
	wantGauge(t, rm, "bulwark.retry.budget.remaining", 10)
	wantBreakerState(t, rm, "tax.internal", CircuitClosed)
	wantGauge(t, rm, "bulwark.bulkhead.in_flight", 0)

	// Debug line per retry; pushback start and end at Info.
	var msgs []string
	logs.mu.Lock()
	for _, r := range logs.recs {
		msgs = append(msgs, r.Level.String()+" "+r.Message)
	}
	logs.mu.Unlock()
	want := []string{"INFO bulwark: pushback started", "DEBUG bulwark: retry scheduled", "INFO bulwark: pushback ended", "DEBUG bulwark: retry scheduled"}
	if strings.Join(msgs, "|") != strings.Join(want, "|") {
		t.Errorf("log = %q, want %q", msgs, want)
	}
}

// A breaker tripped by two 503s, then a rejection.
func TestObserveRealBreakerTrip(t *testing.T) {
	k := newOtelKit(t)
	var logs logRecorder
	cfg := k.realConfig(&seqBase{statuses: []int{503}}, Policy{Breaker: Breaker{MinCalls: 2}, Retry: Retry{Disabled: true}})
	cfg.Logger = slog.New(&logs)
	tr := mustNew(t, cfg)
	ctx, caller := k.caller(t.Context())
	for i := range 2 {
		resp, err := obsGet(t, tr, ctx, "http://tax.internal/rate")
		if err != nil || resp.StatusCode != 503 {
			t.Fatalf("call %d: %v, %v; want 503", i+1, resp, err)
		}
		resp.Body.Close()
	}
	if _, err := obsGet(t, tr, ctx, "http://tax.internal/rate"); !errors.Is(err, ErrBreakerOpen) {
		t.Fatalf("third call: %v, want ErrBreakerOpen", err)
	}
	caller.End()

	rej := eventsNamed(t, k.sr, "caller", eventRejected)
	if len(rej) != 1 {
		t.Fatalf("%d rejection events, want 1", len(rej))
	}
	wantEventAttrs(t, rej[0], map[attribute.Key]any{keyLayer: layerBreaker})
	if n := len(spansNamed(k.sr, "GET")); n != 2 {
		t.Errorf("%d attempt spans, want 2: a rejected request is not sent", n)
	}
	rm := k.collect(t)
	for _, c := range []struct {
		name string
		kv   []attribute.KeyValue
		want int64
	}{
		{"bulwark.rejections", []attribute.KeyValue{upDefault, keyLayer.String(layerBreaker)}, 1},
		{"bulwark.breaker.transitions", []attribute.KeyValue{upDefault, keyBreakerState.String("open")}, 1},
		{"bulwark.requests", []attribute.KeyValue{upDefault, keyOutcome.String(outcomeBreaker)}, 1},
		{"bulwark.requests", []attribute.KeyValue{upDefault, keyOutcome.String(outcomeServerError)}, 2},
	} {
		if got := counter(t, rm, c.name, c.kv...); got != c.want {
			t.Errorf("%s%v = %d, want %d", c.name, c.kv, got, c.want)
		}
	}
	wantBreakerState(t, rm, "tax.internal", CircuitOpen)

	logs.mu.Lock()
	defer logs.mu.Unlock()
	found := false
	for _, r := range logs.recs {
		if r.Level == slog.LevelInfo && r.Message == "bulwark: circuit breaker open" {
			attrs := map[string]string{}
			r.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value.String(); return true })
			found = attrs["from"] == "closed" && attrs["calls"] == "2" && attrs["failures"] == "2" && attrs["host"] == "tax.internal:80"
		}
	}
	if !found {
		t.Errorf("no Info line for the breaker opening with its counts in %d records", len(logs.recs))
	}
}

// A bulkhead of one slot, held by an unread body, refuses the next call.
func TestObserveRealBulkheadRejection(t *testing.T) {
	k := newOtelKit(t)
	tr := mustNew(t, k.realConfig(&seqBase{statuses: []int{200}}, Policy{Bulkhead: Bulkhead{MaxConcurrent: 1}}))
	ctx, caller := k.caller(t.Context())
	held, err := obsGet(t, tr, ctx, "http://tax.internal/rate")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := obsGet(t, tr, ctx, "http://tax.internal/rate"); !errors.Is(err, ErrBulkheadFull) {
		t.Fatalf("second call: %v, want ErrBulkheadFull", err)
	}
	rm := k.collect(t)
	wantGauge(t, rm, "bulwark.bulkhead.in_flight", 1)
	wantGauge(t, rm, "bulwark.bulkhead.queued", 0)
	if got := counter(t, rm, "bulwark.rejections", upDefault, keyLayer.String(layerBulkhead)); got != 1 {
		t.Errorf("bulwark.rejections{bulkhead} = %d, want 1", got)
	}
	held.Body.Close()
	caller.End()
	rej := eventsNamed(t, k.sr, "caller", eventRejected)
	if len(rej) != 1 {
		t.Fatalf("%d rejection events, want 1", len(rej))
	}
	wantEventAttrs(t, rej[0], map[attribute.Key]any{keyLayer: layerBulkhead})
	wantGauge(t, k.collect(t), "bulwark.bulkhead.in_flight", 0)
}

// A 503 answered from the stale cache.
func TestObserveRealStaleFallback(t *testing.T) {
	k := newOtelKit(t)
	tr := mustNew(t, k.realConfig(&seqBase{statuses: []int{200, 503}},
		Policy{Retry: Retry{Disabled: true}, Fallback: Fallback{Stale: StaleCache{MaxAge: time.Hour}}}))
	ctx, caller := k.caller(t.Context())
	for i, want := range []string{"", "stale"} {
		resp, err := obsGet(t, tr, ctx, "http://tax.internal/rate")
		if err != nil || resp.StatusCode != 200 || resp.Header.Get(FallbackHeader) != want {
			t.Fatalf("call %d: %v, %v; want 200 with %s %q", i+1, resp, err, FallbackHeader, want)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	caller.End()
	fb := eventsNamed(t, k.sr, "caller", eventFallback)
	if len(fb) != 1 {
		t.Fatalf("%d fallback events, want 1", len(fb))
	}
	wantEventAttrs(t, fb[0], map[attribute.Key]any{keyFallbackKind: "stale"})
	if got := counter(t, k.collect(t), "bulwark.fallbacks", upDefault, keyFallbackKind.String("stale")); got != 1 {
		t.Errorf("bulwark.fallbacks{stale} = %d, want 1", got)
	}
}

// TestRefusalMetricsMatchSnapshot: every layer's refusals, and the
// fallback's answers, are counted in OTel (bulwark.rejections by
// bulwark.layer, bulwark.fallbacks by kind) exactly as the host's
// Snapshot counts them, so the page and a dashboard agree. Read with the
// SDK's ManualReader.
func TestRefusalMetricsMatchSnapshot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		get := func(tr *Transport, ctx context.Context) {
			t.Helper()
			if resp, err := tr.RoundTrip(testRequest(t, ctx, "GET", "http://a.test/", noBody, "")); err == nil {
				resp.Body.Close()
			}
		}
		for _, c := range []struct {
			layer  string // bulwark.layer, or "fallback"
			base   func(int, *http.Request) (*http.Response, error)
			policy Policy
			calls  int
			left   time.Duration // the caller's deadline; 0: none
			snap   func(HostSnapshot) uint64
		}{
			{layerBreaker, always(500), only(Policy{Breaker: Breaker{MinCalls: 1, OpenFor: time.Hour}}, "breaker"), 5, 0,
				func(h HostSnapshot) uint64 { return h.Breaker.Refused }},
			{layerPushback, always(503, "Retry-After", "60"), only(Policy{Retry: Retry{MaxAttempts: 1}}, "pushback"), 5, 0,
				func(h HostSnapshot) uint64 { return h.Pushback.Refused }},
			{layerBudget, always(503), only(Policy{Retry: Retry{MaxAttempts: 2, NoPushback: true, Budget: Budget{Ratio: 0.001, MinPerSecond: -1}}}, "retry"), 5, 0,
				func(h HostSnapshot) uint64 { return h.Budget.Refused }},
			{layerThrottle, always(503), only(Policy{Throttle: Throttle{Enabled: true, K: 1}}), 200, 0,
				func(h HostSnapshot) uint64 { return h.Throttle.Refused }},
			{layerDeadline, always(200), only(Policy{}, "timeout"), 5, 5 * time.Millisecond,
				func(h HostSnapshot) uint64 { return h.DeadlineTooShort }},
			{"fallback", always(500), only(Policy{Fallback: Fallback{Constant: &ConstantResponse{Body: []byte("0")}}}), 5, 0,
				func(h HostSnapshot) uint64 { return h.Fallback.Served }},
		} {
			k := newOtelKit(t)
			tr := mustNew(t, Config{Base: &scriptBase{step: c.base}, MeterProvider: k.mp, Default: c.policy})
			for range c.calls {
				ctx, cancel := t.Context(), context.CancelFunc(func() {})
				if c.left > 0 {
					ctx, cancel = context.WithTimeout(ctx, c.left)
				}
				get(tr, ctx)
				cancel()
			}
			want := c.snap(tr.Snapshot().Hosts[0])
			var got int64
			if c.layer == "fallback" {
				got = counter(t, k.collect(t), "bulwark.fallbacks", upDefault, keyFallbackKind.String("constant"))
			} else {
				got = counter(t, k.collect(t), "bulwark.rejections", upDefault, keyLayer.String(c.layer))
			}
			if want == 0 || got != int64(want) {
				t.Errorf("%s: the metric counts %d, the Snapshot %d; want them equal and above 0", c.layer, got, want)
			}
		}

		// The bulkhead: one slot, held; the next call is refused.
		k := newOtelKit(t)
		release := make(chan struct{})
		held := &scriptBase{step: func(_ int, req *http.Request) (*http.Response, error) {
			<-release
			return response(req, 200), nil
		}}
		tr := mustNew(t, Config{Base: held, MeterProvider: k.mp, Default: only(Policy{Bulkhead: Bulkhead{MaxConcurrent: 1}}, "bulkhead")})
		done := make(chan struct{})
		go func() { get(tr, t.Context()); close(done) }()
		synctest.Wait()
		get(tr, t.Context())
		get(tr, t.Context())
		want := tr.Snapshot().Hosts[0].Bulkhead.Refused
		if got := counter(t, k.collect(t), "bulwark.rejections", upDefault, keyLayer.String(layerBulkhead)); want != 2 || got != 2 {
			t.Errorf("bulkhead: the metric counts %d, the Snapshot %d; want 2 and 2", got, want)
		}
		close(release)
		<-done
	})
}

// TestPassedUpMetricMatchesSnapshot: the calls answered with a failure
// passed up from below are counted in OTel as bulwark.requests with
// bulwark.outcome "passed_up" (and their attempts in
// bulwark.attempt.duration), exactly as HostSnapshot.PassedUp counts
// them, apart from the host's own server errors, so a dashboard and the
// debug page agree. Read with the SDK's ManualReader.
func TestPassedUpMetricMatchesSnapshot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newOtelKit(t)
		below := &headerBase{status: 503, header: http.Header{NoRetryHeader: {NoRetryFromBelow}}}
		own := &headerBase{status: 503, header: http.Header{NoRetryHeader: {"1"}}} // a Shedder's: the host's own
		tr := mustNew(t, Config{MeterProvider: k.mp, Base: roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if req.URL.Host == "own.test" {
				return own.RoundTrip(req)
			}
			return below.RoundTrip(req)
		})})
		for range 7 {
			if _, err := send(t, tr, t.Context(), "http://h.test/x", ""); err != nil {
				t.Fatal(err)
			}
		}
		for range 3 {
			if _, err := send(t, tr, t.Context(), "http://own.test/x", ""); err != nil {
				t.Fatal(err)
			}
		}
		rm := k.collect(t)
		snap := tr.Snapshot().Host("h.test:80")[0].PassedUp
		requests := counter(t, rm, "bulwark.requests", upDefault, keyOutcome.String(outcomePassedUp))
		attempts := histCount(t, rm, "bulwark.attempt.duration", upDefault, keyOutcome.String(outcomePassedUp))
		if snap != 7 || requests != 7 || attempts != 7 {
			t.Errorf("passed up: Snapshot %d, bulwark.requests %d, bulwark.attempt.duration %d; want 7 each (sent once each)", snap, requests, attempts)
		}
		if own := counter(t, rm, "bulwark.requests", upDefault, keyOutcome.String(outcomeServerError)); own != 3 {
			t.Errorf("the host's own don't-retry 503s: bulwark.requests{server_error} = %d, want 3", own)
		}
		if n := tr.Snapshot().Host("own.test:80")[0].PassedUp; n != 0 {
			t.Errorf("the host's own 503s counted %d as passed up, want 0", n)
		}
		// The calls by final outcome put the pass-ups in a bucket of
		// their own, and the host's own 503s among its failures.
		if c := tr.Snapshot().Host("h.test:80")[0].Calls; c.Calls != 7 || c.PassedUp != 7 || c.Failed != 0 {
			t.Errorf("h.test's calls %+v; want 7, all 7 passed up, none failed", c)
		}
		if c := tr.Snapshot().Host("own.test:80")[0].Calls; c.Calls != 3 || c.PassedUp != 0 || c.Failed != 3 {
			t.Errorf("own.test's calls %+v; want 3, all failed, none passed up", c)
		}
	})
}

// TestHostileUserinfoRedacted: a URL's password never shows in an error or
// a log line, whatever layer speaks: retries (Debug), the breaker opening
// and a pushback pause (Info), the final error.
func TestHostileUserinfoRedacted(t *testing.T) {
	const secret = "s3cr3t-pw"
	var logs syncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	n := 0
	base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		n++
		if n%2 == 0 {
			return response(req, 503, "Retry-After", "1"), nil
		}
		return nil, errReset
	})
	tr := mustNew(t, Config{Base: base, Logger: logger, Default: Policy{
		Retry:   Retry{Base: time.Millisecond, Cap: time.Millisecond, MaxRetryAfter: time.Millisecond},
		Breaker: Breaker{MinCalls: 2, OpenFor: time.Minute},
	}})
	u := "http://admin:" + secret + "@api.test/x?token=1"
	var errs []string
	for i := 0; i < 4; i++ {
		req, err := http.NewRequestWithContext(t.Context(), "GET", u, nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp, err := tr.RoundTrip(req); err != nil {
			errs = append(errs, err.Error())
		} else {
			resp.Body.Close()
		}
		// And through http.Client, whose *url.Error names the URL.
		if resp, err := (&http.Client{Transport: tr}).Get(u); err != nil {
			errs = append(errs, err.Error())
		} else {
			resp.Body.Close()
		}
	}
	if len(errs) == 0 {
		t.Fatal("no errors to inspect")
	}
	for _, e := range errs {
		if strings.Contains(e, secret) {
			t.Errorf("error leaks the password: %s", e)
		}
	}
	if strings.Contains(logs.String(), secret) {
		t.Errorf("log leaks the password:\n%s", logs.String())
	}
	// And every layer named above did speak, so the check covered it.
	for _, msg := range []string{"retry scheduled", "circuit breaker open", "pushback started"} {
		if !strings.Contains(logs.String(), msg) {
			t.Errorf("no %q in the log, so its redaction went unchecked:\n%s", msg, logs.String())
		}
	}
}

// eventAttr returns the value of key on ev.
func eventAttr(ev sdktrace.Event, key attribute.Key) (attribute.Value, bool) {
	for _, kv := range ev.Attributes {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// callerEvents returns, per ended "caller" span that has an event called
// name, the span's X-Call number and the event.
func callerEvents(k *otelKit, name string) map[string]sdktrace.Event {
	out := map[string]sdktrace.Event{}
	for _, s := range spansNamed(k.sr, "caller") {
		call, _ := attr(s, "test.call")
		for _, ev := range s.Events() {
			if ev.Name == name {
				out[call.AsString()] = ev
			}
		}
	}
	return out
}

// TestObserveOutlier: an instance ejected after its consecutive 5xx shows
// as an event on the span of the request whose failure ejected it, a count
// by instance and the ejected gauge; its return as an event and a count.
func TestObserveOutlier(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const sick = 3
		f := newFleet(t, 5, "tax.internal", func(i int) int {
			if i == sick {
				return http.StatusInternalServerError
			}
			return http.StatusOK
		})
		k := newOtelKit(t)
		cfg := k.config(f.transport())
		cfg.Upstreams = map[string]Policy{"tax.internal": {Endpoints: Endpoints{Addrs: f.addrs}}}
		tr := mustNew(t, cfg)
		clk := newFakeClock()
		t.Cleanup(tr.CloseIdleConnections)
		c := &http.Client{Transport: tr}

		call := 0
		get := func() {
			t.Helper()
			call++
			id := strconv.Itoa(call)
			ctx, span := k.caller(t.Context())
			span.SetAttributes(attribute.String("test.call", id))
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://tax.internal/rate", nil)
			req.Header.Set("X-Call", id)
			resp, err := c.Do(req)
			if err != nil {
				t.Fatalf("call %s: %v", id, err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			span.End()
		}
		for i := 0; i < 200 && f.hits[sick].Load() < defaultConsecutiveFailures; i++ {
			get()
		}
		if n := f.hits[sick].Load(); n != defaultConsecutiveFailures {
			t.Fatalf("sick instance served %d, want %d", n, defaultConsecutiveFailures)
		}
		s := stateOf(t, tr, f.addrs[sick])
		if !s.Ejected {
			t.Fatalf("sick instance not ejected: %+v", s)
		}

		evs := callerEvents(k, eventEjected)
		if len(evs) != 1 {
			t.Fatalf("%d caller spans with %s, want 1", len(evs), eventEjected)
		}
		for id, ev := range evs {
			f.mu.Lock()
			served := f.calls[id]
			f.mu.Unlock()
			if len(served) != 1 || served[0] != sick {
				t.Errorf("event on call %s, which instances %v served; want the sick one's fifth failure", id, served)
			}
			want := map[attribute.Key]any{
				keyInstance:      f.addrs[sick],
				keyOutlierReason: "consecutive failures",
				keyEjectionTime:  defaultBaseEjection.Seconds(),
				keyEjections:     int64(1),
			}
			for key, w := range want {
				if v, ok := eventAttr(ev, key); !ok || v.AsInterface() != w {
					t.Errorf("event %s = %v (present %v), want %v", key, v.AsInterface(), ok, w)
				}
			}
		}

		up, inst := keyUpstream.String("tax.internal"), keyInstance.String(f.addrs[sick])
		rm := k.collect(t)
		if got := counter(t, rm, "bulwark.outlier.ejections", up, inst); got != 1 {
			t.Errorf("bulwark.outlier.ejections{sick} = %d, want 1", got)
		}
		if got, ok := gaugeValue(t, rm, "bulwark.outlier.ejected", "tax.internal"); !ok || got != 1 {
			t.Errorf("bulwark.outlier.ejected = %d (present %v), want 1", got, ok)
		}

		// Its time served, the next request returns it.
		clk.advance(defaultBaseEjection)
		get()
		ret := callerEvents(k, eventReturned)
		if ev, ok := ret[strconv.Itoa(call)]; len(ret) != 1 || !ok {
			t.Fatalf("returned events on calls %v, want only on call %d", ret, call)
		} else if v, _ := eventAttr(ev, keyInstance); v.AsString() != f.addrs[sick] {
			t.Errorf("returned event names %q, want %q", v.AsString(), f.addrs[sick])
		}
		rm = k.collect(t)
		if got := counter(t, rm, "bulwark.outlier.returns", up, inst); got != 1 {
			t.Errorf("bulwark.outlier.returns{sick} = %d, want 1", got)
		}
		if got, _ := gaugeValue(t, rm, "bulwark.outlier.ejected", "tax.internal"); got != 0 {
			t.Errorf("bulwark.outlier.ejected = %d after the return, want 0", got)
		}
	})
}

// TestObserveOutlierInstanceCap: past maxLabelValues distinct instances a
// host reports "other", in metrics and events alike.
func TestObserveOutlierInstanceCap(t *testing.T) {
	k := newOtelKit(t)
	cfg := k.config(&stubBase{})
	tr := mustNew(t, cfg)
	u, _ := url.Parse("http://tax.internal/rate")
	hs := tr.lookup(u)
	ctx, span := k.caller(t.Context())
	for i := 0; i < maxLabelValues+5; i++ {
		hs.rep.endpointChanged(ctx, endpointEvent{addr: "10.0.0." + strconv.Itoa(i) + ":80", ejected: true, reason: "consecutive failures", times: 1})
	}
	span.End()
	rm := k.collect(t)
	m := findMetric(rm, "bulwark.outlier.ejections")
	if m == nil {
		t.Fatal("no bulwark.outlier.ejections")
	}
	seen := map[string]bool{}
	var other int64
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		v, _ := dp.Attributes.Value(keyInstance)
		seen[v.AsString()] = true
		if v.AsString() == otherLabel {
			other = dp.Value
		}
	}
	if len(seen) != maxLabelValues+1 || other != 5 {
		t.Errorf("%d instance values (other = %d), want %d and 5", len(seen), other, maxLabelValues+1)
	}
	n := 0
	for _, ev := range eventsNamed(t, k.sr, "caller", eventEjected) {
		if v, _ := eventAttr(ev, keyInstance); v.AsString() == otherLabel {
			n++
		}
	}
	if n != 5 {
		t.Errorf("%d events name %q, want 5", n, otherLabel)
	}
}

// perUpstream combines the hosts of an upstream by its gaugeAgg, and keeps
// upstreams apart.
func TestPerUpstream(t *testing.T) {
	for _, c := range []struct {
		agg  gaugeAgg
		want int64 // for "default", from 1 and 2
	}{{gaugeSum, 3}, {gaugeMax, 2}, {gaugeMin, 1}} {
		p := newPerUpstream[int64](c.agg)
		p.add("default", 1)
		p.add("tax.internal", 7)
		p.add("default", 2)
		if len(p.vals) != 2 || p.vals["default"] != c.want || p.vals["tax.internal"] != 7 {
			t.Errorf("agg %d: %v, want default=%d tax.internal=7", c.agg, p.vals, c.want)
		}
	}
	p := newPerUpstream[float64](gaugeMax)
	p.add("default", 0.25)
	p.add("default", 0.5)
	p.add("default", 0)
	if p.vals["default"] != 0.5 {
		t.Errorf("float max: %v, want 0.5", p.vals)
	}
}

// wantBreakerState checks host's bulwark.breaker.state series (upstream
// "default", port 80, http): 1 for state, 0 for the others.
func wantBreakerState(t *testing.T, rm metricdata.ResourceMetrics, host string, state CircuitState) {
	t.Helper()
	m := findMetric(rm, "bulwark.breaker.state")
	if m == nil {
		t.Fatal("no bulwark.breaker.state")
	}
	for _, st := range breakerStates {
		want := attribute.NewSet(upDefault, attribute.String("url.scheme", "http"), attribute.String("server.address", host),
			attribute.Int("server.port", 80), keyBreakerState.String(stateLabel(st.String())))
		found := false
		for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
			if dp.Attributes.Equals(&want) {
				found = true
				if v := dp.Value; (v == 1) != (st == state) || v > 1 || v < 0 {
					t.Errorf("bulwark.breaker.state{%s} = %d with the breaker %v", stateLabel(st.String()), v, state)
				}
			}
		}
		if !found {
			t.Errorf("no bulwark.breaker.state point at %v", want.Encoded(attribute.DefaultEncoder()))
		}
	}
}
