package bulwark

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"pgregory.net/rapid"
)

// layerRT serves a layer as an http.RoundTripper, as the start of a call:
// for tests that drive a stack below the router.
type layerRT struct{ s layer }

func (r layerRT) RoundTrip(req *http.Request) (*http.Response, error) {
	return r.s.roundTrip(req, call{start: time.Now()})
}

// only returns p with every layer off but the ones named ("timeout",
// "retry", "pushback", "breaker", "bulkhead"), for tests of one layer built
// by the real builder. Fallback and Endpoints are on only when p sets them.
func only(p Policy, layers ...string) Policy {
	keep := map[string]bool{}
	for _, l := range layers {
		keep[l] = true
	}
	p.Timeout.Disabled = !keep["timeout"]
	p.Retry.Disabled = !keep["retry"]
	p.Retry.NoPushback = !keep["pushback"]
	p.Breaker.Disabled = !keep["breaker"]
	p.Bulkhead.Disabled = !keep["bulkhead"]
	return p
}

// layerOf returns the layer of type T in the stack of the host of rawURL,
// creating the host's state if needed; it fails the test if there is none.
func layerOf[T any](t testing.TB, tr *Transport, rawURL string) T {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range tr.lookup(u).parts {
		if l, ok := p.(T); ok {
			return l
		}
	}
	var zero T
	t.Fatalf("no %T in the stack of %s", zero, rawURL)
	return zero
}

// breakerState is the state of host's breaker ("host:port"), the least
// healthy over its schemes; ok is false when it has no live breaker.
func breakerState(tr *Transport, host string) (state CircuitState, ok bool) {
	for _, h := range tr.Snapshot().Host(host) {
		if h.Breaker != nil {
			state, ok = max(state, h.Breaker.State), true
		}
	}
	return state, ok
}

// bulkheadStats sums the slots held and requests queued at host's
// bulkheads ("host:port"); ok is false when it has none.
func bulkheadStats(tr *Transport, host string) (inFlight, queued int, ok bool) {
	for _, h := range tr.Snapshot().Host(host) {
		for _, b := range h.bulkheads() {
			inFlight, queued, ok = inFlight+b.InFlight, queued+b.Queued, true
		}
	}
	return inFlight, queued, ok
}

// endpointStates is the instances of the balanced host ("host:port").
func endpointStates(tr *Transport, host string) []EndpointState {
	var out []EndpointState
	for _, h := range tr.Snapshot().Host(strings.ToLower(host)) {
		out = append(out, h.Endpoints...)
	}
	return out
}

// mustNew is New that fails the test on a config error.
func mustNew(t testing.TB, cfg Config) *Transport {
	t.Helper()
	tr, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// fakeClock is the clock of a test that runs in a testing/synctest bubble:
// bulwark and gobreaker read time.Now, which the bubble fakes, so advancing
// the clock is sleeping, which in a bubble returns as soon as every other
// goroutine of the bubble is blocked. Outside a bubble it would really
// sleep: use it only inside synctest.Test.
type fakeClock struct{}

func newFakeClock() *fakeClock { return &fakeClock{} }

func (*fakeClock) now() time.Time { return time.Now() }

func (*fakeClock) advance(d time.Duration) { time.Sleep(d) }

// countedUpstream is an httptest server that counts its open connections,
// so a test can check that a call left none behind. (The fault tests in
// faults/ have a fuller one that also records each request.)
type countedUpstream struct {
	srv  *httptest.Server
	open atomic.Int64
}

func newCountedUpstream(t *testing.T, h http.HandlerFunc) *countedUpstream {
	t.Helper()
	u := &countedUpstream{}
	u.srv = httptest.NewUnstartedServer(h)
	u.srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			u.open.Add(1)
		case http.StateClosed, http.StateHijacked:
			u.open.Add(-1)
		}
	}
	u.srv.Start()
	t.Cleanup(u.srv.Close)
	return u
}

// statusBase answers each attempt with the next status of its script (the
// last one repeats), counting what it was sent.
type statusBase struct {
	mu     sync.Mutex
	codes  []int
	header http.Header // added to every response
	reqs   []*http.Request
	closed int // response bodies closed
}

