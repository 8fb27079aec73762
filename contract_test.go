package bulwark

// The RoundTripper contract every layer keeps, as one reusable check.
// A layer's tests call runContract with a function that builds the layer
// over a given base, and checkContract for each rejection path of their own.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"pgregory.net/rapid"
)

// trackedBody is a request body that records whether it was closed.
type trackedBody struct {
	r      io.Reader
	closed atomic.Int32
}

func (b *trackedBody) Read(p []byte) (int, error) { return b.r.Read(p) }
func (b *trackedBody) Close() error {
	b.closed.Add(1)
	return nil
}

// bodies tracks every body a request hands out, the first and those
// GetBody makes for replays, so a test can insist all of them are closed.
type bodies struct {
	mu  sync.Mutex
	all []*trackedBody
}

func (bs *bodies) make(s string) *trackedBody {
	b := &trackedBody{r: strings.NewReader(s)}
	bs.mu.Lock()
	bs.all = append(bs.all, b)
	bs.mu.Unlock()
	return b
}

func (bs *bodies) allClosed() bool {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	for _, b := range bs.all {
		if b.closed.Load() == 0 {
			return false
		}
	}
	return true
}

// contractRequest is one kind of request the contract is checked with.
type contractRequest struct {
	name   string
	method string
	body   string
	// replayable gives the request a GetBody.
	replayable bool
}

var contractRequests = []contractRequest{
	{name: "GET", method: http.MethodGet},
	{name: "POST replayable", method: http.MethodPost, body: "payload", replayable: true},
	{name: "POST one-shot", method: http.MethodPost, body: "payload"},
	{name: "PUT replayable", method: http.MethodPut, body: "payload", replayable: true},
}

// newContractRequest builds a request to url with a tracked body.
func newContractRequest(t testing.TB, ctx context.Context, url string, cr contractRequest, bs *bodies) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, cr.method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Contract", "1")
	if cr.body != "" {
		req.Body = bs.make(cr.body)
		req.ContentLength = int64(len(cr.body))
		if cr.replayable {
			body := cr.body
			req.GetBody = func() (io.ReadCloser, error) { return bs.make(body), nil }
		}
	}
	return req
}

// requestSnapshot is what the contract says a RoundTripper must leave as it
// found it.
type requestSnapshot struct {
	method, url   string
	header        http.Header
	body          io.ReadCloser
	hasGetBody    bool
	contentLength int64
	ctx           context.Context
	host          string
}

func snapshot(req *http.Request) requestSnapshot {
	return requestSnapshot{
		method: req.Method, url: req.URL.String(), header: req.Header.Clone(),
		body: req.Body, hasGetBody: req.GetBody != nil, contentLength: req.ContentLength,
		ctx: req.Context(), host: req.Host,
	}
}

func (s requestSnapshot) diff(req *http.Request) string {
	switch {
	case req.Method != s.method:
		return "Method changed to " + req.Method
	case req.URL.String() != s.url:
		return "URL changed to " + req.URL.String()
	case !reflect.DeepEqual(req.Header, s.header):
		return "Header changed"
	case req.Body != s.body:
		return "Body replaced"
	case (req.GetBody != nil) != s.hasGetBody:
		return "GetBody changed"
	case req.ContentLength != s.contentLength:
		return "ContentLength changed"
	case req.Context() != s.ctx:
		return "context replaced"
	case req.Host != s.host:
		return "Host changed"
	}
	return ""
}

