package bench

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/failsafe-go/failsafe-go/bulkhead"
	"github.com/failsafe-go/failsafe-go/circuitbreaker"
	"github.com/failsafe-go/failsafe-go/failsafehttp"
	"github.com/sony/gobreaker/v2"
)

// stubBase is the pure-middleware base: a fresh small response from memory,
// as cheap as an honest transport can be.
type stubBase struct{ status int }

func (s stubBase) RoundTrip(req *http.Request) (*http.Response, error) {
	code := s.status
	if code == 0 {
		code = http.StatusOK
	}
	return &http.Response{StatusCode: code, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok")), Request: req}, nil
}

func roundTrips(b *testing.B, rt http.RoundTripper, url string, wantErr error) {
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
			if wantErr != nil {
				if !errors.Is(err, wantErr) {
					b.Fatalf("RoundTrip: %v, want %v", err, wantErr)
				}
				continue
			}
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	})
}

func all(b *testing.B, base http.RoundTripper) []Stack {
	peers, err := Peers(Defaults, base)
	if err != nil {
		b.Fatal(err)
	}
	layers, err := BulwarkLayers(Defaults, base)
	if err != nil {
		b.Fatal(err)
	}
	return append(peers, layers...)
}

// BenchmarkStub is each stack's pure middleware cost over a base that
// answers from memory.
func BenchmarkStub(b *testing.B) {
	for _, s := range all(b, stubBase{}) {
		b.Run(s.Name, func(b *testing.B) { roundTrips(b, s.RT, "http://stub.internal/x", nil) })
	}
}

// BenchmarkCtxBase is each stack's middleware cost over ctxBase, a base
// that answers from memory but derives and watches a context from the
// request's and reads every header, as net/http's Transport does: work a
// stack defers until the base looks is paid here. floor (Floor: an attempt
// context, a request clone, two headers) is the yardstick.
func BenchmarkCtxBase(b *testing.B) {
	stacks := all(b, ctxBase{})
	stacks = append([]Stack{stacks[0], {"floor", Floor(Defaults.Attempt, ctxBase{})}}, stacks[1:]...)
	for _, s := range stacks {
		b.Run(s.Name, func(b *testing.B) { roundTrips(b, s.RT, "http://stub.internal/x", nil) })
	}
}

// BenchmarkLoopback is a real HTTP exchange with an httptest server on
// 127.0.0.1 through each stack.
func BenchmarkLoopback(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer srv.Close()
	base := http.DefaultTransport.(*http.Transport).Clone()
	base.MaxIdleConnsPerHost = 64
	defer base.CloseIdleConnections()
	peers, err := Peers(Defaults, base)
	if err != nil {
		b.Fatal(err)
	}
	// Warm the shared connection pool first: otherwise the first stack
	// measured (bare) pays for dialing the connections every later stack
	// reuses, and looks slower than the stacks wrapped around it.
	for range 256 {
		resp, err := base.RoundTrip(httptestRequest(b, srv.URL))
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	for _, s := range peers {
		b.Run(s.Name, func(b *testing.B) { roundTrips(b, s.RT, srv.URL, nil) })
	}
}

// pairedBlock is how many requests BenchmarkLoopbackPaired sends through one
// stack before it switches to the other.
const pairedBlock = 64

// BenchmarkLoopbackPaired compares stacks with bare on loopback, each
// measured in one loop with bare: blocks of pairedBlock requests, one
// goroutine, alternately through each, the first of each round alternating
// too. On a shared machine, drift between two separate benchmarks is often
// larger than the few percent at stake; here it falls on both sides alike.
// An op is one request through each; the metrics are each side's ns per
// request and the ratio of their totals (stack/bare).
//
// background sends with context.Background, which net/http never has to
// watch: the cheapest case for bare. Under it, bulwark (full stack),
// bulwark-router (every layer off), bulwark-timeout (the deadline layers
// alone: an attempt context and two headers), floor (Floor: the same done
// with the standard library alone, the yardstick), withcancel (a plain
// context.WithCancel per request, no bulwark: what any cancellable
// per-attempt context costs in net/http) and headers (two more request
// headers, no bulwark) take the cost apart; failsafe-go and retryablehttp,
// configured as in BenchmarkLoopback, are measured the same way.
// cancelable sends with a context.WithCancel context, as a server handler's
// request context is: there bare too pays for a context net/http watches;
// bulwark and floor are measured under it.
func BenchmarkLoopbackPaired(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer srv.Close()
	base := http.DefaultTransport.(*http.Transport).Clone()
	// One connection, which both sides always use: with more, which side
	// gets which connection (they are not equally fast) decides more than
	// the stacks do, and the ratios come out bimodal.
	base.MaxConnsPerHost = 1
	defer base.CloseIdleConnections()
	bw, err := Bulwark(Defaults, base)
	if err != nil {
		b.Fatal(err)
	}
	layers, err := BulwarkLayers(Defaults, base)
	if err != nil {
		b.Fatal(err)
	}
	stacks := []Stack{{"bulwark", bw}}
	for _, l := range layers {
		if l.Name == "bulwark-router" || l.Name == "bulwark-timeout" {
			stacks = append(stacks, l)
		}
	}
	floor := Floor(Defaults.Attempt, base)
	stacks = append(stacks,
		Stack{"floor", floor},
		Stack{"withcancel", withCancelRT{base}},
		Stack{"headers", twoHeadersRT{base}},
		Stack{"failsafe-go", Failsafe(Defaults, base)},
		Stack{"retryablehttp", RetryableHTTP(Defaults, base)})
	for _, s := range stacks {
		b.Run("background/"+s.Name, func(b *testing.B) { pairedLoop(b, pairedRequest(b, srv.URL, false), base, s.RT) })
	}
	b.Run("cancelable/bulwark", func(b *testing.B) { pairedLoop(b, pairedRequest(b, srv.URL, true), base, bw) })
	b.Run("cancelable/floor", func(b *testing.B) { pairedLoop(b, pairedRequest(b, srv.URL, true), base, floor) })
}

// twoHeadersRT sends each request with two headers more, of the lengths of
// bulwark's deadline and attempt headers, on a copy of the request and of
// its header: what propagating a deadline costs without any context.
type twoHeadersRT struct{ next http.RoundTripper }

func (t twoHeadersRT) RoundTrip(req *http.Request) (*http.Response, error) {
	out := req.WithContext(req.Context())
	out.Header = req.Header.Clone()
	out.Header["X-Timeout-Ms-Demo"] = []string{"9995"}
	out.Header["X-Attempt-Demo"] = []string{"1"}
	return t.next.RoundTrip(out)
}

// withCancelRT sends each request under a context.WithCancel of its own,
// cancelled when the body is closed: the least a per-attempt timeout needs.
type withCancelRT struct{ next http.RoundTripper }

func (w withCancelRT) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancel(req.Context())
	resp, err := w.next.RoundTrip(req.WithContext(ctx))
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = cancelBody{resp.Body, cancel}
	return resp, nil
}

