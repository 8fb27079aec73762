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
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fleet is a set of loopback instances of one logical upstream.
type fleet struct {
	srvs      []*httptest.Server
	addrs     []string
	hits      []atomic.Int64 // requests served, per instance
	conns     []atomic.Int64 // connections accepted, per instance
	wrongHost atomic.Int64   // requests whose Host was not the logical name
	mu        sync.Mutex
	calls     map[string][]int // X-Call → instances that served it, in order
}

// newFleet starts n instances; status(i) is what instance i answers.
func newFleet(t *testing.T, n int, logical string, status func(i int) int) *fleet {
	t.Helper()
	f := &fleet{hits: make([]atomic.Int64, n), conns: make([]atomic.Int64, n), calls: map[string][]int{}}
	for i := 0; i < n; i++ {
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			f.hits[i].Add(1)
			if r.Host != logical {
				f.wrongHost.Add(1)
			}
			if c := r.Header.Get("X-Call"); c != "" {
				f.mu.Lock()
				f.calls[c] = append(f.calls[c], i)
				f.mu.Unlock()
			}
			w.WriteHeader(status(i))
			io.WriteString(w, "ok")
		}))
		srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				f.conns[i].Add(1)
			}
		}
		srv.Start()
		t.Cleanup(srv.Close)
		f.srvs = append(f.srvs, srv)
		f.addrs = append(f.addrs, srv.Listener.Addr().String())
	}
	return f
}