func (b *statusBase) RoundTrip(req *http.Request) (*http.Response, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	i := min(len(b.reqs), len(b.codes)-1)
	b.reqs = append(b.reqs, req)
	h := http.Header{}
	for k, v := range b.header {
		h[k] = v
	}
	return &http.Response{StatusCode: b.codes[i], Header: h, Request: req,
		Body: &closeCountBody{Reader: strings.NewReader("body"), closed: &b.closed, mu: &b.mu}}, nil
}

func (b *statusBase) sent() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.reqs)
}

type closeCountBody struct {
	io.Reader
	mu     *sync.Mutex
	closed *int
}

func (c *closeCountBody) Close() error {
	c.mu.Lock()
	*c.closed++
	c.mu.Unlock()
	return nil
}

func sendOnce(t *testing.T, rt http.RoundTripper, method, url string) (int, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// testBreaker builds, with the real builder, a Transport whose one layer is
// a breaker configured by b, over next.
func testBreaker(t testing.TB, b Breaker, next http.RoundTripper) *Transport {
	t.Helper()
	return mustNew(t, Config{Base: next, Default: only(Policy{Breaker: b}, "breaker")})
}

// breakerReq makes a GET of url carrying op for opBase.
func breakerReq(t testing.TB, ctx context.Context, url, op string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Op", op)
	return req
}

// do sends req through rt, reading and closing any response. It never stops
// the test, so any goroutine may call it.
func do(rt http.RoundTripper, req *http.Request) (int, error) {
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// send makes one call with op through rt, closing any response.
func send(t testing.TB, rt http.RoundTripper, ctx context.Context, url, op string) (int, error) {
	t.Helper()
	return do(rt, breakerReq(t, ctx, url, op))
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

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// staticBase returns the same response every time, for benchmarks.
type staticBase struct{ resp *http.Response }

func (s *staticBase) RoundTrip(*http.Request) (*http.Response, error) { return s.resp, nil }

// sent is what a scripted base saw of one attempt.
type sent struct {
	host, method, body string
	attempt, key       string
}

// scriptBase answers each attempt with the outcome its step function gives
// for that attempt's number (from 1), recording what was sent.
type scriptBase struct {
	mu   sync.Mutex
	sent []sent
	step func(n int, req *http.Request) (*http.Response, error)
}

func (s *scriptBase) RoundTrip(req *http.Request) (*http.Response, error) {
	var b []byte
	if req.Body != nil {
		b, _ = io.ReadAll(req.Body)
		req.Body.Close()
	}
	s.mu.Lock()
	s.sent = append(s.sent, sent{host: req.URL.Host, method: req.Method, body: string(b),
		attempt: req.Header.Get(AttemptHeader), key: req.Header.Get(IdempotencyKeyHeader)})
	n := len(s.sent)
	s.mu.Unlock()
	return s.step(n, req)
}

func (s *scriptBase) calls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sent)
}

func (s *scriptBase) all() []sent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sent(nil), s.sent...)
}

// response builds a response with the given status, headers (name, value
// pairs) and a small body.
func response(req *http.Request, status int, kv ...string) *http.Response {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	body := fmt.Sprintf("status %d", status)
	return &http.Response{
		StatusCode: status, Status: http.StatusText(status), Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Body: io.NopCloser(strings.NewReader(body)), ContentLength: int64(len(body)), Request: req,
	}
}

func always(status int, kv ...string) func(int, *http.Request) (*http.Response, error) {
	return func(_ int, req *http.Request) (*http.Response, error) { return response(req, status, kv...), nil }
}

var (
	errReset = &net.OpError{Op: "read", Net: "tcp", Err: &os_SyscallError{"read", syscall.ECONNRESET}}
	// What the attempt layer returns when an attempt runs past Timeout.Attempt.
	errAttemptTO = &timeoutError{limit: ErrAttemptTimeout, cause: context.DeadlineExceeded}
)

