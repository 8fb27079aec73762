package bulwark

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// balancedTransport builds a Transport whose upstream "tax.internal" has p
// (Endpoints filled in by the caller), a seeded picker and a log buffer. It
// returns the logical host's balancer too. Tests that wait (ejections,
// resolves, retry backoff) call it inside a testing/synctest bubble.
func balancedTransport(t *testing.T, base http.RoundTripper, p Policy) (*Transport, *balancerLayer, *syncBuffer) {
	t.Helper()
	logs := new(syncBuffer)
	tr := mustNew(t, Config{
		Base:      base,
		Upstreams: map[string]Policy{"tax.internal": p},
		Logger:    slog.New(slog.NewTextHandler(logs, nil)),
	})
	t.Cleanup(tr.CloseIdleConnections)
	bal := layerOf[*balancerLayer](t, tr, "http://tax.internal/rate")
	var mu sync.Mutex
	rng := mrand.New(mrand.NewPCG(1, 2))
	bal.randN = func(n uint64) uint64 {
		mu.Lock()
		defer mu.Unlock()
		return rng.Uint64N(n)
	}
	return tr, bal, logs
}

func getTax(t *testing.T, c *http.Client, call string) (int, error) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://tax.internal/rate", nil)
	if call != "" {
		req.Header.Set("X-Call", call)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// checkCounts insists that every instance served exactly what the balancer
// sent it, with connections only where requests went, and the logical Host.
func checkCounts(t *testing.T, tr *Transport, f *fleet) {
	t.Helper()
	for i, a := range f.addrs {
		s := stateOf(t, tr, a)
		if got := uint64(f.hits[i].Load()); got != s.Requests {
			t.Errorf("instance %d served %d requests, balancer sent it %d", i, got, s.Requests)
		}
		if hits, conns := f.hits[i].Load(), f.conns[i].Load(); (hits > 0) != (conns > 0) {
			t.Errorf("instance %d: %d hits over %d connections", i, hits, conns)
		}
	}
	if n := f.wrongHost.Load(); n != 0 {
		t.Errorf("%d requests arrived with a Host other than the logical name", n)
	}
}

func TestBalancerEjectsSickInstance(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const sick = 2
		f := newFleet(t, 5, "tax.internal", func(i int) int {
			if i == sick {
				return http.StatusInternalServerError
			}
			return http.StatusOK
		})
		tr, _, logs := balancedTransport(t, f.transport(), Policy{Endpoints: Endpoints{Addrs: f.addrs}})
		clk := newFakeClock()
		c := &http.Client{Transport: tr}

		const calls = 1000
		ok := 0
		for i := 0; i < calls; i++ {
			if st, err := getTax(t, c, ""); err == nil && st == http.StatusOK {
				ok++
			}
		}
		if got := f.hits[sick].Load(); got != defaultConsecutiveFailures {
			t.Errorf("sick instance served %d requests, want %d (ejected after its consecutive failures)", got, defaultConsecutiveFailures)
		}
		if rate := float64(ok) / calls; rate < 0.99 {
			t.Errorf("success rate %.3f, want ≥ 0.99", rate)
		}
		for i := range f.addrs {
			if i != sick && f.hits[i].Load() < calls/10 {
				t.Errorf("healthy instance %d served only %d of %d", i, f.hits[i].Load(), calls)
			}
		}
		// The ejection is timed from the failure that completed the run
		// (the retry of that call waits after it, on the same clock).
		ejectedAt := f.lastServed(sick)
		s := stateOf(t, tr, f.addrs[sick])
		if !s.Ejected || s.Ejections != 1 || !s.EjectedUntil.Equal(ejectedAt.Add(defaultBaseEjection)) {
			t.Fatalf("sick state = %+v, want ejected once until %v (its last failure + %v)", s, ejectedAt.Add(defaultBaseEjection), defaultBaseEjection)
		}
		checkCounts(t, tr, f)
		connsAtEjection := f.conns[sick].Load()

		// Its time served, it returns, fails again, and is out twice as long.
		clk.advance(defaultBaseEjection)
		for i := 0; i < 500 && f.hits[sick].Load() < 2*defaultConsecutiveFailures; i++ {
			getTax(t, c, "")
		}
		ejectedAt = f.lastServed(sick)
		s = stateOf(t, tr, f.addrs[sick])
		if !s.Ejected || s.Ejections != 2 || !s.EjectedUntil.Equal(ejectedAt.Add(2*defaultBaseEjection)) {
			t.Fatalf("after return: sick state = %+v, want ejected twice until %v (its last failure + %v)", s, ejectedAt.Add(2*defaultBaseEjection), 2*defaultBaseEjection)
		}
		if f.hits[sick].Load() != 2*defaultConsecutiveFailures {
			t.Errorf("sick instance served %d requests in all, want %d", f.hits[sick].Load(), 2*defaultConsecutiveFailures)
		}
		for i := 0; i < 100; i++ {
			getTax(t, c, "")
		}
		if f.hits[sick].Load() != 2*defaultConsecutiveFailures {
			t.Errorf("ejected instance got requests: %d", f.hits[sick].Load())
		}
		if f.conns[sick].Load() > connsAtEjection+1 {
			t.Errorf("sick instance got %d new connections after returning once", f.conns[sick].Load()-connsAtEjection)
		}
		checkCounts(t, tr, f)
		l := logs.String()
		if strings.Count(l, "endpoint ejected") != 2 || strings.Count(l, "endpoint returned") != 1 {
			t.Errorf("logs:\n%s\nwant two ejections and one return", l)
		}
		if !strings.Contains(l, "endpoint="+f.addrs[sick]) || !strings.Contains(l, "level=INFO") {
			t.Errorf("logs do not name the instance at Info:\n%s", l)
		}
	})
}

