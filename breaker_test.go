package bulwark

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sony/gobreaker/v2"
)

// opBase answers by the request's X-Op header, one letter:
//
//	S 200   F 503   4 404   N 501   R 429   E transport error
//	T bulwark's attempt timeout     C the caller's cancellation
//	L 200 after slow (moves clk on by slow, or sleeps in a synctest bubble)
//	B blocks until release is closed or the context ends, then 200
type opBase struct {
	clk      *fakeClock // nil: time.Sleep (use inside synctest)
	slow     time.Duration
	release  chan struct{}
	calls    atomic.Int64
	inFlight atomic.Int64
	maxIn    atomic.Int64
}

func (o *opBase) RoundTrip(req *http.Request) (*http.Response, error) {
	o.calls.Add(1)
	n := o.inFlight.Add(1)
	defer o.inFlight.Add(-1)
	for {
		m := o.maxIn.Load()
		if n <= m || o.maxIn.CompareAndSwap(m, n) {
			break
		}
	}
	closeBody(req)
	code := 200
	switch op := req.Header.Get("X-Op"); op {
	case "", "S":
	case "F":
		code = 503
	case "4":
		code = 404
	case "N":
		code = 501
	case "R":
		code = 429
	case "E":
		return nil, errStub
	case "T":
		return nil, &timeoutError{limit: ErrAttemptTimeout, cause: context.DeadlineExceeded}
	case "C":
		return nil, context.Canceled
	case "L":
		if o.clk != nil {
			o.clk.advance(o.slow)
		} else {
			time.Sleep(o.slow)
		}
	case "B":
		select {
		case <-o.release:
		case <-req.Context().Done():
			return nil, req.Context().Err()
		}
	default:
		panic("opBase: unknown op " + op)
	}
	return &http.Response{
		StatusCode: code, Status: http.StatusText(code), Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok")), ContentLength: 2, Request: req,
	}, nil
}

// testBreaker builds a breaker layer alone over next, for the host
// "h.test:80" of tr.
func testBreaker(t testing.TB, tr *Transport, b Breaker, next http.RoundTripper) *breakerRT {
	t.Helper()
	p := Policy{Breaker: b}.withDefaults()
	if err := p.validate(); err != nil {
		t.Fatal(err)
	}
	hs := &hostState{t: tr, name: "h.test:80", upstream: "default", policy: &p}
	return newBreakerRT(next, hs)
}

