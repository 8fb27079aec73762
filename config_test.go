package bulwark

import (
	"errors"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

func TestNewRejectsBadConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string // substring of the error
	}{
		{"negative total", Config{Default: Policy{Timeout: Timeout{Total: -1}}},
			`bulwark: Default: Timeout.Total = -1ns: must be ≥ 0`},
		{"negative attempt in upstream", Config{Upstreams: map[string]Policy{"tax.internal": {Timeout: Timeout{Attempt: -time.Second}}}},
			`bulwark: upstream "tax.internal": Timeout.Attempt = -1s: must be ≥ 0`},
		{"attempt longer than total", Config{Upstreams: map[string]Policy{"tax.internal": {Timeout: Timeout{Total: time.Second, Attempt: 2 * time.Second}}}},
			`bulwark: upstream "tax.internal": Timeout.Attempt = 2s: must not exceed Timeout.Total (1s)`},
		{"attempt longer than inherited total", Config{Default: Policy{Timeout: Timeout{Total: time.Second}}, Upstreams: map[string]Policy{"a:81": {Timeout: Timeout{Attempt: 2 * time.Second}}}},
			`upstream "a:81": Timeout.Attempt = 2s: must not exceed Timeout.Total (1s)`},
		{"bad header name", Config{Default: Policy{Timeout: Timeout{Header: "X Bad"}}},
			`Timeout.Header = "X Bad": not a valid header name`},
		{"scheme in key", Config{Upstreams: map[string]Policy{"http://tax.internal": {}}}, `upstream "http://tax.internal": upstream key must be host or host:port, without a scheme`},
		{"path in key", Config{Upstreams: map[string]Policy{"tax.internal/rate": {}}}, `without path`},
		{"userinfo in key", Config{Upstreams: map[string]Policy{"u:p@tax.internal": {}}}, `without path, query, userinfo`},
		{"empty key", Config{Upstreams: map[string]Policy{"": {}}}, `empty upstream key`},
		{"empty port", Config{Upstreams: map[string]Policy{"tax.internal:": {}}}, `empty port`},
		{"port zero", Config{Upstreams: map[string]Policy{"tax.internal:0": {}}}, `port must be 1..65535`},
		{"port too big", Config{Upstreams: map[string]Policy{"tax.internal:70000": {}}}, `port must be 1..65535`},
		{"port not numeric", Config{Upstreams: map[string]Policy{"tax.internal:http": {}}}, `upstream key must be host or host:port`},
		{"duplicate by case", Config{Upstreams: map[string]Policy{"Tax.internal": {}, "tax.internal": {}}}, `names the same upstream as`},
		{"disabled and enabled in upstream", Config{Upstreams: map[string]Policy{"tax.internal": {Timeout: Timeout{Disabled: true, Enabled: true}}}},
			`bulwark: upstream "tax.internal": Timeout.Enabled = true: conflicts with Timeout.Disabled`},
		{"negative MaxHosts", Config{MaxHosts: -1}, `MaxHosts = -1: must be ≥ 0`},
		{"negative HostIdle", Config{HostIdle: -time.Minute}, `HostIdle = -1m0s: must be ≥ 0`},
		{"fleet rate without a fleet", Config{Upstreams: map[string]Policy{"pay": {Bulkhead: Bulkhead{FleetRate: 10}}}},
			`upstream "pay": Bulkhead.FleetRate = 10: needs a Config.Fleet that implements FleetLeaser`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr, err := New(tt.cfg)
			if err == nil {
				t.Fatalf("New(%s) = %v, nil; want an error", tt.name, tr)
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("New error %v does not match ErrInvalidConfig", err)
			}
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Errorf("New error %T is not a *ConfigError", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New error = %q, want it to contain %q", err, tt.want)
			}
			if _, cerr := NewClient(tt.cfg); cerr == nil {
				t.Errorf("NewClient accepted what New refused")
			}
			if verr := tt.cfg.Validate(); verr == nil || verr.Error() != err.Error() {
				t.Errorf("Validate = %v, want New's error %v", verr, err)
			}
		})
	}
}

func TestNewAcceptsGoodConfig(t *testing.T) {
	for _, cfg := range []Config{
		{},
		{Default: Policy{Timeout: Timeout{Disabled: true}}},
		{Upstreams: map[string]Policy{"tax.internal": {}, "tax.internal:8443": {}, "[::1]:8080": {}, "127.0.0.1": {}}},
		{Default: Policy{Timeout: Timeout{Total: time.Second, Attempt: time.Second, Header: "x-deadline-ms"}}},
	} {
		if _, err := New(cfg); err != nil {
			t.Errorf("New(%+v) = %v, want nil error", cfg, err)
		}
		if err := cfg.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v, want nil error", cfg, err)
		}
	}
}

