package bulwark_test

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/bulwark-http/bulwark/bulwarktest"
)

// TestRoutesScripted: one host, two routes. The charge endpoint does not
// retry; the rates endpoint retries on the server's
// Retry-After; their breakers are their own, so the charge endpoint's
// failures do not stop the rates.
func TestRoutesScripted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := bulwarktest.NewUpstream(map[string]bulwarktest.Script{
			"/v1/charges":  {{Status: 500}},
			"/v1/rates/7":  {{Status: 503, Header: http.Header{"Retry-After": {"1"}}}, {Status: 200, Body: "1.08"}},
			"/v1/rates/42": {{Status: 200, Body: "0.93"}},
		})
		var rec bulwarktest.Recorder
		tr, err := bulwark.New(bulwark.Config{
			Base: u.Transport(),
			// Open for longer than the rates route's one-second
			// Retry-After wait, so the snapshot after it finds it open.
			Default: rec.Hook(bulwark.Policy{Breaker: bulwark.Breaker{MinCalls: 3, FailureRate: 0.5, OpenFor: 5 * time.Second}}),
			Routes: map[string]bulwark.Policy{
				"POST api.example.com/v1/charges": {Retry: bulwark.Retry{Disabled: true}, Timeout: bulwark.Timeout{Attempt: 30 * time.Second}},
				"GET /v1/rates/{id}":              {Timeout: bulwark.Timeout{Attempt: 2 * time.Second}},
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			req, _ := http.NewRequestWithContext(t.Context(), "POST", "http://api.example.com/v1/charges", strings.NewReader("{}"))
			if resp, err := tr.RoundTrip(req); err == nil {
				resp.Body.Close()
			}
		}
		if got := len(u.RequestsTo("/v1/charges")); got != 3 {
			t.Errorf("charge requests = %d, want 3: one per call, no retries", got)
		}
		for _, path := range []string{"/v1/rates/7", "/v1/rates/42"} {
			req, _ := http.NewRequestWithContext(t.Context(), "GET", "http://api.example.com"+path, nil)
			resp, err := tr.RoundTrip(req)
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("GET %s after the charge route's breaker opened: %v, %v", path, resp, err)
			}
			resp.Body.Close()
		}
		if got := rec.Waits(); !slices.Equal(got, []time.Duration{time.Second}) {
			t.Errorf("retry waits = %v, want the rates route's one Retry-After second", got)
		}
		h, _ := bulwarktest.Host(tr, "api.example.com:80")
		if len(h.Routes) != 2 || h.Routes[0].Pattern != "GET /v1/rates/{id}" || h.Routes[1].Breaker.State != bulwark.CircuitOpen {
			t.Errorf("routes = %+v, want the charge route's breaker open and the rates route's own", h.Routes)
		}
		if h.Routes[0].Breaker.State != bulwark.CircuitClosed {
			t.Errorf("rates route breaker = %v, want closed", h.Routes[0].Breaker.State)
		}
	})
}
