package bulwark

import (
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// TestRefusalCounts: each layer that refuses counts its refusals in its
// piece of Snapshot, since the host's state was made, and the breaker
// counts its trips in total as well as in a row; an Update keeps the
// counts. Steps on one timeline of the fake clock.
func TestRefusalCounts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		get := func(tr *Transport, url string) {
			t.Helper()
			req := testRequest(t, t.Context(), "GET", url, noBody, "")
			if resp, err := tr.RoundTrip(req); err == nil {
				resp.Body.Close()
			}
		}
		host := func(tr *Transport) HostSnapshot {
			t.Helper()
			s := tr.Snapshot()
			if len(s.Hosts) != 1 {
				t.Fatalf("Snapshot has %d hosts, want 1", len(s.Hosts))
			}
			return s.Hosts[0]
		}

		// Breaker: opens at the first failure, refuses while open, opens
		// again after a failed probe.
		tr := mustNew(t, Config{Base: &scriptBase{step: always(500)}, Default: only(Policy{Breaker: Breaker{MinCalls: 1, OpenFor: time.Second}}, "breaker")})
		for range 3 {
			get(tr, "http://a.test/")
		}
		if b := host(tr).Breaker; b.Refused != 2 || b.TotalTrips != 1 {
			t.Errorf("after 3 calls to a failing host: breaker refused %d, trips %d in all; want 2 and 1", b.Refused, b.TotalTrips)
		}
		time.Sleep(1500 * time.Millisecond) // past OpenFor: the next call is a probe, and fails
		get(tr, "http://a.test/")
		get(tr, "http://a.test/")
		if b := host(tr).Breaker; b.Refused != 3 || b.TotalTrips != 2 || b.Trips != 2 {
			t.Errorf("after a failed probe and a call: breaker refused %d, trips %d in all, %d in a row; want 3, 2, 2", b.Refused, b.TotalTrips, b.Trips)
		}

		// Pushback: a 503 with Retry-After pauses the host; the calls during
		// the pause are refused.
		tr = mustNew(t, Config{Base: &scriptBase{step: always(503, "Retry-After", "60")}, Default: only(Policy{Retry: Retry{MaxAttempts: 1}}, "pushback")})
		for range 3 {
			get(tr, "http://a.test/")
		}
		if p := host(tr).Pushback; p.Refused != 2 {
			t.Errorf("pushback refused %d during the pause, want 2", p.Refused)
		}
		// A policy change keeps the counts, as it keeps the pause.
		if err := tr.Update(Config{Base: &scriptBase{step: always(503, "Retry-After", "60")}, Default: only(Policy{Retry: Retry{MaxAttempts: 1, MaxRetryAfter: time.Hour}}, "pushback")}); err != nil {
			t.Fatal(err)
		}
		get(tr, "http://a.test/")
		if p := host(tr).Pushback; p.Refused != 3 {
			t.Errorf("pushback refused %d after an Update and one more call, want 3", p.Refused)
		}

		// Retry budget: no floor and a tiny ratio, so every retry is refused.
		tr = mustNew(t, Config{Base: &scriptBase{step: always(503)}, Default: only(Policy{Retry: Retry{MaxAttempts: 2, NoPushback: true,
			Budget: Budget{Ratio: 0.001, MinPerSecond: -1}}}, "retry")})
		for range 3 {
			get(tr, "http://a.test/")
		}
		if b := host(tr).Budget; b.Refused != 3 {
			t.Errorf("retry budget refused %d retries, want 3", b.Refused)
		}
		if err := tr.Update(Config{Base: &scriptBase{step: always(503)}, Default: only(Policy{Retry: Retry{MaxAttempts: 3, NoPushback: true,
			Budget: Budget{Ratio: 0.001, MinPerSecond: -1}}}, "retry")}); err != nil {
			t.Fatal(err)
		}
		get(tr, "http://a.test/")
		if b := host(tr).Budget; b.Refused != 4 {
			t.Errorf("retry budget refused %d after an Update and one more call, want 4", b.Refused)
		}

		// Fallback: every final failure answered by the Func.
		tr = mustNew(t, Config{Base: &scriptBase{step: always(500)}, Default: only(Policy{Fallback: Fallback{Func: func(req *http.Request, _ error) (*http.Response, error) {
			return response(req, 200), nil
		}}})})
		for range 3 {
			get(tr, "http://a.test/")
		}
		if f := host(tr).Fallback; f == nil || f.Served != 3 {
			t.Errorf("fallback = %+v, want 3 answers served", f)
		}

		// Bulkhead: one slot, held; the next call is refused.
		release := make(chan struct{})
		held := &scriptBase{step: func(_ int, req *http.Request) (*http.Response, error) {
			<-release
			return response(req, 200), nil
		}}
		tr = mustNew(t, Config{Base: held, Default: only(Policy{Bulkhead: Bulkhead{MaxConcurrent: 1}}, "bulkhead")})
		var wg sync.WaitGroup
		wg.Go(func() { get(tr, "http://a.test/") })
		synctest.Wait() // the first call holds the slot
		get(tr, "http://a.test/")
		if b := host(tr).Bulkhead; b.Refused != 1 {
			t.Errorf("bulkhead refused %d, want 1", b.Refused)
		}
		close(release)
		wg.Wait()
	})
}
