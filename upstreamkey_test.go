package bulwark

import (
	"errors"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestUpstreamKeys: every Config.Upstreams key New accepts is a host or a
// host:port a request URL can name; any other is a *ConfigError naming
// the key, with a reason that says what to write instead.
func TestUpstreamKeys(t *testing.T) {
	tests := []struct {
		key        string
		host, port string // accepted: what the key routes by
		reason     string // refused: part of the error
	}{
		{key: "api.example.com", host: "api.example.com"},
		{key: "API.Example.COM:8443", host: "api.example.com", port: "8443"},
		{key: "api.example.com.", host: "api.example.com"},
		{key: "api.example.com.:443", host: "api.example.com", port: "443"},
		{key: "tax_internal", host: "tax_internal"},
		{key: "localhost:1", host: "localhost", port: "1"},
		{key: "x:65535", host: "x", port: "65535"},
		{key: "127.0.0.1", host: "127.0.0.1"},
		{key: "127.0.0.1:8080", host: "127.0.0.1", port: "8080"},
		{key: "[::1]", host: "::1"},
		{key: "[::1]:443", host: "::1", port: "443"},
		{key: "[2001:DB8::1]:8080", host: "2001:db8::1", port: "8080"},
		{key: "bücher.example", host: "bücher.example"},

		{key: "", reason: "empty upstream key"},
		{key: "::1", reason: `write it in brackets: "[::1]" or "[::1]:port"`},
		{key: "2001:db8::1:80", reason: `write it in brackets: "[2001:db8::1:80]" or "[2001:db8::1:80]:port"`},
		{key: "fe80::1", reason: "in brackets"},
		{key: "[::1", reason: "upstream key must be host or host:port"},
		{key: "[::1]x", reason: "upstream key must be host or host:port"},
		{key: "[::1]:", reason: "empty port"},
		{key: "[::1]:0", reason: "port must be 1..65535"},
		{key: "[127.0.0.1]", reason: "brackets hold an IPv6 address"},
		{key: "[example.com]:80", reason: "brackets hold an IPv6 address"},
		{key: "[fe80::1%25en0]", reason: "brackets hold an IPv6 address"},
		{key: "[]", reason: "brackets hold an IPv6 address"},
		{key: ":80", reason: "no host"},
		{key: ".", reason: "no host"},
		{key: "..", reason: "empty label"},
		{key: "a..b", reason: "empty label"},
		{key: ".example.com", reason: "empty label"},
		{key: "example.com..", reason: "empty label"},
		{key: "tax.internal:", reason: "empty port"},
		{key: "tax.internal:0", reason: "port must be 1..65535"},
		{key: "tax.internal:65536", reason: "port must be 1..65535"},
		{key: "tax.internal:99999999999999999999", reason: "port must be 1..65535"},
		{key: "tax.internal:080", reason: "without leading zeros"},
		{key: "tax.internal:+80", reason: "with a decimal port"},
		{key: "tax.internal:http", reason: "with a decimal port"},
		{key: "http://tax.internal", reason: "without a scheme"},
		{key: "tax.internal/rate", reason: "without path"},
		{key: "u@tax.internal", reason: "userinfo"},
		{key: "tax internal", reason: "spaces"},
		{key: "tax%2einternal", reason: "letters, digits"},
		{key: "tax!internal", reason: "letters, digits"},
		{key: "tax\x00internal", reason: "letters, digits"},
		{key: "tax\xffinternal", reason: "letters, digits"},
	}
	for _, tt := range tests {
		_, err := New(Config{Upstreams: map[string]Policy{tt.key: {}}})
		var ce *ConfigError
		if tt.reason == "" {
			if err != nil {
				t.Errorf("New with key %q: %v, want it accepted", tt.key, err)
				continue
			}
			if host, port, err := parseUpstreamKey(tt.key); err != nil || host != tt.host || port != tt.port {
				t.Errorf("parseUpstreamKey(%q) = %q, %q, %v; want %q, %q", tt.key, host, port, err, tt.host, tt.port)
			}
			continue
		}
		if !errors.As(err, &ce) || ce.Upstream != tt.key || !errors.Is(err, ErrInvalidConfig) ||
			!strings.Contains(err.Error(), tt.reason) || !strings.HasPrefix(err.Error(), "bulwark: ") {
			t.Errorf("New with key %q: %v; want a *ConfigError naming the key, with %q", tt.key, err, tt.reason)
		}
	}
}

func TestCanonicalHost(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"api.example.com", "api.example.com"},
		{"API.Example.com.", "api.example.com"},
		{"api.example.com..", "api.example.com."}, // one dot only
		{"::1", "::1"},
		{"", ""},
	} {
		if got := canonicalHost(tt.in); got != tt.want {
			t.Errorf("canonicalHost(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestTrailingDotRoutes: a request to "api.example.com." is the same
// upstream as "api.example.com", so it gets that key's stricter policy
// rather than escaping to Default by the dot. Against a 503 on every
// attempt (injected by Fault, so no name is dialled), the key allows one
// attempt and Default three.
func TestTrailingDotRoutes(t *testing.T) {
	var retries atomic.Int64
	client, err := NewClient(Config{
		Base: okBase{},
		Default: Policy{
			Retry: Retry{Base: time.Millisecond, Cap: time.Millisecond, // three attempts
				OnRetry: func(*http.Request, RetryEvent) { retries.Add(1) }},
			Fault: Fault{AbortStatus: http.StatusServiceUnavailable, AbortRate: 1},
		},
		Upstreams: map[string]Policy{"api.example.com": {Retry: Retry{MaxAttempts: 1}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		url  string
		want int64
	}{
		{"http://other.example/", 3},
		{"http://api.example.com/", 1},
		{"http://api.example.com./", 1},
		{"http://API.Example.com.:80/", 1},
	} {
		retries.Store(0)
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, tt.url, nil)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", tt.url, err)
		}
		resp.Body.Close()
		if got := 1 + retries.Load(); resp.StatusCode != http.StatusServiceUnavailable || got != tt.want {
			t.Errorf("%s: %d after %d attempts, want 503 after %d", tt.url, resp.StatusCode, got, tt.want)
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
