package bulwark

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// routeOf reports the pattern of the route the Transport picks for a
// request, "" for none, by finding the stack routeStack returned among the
// host's route stacks.
func routeOf(t *testing.T, tr *Transport, req *http.Request) string {
	t.Helper()
	hs := tr.lookup(req.URL)
	got := tr.routeStack(hs, req)
	if got == nil {
		return ""
	}
	for i := range hs.routes {
		if rs := hs.routes[i].Load(); rs != nil && rs == got {
			return rs.pattern
		}
	}
	t.Fatalf("routeStack(%s %s) returned a stack that is no route's", req.Method, req.URL)
	return ""
}

// TestRoutePrecedence checks that a request's route is the one ServeMux's
// precedence picks: host-specific over host-less, method-specific over any
// method (GET covering HEAD), literal over wildcard, {$} for the exact
// path only, and no route where ServeMux would redirect.
func TestRoutePrecedence(t *testing.T) {
	patterns := []string{
		"POST api.example.com/v1/charges",
		"/v1/charges",
		"GET /v1/rates/{id}",
		"GET /v1/rates/latest",
		"/static/",
		"api.example.com/static/",
		"/{$}",
		"/files/{path...}",
	}
	routes := map[string]Policy{}
	for _, p := range patterns {
		routes[p] = Policy{}
	}
	tr := mustNew(t, Config{Base: &statusBase{codes: []int{200}}, Routes: routes})
	// Rounds: from the mux twice (a path is remembered the second time it
	// is seen), from the memo, after 2,000 paths seen once (which are not
	// remembered), and after 2,000 paths seen twice have replaced the memo's
	// entries.
	others := func(times int) {
		for i := range 2000 {
			req, _ := http.NewRequest("GET", fmt.Sprintf("http://h%d.example.com/v1/rates/%d", i%7, i), nil)
			for range times {
				if got := routeOf(t, tr, req); got != "GET /v1/rates/{id}" {
					t.Fatalf("route of %s = %q", req.URL, got)
				}
			}
		}
	}
	for round := range 5 {
		switch round {
		case 3:
			others(1)
		case 4:
			others(2)
		}
		checkRoutes(t, tr)
	}
}