// checkContract sends req through rt and checks the RoundTripper contract:
// the request is unchanged, every body it handed out was closed, the result
// is a response or an error but never both nor neither, and a response's
// body can be read and closed after RoundTrip returns. It returns the
// response body read (or the error) for the caller's own assertions. It
// reports with t.Errorf and returns early where it cannot go on, never
// t.Fatal, so it may run on any goroutine.
func checkContract(t testing.TB, rt http.RoundTripper, req *http.Request, bs *bodies) (status int, respBody string, err error) {
	t.Helper()
	snap := snapshot(req)
	resp, err := rt.RoundTrip(req)
	if d := snap.diff(req); d != "" {
		t.Errorf("%s %s: caller's request modified: %s", req.Method, req.URL, d)
	}
	switch {
	case resp == nil && err == nil:
		t.Errorf("%s %s: RoundTrip returned (nil, nil)", req.Method, req.URL)
		return 0, "", nil
	case resp != nil && err != nil:
		t.Errorf("%s %s: RoundTrip returned a response with error %v", req.Method, req.URL, err)
		resp.Body.Close()
	}
	if resp != nil {
		if resp.Body == nil {
			t.Errorf("%s %s: response with nil Body", req.Method, req.URL)
			return resp.StatusCode, "", err
		}
		b, rerr := io.ReadAll(resp.Body)
		if rerr != nil {
			t.Errorf("%s %s: reading body after RoundTrip: %v", req.Method, req.URL, rerr)
		}
		if cerr := resp.Body.Close(); cerr != nil {
			t.Errorf("%s %s: closing body: %v", req.Method, req.URL, cerr)
		}
		status, respBody = resp.StatusCode, string(b)
	}
	if bs != nil && !bs.allClosed() {
		t.Errorf("%s %s: a request body was left open (err=%v)", req.Method, req.URL, err)
	}
	return status, respBody, err
}

// runContract checks build's RoundTripper over a set of bases (success,
// error, 503, a base that only returns when the context ends, with a
// cancelled context) with every kind of contract request, then hammers one
// instance from several goroutines for the race detector. build runs on the
// goroutine of runContract's caller, never in a subtest, so it may stop
// the test with t.Fatal (as mustNew does) on the t it closes over.
func runContract(t *testing.T, build func(base http.RoundTripper) http.RoundTripper) {
	t.Helper()
	bases := []struct {
		name   string
		base   func() *stubBase
		cancel bool
	}{
		{"ok", func() *stubBase { return &stubBase{} }, false},
		{"error", func() *stubBase { return &stubBase{err: errStub} }, false},
		{"503", func() *stubBase { return &stubBase{status: 503} }, false},
		{"cancelled", func() *stubBase { return &stubBase{block: true} }, true},
	}
	// Every RoundTripper is built here, before the subtests that use it.
	type contractCase struct {
		name   string
		cr     contractRequest
		cancel bool
		rt     http.RoundTripper
	}
	var cases []contractCase
	for _, b := range bases {
		for _, cr := range contractRequests {
			cases = append(cases, contractCase{b.name + "/" + cr.name, cr, b.cancel, build(b.base())})
		}
	}
	concurrent := build(&stubBase{})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			if c.cancel {
				cancel()
			}
			var bs bodies
			req := newContractRequest(t, ctx, "http://contract.test/x?q=1", c.cr, &bs)
			status, got, err := checkContract(t, c.rt, req, &bs)
			if err == nil && got != "hello" {
				t.Errorf("body = %q (status %d), want %q", got, status, "hello")
			}
			if c.cancel && !errors.Is(err, context.Canceled) {
				t.Errorf("cancelled context: err = %v, want one wrapping context.Canceled", err)
			}
		})
	}
	t.Run("concurrent", func(t *testing.T) {
		rt := concurrent
		// The requests are built here, where newContractRequest may stop the
		// test; the workers only report, and each stops at the first
		// failure any of them saw.
		// (contractCall, not call: that is the layers' call state.)
		type contractCall struct {
			req *http.Request
			bs  *bodies
		}
		var calls [8][50]contractCall
		for g := range calls {
			for i := range calls[g] {
				bs := new(bodies)
				cr := contractRequests[i%len(contractRequests)]
				calls[g][i] = contractCall{newContractRequest(t, t.Context(), "http://contract.test/c", cr, bs), bs}
			}
		}
		var wg sync.WaitGroup
		for g := range calls {
			wg.Go(func() {
				for _, c := range calls[g] {
					if t.Failed() {
						return
					}
					checkContract(t, rt, c.req, c.bs)
				}
			})
		}
		wg.Wait()
	})
}