func TestBalancerAllSickBreakerOpens(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet(t, 5, "tax.internal", func(int) int { return http.StatusInternalServerError })
		tr, _, _ := balancedTransport(t, f.transport(), Policy{
			Endpoints: Endpoints{Addrs: f.addrs},
			Breaker:   Breaker{MinCalls: 20, ConsecutiveFailures: -1}, // MinCalls under test
			Retry:     Retry{Disabled: true},
		})
		c := &http.Client{Transport: tr}
		open := 0
		for i := 0; i < 100; i++ {
			if _, err := getTax(t, c, ""); errors.Is(err, ErrBreakerOpen) {
				open++
			}
		}
		ejected := 0
		for _, s := range endpointStates(tr, "tax.internal:80") {
			if s.Ejected {
				ejected++
			}
		}
		// 10 % of 5 rounds to none, but one may always be ejected.
		if ejected != 1 {
			t.Errorf("%d instances ejected, want 1 (the cap)", ejected)
		}
		if st, _ := breakerState(tr, "tax.internal:80"); st != CircuitOpen || open == 0 {
			t.Errorf("breaker %v after 100 calls (%d refused), want open", st, open)
		}
		var sent int64
		for i := range f.hits {
			sent += f.hits[i].Load()
		}
		if sent != 20 {
			t.Errorf("instances served %d requests, want 20 (the breaker's MinCalls)", sent)
		}
		checkCounts(t, tr, f)
	})
}

func TestBalancerRetriesElsewhere(t *testing.T) {
	// In a bubble: the waits before retries take no real time.
	synctest.Test(t, func(t *testing.T) {
		// Two of five always answer 503: a call that meets both still ends
		// on a healthy instance in three attempts, if no attempt repeats one.
		f := newFleet(t, 5, "tax.internal", func(i int) int {
			if i < 2 {
				return http.StatusServiceUnavailable
			}
			return http.StatusOK
		})
		tr, _, _ := balancedTransport(t, f.transport(), Policy{
			Endpoints: Endpoints{Addrs: f.addrs, Outlier: Outlier{Disabled: true}},
			Retry:     Retry{Budget: Budget{Disabled: true}, NoPushback: true},
			Breaker:   Breaker{Disabled: true},
		})
		c := &http.Client{Transport: tr}
		const calls = 300
		for i := 0; i < calls; i++ {
			if st, err := getTax(t, c, fmt.Sprint(i)); err != nil || st != http.StatusOK {
				t.Fatalf("call %d: %d, %v", i, st, err)
			}
		}
		retried := 0
		for call, insts := range f.calls {
			seen := map[int]bool{}
			for _, i := range insts {
				if seen[i] {
					t.Fatalf("call %s went to instance %d twice: %v", call, i, insts)
				}
				seen[i] = true
			}
			if len(insts) > 1 {
				retried++
			}
		}
		if retried < calls/10 {
			t.Errorf("only %d of %d calls were retried", retried, calls)
		}
		checkCounts(t, tr, f)
	})
}