func mustNew(t testing.TB, cfg Config) *Transport {
	t.Helper()
	tr, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// send makes one call with op through rt, closing any response.
func send(t testing.TB, rt http.RoundTripper, ctx context.Context, url, op string) (int, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Op", op)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// runScript sends the script's ops one by one and returns the 1-based
// number of the call after which the breaker was open, or 0.
func runScript(t *testing.T, b *breakerRT, script string) int {
	t.Helper()
	for i, op := range script {
		ctx := t.Context()
		if op == 'C' {
			c, cancel := context.WithCancel(ctx)
			cancel()
			ctx = c
		}
		_, err := send(t, b, ctx, "http://h.test/x", string(op))
		if errors.Is(err, ErrBreakerOpen) {
			t.Fatalf("call %d (%c) refused: breaker opened earlier than reported", i+1, op)
		}
		if b.state() == CircuitOpen {
			return i + 1
		}
	}
	return 0
}

func TestBreakerTrips(t *testing.T) {
	const slow = time.Second
	tests := []struct {
		name     string
		br       Breaker
		script   string
		wantOpen int // call after which the breaker is open; 0: never
	}{
		{"exactly at failure rate at MinCalls", Breaker{MinCalls: 10}, "SSSSSFFFFF", 10},
		{"below MinCalls all failing", Breaker{MinCalls: 10}, "FFFFFFFFF", 0},
		{"just under the rate", Breaker{MinCalls: 10}, "SSSSSSFFFFF", 0},
		{"threshold reached after MinCalls", Breaker{MinCalls: 10}, "SSSSSSFFFFFF", 12},
		{"a success reaching MinCalls at the rate", Breaker{MinCalls: 10}, "FFFFFSSSSS", 10},
		{"rate 0.3 exact", Breaker{MinCalls: 10, FailureRate: 0.3}, "SSSSSSSFFF", 10},
		{"rate 0.7 exact", Breaker{MinCalls: 10, FailureRate: 0.7}, "SSSFFFFFFF", 10},
		{"rate 0.7 under", Breaker{MinCalls: 10, FailureRate: 0.7}, "SSSSFFFFFF", 0},
		{"rate 0.28, 7 of 25", Breaker{MinCalls: 25, FailureRate: 0.28}, strings.Repeat("S", 18) + "FFFFFFF", 25},
		{"rate 0.3 under", Breaker{MinCalls: 10, FailureRate: 0.3}, "SSSSSSSSFF", 0},
		{"transport errors, timeouts and 429 fail", Breaker{MinCalls: 4, FailureRate: 1}, "ETRF", 4},
		{"4xx, 501 and cancellations ignored", Breaker{MinCalls: 10}, "4444NNCCCCSSSSSFFFF44CC", 0},
		{"ignored calls leave the denominator", Breaker{MinCalls: 10}, "4444NNCCCCSSSSSFFFF44CCF", 24},
		{"every call slow", Breaker{MinCalls: 10, SlowCall: slow}, "LLLLLLLLLL", 10},
		{"half slow", Breaker{MinCalls: 10, SlowCall: slow}, "SSSSSLLLLL", 10},
		{"under the slow rate", Breaker{MinCalls: 10, SlowCall: slow}, "SSSSSSLLLLS", 0},
		{"slow rate 0.2", Breaker{MinCalls: 10, SlowCall: slow, SlowCallRate: 0.2}, "SSSSSSSSLL", 10},
		{"slow successes are not failures", Breaker{MinCalls: 10, SlowCall: slow, SlowCallRate: 1}, "LLLLLFFFFS", 0},
		{"two failures on a quiet endpoint", Breaker{}, "FF", 0},
		{"default MinCalls", Breaker{}, strings.Repeat("F", 99), 0},
		{"default MinCalls reached", Breaker{}, strings.Repeat("S", 50) + strings.Repeat("F", 50), 100},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := newFakeClock()
			tr := mustNew(t, Config{})
			tr.setClock(clk.now)
			base := &opBase{clk: clk, slow: 2 * slow}
			b := testBreaker(t, tr, tt.br, base)
			if got := runScript(t, b, tt.script); got != tt.wantOpen {
				t.Errorf("script %q: open after call %d, want %d", tt.script, got, tt.wantOpen)
			}
		})
	}
}

func TestBreakerWindowRolls(t *testing.T) {
	clk := newFakeClock()
	tr := mustNew(t, Config{})
	tr.setClock(clk.now)
	b := testBreaker(t, tr, Breaker{MinCalls: 10, Window: 10 * time.Second}, &opBase{})
	// Five successes, then 5 s on four failures: 9 calls, under MinCalls.
	steps := []struct {
		advance  time.Duration
		script   string
		wantOpen int
	}{
		{0, "SSSSS", 0},
		{5 * time.Second, "FFFF", 0},
		// A full window after the successes they have expired; one failure
		// and five successes make 10 calls with 5 failures, which trips.
		// Had the successes stayed it would be 5 of 15.
		{5 * time.Second, "FSSSSS", 6},
	}
	for _, st := range steps {
		clk.advance(st.advance)
		if got := runScript(t, b, st.script); got != st.wantOpen {
			t.Fatalf("+%v %q: open after call %d, want %d", st.advance, st.script, got, st.wantOpen)
		}
	}
}

func TestBreakerDefaults(t *testing.T) {
	p := Policy{Timeout: Timeout{Attempt: 2 * time.Second}}.withDefaults()
	want := Breaker{
		FailureRate: DefaultFailureRate, SlowCallRate: DefaultSlowCallRate, SlowCall: time.Second,
		Window: DefaultBreakerWindow, MinCalls: DefaultMinCalls, OpenFor: DefaultOpenFor, HalfOpenCalls: DefaultHalfOpenCalls,
	}
	got := p.Breaker
	got.Classify = nil
	if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
		t.Errorf("defaults = %+v, want %+v", got, want)
	}
	if p.Breaker.Classify == nil {
		t.Error("Classify default is nil")
	}
	if d := (Policy{}).withDefaults().Breaker.SlowCall; d != DefaultAttemptTimeout/2 {
		t.Errorf("SlowCall with package defaults = %v, want %v", d, DefaultAttemptTimeout/2)
	}
	// Inheritance: an upstream's zero fields come from Default.
	up := Policy{Breaker: Breaker{MinCalls: 5}}.inherit(Policy{Breaker: Breaker{MinCalls: 7, OpenFor: time.Second, Disabled: true}})
	if up.Breaker.MinCalls != 5 || up.Breaker.OpenFor != time.Second || !up.Breaker.Disabled {
		t.Errorf("inherit = %+v", up.Breaker)
	}
}