// balancedTransport builds a Transport whose upstream "tax.internal" has p
// (Endpoints filled in by the caller), an injected clock, retries that do
// not sleep, a seeded picker and a log buffer. It returns the logical
// host's balancer too.
func balancedTransport(t *testing.T, base http.RoundTripper, p Policy) (*Transport, *fakeClock, *balancerRT, *syncBuffer) {
	t.Helper()
	logs := new(syncBuffer)
	tr := mustNew(t, Config{
		Base:      base,
		Upstreams: map[string]Policy{"tax.internal": p},
		Logger:    slog.New(slog.NewTextHandler(logs, nil)),
	})
	clk := newFakeClock()
	tr.setClock(clk.now)
	tr.retry.sleep = func(ctx context.Context, _ time.Duration) error { return ctx.Err() }
	t.Cleanup(tr.CloseIdleConnections)
	u, _ := url.Parse("http://tax.internal/rate")
	bal := tr.lookup(u).balancer
	if bal == nil {
		t.Fatal("no balancer for tax.internal")
	}
	var mu sync.Mutex
	rng := mrand.New(mrand.NewPCG(1, 2))
	bal.randN = func(n uint64) uint64 {
		mu.Lock()
		defer mu.Unlock()
		return rng.Uint64N(n)
	}
	return tr, clk, bal, logs
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
	const sick = 2
	f := newFleet(t, 5, "tax.internal", func(i int) int {
		if i == sick {
			return http.StatusInternalServerError
		}
		return http.StatusOK
	})
	tr, clk, _, logs := balancedTransport(t, nil, Policy{Endpoints: Endpoints{Addrs: f.addrs}})
	c := &http.Client{Transport: tr}

	const calls = 1000
	ok := 0
	for i := 0; i < calls; i++ {
		if st, err := getTax(t, c, ""); err == nil && st == http.StatusOK {
			ok++
		}
	}
	if got := f.hits[sick].Load(); got != DefaultConsecutiveFailures {
		t.Errorf("sick instance served %d requests, want %d (ejected after its consecutive failures)", got, DefaultConsecutiveFailures)
	}
	if rate := float64(ok) / calls; rate < 0.99 {
		t.Errorf("success rate %.3f, want ≥ 0.99", rate)
	}
	for i := range f.addrs {
		if i != sick && f.hits[i].Load() < calls/10 {
			t.Errorf("healthy instance %d served only %d of %d", i, f.hits[i].Load(), calls)
		}
	}
	s := stateOf(t, tr, f.addrs[sick])
	if !s.Ejected || s.Ejections != 1 || !s.EjectedUntil.Equal(clk.now().Add(DefaultBaseEjection)) {
		t.Fatalf("sick state = %+v, want ejected once until now+%v", s, DefaultBaseEjection)
	}
	checkCounts(t, tr, f)
	connsAtEjection := f.conns[sick].Load()

	// Its time served, it returns, fails again, and is out twice as long.
	clk.advance(DefaultBaseEjection)
	for i := 0; i < 500 && f.hits[sick].Load() < 2*DefaultConsecutiveFailures; i++ {
		getTax(t, c, "")
	}
	s = stateOf(t, tr, f.addrs[sick])
	if !s.Ejected || s.Ejections != 2 || !s.EjectedUntil.Equal(clk.now().Add(2*DefaultBaseEjection)) {
		t.Fatalf("after return: sick state = %+v, want ejected twice until now+%v", s, 2*DefaultBaseEjection)
	}
	if f.hits[sick].Load() != 2*DefaultConsecutiveFailures {
		t.Errorf("sick instance served %d requests in all, want %d", f.hits[sick].Load(), 2*DefaultConsecutiveFailures)
	}
	for i := 0; i < 100; i++ {
		getTax(t, c, "")
	}
	if f.hits[sick].Load() != 2*DefaultConsecutiveFailures {
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
}

func TestBalancerAllSickBreakerOpens(t *testing.T) {
	f := newFleet(t, 5, "tax.internal", func(int) int { return http.StatusInternalServerError })
	tr, _, _, _ := balancedTransport(t, nil, Policy{
		Endpoints: Endpoints{Addrs: f.addrs},
		Breaker:   Breaker{MinCalls: 20},
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
}

func TestBalancerRetriesElsewhere(t *testing.T) {
	// Two of five always answer 503: a call that meets both still ends on
	// a healthy instance in three attempts, if no attempt repeats one.
	f := newFleet(t, 5, "tax.internal", func(i int) int {
		if i < 2 {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	})
	tr, _, _, _ := balancedTransport(t, nil, Policy{
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
}

func TestBalancerPickAvoidsTried(t *testing.T) {
	for _, rr := range []bool{false, true} {
		tr := mustNew(t, Config{})
		b := testBalancer(t, tr, &stubBase{}, Endpoints{Addrs: []string{"10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"}, RoundRobin: rr})
		set := b.set.Load()
		for trial := 0; trial < 50; trial++ {
			var st callState
			seen := map[uint32]bool{}
			for k := 0; k < 3; k++ {
				in := b.pick(set, &st)
				if seen[in.id] {
					t.Fatalf("rr=%v: attempt %d repeated %s", rr, k+1, in.addr)
				}
				seen[in.id] = true
				st.markTried(in.id)
			}
			// Everything tried: any instance will do, but one is picked.
			if b.pick(set, &st) == nil {
				t.Fatal("nil pick")
			}
		}
	}
}

func TestBalancerPrefersLessLoaded(t *testing.T) {
	tr := mustNew(t, Config{})
	b := testBalancer(t, tr, &stubBase{}, Endpoints{Addrs: []string{"10.0.0.1:80", "10.0.0.2:80"}})
	set := b.set.Load()
	set.all[0].inflight.Store(5)
	for i := 0; i < 20; i++ {
		if in := b.pick(set, nil); in != set.all[1] {
			t.Fatalf("picked %s with %d in flight over one with none", in.addr, in.inflight.Load())
		}
	}
}

// testBalancer builds the balancer layer alone for "tax.internal:80".
func testBalancer(t testing.TB, tr *Transport, base http.RoundTripper, e Endpoints) *balancerRT {
	t.Helper()
	tr.base = base
	p := Policy{Endpoints: e}.withDefaults()
	if err := p.validate(); err != nil {
		t.Fatal(err)
	}
	hs := &hostState{t: tr, key: hostKey{"http", "tax.internal", "80"}, name: "tax.internal:80", upstream: "tax.internal", policy: &p}
	return newBalancerRT(hs, tr.instanceStack)
}

func TestBalancerSuccessRate(t *testing.T) {
	clk := newFakeClock()
	tr := mustNew(t, Config{})
	tr.setClock(clk.now)
	addrs := []string{"10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80", "10.0.0.4:80", "10.0.0.5:80", "10.0.0.6:80"}
	b := testBalancer(t, tr, &stubBase{}, Endpoints{Addrs: addrs})
	all := b.set.Load().all
	for i, in := range all {
		in.reqs.Store(200)
		if i == 0 {
			in.fails.Store(100) // 50 %, never five in a row
		}
	}
	all[5].reqs.Store(50) // below the volume: not compared
	clk.advance(DefaultOutlierInterval)
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
	clk.advance(DefaultOutlierInterval)
	b.sweep(t.Context(), clk.now())
	if all[1].ejected {
		t.Error("ejected on the success rate of four instances")
	}
	// Returned, and healthy for as long as it was out: its count drops.
	clk.advance(DefaultBaseEjection)
	b.sweep(t.Context(), clk.now())
	if all[0].ejected || all[0].times != 1 {
		t.Fatalf("after its time: ejected=%v times=%d", all[0].ejected, all[0].times)
	}
	for i := 0; i < 3; i++ {
		clk.advance(DefaultOutlierInterval)
		b.sweep(t.Context(), clk.now())
	}
	if all[0].times != 0 {
		t.Errorf("times = %d after %v healthy, want 0", all[0].times, 3*DefaultOutlierInterval)
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
	fr := &fakeResolver{called: make(chan struct{}, 1)}
	fr.set(nil, errors.New("fake: no such host"))
	base := &hostsBase{hosts: map[string]int{}}
	tr, clk, b, logs := balancedTransport(t, base, Policy{Endpoints: Endpoints{Resolver: fr}})
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
		select {
		case <-fr.called:
		case <-time.After(10 * time.Second):
			t.Fatal("no background resolve")
		}
		for i := 0; i < 1000 && b.resolving.Load(); i++ {
			time.Sleep(time.Millisecond)
		}
		if b.resolving.Load() {
			t.Fatal("background resolve did not finish")
		}
	}
	fr.set(nil, errors.New("fake: SERVFAIL"))
	clk.advance(DefaultResolveEvery)
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
	clk.advance(DefaultResolveEvery)
	getTax(t, c, "")
	waitRefresh()
	before := base.hosts["10.0.0.3:80"]
	for i := 0; i < 10; i++ {
		getTax(t, c, "")
	}
	if got := base.hosts["10.0.0.3:80"] - before; got != 10 {
		t.Errorf("%d of 10 requests went to the new set's instance (hosts %v)", got, base.hosts)
	}
	if fr.names[0] != "tax.internal:80" {
		t.Errorf("resolver asked for %q, want the logical host:port", fr.names[0])
	}
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
		return testBalancer(t, mustNew(t, Config{}), base, Endpoints{Addrs: []string{"10.0.0.1:80", "10.0.0.2:80"}})
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
		bal := testBalancer(b, mustNew(b, Config{}), &stubBase{}, Endpoints{Addrs: addrs, RoundRobin: rr})
		set := bal.set.Load()
		b.Run(name+"/first", func(b *testing.B) {
			b.ReportAllocs()
			var st callState
			for b.Loop() {
				st.ntried = 0
				in := bal.pick(set, &st)
				st.markTried(in.id)
			}
		})
		b.Run(name+"/retry", func(b *testing.B) {
			b.ReportAllocs()
			var st callState
			for b.Loop() {
				st.ntried = 0
				st.markTried(set.active[0].id)
				st.markTried(set.active[1].id)
				in := bal.pick(set, &st)
				st.markTried(in.id)
			}
		})
		b.Run(name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				var st callState
				for pb.Next() {
					st.ntried = 0
					in := bal.pick(set, &st)
					st.markTried(in.id)
				}
			})
		})
	}
	// The whole layer over a stub base, with the layers below it off:
	// pick, clock read, request copy, outcome and in-flight accounting.
	tr := mustNew(b, Config{})
	bal := testBalancer(b, tr, wrappedBenchBase{}, Endpoints{Addrs: addrs})
	bal.hs.policy.Bulkhead.Disabled = true
	bal.hs.policy.Timeout.Disabled = true
	bal.install(nil, tr.now()) // rebuild the instances without those layers
	bal.install(addrs, tr.now())
	req, _ := http.NewRequest(http.MethodGet, "http://tax.internal/rate", nil)
	b.Run("layer", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			resp, err := bal.RoundTrip(req)
			if err != nil {
				b.Fatal(err)
			}
			resp.Body.Close()
		}
	})
}

// TestBalancerBulkheadStates: with Endpoints, each instance has a bulkhead
// of its own, and BulkheadStates reports each, under the logical host, with
// the instance in Endpoint: a held response shows on the instance that
// served it and nowhere else.
func TestBalancerBulkheadStates(t *testing.T) {
	f := newFleet(t, 2, "tax.internal", func(int) int { return 200 })
	tr, _, _, _ := balancedTransport(t, nil, Policy{
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
		states := tr.BulkheadStates()
		if len(states) != len(f.addrs) {
			t.Fatalf("%d bulkhead states, want one per instance (%d): %+v", len(states), len(f.addrs), states)
		}
		for _, s := range states {
			want := 0
			if s.Endpoint == served {
				want = wantHeld
			}
			if s.Host != "tax.internal:80" || s.Upstream != "tax.internal" || s.MaxConcurrent != 3 || s.InFlight != want {
				t.Errorf("state %+v: want host tax.internal:80, upstream tax.internal, 3 slots, %d held", s, want)
			}
		}
	}
	check(1)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	check(0)
}