// Properties over random schedules of faults, methods, bodies, keys,
// cancellations and deadlines, checked with pgregory.net/rapid inside a
// testing/synctest bubble: time is virtual, so "returns by its deadline"
// is checked exactly, and a hanging upstream costs no real time.

// propCall is one drawn call.
type propCall struct {
	method   string
	body     bodyKind
	key      string
	cancel   time.Duration // zero: never cancelled
	deadline time.Duration // zero: no caller deadline
	script   []int         // outcome per attempt; the last repeats
}

func drawPropCall(t *rapid.T, i int) propCall {
	c := propCall{
		method: rapid.SampledFrom([]string{"GET", "POST", "PUT", "DELETE"}).Draw(t, "method"),
		body:   bodyKind(rapid.IntRange(0, 2).Draw(t, "body")),
		script: rapid.SliceOfN(rapid.IntRange(0, numOutcomes-1), 1, 4).Draw(t, "script"),
	}
	if rapid.Bool().Draw(t, "keyed") {
		c.key = fmt.Sprintf("key-%d", i)
	}
	if rapid.Bool().Draw(t, "cancels") {
		c.cancel = time.Duration(rapid.IntRange(1, 400).Draw(t, "cancelMs")) * time.Millisecond
	}
	if rapid.Bool().Draw(t, "deadlined") {
		c.deadline = time.Duration(rapid.IntRange(1, 800).Draw(t, "deadlineMs")) * time.Millisecond
	}
	return c
}

func drawPropPolicy(t *rapid.T) Policy {
	total := time.Duration(rapid.IntRange(20, 1000).Draw(t, "totalMs")) * time.Millisecond
	return Policy{
		Timeout: Timeout{Total: total, Attempt: time.Duration(rapid.Int64Range(int64(10*time.Millisecond), int64(total)).Draw(t, "attempt"))},
		Retry: Retry{
			MaxAttempts:   rapid.IntRange(1, 4).Draw(t, "maxAttempts"),
			Base:          time.Duration(rapid.IntRange(1, 50).Draw(t, "baseMs")) * time.Millisecond,
			Cap:           100 * time.Millisecond,
			MaxRetryAfter: time.Duration(rapid.IntRange(1, 300).Draw(t, "maxRAms")) * time.Millisecond,
			Jitter:        Jitter(rapid.IntRange(1, 4).Draw(t, "jitter")),
		},
		Bulkhead: Bulkhead{
			MaxConcurrent: rapid.IntRange(1, 4).Draw(t, "maxConcurrent"),
			MaxQueue:      rapid.IntRange(0, 2).Draw(t, "maxQueue"),
		},
		Breaker: Breaker{
			MinCalls:      rapid.IntRange(1, 5).Draw(t, "minCalls"),
			HalfOpenCalls: rapid.IntRange(1, 3).Draw(t, "halfOpen"),
			OpenFor:       time.Duration(rapid.IntRange(10, 200).Draw(t, "openForMs")) * time.Millisecond,
			Window:        time.Second,
		},
	}
}

