package bulwark

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

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