func TestPolicyInheritance(t *testing.T) {
	tr, err := New(Config{
		Default: Policy{Timeout: Timeout{Total: 4 * time.Second, Header: "X-Deadline"}},
		Upstreams: map[string]Policy{
			"tax.internal":      {Timeout: Timeout{Attempt: 150 * time.Millisecond}},
			"tax.internal:8443": {Timeout: Timeout{Disabled: true}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		url      string
		upstream string
		want     Timeout
	}{
		// Default: Attempt is learned, under the package default capped at
		// Total, and BodyIdle takes that ceiling; Total, set (in Default),
		// bounds the body.
		{"http://other.internal/", "default", Timeout{Total: 4 * time.Second, Attempt: 4 * time.Second, BodyIdle: 4 * time.Second, Header: "X-Deadline", totalSet: true, learn: true}},
		// Host key, any port; inherits Total and Header from Default.
		{"http://tax.internal/rate", "tax.internal", Timeout{Total: 4 * time.Second, Attempt: 150 * time.Millisecond, BodyIdle: 150 * time.Millisecond, Header: "X-Deadline", totalSet: true}},
		{"https://TAX.internal:9000/rate", "tax.internal", Timeout{Total: 4 * time.Second, Attempt: 150 * time.Millisecond, BodyIdle: 150 * time.Millisecond, Header: "X-Deadline", totalSet: true}},
		// Exact host:port wins over the host key.
		{"https://tax.internal:8443/rate", "tax.internal:8443", Timeout{Total: 4 * time.Second, Attempt: 4 * time.Second, BodyIdle: 4 * time.Second, Header: "X-Deadline", Disabled: true, totalSet: true, learn: true}},
	}
	for _, tt := range tests {
		u, _ := url.Parse(tt.url)
		hs := tr.lookup(u)
		if hs.upstream != tt.upstream {
			t.Errorf("route(%s) = upstream %q, want %q", tt.url, hs.upstream, tt.upstream)
		}
		if hs.policy.Timeout != tt.want {
			t.Errorf("route(%s).Timeout = %+v, want %+v", tt.url, hs.policy.Timeout, tt.want)
		}
	}
}

func TestDefaultPortRouting(t *testing.T) {
	tr, err := New(Config{Upstreams: map[string]Policy{
		"tax.internal:80": {Timeout: Timeout{Attempt: time.Second}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		url, upstream string
	}{
		{"http://tax.internal/", "tax.internal:80"},
		{"http://tax.internal:80/", "tax.internal:80"},
		{"https://tax.internal/", "default"}, // port 443
	} {
		u, _ := url.Parse(tt.url)
		if got := tr.lookup(u).upstream; got != tt.upstream {
			t.Errorf("route(%s) = %q, want %q", tt.url, got, tt.upstream)
		}
	}
}

// Per authority: two ports of one host are two hosts with two states.
func TestHostStatePerAuthority(t *testing.T) {
	tr, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := url.Parse("http://127.0.0.1:8080/x")
	b, _ := url.Parse("http://127.0.0.1:9090/x")
	a2, _ := url.Parse("http://127.0.0.1:8080/y?q=1")
	c, _ := url.Parse("https://127.0.0.1:8080/x")
	if tr.lookup(a) == tr.lookup(b) {
		t.Error("127.0.0.1:8080 and 127.0.0.1:9090 share state")
	}
	if tr.lookup(a) != tr.lookup(a2) {
		t.Error("two URLs of one authority got two states")
	}
	if tr.lookup(a) == tr.lookup(c) {
		t.Error("http and https on one host:port share state")
	}
	if n := tr.hostCount(); n != 3 {
		t.Errorf("hostCount = %d, want 3", n)
	}
}

func TestHostStateBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, err := New(Config{MaxHosts: 64, HostIdle: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		hot, _ := url.Parse("http://hot.internal/")
		hotState := tr.lookup(hot)
		for i := 0; i < 10_000; i++ {
			// A churn of one new host per millisecond, while the hot host is
			// used every 20 ms.
			time.Sleep(time.Millisecond)
			tr.lookup(&url.URL{Scheme: "http", Host: "h" + strconv.Itoa(i) + ".example:80"})
			if i%20 == 0 {
				if tr.lookup(hot) != hotState {
					t.Fatalf("after %d hosts, a host in steady use lost its state to the churn", i+1)
				}
			}
			if n := tr.hostCount(); n > 64 {
				t.Fatalf("after %d hosts, hostCount = %d > MaxHosts 64", i+1, n)
			}
		}
		// Fill to the cap exactly; then, after HostIdle with no requests, one new
		// host clears every idle one instead of the least recently used alone.
		for i := 0; tr.hostCount() < 64; i++ {
			tr.lookup(&url.URL{Scheme: "http", Host: "fill" + strconv.Itoa(i) + ".example"})
		}
		time.Sleep(2 * time.Minute)
		tr.lookup(&url.URL{Scheme: "http", Host: "fresh.example"})
		if n := tr.hostCount(); n != 1 {
			t.Errorf("after HostIdle at the cap, hostCount = %d, want 1 (the new host only)", n)
		}
	})
}

// TestLastHostFastPath: the last-host shortcut in lookup gives the same
// state as the map for every spelling of a host, and never an evicted one.
func TestLastHostFastPath(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, err := New(Config{MaxHosts: 8, HostIdle: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		a := &url.URL{Scheme: "http", Host: "a.example"}
		hs := tr.lookup(a)
		if tr.last.Load() != hs {
			t.Fatal("the host just looked up is not the last one")
		}
		for _, u := range []*url.URL{
			{Scheme: "http", Host: "A.EXAMPLE"},
			{Scheme: "HTTP", Host: "a.example:80"},
			{Scheme: "http", Host: "a.example"},
		} {
			if got := tr.lookup(u); got != hs {
				t.Errorf("%s://%s: another state than a.example's", u.Scheme, u.Host)
			}
		}
		if tr.last.Load() != hs {
			t.Error("other spellings displaced the state's own from the fast path")
		}
		// Seven more hosts fill the map; a.example, looked up last again, then
		// idles past HostIdle, and the next new host evicts every idle one:
		// the next request for a.example must get a fresh state, not the
		// evicted one.
		for i := 0; i < 7; i++ {
			tr.lookup(&url.URL{Scheme: "http", Host: "h" + strconv.Itoa(i) + ".example"})
		}
		if tr.lookup(a) != hs || tr.hostCount() != 8 {
			t.Fatalf("a.example lost its state before the map was full (%d hosts)", tr.hostCount())
		}
		time.Sleep(2 * time.Minute)
		tr.lookup(&url.URL{Scheme: "http", Host: "new.example"})
		// A lookup that found a.example in the map just before the eviction
		// may store it on the fast path just after.
		tr.last.Store(hs)
		if got := tr.lookup(a); got == hs {
			t.Error("a.example got its evicted state back")
		}
	})
}

func TestRoundTripBadInput(t *testing.T) {
	base := &stubBase{}
	tr, err := New(Config{Base: base})
	if err != nil {
		t.Fatal(err)
	}
	var bs bodies
	req := &http.Request{Method: "POST", Header: http.Header{}, Body: bs.make("x")}
	resp, err := tr.RoundTrip(req)
	if resp != nil || !errors.Is(err, errNilURL) {
		t.Errorf("nil URL: RoundTrip = %v, %v; want nil, errNilURL", resp, err)
	}
	if !bs.allClosed() {
		t.Error("nil URL: request body not closed")
	}
	if base.calls.Load() != 0 {
		t.Error("nil URL: base was called")
	}
}

// Eviction spares a host whose requests still hold bulkhead slots, so its
// next request does not get a second bulkhead beside the first.
func TestEvictionSparesBusyHosts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &stubBase{}
		tr, err := New(Config{Base: base, MaxHosts: 16, HostIdle: time.Minute, Default: Policy{Timeout: Timeout{Disabled: true}}})
		if err != nil {
			t.Fatal(err)
		}
		busyURL, _ := url.Parse("http://busy.internal/")
		req, _ := http.NewRequest("GET", busyURL.String(), nil)
		resp, err := tr.RoundTrip(req) // holds a slot until the body is closed
		if err != nil {
			t.Fatal(err)
		}
		busy := tr.lookup(busyURL)
		time.Sleep(2 * time.Minute) // idle by the clock, but busy
		for i := 0; i < 200; i++ {
			time.Sleep(time.Millisecond)
			tr.lookup(&url.URL{Scheme: "http", Host: "churn" + strconv.Itoa(i) + ".example"})
		}
		if tr.lookup(busyURL) != busy {
			t.Error("a host with a slot held was evicted")
		}
		if in, _, _ := bulkheadStats(tr, "busy.internal:80"); in != 1 {
			t.Errorf("in flight = %d, want 1", in)
		}
		resp.Body.Close()
	})
}

func TestAdaptiveConfigErrors(t *testing.T) {
	for _, p := range []Policy{
		{Bulkhead: Bulkhead{Adaptive: true, MinConcurrent: 20, MaxConcurrent: 10}},
		{Bulkhead: Bulkhead{MinConcurrent: -1}},
		{Throttle: Throttle{Enabled: true, K: 0.5}},
		{Throttle: Throttle{Enabled: true, MaxProbability: 1.5}},
		{Throttle: Throttle{Enabled: true, MaxProbability: -0.1}},
		{Throttle: Throttle{Enabled: true, MaxProbability: math.NaN()}},
		{Throttle: Throttle{Enabled: true, Window: time.Millisecond}},
		{Throttle: Throttle{Enabled: true, Disabled: true}},
	} {
		var ce *ConfigError
		if _, err := New(Config{Default: p}); !errors.As(err, &ce) {
			t.Errorf("New(%+v) = %v, want a *ConfigError", p, err)
		}
	}
}

// TestReenable: a layer Default turns off can be turned back on for one
// upstream; both switches at once is a config error.
func TestReenable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &statusBase{codes: []int{503, 200}}
		tr := mustNew(t, Config{Base: base,
			Default:   Policy{Retry: Retry{Disabled: true}, Breaker: Breaker{Disabled: true}},
			Upstreams: map[string]Policy{"on.test": {Retry: Retry{Enabled: true}, Breaker: Breaker{Enabled: true}}},
		})
		if code, _ := sendOnce(t, tr, http.MethodGet, "http://off.test/"); code != 503 || base.sent() != 1 {
			t.Errorf("off.test: status %d after %d sends; want 503, sent once", code, base.sent())
		}
		base.reqs = nil
		if code, _ := sendOnce(t, tr, http.MethodGet, "http://on.test/"); code != 200 || base.sent() != 2 {
			t.Errorf("on.test: status %d after %d sends; want 200 after a retry", code, base.sent())
		}
		for _, h := range tr.Snapshot().Hosts {
			if on := h.Breaker != nil; on != (h.Host == "on.test:80") {
				t.Errorf("%s: breaker present = %v", h.Host, on)
			}
		}
	})
	for _, p := range []Policy{
		{Retry: Retry{Disabled: true, Enabled: true}},
		{Breaker: Breaker{Disabled: true, Enabled: true}},
		{Bulkhead: Bulkhead{Disabled: true, Enabled: true}},
		{Timeout: Timeout{Disabled: true, Enabled: true}},
		{Fallback: Fallback{Disabled: true, Enabled: true}},
		{Retry: Retry{Budget: Budget{Disabled: true, Enabled: true}}},
	} {
		_, err := New(Config{Upstreams: map[string]Policy{"x.test": p}})
		var ce *ConfigError
		if !errors.As(err, &ce) || !strings.HasSuffix(ce.Field, "Enabled") || ce.Upstream != "x.test" {
			t.Errorf("New(%+v) = %v, want a ConfigError on an Enabled field of x.test", p, err)
		}
	}
}

