package integration_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/bulwark-http/bulwark/server"
)

// TestChainAbsorbsTransientOverSockets: server's TestChainAbsorbsTransient
// on real sockets. A chain of three services on 127.0.0.1 (gateway →
// checkout → tax), each behind server.DeadlineHandler, each calling the
// next through a bulwark client with package defaults, serves 300 calls,
// so that every client has learned its host's latency and the gateway's
// caller hands checkout the learned bound (50 ms, less the margin); then,
// trial after trial, tax answers one request 503. The tier nearest tax
// must retry it within the time it was given (some 30 ms), and the caller
// get 200, in at least 90 of 100 trials. In memory the bar is 99
// (server's test); here a stall of the machine's own (a loaded CI runner,
// a GC) of a few milliseconds between the retry's decision and its
// sending leaves it under the 10 ms an attempt needs: measured 96 to 100
// of 100 in 7 runs on two cores shared with other test runs, 26 to 31 of
// 100 with the retry's wait drawn over the backoff's whole range.
func TestChainAbsorbsTransientOverSockets(t *testing.T) {
	const trials, between = 100, 5
	var fail atomic.Bool
	var timeouts []string // the deadline header checkout received, in the first trials
	tax := httptest.NewServer(server.DeadlineHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if fail.CompareAndSwap(true, false) {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok")
	}), server.DeadlineOptions{}))
	defer tax.Close()
	relay := func(below string, seen *atomic.Value) *httptest.Server {
		c, err := bulwark.NewClient(bulwark.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.CloseIdleConnections)
		return httptest.NewServer(server.DeadlineHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if seen != nil {
				seen.Store(r.Header.Get(bulwark.DefaultDeadlineHeader))
			}
			req, _ := http.NewRequestWithContext(r.Context(), http.MethodGet, below, nil)
			resp, err := c.Do(req)
			if err != nil {
				w.WriteHeader(http.StatusBadGateway)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			io.WriteString(w, "ok")
		}), server.DeadlineOptions{}))
	}
	var seen atomic.Value
	checkout := relay(tax.URL, &seen)
	defer checkout.Close()
	gateway := relay(checkout.URL, nil)
	defer gateway.Close()
	caller, err := bulwark.NewClient(bulwark.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer caller.CloseIdleConnections()
	call := func() int {
		resp, err := caller.Get(gateway.URL)
		if err != nil {
			return 0
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	for i := range 300 {
		if code := call(); code != http.StatusOK {
			t.Fatalf("warm-up call %d: %d", i, code)
		}
	}
	absorbed := 0
	for trial := range trials {
		for range between {
			call()
		}
		fail.Store(true)
		start := time.Now()
		if code := call(); code == http.StatusOK {
			absorbed++
		} else {
			t.Logf("trial %d: %d after %v", trial, code, time.Since(start).Round(time.Millisecond))
		}
		if fail.Load() {
			t.Fatalf("trial %d: the transient failure was not met", trial)
		}
		if v, _ := seen.Load().(string); trial < 5 {
			timeouts = append(timeouts, v)
		}
	}
	t.Logf("absorbed %d of %d; checkout was handed %s ms (first 5 trials)", absorbed, trials, fmt.Sprint(timeouts))
	if absorbed < trials*90/100 {
		t.Errorf("absorbed %d of %d transient failures at tax, want ≥ 90 %%", absorbed, trials)
	}
}
