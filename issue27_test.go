package bulwark_test

// What black-box reviews found at the seams of net/http, go-retryablehttp
// and bulwark, over real sockets on 127.0.0.1 (the seam table, in
// seams_test.go, has the rest).

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/bulwark-http/bulwark"
)

// countingServer answers code and counts the requests it got.
func countingServer(t *testing.T, code int) (*httptest.Server, *atomic.Int32) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(code)
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

// TestNilHeaderNoPanic: a request with a nil Header gets an error, as from
// net/http's Transport, on every path (a priority in its context, a
// route, hedging, a fallback), never a panic.
func TestNilHeaderNoPanic(t *testing.T) {
	base := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) { return seamAnswer(req, 0, 200) }}
	for _, cfg := range []bulwark.Config{
		{Base: base},
		{Base: base, Routes: map[string]bulwark.Policy{"GET /a": {}}},
		{Base: base, Default: bulwark.Policy{Hedge: bulwark.Hedge{Delay: 1}, Retry: bulwark.Retry{KeyPOST: true},
			Fallback: bulwark.Fallback{Constant: &bulwark.ConstantResponse{StatusCode: 200}}}},
	} {
		tr := seamNew(t, cfg)
		for _, method := range []string{"GET", "POST"} {
			u, _ := url.Parse("http://api.test/a")
			req := (&http.Request{Method: method, URL: u}).WithContext(bulwark.WithPriority(t.Context(), bulwark.PriorityCritical))
			resp, err := tr.RoundTrip(req)
			if resp != nil || !errors.Is(err, bulwark.ErrInvalidRequest) {
				t.Fatalf("%s with a nil Header: %v, %v; want ErrInvalidRequest", method, resp, err)
			}
		}
	}
	if base.sent() != 0 {
		t.Fatalf("sent %d requests with a nil Header", base.sent())
	}
}

// TestDocsTellPeersTruly: the README and the doc comments no longer say
// what the peers do not: that 408, 429, 500, 502, 503 and 504 are the set
// Polly and go-retryablehttp retry, that bulwark's breaker rates are
// resilience4j's defaults (its slow-call rate is 100 %), or that the
// adaptive limit never refuses a healthy burst.
func TestDocsTellPeersTruly(t *testing.T) {
	for _, f := range []string{"README.md", "classify.go", "retry_rt.go", "breaker_rt.go", "bulkhead_rt.go"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		text := strings.Join(strings.Fields(strings.ReplaceAll(string(b), "//", "")), " ")
		for _, claim := range []string{
			"the set Polly's standard pipeline and go-retryablehttp retry",
			"as Polly's standard pipeline and go-retryablehttp retry them",
			"Polly's standard pipeline and go-retryablehttp retry:",
			"(resilience4j's defaults)",
			"The rates, the window of the last 100 calls and the 100-call minimum are resilience4j's defaults",
			"is never refused",
			"bursts are never refused",
		} {
			if strings.Contains(text, claim) {
				t.Errorf("%s still says %q", f, claim)
			}
		}
	}
}
