package integration_test

// bulwark with otelhttp, both ways round, as the package documentation of
// Config.TracerProvider recommends. Here rather than in the root module so
// that the library's go.mod does not require otelhttp for a test.

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bulwark-http/bulwark"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// bulwark's instrumentation scope, and the event it puts on the caller's
// span before a retry.
const (
	bulwarkScope = "github.com/bulwark-http/bulwark"
	eventRetry   = "bulwark.retry"
)

// otelKit is an SDK tracer and meter that keep everything in memory.
type otelKit struct {
	sr *tracetest.SpanRecorder
	tp *sdktrace.TracerProvider
	mp *sdkmetric.MeterProvider
}

func newOtelKit(t *testing.T) *otelKit {
	k := &otelKit{sr: tracetest.NewSpanRecorder()}
	k.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(k.sr))
	k.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	t.Cleanup(func() {
		_ = k.tp.Shutdown(context.Background())
		_ = k.mp.Shutdown(context.Background())
	})
	return k
}

// config retries once, at once, with no breaker, so each span is accounted
// for.
func (k *otelKit) config(base http.RoundTripper) bulwark.Config {
	return bulwark.Config{Base: base, TracerProvider: k.tp, MeterProvider: k.mp, Propagator: propagation.TraceContext{},
		Default: bulwark.Policy{
			Retry:   bulwark.Retry{MaxAttempts: 2, NoPushback: true, Budget: bulwark.Budget{Disabled: true}, Backoff: func(_, _ time.Duration, _ int, _ *http.Response) time.Duration { return 0 }},
			Breaker: bulwark.Breaker{Disabled: true},
		}}
}

// seqBase answers each request with the next status of its list, from
// memory.
type seqBase struct {
	mu       sync.Mutex
	statuses []int
	n        int
}

func (b *seqBase) RoundTrip(req *http.Request) (*http.Response, error) {
	b.mu.Lock()
	code := b.statuses[min(b.n, len(b.statuses)-1)]
	b.n++
	b.mu.Unlock()
	return &http.Response{StatusCode: code, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok")), Request: req}, nil
}

// Recommended arrangement: otelhttp outside bulwark. otelhttp's span is the
// logical request; bulwark's attempt spans are its children; no logical
// span of bulwark's; the server sees the attempt as its parent.
func TestOtelhttpOutside(t *testing.T) {
	k := newOtelKit(t)
	var mu sync.Mutex
	var parents []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		parents = append(parents, r.Header.Get("Traceparent"))
		n := len(parents)
		mu.Unlock()
		if n == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	base := http.DefaultTransport.(*http.Transport).Clone()
	defer base.CloseIdleConnections()
	tr, err := bulwark.New(k.config(base))
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: otelhttp.NewTransport(tr,
		otelhttp.WithTracerProvider(k.tp), otelhttp.WithMeterProvider(k.mp), otelhttp.WithPropagators(propagation.TraceContext{}))}

	resp, err := client.Get(srv.URL + "/rate")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	var outer, attempts []sdktrace.ReadOnlySpan
	for _, s := range k.sr.Ended() {
		switch {
		case s.InstrumentationScope().Name == bulwarkScope && s.Name() == "GET":
			attempts = append(attempts, s)
		case s.InstrumentationScope().Name == bulwarkScope:
			t.Errorf("bulwark made span %q under otelhttp, want attempt spans only", s.Name())
		default:
			outer = append(outer, s)
		}
	}
	if len(outer) != 1 || len(attempts) != 2 {
		t.Fatalf("got %d otelhttp spans and %d attempt spans, want 1 and 2", len(outer), len(attempts))
	}
	mu.Lock()
	defer mu.Unlock()
	for i, s := range attempts {
		if s.Parent().SpanID() != outer[0].SpanContext().SpanID() {
			t.Errorf("attempt %d's parent = %v, want otelhttp's span", i+1, s.Parent().SpanID())
		}
		if !strings.Contains(parents[i], s.SpanContext().SpanID().String()) {
			t.Errorf("server saw traceparent %q for attempt %d, want span %s", parents[i], i+1, s.SpanContext().SpanID())
		}
	}
	if evs := outer[0].Events(); len(evs) == 0 || evs[len(evs)-1].Name != eventRetry {
		t.Errorf("otelhttp span events = %v, want bulwark's retry event", evs)
	}
}

// otelhttp inside bulwark (as Config.Base) with bulwark's tracer off: one
// client span per attempt, otelhttp's, each a child of the caller's span;
// bulwark's events still land on the caller's span.
func TestOtelhttpInside(t *testing.T) {
	k := newOtelKit(t)
	inner := otelhttp.NewTransport(&seqBase{statuses: []int{503, 200}},
		otelhttp.WithTracerProvider(k.tp), otelhttp.WithMeterProvider(k.mp), otelhttp.WithPropagators(propagation.TraceContext{}))
	cfg := k.config(inner)
	cfg.TracerProvider = tracenoop.NewTracerProvider()
	tr, err := bulwark.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, caller := k.tp.Tracer("app").Start(t.Context(), "caller")
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://tax.internal/rate", nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	caller.End()

	var client []sdktrace.ReadOnlySpan
	var callerSpan sdktrace.ReadOnlySpan
	for _, s := range k.sr.Ended() {
		if s.InstrumentationScope().Name == bulwarkScope {
			t.Errorf("bulwark made span %q with its tracer off", s.Name())
		}
		if s.SpanKind() == trace.SpanKindClient {
			client = append(client, s)
		}
		if s.Name() == "caller" {
			callerSpan = s
		}
	}
	if len(client) != 2 {
		t.Fatalf("%d client spans, want 2 (one per attempt)", len(client))
	}
	for _, s := range client {
		if s.Parent().SpanID() != caller.SpanContext().SpanID() {
			t.Errorf("otelhttp span's parent = %v, want the caller's", s.Parent().SpanID())
		}
	}
	if evs := callerSpan.Events(); len(evs) != 1 || evs[0].Name != eventRetry {
		t.Errorf("caller events = %v, want the retry", evs)
	}
}