func checkRoutes(t *testing.T, tr *Transport) {
	t.Helper()
	for _, tc := range []struct {
		method, url, want string
	}{
		{"POST", "http://api.example.com/v1/charges", "POST api.example.com/v1/charges"},
		{"POST", "https://api.example.com:8443/v1/charges", "POST api.example.com/v1/charges"}, // the port is not matched
		{"GET", "http://api.example.com/v1/charges", "/v1/charges"},                            // the host pattern is POST only
		{"POST", "http://other.example.com/v1/charges", "/v1/charges"},
		{"GET", "http://api.example.com/v1/rates/42", "GET /v1/rates/{id}"},
		{"HEAD", "http://api.example.com/v1/rates/42", "GET /v1/rates/{id}"}, // GET matches HEAD
		{"POST", "http://api.example.com/v1/rates/42", ""},
		{"GET", "http://api.example.com/v1/rates/latest", "GET /v1/rates/latest"}, // literal beats wildcard
		{"GET", "http://api.example.com/static/css/a.css", "api.example.com/static/"},
		{"GET", "http://cdn.example.com/static/css/a.css", "/static/"},
		{"GET", "http://cdn.example.com/static", ""}, // ServeMux would redirect to /static/
		{"GET", "http://cdn.example.com/", "/{$}"},
		{"GET", "http://cdn.example.com/other", ""}, // {$} is the exact path only
		{"PUT", "http://cdn.example.com/files/a/b/c", "/files/{path...}"},
		{"GET", "http://cdn.example.com/v1/../v1/charges", ""}, // unclean: ServeMux would redirect
	} {
		req, err := http.NewRequest(tc.method, tc.url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := routeOf(t, tr, req); got != tc.want {
			t.Errorf("route of %s %s = %q, want %q", tc.method, tc.url, got, tc.want)
		}
	}

	// Without Host set (a hand-made request), the URL's host is matched.
	req := &http.Request{Method: "POST", URL: mustURL(t, "http://api.example.com/v1/charges"), Header: http.Header{}}
	if got := routeOf(t, tr, req); got != "POST api.example.com/v1/charges" {
		t.Errorf("route of a request without Host = %q, want the host's pattern", got)
	}
}

// TestRoutePolicies checks that a route's policy applies to its requests
// and inherits the rest from its host's: no retries on charges, the
// upstream's retries elsewhere, and a breaker per route.
func TestRoutePolicies(t *testing.T) {
	base := &statusBase{codes: []int{503}}
	tr := mustNew(t, Config{
		Base:      base,
		Upstreams: map[string]Policy{"api.example.com": {Retry: Retry{MaxAttempts: 3, Base: 1, Cap: 1}}},
		Routes:    map[string]Policy{"POST /v1/charges": {Retry: Retry{Disabled: true}}},
	})
	count := func(method, url string) int {
		t.Helper()
		base.mu.Lock()
		before := len(base.reqs)
		base.mu.Unlock()
		if _, err := sendOnce(t, tr, method, url); err != nil {
			t.Fatalf("%s %s: %v", method, url, err)
		}
		base.mu.Lock()
		defer base.mu.Unlock()
		return len(base.reqs) - before
	}
	if n := count("POST", "http://api.example.com/v1/charges"); n != 1 {
		t.Errorf("attempts on the no-retry route = %d, want 1", n)
	}
	if n := count("GET", "http://api.example.com/v1/rates"); n != 3 {
		t.Errorf("attempts on the host's policy = %d, want 3 (the upstream's MaxAttempts)", n)
	}
	s := tr.Snapshot().Host("api.example.com:80")
	if len(s) != 1 || len(s[0].Routes) != 1 {
		t.Fatalf("snapshot = %+v, want one host with one route", s)
	}
	r := s[0].Routes[0]
	if r.Pattern != "POST /v1/charges" || r.Breaker == nil || r.Breaker.Calls != 1 {
		t.Errorf("route snapshot = %+v, want its own breaker with 1 call", r)
	}
	if s[0].Breaker.Calls != 3 {
		t.Errorf("host breaker calls = %d, want 3: the route's call is not the host's", s[0].Breaker.Calls)
	}
}

// TestRouteSharesBulkhead checks that a host's routes share its bulkhead:
// a request held on a route fills the host's one slot.
func TestRouteSharesBulkhead(t *testing.T) {
	hold, entered := make(chan struct{}), make(chan struct{})
	base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		if strings.HasPrefix(req.URL.Path, "/slow") {
			entered <- struct{}{}
			<-hold
		}
		return &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody, Request: req}, nil
	})
	tr := mustNew(t, Config{
		Base:    base,
		Default: Policy{Bulkhead: Bulkhead{MaxConcurrent: 1}, Retry: Retry{Disabled: true}},
		Routes:  map[string]Policy{"/slow": {Timeout: Timeout{Attempt: 1e9}}},
	})
	// Built here: the goroutine below only reports.
	held, err := http.NewRequestWithContext(t.Context(), "GET", "http://api.example.com/slow", nil)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		resp, err := tr.RoundTrip(held)
		if err != nil {
			t.Errorf("held request: %v", err)
			return
		}
		resp.Body.Close()
	})
	<-entered
	_, err = sendOnce(t, tr, "GET", "http://api.example.com/fast")
	close(hold)
	wg.Wait()
	if !errors.Is(err, ErrBulkheadFull) {
		t.Errorf("request beside a held route request: err = %v, want ErrBulkheadFull", err)
	}
}

func TestRouteConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name   string
		routes map[string]Policy
		want   string // in the error text
	}{
		{"malformed", map[string]Policy{"GET /{x": {}}, `route "GET /{x"`},
		{"conflict", map[string]Policy{"GET /v1/rates/{id}": {}, "/v1/rates/latest": {}}, "conflicts"},
		{"per host field", map[string]Policy{"/x": {Bulkhead: Bulkhead{MaxConcurrent: 3}}}, "Bulkhead"},
		{"pushback", map[string]Policy{"/x": {Retry: Retry{NoPushback: true}}}, "Retry.NoPushback"},
		{"bad value", map[string]Policy{"/x": {Retry: Retry{MaxAttempts: -1}}}, "Retry.MaxAttempts"},
		{"switches", map[string]Policy{"/x": {Fault: Fault{Enabled: true, Disabled: true}}}, "Fault.Enabled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(Config{Routes: tc.routes})
			var ce *ConfigError
			if !errors.As(err, &ce) || !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("New = %v, want a *ConfigError", err)
			}
			if ce.Route == "" || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New = %q (Route %q), want it to name the route and contain %q", err, ce.Route, tc.want)
			}
		})
	}
	// A route's value is checked against every parent it can inherit from.
	_, err := New(Config{
		Upstreams: map[string]Policy{"a.example.com": {Timeout: Timeout{Total: 1e9}}},
		Routes:    map[string]Policy{"/x": {Timeout: Timeout{Attempt: 2e9}}},
	})
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Upstream != "a.example.com" || ce.Route != "/x" {
		t.Errorf("New with a route invalid under one upstream = %v, want a ConfigError naming both", err)
	}
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func TestRouteContract(t *testing.T) {
	runContract(t, func(base http.RoundTripper) http.RoundTripper {
		// The contract's requests go to /x and /c: one through a route's
		// stack, one through the host's.
		return mustNew(t, Config{Base: base, Default: Policy{Bulkhead: Bulkhead{MaxConcurrent: 4}},
			Routes: map[string]Policy{"/x": {Retry: Retry{MaxAttempts: 2}, Timeout: Timeout{Attempt: time.Second}}}})
	})
}

