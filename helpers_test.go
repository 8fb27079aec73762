package bulwark

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// stageRT serves a stage as an http.RoundTripper, as the start of a call:
// for tests that drive a stack below the router.
type stageRT struct{ s stage }

func (r stageRT) RoundTrip(req *http.Request) (*http.Response, error) {
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