func TestBalancerPickAvoidsTried(t *testing.T) {
	for _, rr := range []bool{false, true} {
		b := testBalancer(t, &stubBase{}, Endpoints{Addrs: []string{"10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"}, RoundRobin: rr})
		set := b.set.Load()
		for trial := 0; trial < 50; trial++ {
			var tried triedSet
			seen := map[uint32]bool{}
			for k := 0; k < 3; k++ {
				in := b.pick(set, &tried)
				if seen[in.id] {
					t.Fatalf("rr=%v: attempt %d repeated %s", rr, k+1, in.addr)
				}
				seen[in.id] = true
				tried.mark(in.id)
			}
			// Everything tried: any instance will do, but one is picked.
			if b.pick(set, &tried) == nil {
				t.Fatal("nil pick")
			}
		}
	}
}

func TestBalancerPrefersLessLoaded(t *testing.T) {
	b := testBalancer(t, &stubBase{}, Endpoints{Addrs: []string{"10.0.0.1:80", "10.0.0.2:80"}})
	set := b.set.Load()
	set.all[0].inflight.Store(5)
	for i := 0; i < 20; i++ {
		if in := b.pick(set, nil); in != set.all[1] {
			t.Fatalf("picked %s with %d in flight over one with none", in.addr, in.inflight.Load())
		}
	}
}

// balancerOnly builds, with the real builder, a Transport whose upstream
// has the balancer alone: each instance keeps its bulkhead and attempt
// deadline, and no breaker, retry or pushback sits above.
func balancerOnly(t testing.TB, base http.RoundTripper, upstream string, e Endpoints) *Transport {
	t.Helper()
	return mustNew(t, Config{Base: base, Upstreams: map[string]Policy{
		upstream: only(Policy{Endpoints: e}, "bulkhead", "timeout"),
	}})
}

// testBalancer is the balancer of balancerOnly's "tax.internal".
func testBalancer(t testing.TB, base http.RoundTripper, e Endpoints) *balancerLayer {
	t.Helper()
	return layerOf[*balancerLayer](t, balancerOnly(t, base, "tax.internal", e), "http://tax.internal/")
}

func TestBalancerSuccessRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := newFakeClock()
		addrs := []string{"10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80", "10.0.0.4:80", "10.0.0.5:80", "10.0.0.6:80"}
		b := testBalancer(t, &stubBase{}, Endpoints{Addrs: addrs})
		all := b.set.Load().all
		for i, in := range all {
			in.reqs.Store(200)
			if i == 0 {
				in.fails.Store(100) // 50 %, never five in a row
			}
		}
		all[5].reqs.Store(50) // below the volume: not compared
		clk.advance(defaultOutlierInterval)
		if !b.sweep(t.Context(), clk.now()) {
			t.Fatal("sweep changed nothing")
		}
		if !all[0].ejected || len(b.set.Load().active) != 5 {
			t.Fatalf("success-rate outlier not ejected (ejected=%v, active %d)", all[0].ejected, len(b.set.Load().active))
		}
		// Four samples are too few to compare.
		for i, in := range all[1:] {
			in.reqs.Store(200)
			if i == 0 {
				in.fails.Store(200)
			}
		}
		all[5].reqs.Store(0)
		all[4].reqs.Store(0)
		clk.advance(defaultOutlierInterval)
		b.sweep(t.Context(), clk.now())
		if all[1].ejected {
			t.Error("ejected on the success rate of four instances")
		}
		// Returned, and healthy for as long as it was out: its count drops.
		clk.advance(defaultBaseEjection)
		b.sweep(t.Context(), clk.now())
		if all[0].ejected || all[0].times != 1 {
			t.Fatalf("after its time: ejected=%v times=%d", all[0].ejected, all[0].times)
		}
		for i := 0; i < 3; i++ {
			clk.advance(defaultOutlierInterval)
			b.sweep(t.Context(), clk.now())
		}
		if all[0].times != 0 {
			t.Errorf("times = %d after %v healthy, want 0", all[0].times, 3*defaultOutlierInterval)
		}
	})
}