// TestPropertyCalls: over random schedules, (1) a request that is not safe
// to replay reaches the upstream at most once; (2) every replay carries the
// caller's body byte for byte and its idempotency key; (3) the caller's
// request is never modified; (4) every call returns by the soonest of its
// deadline, its cancellation and Timeout.Total, exactly, on the virtual
// clock; (5) once every call is over, no bulkhead slot is held, nobody is
// queued and no half-open probe is outstanding.
func TestPropertyCalls(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		p := drawPropPolicy(rt)
		calls := make([]propCall, rapid.IntRange(1, 8).Draw(rt, "calls"))
		base := &propBase{scripts: map[string][]int{}, got: map[string][]sent{}}
		for i := range calls {
			calls[i] = drawPropCall(rt, i)
			base.scripts[fmt.Sprint(i)] = calls[i].script
		}
		var f propFailure
		defer f.report(rt)
		synctest.Test(t, func(t *testing.T) {
			rt := &f
			tr, err := New(Config{Base: base, Default: p})
			if err != nil {
				rt.Fatalf("%v", err)
				return
			}
			var wg sync.WaitGroup
			for i, c := range calls {
				wg.Go(func() { runPropCall(rt, tr, p, i, c, base) })
			}
			wg.Wait()
			// Bodies are closed; let any goroutine a layer started finish.
			synctest.Wait()
			for _, h := range tr.Snapshot().Hosts {
				for _, st := range h.bulkheads() {
					if st.InFlight != 0 || st.Queued != 0 {
						rt.Fatalf("bulkhead %s: %d in flight, %d queued after all calls", h.Host, st.InFlight, st.Queued)
					}
				}
			}
			tr.mu.RLock()
			for _, hs := range tr.hosts {
				for _, p := range hs.parts {
					if b, ok := p.(*breakerLayer); ok && b.state().State == CircuitHalfOpen {
						c := b.cb.Counts()
						if out := int64(c.Requests) - int64(c.TotalSuccesses+c.TotalFailures+c.TotalExclusions); out != 0 {
							rt.Fatalf("half-open breaker has %d probes outstanding after all calls", out)
						}
					}
				}
			}
			tr.mu.RUnlock()
		})
	})
}

func runPropCall(rt *propFailure, tr *Transport, p Policy, i int, c propCall, base *propBase) {
	const body = "the caller's body, byte for byte: \x00\xff"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	limit := p.Timeout.Total
	if c.deadline > 0 {
		var dcancel context.CancelFunc
		ctx, dcancel = context.WithTimeout(ctx, c.deadline)
		defer dcancel()
		limit = min(limit, c.deadline)
	}
	if c.cancel > 0 {
		tm := time.AfterFunc(c.cancel, cancel)
		defer tm.Stop()
		limit = min(limit, c.cancel)
	}
	req, err := http.NewRequestWithContext(ctx, c.method, fmt.Sprintf("http://prop%d.test/", i%2), nil)
	if err != nil {
		rt.Fatalf("%v", err)
		return
	}
	req.Header.Set("X-Call", fmt.Sprint(i))
	if c.key != "" {
		req.Header.Set(IdempotencyKeyHeader, c.key)
	}
	switch c.body {
	case replayableBody:
		req.Body = io.NopCloser(strings.NewReader(body))
		req.ContentLength = int64(len(body))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(body)), nil }
	case oneShotBody:
		req.Body = io.NopCloser(strings.NewReader(body))
	}
	snap := snapshot(req)
	start := time.Now()
	resp, err := tr.RoundTrip(req)
	if resp != nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	took := time.Since(start)
	if (resp == nil) == (err == nil) {
		rt.Fatalf("call %d: RoundTrip = %v, %v", i, resp, err)
	}
	if d := snap.diff(req); d != "" {
		rt.Fatalf("call %d: caller's request modified: %s", i, d)
	}
	if took > limit {
		rt.Fatalf("call %d returned after %v, past its limit %v (err %v)", i, took, limit, err)
	}
	base.mu.Lock()
	got := base.got[fmt.Sprint(i)]
	base.mu.Unlock()
	replayable := (idempotentMethod(c.method) || c.key != "") && c.body != oneShotBody
	if !replayable && len(got) > 1 {
		rt.Fatalf("call %d (%s, body %d, key %q) is not replayable but was sent %d times", i, c.method, c.body, c.key, len(got))
	}
	for n, s := range got {
		if c.body != noBody && s.body != body {
			rt.Fatalf("call %d attempt %d carried body %q", i, n+1, s.body)
		}
		if s.key != c.key {
			rt.Fatalf("call %d attempt %d carried key %q, want %q", i, n+1, s.key, c.key)
		}
	}
}