// os_SyscallError mirrors *os.SyscallError without importing os for one type.
type os_SyscallError struct {
	Syscall string
	Err     error
}

func (e *os_SyscallError) Error() string { return e.Syscall + ": " + e.Err.Error() }

func (e *os_SyscallError) Unwrap() error { return e.Err }

// newTestTransport builds a Transport over base with a random source that
// always picks the top of the range, and records the waits before retries
// (through Retry.OnRetry, chained to p's own). Call it inside a
// testing/synctest bubble, where the waits take no real time: the fake
// clock it returns is the bubble's.
func newTestTransport(t testing.TB, base http.RoundTripper, p Policy) (*Transport, *fakeClock, *[]time.Duration) {
	t.Helper()
	if reflect.ValueOf(p.Breaker).IsZero() {
		// These tests are about the retry layer: a breaker opening under
		// their sustained failures would hide what retry does.
		p.Breaker.Disabled = true
	}
	var mu sync.Mutex
	waits := new([]time.Duration)
	user := p.Retry.OnRetry
	p.Retry.OnRetry = func(req *http.Request, ev RetryEvent) {
		mu.Lock()
		*waits = append(*waits, ev.Wait)
		mu.Unlock()
		if user != nil {
			user(req, ev)
		}
	}
	tr, err := New(Config{Base: base, Default: p})
	if err != nil {
		t.Fatal(err)
	}
	tr.randN = func(n int64) int64 { return n - 1 }
	return tr, newFakeClock(), waits
}

type bodyKind int

const (
	noBody bodyKind = iota
	replayableBody
	oneShotBody
)

func testRequest(t testing.TB, ctx context.Context, method, url string, kind bodyKind, body string, kv ...string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		req.Header.Set(kv[i], kv[i+1])
	}
	switch kind {
	case replayableBody:
		req.Body = io.NopCloser(strings.NewReader(body))
		req.ContentLength = int64(len(body))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(body)), nil }
	case oneShotBody:
		// No GetBody and no length: what a streamed body looks like.
		req.Body = io.NopCloser(strings.NewReader(body))
	}
	return req
}

// noWait is a Backoff of no wait, for the tests that cannot run in a
// synctest bubble (a real server, or t.Run) and would otherwise sleep.
func noWait(time.Duration, time.Duration, int, *http.Response) time.Duration { return 0 }

// stubBase is a base RoundTripper that answers like http.Transport would,
// without a network: it reads and closes the request body, then responds.
type stubBase struct {
	status int
	err    error
	// block waits for the request context to end before answering.
	block bool
	calls atomic.Int64
}

func (s *stubBase) RoundTrip(req *http.Request) (*http.Response, error) {
	s.calls.Add(1)
	if req.Body != nil {
		_, _ = io.Copy(io.Discard, req.Body)
		req.Body.Close()
	}
	if s.block {
		<-req.Context().Done()
		return nil, req.Context().Err()
	}
	if s.err != nil {
		return nil, s.err
	}
	status := s.status
	if status == 0 {
		status = http.StatusOK
	}
	return &http.Response{
		StatusCode: status, Status: http.StatusText(status), Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{}, Body: io.NopCloser(bytes.NewReader([]byte("hello"))), ContentLength: 5, Request: req,
	}, nil
}

var errStub = errors.New("stub: connection refused")

// Outcomes the scripted upstream can give one attempt.
const (
	outOK = iota
	out503
	out429
	outReset
	outHang
	numOutcomes
)

// propBase answers each call's attempts from its script, keyed by X-Call,
// and records what every attempt carried.
type propBase struct {
	mu      sync.Mutex
	scripts map[string][]int
	got     map[string][]sent
}

func (b *propBase) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		body, _ = io.ReadAll(req.Body)
		req.Body.Close()
	}
	id := req.Header.Get("X-Call")
	b.mu.Lock()
	n := len(b.got[id])
	b.got[id] = append(b.got[id], sent{body: string(body), key: req.Header.Get(IdempotencyKeyHeader)})
	sc := b.scripts[id]
	b.mu.Unlock()
	switch sc[min(n, len(sc)-1)] {
	case out503:
		return response(req, 503), nil
	case out429:
		return response(req, 429, "Retry-After", "1"), nil
	case outReset:
		return nil, errReset
	case outHang:
		<-req.Context().Done()
		return nil, req.Context().Err()
	}
	return response(req, 200), nil
}