// TestBalancerCountsByClassification: an instance's run of failures is
// counted by the one classification (classify(...).health()): 429 is a
// failure, 501 (a wrong request) is not.
func TestBalancerCountsByClassification(t *testing.T) {
	for _, tt := range []struct {
		status    int
		wantEject bool
	}{
		{http.StatusTooManyRequests, true},
		{http.StatusNotImplemented, false},
		{http.StatusInternalServerError, true},
		{http.StatusNotFound, false},
	} {
		t.Run(fmt.Sprint(tt.status), func(t *testing.T) {
			const bad = "10.0.0.1:80"
			var badHits atomic.Int64
			base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
				if req.URL.Host == bad {
					badHits.Add(1)
					return response(req, tt.status), nil
				}
				return response(req, http.StatusOK), nil
			})
			tr := balancerOnly(t, base, "tax.internal", Endpoints{Addrs: []string{bad, "10.0.0.2:80"}})
			c := &http.Client{Transport: tr}
			for i := 0; i < 200 && badHits.Load() < 4*defaultConsecutiveFailures; i++ {
				getTax(t, c, "")
			}
			s := stateOf(t, tr, bad)
			if tt.wantEject {
				if !s.Ejected || badHits.Load() != defaultConsecutiveFailures {
					t.Errorf("%d: %+v after %d hits, want ejected after %d", tt.status, s, badHits.Load(), defaultConsecutiveFailures)
				}
			} else if s.Ejected || s.ConsecutiveFailures != 0 || badHits.Load() != 4*defaultConsecutiveFailures {
				t.Errorf("%d: %+v after %d hits, want never counted as a failure", tt.status, s, badHits.Load())
			}
		})
	}
}
func TestOutlierArithmetic(t *testing.T) {
	for _, c := range []struct{ n, pct, want int }{
		{1, 10, 0}, {2, 10, 1}, {5, 10, 1}, {20, 10, 2}, {25, 10, 2}, {3, 100, 2}, {10, 0, 1},
	} {
		if got := ejectCap(c.n, c.pct); got != c.want {
			t.Errorf("ejectCap(%d, %d) = %d, want %d", c.n, c.pct, got, c.want)
		}
	}
	o := Endpoints{}.withDefaults().Outlier
	for _, c := range []struct {
		times int
		want  time.Duration
	}{{1, 30 * time.Second}, {2, 60 * time.Second}, {10, 300 * time.Second}, {11, 300 * time.Second}, {1 << 40, 300 * time.Second}} {
		if got := o.ejectionTime(c.times); got != c.want {
			t.Errorf("ejectionTime(%d) = %v, want %v", c.times, got, c.want)
		}
	}
	s := func(rates ...float64) []rateSample {
		out := make([]rateSample, len(rates))
		for i, r := range rates {
			out[i] = rateSample{in: &instance{id: uint32(i + 1)}, rate: r}
		}
		return out
	}
	if got := successRateOutliers(s(0, 1, 1, 1, 1), 5, 1.9); len(got) != 1 || got[0].in.id != 1 {
		t.Errorf("outliers of 0,1,1,1,1 = %v, want the first", got)
	}
	if got := successRateOutliers(s(0.9, 0.9, 0.9, 0.9, 0.9), 5, 1.9); len(got) != 0 {
		t.Errorf("outliers of equal rates = %v", got)
	}
	if got := successRateOutliers(s(0, 1, 1, 1), 5, 1.9); len(got) != 0 {
		t.Errorf("outliers of four samples = %v", got)
	}
}

// fakeResolver answers from a list it is given; called signals each call.
type fakeResolver struct {
	mu     sync.Mutex
	addrs  []string
	err    error
	names  []string
	called chan struct{}
}

func (r *fakeResolver) set(addrs []string, err error) {
	r.mu.Lock()
	r.addrs, r.err = addrs, err
	r.mu.Unlock()
}

func (r *fakeResolver) Resolve(ctx context.Context, name string) ([]string, error) {
	r.mu.Lock()
	r.names = append(r.names, name)
	a, err := append([]string(nil), r.addrs...), r.err
	r.mu.Unlock()
	select {
	case r.called <- struct{}{}:
	default:
	}
	return a, err
}

// hostsBase answers 200 and counts requests per URL host.
type hostsBase struct {
	mu    sync.Mutex
	hosts map[string]int
}