// TestRouteControlBreaker checks that ControlBreaker reaches the breakers
// of a host's routes, those built before the control and after it.
func TestRouteControlBreaker(t *testing.T) {
	tr := mustNew(t, Config{Base: &statusBase{codes: []int{200}},
		Routes: map[string]Policy{"/a": {Retry: Retry{Disabled: true}}, "/b": {Retry: Retry{Disabled: true}}}})
	if _, err := sendOnce(t, tr, "GET", "http://api.example.com/a"); err != nil {
		t.Fatal(err)
	}
	if err := tr.ControlBreaker("api.example.com:80", BreakerForceOpen); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/a", "/b"} {
		if _, err := sendOnce(t, tr, "GET", "http://api.example.com"+path); !errors.Is(err, ErrBreakerOpen) {
			t.Errorf("GET %s with the host forced open: err = %v, want ErrBreakerOpen", path, err)
		}
	}
}

// TestRouteUpdate: Update replaces the route table; a host built before it
// serves the new routes' policies, and one Update never races a lookup.
func TestRouteUpdate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &statusBase{codes: []int{503}}
		cfg := Config{Base: base, Default: Policy{Breaker: Breaker{Disabled: true}},
			Routes: map[string]Policy{"GET /once": {Retry: Retry{MaxAttempts: 1}}}}
		tr := mustNew(t, cfg)
		if _, err := sendOnce(t, tr, http.MethodGet, "http://h.test/once"); err != nil || base.sent() != 1 {
			t.Fatalf("before Update: err %v, sent %d; want 1 send", err, base.sent())
		}
		cfg.Routes = map[string]Policy{"GET /once": {Retry: Retry{MaxAttempts: 2}}}
		if err := tr.Update(cfg); err != nil {
			t.Fatal(err)
		}
		base.reqs = nil
		if _, err := sendOnce(t, tr, http.MethodGet, "http://h.test/once"); err != nil || base.sent() != 2 {
			t.Fatalf("after Update: err %v, sent %d; want 2 sends under the new route", err, base.sent())
		}
	})
}

// TestRoutesMuxGo121: under GODEBUG=httpmuxgo121=1 ServeMux reads patterns
// by the Go 1.21 rules, where "GET /v1/rates/{id}" is a host "GET " and a
// literal path; New refuses Routes there. net/http reads the setting when
// the process starts, so the test runs itself again with it set.
func TestRoutesMuxGo121(t *testing.T) {
	cfg := Config{Routes: map[string]Policy{"GET /v1/rates/{id}": {}}}
	if os.Getenv("BULWARK_TEST_MUX121") == "1" {
		if !muxGo121() {
			t.Fatal("muxGo121() = false under GODEBUG=httpmuxgo121=1")
		}
		_, err := New(cfg)
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Route != "GET /v1/rates/{id}" || !strings.Contains(ce.Reason, "httpmuxgo121") {
			t.Fatalf("New = %v, want a ConfigError naming the route and the setting", err)
		}
		if _, err := New(Config{}); err != nil {
			t.Fatalf("New without Routes = %v, want it to work under the old rules", err)
		}
		return
	}
	if muxGo121() {
		t.Fatal("muxGo121() = true without the setting")
	}
	if _, err := New(cfg); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestRoutesMuxGo121$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "GODEBUG=httpmuxgo121=1", "BULWARK_TEST_MUX121=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestRoutesMuxGo121") {
		t.Fatalf("under GODEBUG=httpmuxgo121=1: %v\n%s", err, out)
	}
}