// propFailure keeps the first failure seen inside a synctest bubble, where
// rapid's T cannot be used (rapid asks for the test's deadline, which a
// bubble refuses): the property reports it once the bubble is over, so
// rapid can still shrink the schedule.
type propFailure struct {
	mu  sync.Mutex
	msg string
}

func (f *propFailure) Fatalf(format string, args ...any) {
	f.mu.Lock()
	if f.msg == "" {
		f.msg = fmt.Sprintf(format, args...)
	}
	f.mu.Unlock()
}

func (f *propFailure) report(rt *rapid.T) {
	if f.msg != "" {
		rt.Fatal(f.msg)
	}
}

// benchBase is the cheapest honest base: a fixed response, body included,
// like a transport that answers from memory.
type benchBase struct{}

func (benchBase) RoundTrip(req *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok")), Request: req}, nil
}

func benchRoundTrips(b *testing.B, rt http.RoundTripper, url string) {
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set("Accept", "application/json")
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := rt.RoundTrip(req)
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	})
}

// memNet is an in-memory network: listeners by address, connections over
// net.Pipe. httptest servers on it can run in a testing/synctest bubble,
// where a goroutine waiting on a real socket (an idle connection, an
// Accept) is not durably blocked and would keep the fake clock from ever
// moving; on memNet every such wait is on a channel of the bubble.
type memNet struct {
	mu sync.Mutex
	ls map[string]*memListener
}

func newMemNet() *memNet { return &memNet{ls: map[string]*memListener{}} }

// memListener is a net.Listener of a memNet.
type memListener struct {
	addr   memAddr
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

type memAddr string

func (a memAddr) Network() string { return "tcp" }

func (a memAddr) String() string { return string(a) }

func (l *memListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *memListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *memListener) Addr() net.Addr { return l.addr }

// listen makes the listener for addr ("host:port").
func (n *memNet) listen(addr string) *memListener {
	l := &memListener{addr: memAddr(addr), conns: make(chan net.Conn), closed: make(chan struct{})}
	n.mu.Lock()
	n.ls[addr] = l
	n.mu.Unlock()
	return l
}

// dial connects to the listener at addr, as a DialContext.
func (n *memNet) dial(ctx context.Context, _, addr string) (net.Conn, error) {
	n.mu.Lock()
	l := n.ls[addr]
	n.mu.Unlock()
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("memnet: connection refused")}
	if l == nil {
		return nil, refused
	}
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.closed:
		return nil, refused
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// transport is an *http.Transport (so the balancer clones one per
// instance) whose connections go over n.
func (n *memNet) transport() *http.Transport { return &http.Transport{DialContext: n.dial} }

// fleet is a set of instances of one logical upstream: httptest servers on
// a memNet.
type fleet struct {
	net       *memNet
	srvs      []*httptest.Server
	addrs     []string
	hits      []atomic.Int64 // requests served, per instance
	conns     []atomic.Int64 // connections accepted, per instance
	wrongHost atomic.Int64   // requests whose Host was not the logical name
	mu        sync.Mutex
	calls     map[string][]int // X-Call → instances that served it, in order
	last      []time.Time      // when each instance last served, on the test's clock
}

// newFleet starts n instances; status(i) is what instance i answers. Base
// a Transport on f.transport() to reach them.
func newFleet(t *testing.T, n int, logical string, status func(i int) int) *fleet {
	t.Helper()
	f := &fleet{net: newMemNet(), hits: make([]atomic.Int64, n), conns: make([]atomic.Int64, n),
		calls: map[string][]int{}, last: make([]time.Time, n)}
	for i := 0; i < n; i++ {
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			f.hits[i].Add(1)
			if r.Host != logical {
				f.wrongHost.Add(1)
			}
			f.mu.Lock()
			f.last[i] = time.Now()
			if c := r.Header.Get("X-Call"); c != "" {
				f.calls[c] = append(f.calls[c], i)
			}
			f.mu.Unlock()
			w.WriteHeader(status(i))
			io.WriteString(w, "ok")
		}))
		srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				f.conns[i].Add(1)
			}
		}
		addr := fmt.Sprintf("10.9.0.%d:8080", i+1)
		srv.Listener = f.net.listen(addr)
		srv.Start()
		t.Cleanup(srv.Close)
		f.srvs = append(f.srvs, srv)
		f.addrs = append(f.addrs, addr)
	}
	return f
}