func (h *hostsBase) RoundTrip(req *http.Request) (*http.Response, error) {
	h.mu.Lock()
	h.hosts[req.URL.Host]++
	h.mu.Unlock()
	return (&stubBase{}).RoundTrip(req)
}

func TestBalancerResolver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fr := &fakeResolver{called: make(chan struct{}, 1)}
		fr.set(nil, errors.New("fake: no such host"))
		base := &hostsBase{hosts: map[string]int{}}
		tr, b, logs := balancedTransport(t, base, Policy{Endpoints: Endpoints{Resolver: fr}})
		clk := newFakeClock()
		c := &http.Client{Transport: tr}

		if _, err := getTax(t, c, ""); !errors.Is(err, ErrNoEndpoints) {
			t.Fatalf("no endpoints yet: err = %v, want ErrNoEndpoints", err)
		}
		<-fr.called
		fr.set([]string{"10.0.0.1:80", "10.0.0.2:80"}, nil)
		for i := 0; i < 20; i++ {
			if st, err := getTax(t, c, ""); err != nil || st != 200 {
				t.Fatalf("get: %d, %v", st, err)
			}
		}
		<-fr.called
		if base.hosts["10.0.0.1:80"]+base.hosts["10.0.0.2:80"] != 20 {
			t.Fatalf("requests went to %v", base.hosts)
		}

		// The interval passes, the lookup fails: the last good set stays.
		waitRefresh := func() {
			t.Helper()
			// Every goroutine of the bubble idle: the background lookup
			// has run, if one was started, and is over.
			synctest.Wait()
			select {
			case <-fr.called:
			default:
				t.Fatal("no background resolve")
			}
			if b.resolving.Load() {
				t.Fatal("background resolve did not finish")
			}
		}
		fr.set(nil, errors.New("fake: SERVFAIL"))
		clk.advance(defaultResolveEvery)
		getTax(t, c, "")
		waitRefresh()
		if n := len(endpointStates(tr, "tax.internal:80")); n != 2 {
			t.Fatalf("after a failed lookup: %d endpoints, want the last good 2", n)
		}
		if !strings.Contains(logs.String(), "keeping the last good endpoints") {
			t.Errorf("failed lookup not logged:\n%s", logs.String())
		}

		// Then the set changes.
		fr.set([]string{"10.0.0.3:80"}, nil)
		clk.advance(defaultResolveEvery)
		getTax(t, c, "")
		waitRefresh()
		before := base.hosts["10.0.0.3:80"]
		for i := 0; i < 10; i++ {
			getTax(t, c, "")
		}
		if got := base.hosts["10.0.0.3:80"] - before; got != 10 {
			t.Errorf("%d of 10 requests went to the new set's instance (hosts %v)", got, base.hosts)
		}
		fr.mu.Lock()
		first := fr.names[0]
		fr.mu.Unlock()
		if first != "tax.internal:80" {
			t.Errorf("resolver asked for %q, want the logical host:port", first)
		}
	})
}

func TestDNSResolver(t *testing.T) {
	got, err := (&DNSResolver{}).Resolve(t.Context(), "127.0.0.1:8080")
	if err != nil || len(got) != 1 || got[0] != "127.0.0.1:8080" {
		t.Errorf("literal: %v, %v", got, err)
	}
	got, err = (&DNSResolver{Port: "9090"}).Resolve(t.Context(), "[::1]:8080")
	if err != nil || len(got) != 1 || got[0] != "[::1]:9090" {
		t.Errorf("literal with Port: %v, %v", got, err)
	}
	// A resolver whose every query fails: no real DNS is asked.
	errDial := errors.New("fake: no network")
	r := &DNSResolver{Resolver: &net.Resolver{PreferGo: true, Dial: func(context.Context, string, string) (net.Conn, error) {
		return nil, errDial
	}}}
	if _, err := r.Resolve(t.Context(), "tax.invalid-bulwark-test:443"); err == nil {
		t.Error("lookup through a failing dialer succeeded")
	}
	if _, err := r.Resolve(t.Context(), "no-port"); err == nil {
		t.Error("name without a port accepted")
	}
}