func TestBreakerValidate(t *testing.T) {
	tests := []struct {
		br    Breaker
		field string
	}{
		{Breaker{FailureRate: 1.5}, "Breaker.FailureRate"},
		{Breaker{FailureRate: -0.1}, "Breaker.FailureRate"},
		{Breaker{SlowCallRate: 2}, "Breaker.SlowCallRate"},
		{Breaker{SlowCall: -1}, "Breaker.SlowCall"},
		{Breaker{Window: time.Millisecond}, "Breaker.Window"},
		{Breaker{MinCalls: -1}, "Breaker.MinCalls"},
		{Breaker{OpenFor: -time.Second}, "Breaker.OpenFor"},
		{Breaker{HalfOpenCalls: -3}, "Breaker.HalfOpenCalls"},
	}
	for _, tt := range tests {
		_, err := New(Config{Upstreams: map[string]Policy{"api.test": {Breaker: tt.br}}})
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != tt.field || ce.Upstream != "api.test" {
			t.Errorf("New(%+v) = %v, want a ConfigError for %s", tt.br, err, tt.field)
		}
	}
	if _, err := New(Config{Default: Policy{Breaker: Breaker{FailureRate: 1, SlowCallRate: 1, MinCalls: 1}}}); err != nil {
		t.Errorf("valid breaker refused: %v", err)
	}
}

func TestDefaultClassify(t *testing.T) {
	resp := func(code int) *http.Response { return &http.Response{StatusCode: code} }
	tests := []struct {
		resp *http.Response
		err  error
		want Outcome
	}{
		{resp(200), nil, OutcomeSuccess},
		{resp(204), nil, OutcomeSuccess},
		{resp(304), nil, OutcomeSuccess},
		{resp(400), nil, OutcomeIgnored},
		{resp(404), nil, OutcomeIgnored},
		{resp(429), nil, OutcomeFailure},
		{resp(500), nil, OutcomeFailure},
		{resp(501), nil, OutcomeIgnored},
		{resp(502), nil, OutcomeFailure},
		{resp(503), nil, OutcomeFailure},
		{nil, errStub, OutcomeFailure},
		{nil, &timeoutError{limit: ErrAttemptTimeout, cause: errStub}, OutcomeFailure},
		{nil, ErrAttemptTimeout, OutcomeFailure},
		{nil, context.Canceled, OutcomeIgnored},
		{nil, fmt.Errorf("wrapped: %w", context.DeadlineExceeded), OutcomeIgnored},
		{nil, ErrDeadlineTooShort, OutcomeIgnored},
		{nil, ErrBulkheadFull, OutcomeIgnored},
	}
	for _, tt := range tests {
		code := 0
		if tt.resp != nil {
			code = tt.resp.StatusCode
		}
		if got := DefaultClassify(tt.resp, tt.err); got != tt.want {
			t.Errorf("DefaultClassify(%d, %v) = %v, want %v", code, tt.err, got, tt.want)
		}
	}
}

func TestBreakerCustomClassify(t *testing.T) {
	tr := mustNew(t, Config{})
	// Count 404 as a failure: this upstream answers 404 when its index is gone.
	classify := func(resp *http.Response, err error) Outcome {
		if resp != nil && resp.StatusCode == 404 {
			return Failure
		}
		return DefaultClassify(resp, err)
	}
	b := testBreaker(t, tr, Breaker{MinCalls: 4, Classify: classify}, &opBase{})
	if got := runScript(t, b, "S4S4"); got != 4 {
		t.Errorf("open after %d, want 4", got)
	}
}

// trip opens b with failures and fails the test if it does not open.
func trip(t *testing.T, b *breakerRT) {
	t.Helper()
	for range 1000 {
		if b.state() == CircuitOpen {
			return
		}
		send(t, b, t.Context(), "http://h.test/x", "F")
	}
	t.Fatal("breaker never opened")
}