// transport is a base that reaches the fleet's instances.
func (f *fleet) transport() *http.Transport { return f.net.transport() }

// lastServed is when instance i last served a request.
func (f *fleet) lastServed(i int) time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last[i]
}

func stateOf(t *testing.T, tr *Transport, addr string) EndpointState {
	t.Helper()
	for _, s := range endpointStates(tr, "tax.internal:80") {
		if s.Addr == addr {
			return s
		}
	}
	t.Fatalf("EndpointStates has no %s", addr)
	return EndpointState{}
}

func wantStats(t testing.TB, tr *Transport, host string, inFlight, queued int) {
	t.Helper()
	f, q, ok := bulkheadStats(tr, host)
	if !ok || f != inFlight || q != queued {
		t.Fatalf("BulkheadStats(%q) = %d, %d, %v; want %d, %d, true", host, f, q, ok, inFlight, queued)
	}
}

// wrappedBenchBase answers at once with a fresh response, as cheaply as a base
// can. It puts the shared body wrapper on, as the attempt-deadline layer
// below the bulkhead does in the real stack, so that the admitted path's
// cost over it is the bulkhead's alone.
type wrappedBenchBase struct{}

type noopEnder struct{}

func (noopEnder) bodyEnd() {}

var benchBody = io.NopCloser(bytes.NewReader(nil))

func (wrappedBenchBase) RoundTrip(req *http.Request) (*http.Response, error) {
	resp := &http.Response{StatusCode: 200, Body: benchBody, Request: req}
	onBodyEnd(resp, noopEnder{})
	return resp, nil
}

// The tests in this file never set otel's global providers in this
// process: several of them rely on the globals still being the
// placeholders. TestGlobalProvidersSetAfterNew sets them in a child process.

// otelKit is an SDK tracer and meter that keep everything in memory.
type otelKit struct {
	sr     *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
	mp     *sdkmetric.MeterProvider
}

func newOtelKit(t testing.TB) *otelKit {
	k := &otelKit{sr: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	k.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(k.sr))
	k.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(k.reader))
	t.Cleanup(func() {
		_ = k.tp.Shutdown(context.Background())
		_ = k.mp.Shutdown(context.Background())
	})
	return k
}

func (k *otelKit) config(base http.RoundTripper) Config {
	// The retry layer and breaker are off, so that each span is accounted
	// for: a test that wants a second attempt turns the real retry layer on
	// with retryOnce.
	return Config{Base: base, TracerProvider: k.tp, MeterProvider: k.mp, Propagator: propagation.TraceContext{},
		Default: Policy{Retry: Retry{Disabled: true, NoPushback: true}, Breaker: Breaker{Disabled: true}}}
}

// caller starts the span the application would have around its call.
func (k *otelKit) caller(ctx context.Context) (context.Context, trace.Span) {
	return k.tp.Tracer("app").Start(ctx, "caller")
}

func (k *otelKit) collect(t *testing.T) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := k.reader.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	return rm
}

func findMetric(rm metricdata.ResourceMetrics, name string) *metricdata.Metrics {
	for _, sm := range rm.ScopeMetrics {
		for i := range sm.Metrics {
			if sm.Metrics[i].Name == name {
				return &sm.Metrics[i]
			}
		}
	}
	return nil
}