func TestBalancerTLSServerName(t *testing.T) {
	var bad atomic.Int64
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// httptest's certificate is for example.com and 127.0.0.1.
		if r.Host != "example.com" || r.TLS == nil || r.TLS.ServerName != "example.com" {
			bad.Add(1)
		}
	}))
	defer srv.Close()
	base := srv.Client().Transport.(*http.Transport).Clone()
	base.TLSClientConfig.ServerName = ""
	tr := mustNew(t, Config{Base: base, Upstreams: map[string]Policy{
		"example.com": {Endpoints: Endpoints{Addrs: []string{srv.Listener.Addr().String()}}},
	}})
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get("https://example.com/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if bad.Load() != 0 {
		t.Error("request arrived without the logical Host or TLS server name")
	}
	if resp.Request.URL.Host != "example.com" {
		t.Errorf("resp.Request.URL.Host = %q, want the logical name", resp.Request.URL.Host)
	}
}

func TestBalancerConfig(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"default endpoints", Config{Default: Policy{Endpoints: Endpoints{Addrs: []string{"10.0.0.1:80"}}}}, "Endpoints"},
		{"bad addr", Config{Upstreams: map[string]Policy{"a": {Endpoints: Endpoints{Addrs: []string{"10.0.0.1"}}}}}, "Endpoints.Addrs"},
		{"bad port", Config{Upstreams: map[string]Policy{"a": {Endpoints: Endpoints{Addrs: []string{"h:0"}}}}}, "Endpoints.Addrs"},
		{"dup", Config{Upstreams: map[string]Policy{"a": {Endpoints: Endpoints{Addrs: []string{"h:1", "h:1"}}}}}, "Endpoints.Addrs"},
		{"both", Config{Upstreams: map[string]Policy{"a": {Endpoints: Endpoints{Addrs: []string{"h:1"}, Resolver: &DNSResolver{}}}}}, "Endpoints.Addrs"},
		{"pct", Config{Upstreams: map[string]Policy{"a": {Endpoints: Endpoints{Addrs: []string{"h:1"}, Outlier: Outlier{MaxEjectedPercent: 101}}}}}, "MaxEjectedPercent"},
		{"max below base", Config{Upstreams: map[string]Policy{"a": {Endpoints: Endpoints{Addrs: []string{"h:1"}, Outlier: Outlier{BaseEjection: time.Minute, MaxEjection: time.Second}}}}}, "MaxEjection"},
	} {
		_, err := New(c.cfg)
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want a config error naming %s", c.name, err, c.want)
		}
	}
	// Tuning is inherited from Default; instances are not.
	tr := mustNew(t, Config{
		Default:   Policy{Endpoints: Endpoints{Outlier: Outlier{Consecutive: 3}}},
		Upstreams: map[string]Policy{"a": {Endpoints: Endpoints{Addrs: []string{"h:1"}}}},
	})
	if got := tr.byHost["a"].policy.Endpoints.Outlier.Consecutive; got != 3 {
		t.Errorf("inherited Consecutive = %d, want 3", got)
	}
	if tr.def.policy.Endpoints.enabled() {
		t.Error("Default balanced")
	}
}

func TestBalancerContract(t *testing.T) {
	runContract(t, func(base http.RoundTripper) http.RoundTripper {
		return balancerOnly(t, base, "contract.test", Endpoints{Addrs: []string{"10.0.0.1:80", "10.0.0.2:80"}})
	})
	t.Run("stack", func(t *testing.T) {
		runContract(t, func(base http.RoundTripper) http.RoundTripper {
			return mustNew(t, Config{Base: base, Upstreams: map[string]Policy{
				"contract.test": {Endpoints: Endpoints{Addrs: []string{"10.0.0.1:80", "10.0.0.2:80"}}, Breaker: Breaker{Disabled: true}},
			}})
		})
	})
	t.Run("no endpoints", func(t *testing.T) {
		fr := &fakeResolver{err: errors.New("fake: down")}
		tr := mustNew(t, Config{Base: &stubBase{}, Upstreams: map[string]Policy{"contract.test": {Endpoints: Endpoints{Resolver: fr}}}})
		for _, cr := range contractRequests {
			var bs bodies
			_, _, err := checkContract(t, tr, newContractRequest(t, t.Context(), "http://contract.test/x", cr, &bs), &bs)
			var ne *NoEndpointsError
			if !errors.As(err, &ne) || ne.Host != "contract.test:80" {
				t.Errorf("%s: err = %v, want a *NoEndpointsError", cr.name, err)
			}
		}
	})
}