// TestRouteObserved: a call that matched a route carries the route's
// pattern as bulwark.route on its metrics and spans, never its path; a call
// that matched none carries no bulwark.route.
func TestRouteObserved(t *testing.T) {
	const pattern = "GET /v1/rates/{id}"
	k := newOtelKit(t)
	cfg := k.config(&statusBase{codes: []int{200}})
	cfg.Routes = map[string]Policy{pattern: {Fault: Fault{AbortStatus: 503, AbortRate: 1}}}
	tr := mustNew(t, cfg)
	for _, path := range []string{"/v1/rates/eur", "/v1/rates/usd", "/v1/other"} {
		if _, err := sendOnce(t, tr, "GET", "http://fx.test"+path); err != nil {
			t.Fatal(err)
		}
	}
	rm := k.collect(t)
	// byRoute sums a counter's points by their bulwark.route ("" for none).
	byRoute := func(name string) map[string]int64 {
		out := map[string]int64{}
		m := findMetric(rm, name)
		if m == nil {
			t.Fatalf("no metric %s", name)
		}
		for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
			v, _ := dp.Attributes.Value(keyRoute)
			out[v.AsString()] += dp.Value
		}
		return out
	}
	if got := byRoute("bulwark.requests"); len(got) != 2 || got[pattern] != 2 || got[""] != 1 {
		t.Errorf("bulwark.requests by route = %v, want 2 under %q and 1 without", got, pattern)
	}
	if got := byRoute("bulwark.faults"); len(got) != 1 || got[pattern] != 2 {
		t.Errorf("bulwark.faults by route = %v, want the route's 2 aborts", got)
	}
	if got := counter(t, rm, "bulwark.faults", keyUpstream.String("default"), keyRoute.String(pattern), keyFault.String(faultAbort)); got != 2 {
		t.Errorf("bulwark.faults{default, %s, abort} = %d, want 2", pattern, got)
	}
	for _, name := range []string{spanRequest, "GET"} {
		spans := spansNamed(k.sr, name)
		if len(spans) != 3 {
			t.Fatalf("%d %q spans, want 3", len(spans), name)
		}
		for i, s := range spans {
			v, ok := attr(s, keyRoute)
			switch {
			case i < 2 && (!ok || v.AsString() != pattern):
				t.Errorf("%q span of call %d: bulwark.route = %v, %v; want %q", name, i, v.AsString(), ok, pattern)
			case i == 2 && ok:
				t.Errorf("%q span of the unrouted call: bulwark.route = %q, want none", name, v.AsString())
			}
		}
	}
}

// TestRouteMemoAdmission: a path is remembered the second time it is
// seen, so paths seen once (an ID in each) leave the memo as it was.
func TestRouteMemoAdmission(t *testing.T) {
	tr := mustNew(t, Config{Base: &statusBase{codes: []int{200}}, Routes: map[string]Policy{"GET /v1/rates/{id}": {}}})
	hs := tr.lookup(mustURL(t, "http://api.test/"))
	entries := func() (n int) {
		for i := range hs.table.memo.slots {
			if hs.table.memo.slots[i].Load() != nil {
				n++
			}
		}
		return n
	}
	hot, _ := http.NewRequest("GET", "http://api.test/v1/rates/latest", nil)
	for i := range 2 {
		if routeOf(t, tr, hot) != "GET /v1/rates/{id}" {
			t.Fatal("no route for the hot path")
		}
		if n := entries(); n != i {
			t.Fatalf("after %d sightings, %d memo entries, want %d", i+1, n, i)
		}
	}
	for i := range 5000 {
		req, _ := http.NewRequest("GET", fmt.Sprintf("http://api.test/v1/rates/%d", i), nil)
		if routeOf(t, tr, req) != "GET /v1/rates/{id}" {
			t.Fatalf("no route for %s", req.URL)
		}
	}
	if n := entries(); n != 1 {
		t.Errorf("after 5,000 paths seen once, %d memo entries, want the hot path's alone", n)
	}
	if allocs := testing.AllocsPerRun(100, func() { hs.table.lookup(hot) }); allocs != 0 {
		t.Errorf("a remembered path's lookup allocates %.0f times, want 0", allocs)
	}
}

// TestRouteMemoBoundedInBytes: the route memo is bounded in bytes, not
// only in entries: 600 distinct 32 KiB paths, each sent twice (so each is
// admitted past the doorkeeper), leave it holding at most 1 MiB of keys,
// while a short path sent twice is still remembered.
func TestRouteMemoBoundedInBytes(t *testing.T) {
	ok := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody, Request: req}, nil
	})
	tr := mustNew(t, Config{Base: ok, Routes: map[string]Policy{"GET /a/": {}}})
	long := strings.Repeat("x", 32<<10)
	for i := range 600 {
		for range 2 {
			if _, err := sendOnce(t, tr, "GET", fmt.Sprintf("http://api.test/a/%d/%s", i, long)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for range 2 {
		_, _ = sendOnce(t, tr, "GET", "http://api.test/a/short")
	}
	hs := tr.lookup(&url.URL{Scheme: "http", Host: "api.test"})
	var bytes, entries int
	var short bool
	for i := range hs.table.memo.slots {
		if m := hs.table.memo.slots[i].Load(); m != nil {
			entries++
			bytes += len(m.method) + len(m.host) + len(m.path) + len(m.rawPath)
			short = short || m.path == "/a/short"
		}
	}
	if bytes > 1<<20 || !short {
		t.Fatalf("memo holds %d entries, %d bytes of keys, the short path: %v; want at most 1 MiB, the short path kept", entries, bytes, short)
	}
}