func TestBreakerOpenRejects(t *testing.T) {
	base := &opBase{}
	tr := mustNew(t, Config{})
	b := testBreaker(t, tr, Breaker{MinCalls: 1}, base)
	trip(t, b)
	calls := base.calls.Load()
	for _, cr := range contractRequests {
		var bs bodies
		req := newContractRequest(t, t.Context(), "http://h.test/y", cr, &bs)
		_, _, err := checkContract(t, b, req, &bs)
		if !errors.Is(err, ErrBreakerOpen) {
			t.Fatalf("%s: err = %v, want ErrBreakerOpen", cr.name, err)
		}
		var oe *BreakerOpenError
		if !errors.As(err, &oe) || oe.Host != "h.test:80" || oe.ProbeAt.IsZero() {
			t.Errorf("%s: err = %#v, want a *BreakerOpenError for h.test:80 with ProbeAt", cr.name, err)
		}
	}
	if n := base.calls.Load(); n != calls {
		t.Errorf("open breaker sent %d requests", n-calls)
	}
	req, _ := http.NewRequest(http.MethodGet, "http://h.test/z", nil)
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := b.RoundTrip(req); err == nil {
			t.Fatal("open breaker let a request through")
		}
	})
	if allocs != 0 {
		t.Errorf("open rejection allocates %v times, want 0", allocs)
	}
}

func TestBreakerHalfOpen(t *testing.T) {
	tests := []struct {
		name      string
		probes    string // ops of the admitted probes, in order of release
		wantState CircuitState
	}{
		{"all succeed", "SSS", CircuitClosed},
		{"one fails", "SF", CircuitOpen},
		{"one slow", "SL", CircuitOpen},
		{"first fails", "F", CircuitOpen},
		{"one ignored frees its slot", "S4SS", CircuitClosed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const openFor = 10 * time.Second
				base := &opBase{slow: 2 * time.Second}
				tr := mustNew(t, Config{})
				b := testBreaker(t, tr, Breaker{MinCalls: 1, OpenFor: openFor, HalfOpenCalls: 3, SlowCall: time.Second}, base)
				trip(t, b)
				opened := b.openErr.Load()
				time.Sleep(openFor + time.Millisecond)
				if s := b.state(); s != CircuitHalfOpen {
					t.Fatalf("after OpenFor: state %v, want half-open", s)
				}
				// Probes one at a time keep the order of verdicts fixed.
				for i, op := range tt.probes {
					if _, err := send(t, b, t.Context(), "http://h.test/p", string(op)); err != nil {
						t.Fatalf("probe %d (%c): %v", i+1, op, err)
					}
				}
				if s := b.state(); s != tt.wantState {
					t.Errorf("after probes %q: state %v, want %v", tt.probes, s, tt.wantState)
				}
				if tt.wantState == CircuitOpen {
					e := b.openErr.Load()
					if e == opened || !e.ProbeAt.After(opened.ProbeAt) {
						t.Errorf("reopened without a new ProbeAt: %v then %v", opened.ProbeAt, e.ProbeAt)
					}
				}
			})
		})
	}
}

func TestBreakerHalfOpenConcurrency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const probes = 3
		base := &opBase{release: make(chan struct{})}
		tr := mustNew(t, Config{})
		b := testBreaker(t, tr, Breaker{MinCalls: 1, OpenFor: time.Second, HalfOpenCalls: probes}, base)
		trip(t, b)
		time.Sleep(2 * time.Second)
		sent := base.calls.Load()

		// Ten callers at once: three probes go out, the rest are refused.
		ctx, cancelOne := context.WithCancel(t.Context())
		var refused atomic.Int64
		var wg sync.WaitGroup
		for i := range 10 {
			c := t.Context()
			if i == 0 {
				c = ctx
			}
			wg.Go(func() {
				if _, err := send(t, b, c, "http://h.test/p", "B"); errors.Is(err, ErrBreakerOpen) {
					refused.Add(1)
				}
			})
			synctest.Wait()
		}
		if n := base.inFlight.Load(); n != probes {
			t.Errorf("%d probes in flight, want %d", n, probes)
		}
		if n := refused.Load(); n != 10-probes {
			t.Errorf("%d callers refused, want %d", n, 10-probes)
		}
		// The caller cancels the first probe: its slot frees without a
		// verdict, so one more probe may go.
		cancelOne()
		synctest.Wait()
		if s := b.state(); s != CircuitHalfOpen {
			t.Fatalf("after a cancelled probe: state %v, want half-open", s)
		}
		wg.Go(func() {
			if _, err := send(t, b, t.Context(), "http://h.test/p", "B"); err != nil {
				t.Errorf("probe after a freed slot: %v", err)
			}
		})
		synctest.Wait()
		if _, err := send(t, b, t.Context(), "http://h.test/p", "S"); !errors.Is(err, ErrBreakerOpen) {
			t.Errorf("a fourth probe: err = %v, want ErrBreakerOpen", err)
		}
		if n := base.maxIn.Load(); n > probes {
			t.Errorf("%d probes in flight at once, want ≤ %d", n, probes)
		}
		close(base.release)
		wg.Wait()
		if s := b.state(); s != CircuitClosed {
			t.Errorf("after %d good probes: state %v, want closed", probes, s)
		}
		if n := base.calls.Load() - sent; n != probes+1 {
			t.Errorf("%d requests sent while half-open, want %d", n, probes+1)
		}
	})
}

