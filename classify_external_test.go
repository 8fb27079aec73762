package bulwark_test

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/bulwark-http/bulwark"
)

// TestLocalErrorNeverCounted: requests net/http refuses to write (a header
// name with a control byte, an unsupported scheme) and a body that fails
// to read are the caller's faults: sent at most once, never retried, never
// counted by the host's breaker or budget, so five of them cannot open the
// breaker for every caller.
func TestLocalErrorNeverCounted(t *testing.T) {
	srv, hits := countingServer(t, 200)
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	var retries atomic.Int32
	tr := seamNew(t, bulwark.Config{Base: base, Default: bulwark.Policy{
		Breaker: bulwark.Breaker{MinCalls: 5, WindowCalls: 10},
		Retry:   bulwark.Retry{Backoff: noWait, OnRetry: func(*http.Request, bulwark.RetryEvent) { retries.Add(1) }},
	}})
	for range 5 {
		_, err := seamSend(t, tr, "GET", srv.URL+"/", "X-Bad\x7fName", "v")
		if !errors.Is(err, bulwark.ErrInvalidRequest) {
			t.Fatalf("bad header name: %v; want ErrInvalidRequest", err)
		}
		_, err = seamSend(t, tr, "GET", srv.URL+"/", "X-Value", "a\nb")
		if !errors.Is(err, bulwark.ErrInvalidRequest) {
			t.Fatalf("bad header value: %v; want ErrInvalidRequest", err)
		}
	}
	errRead := errors.New("disk gone")
	for range 5 {
		body := func() io.ReadCloser {
			return io.NopCloser(io.MultiReader(strings.NewReader(strings.Repeat("x", 64<<10)), errReader{errRead}))
		}
		req, _ := http.NewRequestWithContext(t.Context(), "PUT", srv.URL+"/", body())
		req.GetBody = func() (io.ReadCloser, error) { return body(), nil }
		resp, err := tr.RoundTrip(req)
		if resp != nil || !errors.Is(err, bulwark.ErrRequestBody) || !errors.Is(err, errRead) {
			t.Fatalf("failing body: %v, %v; want ErrRequestBody and the body's error", resp, err)
		}
	}
	// A failing body's request may reach the server before its body
	// fails (once each); a bad header's never does.
	if retries.Load() != 0 || hits.Load() > 5 {
		t.Fatalf("%d retries, %d requests served; want none, at most 5", retries.Load(), hits.Load())
	}
	hs := seamHost(t, tr, strings.TrimPrefix(srv.URL, "http://"))
	if hs.Breaker.State != bulwark.CircuitClosed || hs.Breaker.Calls != 0 || hs.Budget.Calls != 0 {
		t.Fatalf("breaker %+v, budget %+v; want nothing counted", hs.Breaker, hs.Budget)
	}
	if code, err := seamSend(t, tr, "GET", srv.URL+"/"); code != 200 {
		t.Fatalf("a good request after: %d, %v", code, err)
	}

	// With bulwark's own base, a scheme it cannot send is refused too.
	own := seamNew(t, bulwark.Config{})
	if _, err := seamSend(t, own, "GET", "ftp://127.0.0.1:1/"); !errors.Is(err, bulwark.ErrInvalidRequest) {
		t.Fatalf("ftp with bulwark's base: %v; want ErrInvalidRequest", err)
	}
	if hs := own.Snapshot().Hosts; len(hs) != 0 {
		t.Fatalf("a host state for a request never sent: %+v", hs)
	}
}