type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c cancelBody) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

func pairedRequest(b *testing.B, url string, cancelable bool) *http.Request {
	req := httptestRequest(b, url)
	if cancelable {
		ctx, cancel := context.WithCancel(context.Background())
		b.Cleanup(cancel)
		req = req.WithContext(ctx)
	}
	req.Header.Set("Accept", "application/json")
	return req
}

// pairedLoop times req through bare and bw alternately (see
// BenchmarkLoopbackPaired).
func pairedLoop(b *testing.B, req *http.Request, bare, bw http.RoundTripper) {
	t := interleave(b, req, pairedBlock, bare, bw)
	b.ReportMetric(float64(t[0].Nanoseconds())/float64(b.N), "bare-ns/req")
	b.ReportMetric(float64(t[1].Nanoseconds())/float64(b.N), "stack-ns/req")
	b.ReportMetric(float64(t[1])/float64(t[0]), "stack/bare")
}

// interleave sends b.N requests through each of rts, in blocks of block,
// the order of the stacks rotating each round, from one goroutine, and
// returns each stack's total time.
func interleave(b *testing.B, req *http.Request, block int, rts ...http.RoundTripper) []time.Duration {
	return interleaveRequests(b, []*http.Request{req}, block, rts...)
}

// interleaveRequests is interleave for a list of requests, which each of
// rts sends in turn, from the first, again and again.
func interleaveRequests(b *testing.B, reqs []*http.Request, block int, rts ...http.RoundTripper) []time.Duration {
	pos := make([]int, len(rts))
	send := func(j, n int) time.Duration {
		start := time.Now()
		for range n {
			resp, err := rts[j].RoundTrip(reqs[pos[j]%len(reqs)])
			pos[j]++
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return time.Since(start)
	}
	for j := range rts {
		send(j, block) // warm: connections dialled, per-host state made
	}
	total := make([]time.Duration, len(rts))
	b.ReportAllocs()
	b.ResetTimer()
	for n, round := 0, 0; n < b.N; round++ {
		k := min(block, b.N-n)
		for i := range rts {
			j := (i + round) % len(rts)
			total[j] += send(j, k)
		}
		n += k
	}
	return total
}

func httptestRequest(b *testing.B, url string) *http.Request {
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		b.Fatal(err)
	}
	return req
}

// openParams trip on the first ten failures and stay open for the run.
var openParams = func() Params {
	p := Defaults
	p.MinCalls, p.OpenFor = 10, time.Hour
	return p
}()

// trip sends 503s through rt until it refuses with want.
func trip(b *testing.B, rt http.RoundTripper, want error) {
	for range 1000 {
		req, _ := http.NewRequest("GET", "http://stub.internal/x", nil)
		resp, err := rt.RoundTrip(req)
		if errors.Is(err, want) {
			return
		}
		if err == nil {
			resp.Body.Close()
		}
	}
	b.Fatalf("breaker never opened with %v", want)
}