// counter returns the value of counter name at exactly the attributes kv.
func counter(t *testing.T, rm metricdata.ResourceMetrics, name string, kv ...attribute.KeyValue) int64 {
	t.Helper()
	m := findMetric(rm, name)
	if m == nil {
		return 0
	}
	want := attribute.NewSet(kv...)
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		if dp.Attributes.Equals(&want) {
			return dp.Value
		}
	}
	return 0
}

func attr(s sdktrace.ReadOnlySpan, key attribute.Key) (attribute.Value, bool) {
	for _, kv := range s.Attributes() {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

func wantAttr(t *testing.T, s sdktrace.ReadOnlySpan, key attribute.Key, want any) {
	t.Helper()
	v, ok := attr(s, key)
	if !ok {
		t.Errorf("span %q: no attribute %s, want %v", s.Name(), key, want)
		return
	}
	if got := v.AsInterface(); got != want {
		t.Errorf("span %q: %s = %v (%T), want %v (%T)", s.Name(), key, got, got, want, want)
	}
}

func spansNamed(sr *tracetest.SpanRecorder, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// The tests below run every layer (retry, pushback, breaker, bulkhead,
// fallback) as it comes, where otelKit.config turns the retry layer and
// the breaker off.

// realConfig is k.config with the given policy as Default, every layer as
// it comes.
func (k *otelKit) realConfig(base http.RoundTripper, p Policy) Config {
	cfg := k.config(base)
	cfg.Default = p
	return cfg
}

// headerBase answers every request with status and header, counting the
// requests and when each arrived.
type headerBase struct {
	status int
	header http.Header
	calls  atomic.Int64
	mu     chan struct{} // nil: times not kept
	times  []time.Time
}

func (b *headerBase) RoundTrip(req *http.Request) (*http.Response, error) {
	closeBody(req)
	b.calls.Add(1)
	if b.mu != nil {
		b.mu <- struct{}{}
		b.times = append(b.times, time.Now())
		<-b.mu
	}
	return &http.Response{StatusCode: b.status, Header: b.header.Clone(), Body: io.NopCloser(strings.NewReader("x")), Request: req}, nil
}

// okBase answers every attempt 200 at once.
type okBase struct{}

func (okBase) RoundTrip(req *http.Request) (*http.Response, error) {
	return response(req, http.StatusOK), nil
}

// memHub is an in-memory store two Transports (two pods) share: what one
// publishes is kept and handed to every receiving sink.
type memHub struct {
	mu    sync.Mutex
	sinks []hubSink
	state []FleetUpdate
}

type hubSink struct {
	owner *memFleet
	s     *FleetSink
}

// memFleet is one pod's Fleet over a memHub. down makes every call fail;
// stuck makes Publish wait for its context.
type memFleet struct {
	hub         *memHub
	down, stuck bool
}

func (f *memFleet) Publish(ctx context.Context, u FleetUpdate) error {
	if f.stuck {
		<-ctx.Done()
		return ctx.Err()
	}
	if f.down {
		return errors.New("store down")
	}
	u.From = fmt.Sprintf("%p", f)
	f.hub.mu.Lock()
	defer f.hub.mu.Unlock()
	if u.Kind != FleetBreakerCounts {
		f.hub.state = append(f.hub.state, u)
	}
	for _, s := range f.hub.sinks {
		if s.owner != f { // a pod's own counts must not come back
			s.s.Apply(u)
		}
	}
	return nil
}

func (f *memFleet) Receive(ctx context.Context, s *FleetSink) error {
	if f.down {
		return errors.New("store down")
	}
	f.hub.mu.Lock()
	for _, u := range f.hub.state {
		s.Apply(u)
	}
	f.hub.sinks = append(f.hub.sinks, hubSink{f, s})
	f.hub.mu.Unlock()
	s.Connected()
	<-ctx.Done()
	f.hub.mu.Lock()
	f.hub.sinks = slices.DeleteFunc(f.hub.sinks, func(x hubSink) bool { return x.s == s })
	f.hub.mu.Unlock()
	return ctx.Err()
}

// closeFlag is a response body that records being closed.
type closeFlag struct {
	io.Reader
	closed atomic.Bool
}

func (c *closeFlag) Close() error { c.closed.Store(true); return nil }