// syncBuffer is a log destination safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// reentrantHandler asks the Transport for the breaker's state while
// logging: were bulwark to log under gobreaker's mutex, this would deadlock.
type reentrantHandler struct {
	slog.Handler
	tr   *Transport
	host string
}

func (h reentrantHandler) Handle(ctx context.Context, r slog.Record) error {
	h.breakerState(tr, h.host)
	return h.Handler.Handle(ctx, r)
}

func TestBreakerPerHost(t *testing.T) {
	var logs syncBuffer
	var tr *Transport
	base := http.RoundTripper(roundTripFunc(func(req *http.Request) (*http.Response, error) {
		if req.URL.Hostname() == "sick.test" {
			req.Header.Set("X-Op", "F")
		}
		return (&opBase{}).RoundTrip(req)
	}))
	h := &reentrantHandler{Handler: slog.NewTextHandler(&logs, nil), host: "sick.test:80"}
	tr = mustNew(t, Config{
		Base:   base,
		Logger: slog.New(h),
		// Retries off: each call is one verdict, so the counts are exact.
		Default: Policy{Breaker: Breaker{MinCalls: 5}, Retry: Retry{Disabled: true}},
	})
	h.tr = tr
	for i := range 20 {
		if code, err := send(t, tr, t.Context(), "http://well.test/x", "S"); err != nil || code != 200 {
			t.Fatalf("well.test call %d: %d, %v", i, code, err)
		}
		code, err := send(t, tr, t.Context(), "http://sick.test/x", "S")
		switch {
		case i < 5 && code != 503:
			t.Fatalf("sick.test call %d: %d, %v; want 503", i, code, err)
		case i >= 5 && !errors.Is(err, ErrBreakerOpen):
			t.Fatalf("sick.test call %d: %d, %v; want ErrBreakerOpen", i, code, err)
		}
	}
	if s, ok := breakerState(tr, "sick.test:80"); !ok || s != CircuitOpen {
		t.Errorf("sick.test: %v, %v; want open", s, ok)
	}
	if s, ok := breakerState(tr, "WELL.test:80"); !ok || s != CircuitClosed {
		t.Errorf("well.test: %v, %v; want closed", s, ok)
	}
	if _, ok := breakerState(tr, "other.test:80"); ok {
		t.Error("BreakerState of an unseen host: ok")
	}
	if got := logs.String(); !strings.Contains(got, "circuit breaker open") || !strings.Contains(got, "host=sick.test:80") ||
		strings.Contains(got, "well.test") {
		t.Errorf("log = %q, want one open transition for sick.test only", got)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

func TestBreakerDisabled(t *testing.T) {
	base := &opBase{}
	tr := mustNew(t, Config{Base: base, Upstreams: map[string]Policy{"off.test": {Breaker: Breaker{Disabled: true}}},
		Default: Policy{Breaker: Breaker{MinCalls: 1}}})
	for range 5 {
		if _, err := send(t, tr, t.Context(), "http://off.test/", "F"); err != nil {
			t.Fatalf("disabled breaker: %v", err)
		}
	}
	if _, ok := breakerState(tr, "off.test:80"); ok {
		t.Error("disabled breaker reports a state")
	}
}

func TestBreakerContract(t *testing.T) {
	runContract(t, func(base http.RoundTripper) http.RoundTripper {
		return testBreaker(t, mustNew(t, Config{}), Breaker{}, base)
	})
}

func TestBreakerTransportContract(t *testing.T) {
	runContract(t, func(base http.RoundTripper) http.RoundTripper {
		return mustNew(t, Config{Base: base, Default: Policy{Breaker: Breaker{MinCalls: 1000}}})
	})
}

// staticBase returns the same response every time, for benchmarks.
type staticBase struct{ resp *http.Response }

func (s *staticBase) RoundTrip(*http.Request) (*http.Response, error) { return s.resp, nil }

func BenchmarkBreaker(b *testing.B) {
	resp := &http.Response{StatusCode: 200, Body: http.NoBody}
	req, _ := http.NewRequest(http.MethodGet, "http://h.test/x", nil)
	tr := mustNew(b, Config{})
	b.Run("base", func(b *testing.B) {
		rt := &staticBase{resp}
		b.ReportAllocs()
		for b.Loop() {
			rt.RoundTrip(req)
		}
	})
	b.Run("gobreaker-alone", func(b *testing.B) {
		// The floor: gobreaker's Execute, which reads time.Now twice.
		cb := gobreaker.NewCircuitBreaker[struct{}](gobreaker.Settings{Interval: time.Minute, BucketPeriod: 6 * time.Second})
		b.ReportAllocs()
		for b.Loop() {
			if _, err := cb.Execute(func() (struct{}, error) { return struct{}{}, nil }); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("time.Now", func(b *testing.B) {
		for b.Loop() {
			tr.now()
		}
	})
	b.Run("closed", func(b *testing.B) {
		rt := testBreaker(b, tr, Breaker{}, &staticBase{resp})
		b.ReportAllocs()
		for b.Loop() {
			rt.RoundTrip(req)
		}
	})
	b.Run("open", func(b *testing.B) {
		rt := testBreaker(b, tr, Breaker{MinCalls: 1}, &staticBase{&http.Response{StatusCode: 503, Body: http.NoBody}})
		rt.RoundTrip(req)
		if rt.state() != CircuitOpen {
			b.Fatal("breaker not open")
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := rt.RoundTrip(req); err == nil {
				b.Fatal("open breaker let a request through")
			}
		}
	})
	b.Run("closed-parallel", func(b *testing.B) {
		rt := testBreaker(b, tr, Breaker{}, &staticBase{resp})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				rt.RoundTrip(req)
			}
		})
	})
}

// panicBase panics on every call, as a buggy base might.
type panicBase struct{}

func (panicBase) RoundTrip(*http.Request) (*http.Response, error) { panic("base exploded") }

// TestBreakerPanicIsFailure: a panic below the breaker goes on up, and the
// breaker counts it as a failure, so a half-open probe that panics reopens
// the circuit instead of keeping its probe slot for good.
func TestBreakerPanicIsFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const openFor = 10 * time.Second
		var sw switchRT
		sw.set(&opBase{})
		tr := mustNew(t, Config{})
		b := testBreaker(t, tr, Breaker{MinCalls: 1, OpenFor: openFor, HalfOpenCalls: 1}, &sw)
		trip(t, b)
		time.Sleep(openFor + time.Millisecond)
		if s := b.state(); s != CircuitHalfOpen {
			t.Fatalf("after OpenFor: state %v, want half-open", s)
		}
		sw.set(panicBase{})
		func() {
			defer func() {
				if r := recover(); r != "base exploded" {
					t.Errorf("recovered %v, want the base's panic", r)
				}
			}()
			_, _ = send(t, b, t.Context(), "http://h.test/p", "S")
		}()
		if s := b.state(); s != CircuitOpen {
			t.Errorf("after a panicking probe: state %v, want open", s)
		}

		// Closed: the panic is a failed call in the window (one of one).
		c := testBreaker(t, tr, Breaker{MinCalls: 1}, panicBase{})
		func() {
			defer func() { _ = recover() }()
			_, _ = send(t, c, t.Context(), "http://h.test/p", "S")
		}()
		if s := c.state(); s != CircuitOpen {
			t.Errorf("closed, after one panicking call of MinCalls 1: state %v, want open", s)
		}
	})
}

// switchRT forwards to a RoundTripper that a test can replace.
type switchRT struct {
	rt atomic.Pointer[http.RoundTripper]
}

func (s *switchRT) set(rt http.RoundTripper) { s.rt.Store(&rt) }

func (s *switchRT) RoundTrip(req *http.Request) (*http.Response, error) {
	return (*s.rt.Load()).RoundTrip(req)
}