// TestPolicyDurationBound: a duration past maxPolicyDuration anywhere in a
// Policy is refused, naming the field, rather than overflowing later.
func TestPolicyDurationBound(t *testing.T) {
	huge := time.Duration(1<<63 - 1)
	for _, tt := range []struct {
		p     Policy
		field string
	}{
		{Policy{Timeout: Timeout{Total: huge}}, "Timeout.Total"},
		{Policy{Retry: Retry{Cap: huge}}, "Retry.Cap"},
		{Policy{Retry: Retry{Budget: Budget{Window: huge}}}, "Retry.Budget.Window"},
		{Policy{Breaker: Breaker{MaxOpenFor: huge}}, "Breaker.MaxOpenFor"},
		{Policy{Endpoints: Endpoints{Addrs: []string{"127.0.0.1:1"}, Outlier: Outlier{MaxEjection: huge}}}, "Endpoints.Outlier.MaxEjection"},
	} {
		_, err := New(Config{Upstreams: map[string]Policy{"x.test": tt.p}})
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != tt.field {
			t.Errorf("New with %s = %v: want a ConfigError on %s", tt.field, huge, err)
		}
	}
	if _, err := New(Config{Default: Policy{Timeout: Timeout{Total: maxPolicyDuration}}}); err != nil {
		t.Errorf("Timeout.Total = maxPolicyDuration: %v, want accepted", err)
	}
}
