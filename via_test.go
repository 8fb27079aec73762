package bulwark_test

import (
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/bulwark-http/bulwark"
)

// viaRequest is a request for Transport.RoundTripVia, with an
// Idempotency-Key when key.
func viaRequest(t *testing.T, method, url string, key bool) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if key {
		req.Header.Set(bulwark.IdempotencyKeyHeader, "k")
	}
	return req
}

// RoundTripVia × retry, hedge: every attempt, a retry's and a hedge's
// included, goes to the sender; the base sees none; RoundTrip beside it
// still goes to the base.
func seamViaRetryHedge(t *testing.T) {
	base := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) { return seamAnswer(req, 0, 200) }}
	via := &seamBase{answer: func(n int, req *http.Request) (*http.Response, error) {
		switch n {
		case 1:
			return seamAnswer(req, 200*time.Millisecond, 200) // hedged
		case 3:
			return seamAnswer(req, 0, 503) // retried
		}
		return seamAnswer(req, 5*time.Millisecond, 200)
	}}
	tr := seamNew(t, bulwark.Config{Base: base, Default: bulwark.Policy{
		Retry: bulwark.Retry{Base: time.Millisecond, Cap: time.Millisecond},
		Hedge: bulwark.Hedge{Delay: 20 * time.Millisecond},
	}})
	for _, want := range []int{2, 4} { // first and hedge; then 503 and retry
		resp, err := tr.RoundTripVia(via, viaRequest(t, "POST", "http://api.test/x", true))
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("RoundTripVia: %v, %v; want 200", resp, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if via.sent() != want || base.sent() != 0 {
			t.Fatalf("sender got %d attempts, base %d; want %d and 0", via.sent(), base.sent(), want)
		}
	}
	if code, err := seamSend(t, tr, "GET", "http://api.test/x"); code != 200 || err != nil || base.sent() != 1 {
		t.Fatalf("RoundTrip beside it: %d, %v, base got %d; want the base's 200", code, err, base.sent())
	}
}

// RoundTripVia × route: a route's stack sends to the sender too, and its
// calls count in the host's state beside RoundTrip's.
func seamViaRoute(t *testing.T) {
	base := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) { return seamAnswer(req, 0, 200) }}
	via := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) { return seamAnswer(req, 0, 500) }}
	tr := seamNew(t, bulwark.Config{Base: base, Default: bulwark.Policy{Retry: bulwark.Retry{Disabled: true}},
		Routes: map[string]bulwark.Policy{"/pkg.Svc/": {Breaker: seamBreaker}}})
	for range 5 {
		resp, err := tr.RoundTripVia(via, viaRequest(t, "POST", "http://api.test/pkg.Svc/Get", false))
		if err == nil {
			resp.Body.Close()
		}
	}
	if s := seamRoute(t, tr, "api.test:80", "/pkg.Svc/").Breaker.State; s != bulwark.CircuitOpen || via.sent() == 0 || base.sent() != 0 {
		t.Fatalf("route breaker %v after the sender's failures (sender %d, base %d), want open, the base untouched", s, via.sent(), base.sent())
	}
	_, err := tr.RoundTripVia(via, viaRequest(t, "POST", "http://api.test/pkg.Svc/Get", false))
	var oe *bulwark.BreakerOpenError
	if !errors.As(err, &oe) {
		t.Fatalf("RoundTripVia on the open route: %v, want a BreakerOpenError", err)
	}
	if code, err := seamSend(t, tr, "GET", "http://api.test/other"); code != 200 || err != nil {
		t.Fatalf("the host's own stack: %d, %v; want 200", code, err)
	}
}