// BenchmarkBalancerPick measures choosing one of 20 instances: first
// attempts, and retries that must avoid the instance already tried.
func BenchmarkBalancerPick(b *testing.B) {
	addrs := make([]string, 20)
	for i := range addrs {
		addrs[i] = fmt.Sprintf("10.0.0.%d:80", i+1)
	}
	for _, rr := range []bool{false, true} {
		name := "p2c"
		if rr {
			name = "roundrobin"
		}
		bal := testBalancer(b, &stubBase{}, Endpoints{Addrs: addrs, RoundRobin: rr})
		set := bal.set.Load()
		b.Run(name+"/first", func(b *testing.B) {
			b.ReportAllocs()
			var tried triedSet
			for b.Loop() {
				tried.n = 0
				in := bal.pick(set, &tried)
				tried.mark(in.id)
			}
		})
		b.Run(name+"/retry", func(b *testing.B) {
			b.ReportAllocs()
			var tried triedSet
			for b.Loop() {
				tried.n = 0
				tried.mark(set.active[0].id)
				tried.mark(set.active[1].id)
				in := bal.pick(set, &tried)
				tried.mark(in.id)
			}
		})
		b.Run(name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				var tried triedSet
				for pb.Next() {
					tried.n = 0
					in := bal.pick(set, &tried)
					tried.mark(in.id)
				}
			})
		})
	}
	// The whole layer over a stub base, with the layers below it off
	// (no bulkhead, no attempt deadline): pick, clock read, request copy,
	// outcome and in-flight accounting.
	tr := mustNew(b, Config{Base: wrappedBenchBase{}, Upstreams: map[string]Policy{
		"tax.internal": only(Policy{Endpoints: Endpoints{Addrs: addrs}}),
	}})
	bal := layerOf[*balancerLayer](b, tr, "http://tax.internal/")
	req, _ := http.NewRequest(http.MethodGet, "http://tax.internal/rate", nil)
	b.Run("layer", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			resp, err := bal.roundTrip(req, call{})
			if err != nil {
				b.Fatal(err)
			}
			resp.Body.Close()
		}
	})
}

// TestBalancerBulkheadStates: with Endpoints, each instance has a bulkhead
// of its own, and Snapshot reports each under the logical host, with its
// instance: a held response shows on the instance that served it and
// nowhere else.
func TestBalancerBulkheadStates(t *testing.T) {
	f := newFleet(t, 2, "tax.internal", func(int) int { return 200 })
	tr, _, _ := balancedTransport(t, f.transport(), Policy{
		Endpoints: Endpoints{Addrs: f.addrs},
		Bulkhead:  Bulkhead{MaxConcurrent: 3},
	})
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://tax.internal/rate", nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	served := f.addrs[0]
	if f.hits[1].Load() == 1 {
		served = f.addrs[1]
	}
	check := func(wantHeld int) {
		t.Helper()
		hosts := tr.Snapshot().Host("tax.internal:80")
		if len(hosts) != 1 {
			t.Fatalf("%d snapshots of tax.internal:80, want 1: %+v", len(hosts), hosts)
		}
		h := hosts[0]
		if h.Host != "tax.internal:80" || h.Upstream != "tax.internal" || h.Bulkhead != nil {
			t.Errorf("host %+v: want host tax.internal:80, upstream tax.internal, no bulkhead of its own", h)
		}
		if len(h.Endpoints) != len(f.addrs) {
			t.Fatalf("%d endpoints, want one per instance (%d): %+v", len(h.Endpoints), len(f.addrs), h.Endpoints)
		}
		for _, e := range h.Endpoints {
			want := 0
			if e.Addr == served {
				want = wantHeld
			}
			if e.Bulkhead == nil || e.Bulkhead.MaxConcurrent != 3 || e.Bulkhead.InFlight != want {
				t.Errorf("instance %s: bulkhead %+v, want 3 slots, %d held", e.Addr, e.Bulkhead, want)
			}
		}
		if held, _, _ := bulkheadStats(tr, "tax.internal:80"); held != wantHeld {
			t.Errorf("bulkheadStats = %d held, want %d", held, wantHeld)
		}
	}
	check(1)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	check(0)
}
