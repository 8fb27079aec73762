package bulwark

import (
	"errors"
	"math"
	"net/http"
	"net/url"
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