// BenchmarkOpenBreaker is the cost of a refusal by an open breaker: the
// breaker alone, and inside the full stack where there is one.
func BenchmarkOpenBreaker(b *testing.B) {
	base := stubBase{status: http.StatusServiceUnavailable}
	noRetry := openParams
	noRetry.MaxAttempts = 1 // so tripping needs no backoff sleeps

	bwFull, err := bulwark.New(bulwark.Config{Base: base, Default: BulwarkPolicy(noRetry)})
	if err != nil {
		b.Fatal(err)
	}
	onlyBreaker := bulwark.Policy{
		Timeout:  bulwark.Timeout{Disabled: true},
		Breaker:  BulwarkPolicy(openParams).Breaker,
		Bulkhead: bulwark.Bulkhead{Disabled: true},
		Retry:    bulwark.Retry{Disabled: true, NoPushback: true},
	}
	bwAlone, err := bulwark.New(bulwark.Config{Base: base, Default: onlyBreaker})
	if err != nil {
		b.Fatal(err)
	}
	// Zero config, held open by ControlBreaker: what NewClient(Config{})
	// pays for a refusal.
	bwZero, err := bulwark.New(bulwark.Config{Base: base})
	if err != nil {
		b.Fatal(err)
	}
	if err := bwZero.ControlBreaker("stub.internal:80", bulwark.BreakerForceOpen); err != nil {
		b.Fatal(err)
	}
	fsAlone, _ := FailsafeBreaker(openParams, base)
	fsFull := Failsafe(noRetry, base)
	gb := GoBreaker(openParams, base)

	cases := []struct {
		name string
		rt   http.RoundTripper
		err  error
	}{
		{"gobreaker", gb, errOpenGoBreaker},
		{"failsafe-go-breaker", fsAlone, errOpenFailsafe},
		{"failsafe-go", fsFull, errOpenFailsafe},
		{"bulwark-breaker", bwAlone, bulwark.ErrBreakerOpen},
		{"bulwark", bwFull, bulwark.ErrBreakerOpen},
		{"bulwark-zero-config", bwZero, bulwark.ErrBreakerOpen},
	}
	for _, c := range cases {
		trip(b, c.rt, c.err)
		b.Run(c.name, func(b *testing.B) { roundTrips(b, c.rt, "http://stub.internal/x", c.err) })
	}
}

// BenchmarkFullBulkhead is the cost of a refusal by a full bulkhead (one
// slot, held for the whole benchmark).
func BenchmarkFullBulkhead(b *testing.B) {
	p := Defaults
	p.BulkheadCapacity = 1
	base := stubBase{}

	bwFull, err := bulwark.New(bulwark.Config{Base: base, Default: BulwarkPolicy(p)})
	if err != nil {
		b.Fatal(err)
	}
	bwAlone, err := bulwark.New(bulwark.Config{Base: base, Default: bulwark.Policy{
		Timeout:  bulwark.Timeout{Disabled: true},
		Breaker:  bulwark.Breaker{Disabled: true},
		Bulkhead: bulwark.Bulkhead{MaxConcurrent: 1},
		Retry:    bulwark.Retry{Disabled: true, NoPushback: true},
	}})
	if err != nil {
		b.Fatal(err)
	}
	fsBH := bulkhead.New[*http.Response](1)
	fsAlone := failsafehttp.NewRoundTripper(base, fsBH)
	fsFull, fsFullBH := FailsafeWithBulkhead(p, base)

	var held []io.Closer
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	hold := func(rt http.RoundTripper) {
		req, _ := http.NewRequest("GET", "http://stub.internal/x", nil)
		resp, err := rt.RoundTrip(req)
		if err != nil {
			b.Fatal(err)
		}
		held = append(held, resp.Body) // not closed: the slot stays taken
	}
	hold(bwFull)
	hold(bwAlone)
	for _, bh := range []bulkhead.Bulkhead[*http.Response]{fsBH, fsFullBH} {
		if !bh.TryAcquirePermit() {
			b.Fatal("failsafe-go bulkhead already full")
		}
		defer bh.ReleasePermit()
	}

	cases := []struct {
		name string
		rt   http.RoundTripper
		err  error
	}{
		{"failsafe-go-bulkhead", fsAlone, bulkhead.ErrFull},
		{"failsafe-go", fsFull, bulkhead.ErrFull},
		{"bulwark-bulkhead", bwAlone, bulwark.ErrBulkheadFull},
		{"bulwark", bwFull, bulwark.ErrBulkheadFull},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) { roundTrips(b, c.rt, "http://stub.internal/x", c.err) })
	}
}

var (
	errOpenGoBreaker = gobreaker.ErrOpenState
	errOpenFailsafe  = circuitbreaker.ErrOpen
)
