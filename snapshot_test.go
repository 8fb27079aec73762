package bulwark

import (
	"encoding/json"
	"io"
	"net/http"
	neturl "net/url"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// TestSnapshotJSON: a Snapshot encodes its breaker states and controls as
// their names, and decodes from its own JSON unchanged; a name it does not
// know is an error, not a zero state.
func TestSnapshotJSON(t *testing.T) {
	for _, st := range []CircuitState{CircuitClosed, CircuitHalfOpen, CircuitOpen} {
		for _, c := range []BreakerControl{BreakerAuto, BreakerForceOpen, BreakerForceClosed} {
			in := Snapshot{Hosts: []HostSnapshot{{Host: "a.test:80", Scheme: "http", Upstream: "default",
				Breaker: &BreakerSnapshot{State: st, Control: c, Calls: 3}}}}
			raw, err := json.Marshal(in)
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{`"State":"` + st.String() + `"`, `"Control":"` + c.String() + `"`} {
				if !strings.Contains(string(raw), want) {
					t.Errorf("json.Marshal(%v, %v) = %s, want it to contain %s", st, c, raw, want)
				}
			}
			var out Snapshot
			if err := json.Unmarshal(raw, &out); err != nil {
				t.Fatalf("json.Unmarshal(%s): %v", raw, err)
			}
			if !reflect.DeepEqual(out, in) {
				t.Errorf("json round trip of %v, %v = %+v, want %+v", st, c, out.Hosts[0].Breaker, in.Hosts[0].Breaker)
			}
		}
	}
	for _, bad := range []string{`{"State":"ajar"}`, `{"Control":"force-half"}`, `{"State":2}`} {
		var b BreakerSnapshot
		if err := json.Unmarshal([]byte(bad), &b); err == nil {
			t.Errorf("json.Unmarshal(%s) = %+v, want an error", bad, b)
		}
	}
}

// TestSnapshot: every layer with state shows in the host's entry, a
// disabled one is nil, and a malformed Retry-After is counted.
func TestSnapshot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &statusBase{codes: []int{503, 200}, header: http.Header{"Retry-After": {"soon"}}}
		tr := mustNew(t, Config{Base: base, Upstreams: map[string]Policy{
			"bare.test": only(Policy{}),
		}})
		if code, err := sendOnce(t, tr, http.MethodGet, "http://H.test/"); err != nil || code != 200 {
			t.Fatalf("status %d, err %v", code, err)
		}
		if _, err := sendOnce(t, tr, http.MethodGet, "http://bare.test:8080/"); err != nil {
			t.Fatal(err)
		}
		s := tr.Snapshot()
		if len(s.Hosts) != 2 {
			t.Fatalf("Snapshot has %d hosts, want 2: %+v", len(s.Hosts), s.Hosts)
		}
		bare, h := s.Hosts[0], s.Hosts[1]
		if bare.Host != "bare.test:8080" || bare.Upstream != "bare.test" || bare.Breaker != nil || bare.Bulkhead != nil || bare.Budget != nil || bare.Pushback != nil {
			t.Errorf("bare host = %+v, want bare.test:8080 with every layer off", bare)
		}
		if h.Host != "h.test:80" || h.Scheme != "http" || h.Upstream != "default" {
			t.Errorf("host = %s %s %s, want h.test:80 http default", h.Host, h.Scheme, h.Upstream)
		}
		if b := h.Breaker; b == nil || b.State != CircuitClosed || b.Control != BreakerAuto || b.Calls != 2 || b.Failures != 1 {
			t.Errorf("breaker = %+v, want closed, auto, 2 calls, 1 failure", b)
		}
		if b := h.Bulkhead; b == nil || b.InFlight != 0 || !b.Adaptive || b.MaxConcurrent != defaultAdaptiveMax || b.MinConcurrent != defaultMinConcurrent || b.Limit != defaultAdaptiveMax {
			t.Errorf("bulkhead = %+v, want empty with the default adaptive limit, at its ceiling", b)
		}
		if b := h.Budget; b == nil || b.Calls != 1 || b.Retries != 1 {
			t.Errorf("budget = %+v, want 1 call and 1 retry", b)
		}
		if p := h.Pushback; p == nil || !p.Until.IsZero() {
			t.Errorf("pushback = %+v, want no pause (the Retry-After was malformed)", p)
		}
		if s.RetryAfterIgnored != 1 {
			t.Errorf("RetryAfterIgnored = %d, want 1", s.RetryAfterIgnored)
		}
		if got := s.Host("H.TEST:80"); len(got) != 1 || got[0].Host != "h.test:80" {
			t.Errorf("Host(H.TEST:80) = %+v, want the one entry", got)
		}
	})
}

// TestSnapshotLatency: Snapshot's Latency is the host's recent attempts'
// percentiles, failures included, and nil once its window has passed.
func TestSnapshotLatency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// The n-th attempt takes n × 100 µs (all 200 within the 5 s
		// window); every tenth fails.
		base := &scriptBase{step: func(n int, req *http.Request) (*http.Response, error) {
			time.Sleep(time.Duration(n) * 100 * time.Microsecond)
			if n%10 == 0 {
				return response(req, 500), nil
			}
			return response(req, 200), nil
		}}
		tr := mustNew(t, Config{Base: base, Default: only(Policy{Retry: Retry{MaxAttempts: 1}}, "retry")})
		if h := tr.Snapshot().Hosts; len(h) != 0 {
			t.Fatalf("hosts before a call: %v", h)
		}
		for range 200 {
			req := testRequest(t, t.Context(), "GET", "http://a.test/", noBody, "")
			if resp, err := tr.RoundTrip(req); err == nil {
				resp.Body.Close()
			}
		}
		l := tr.Snapshot().Hosts[0].Latency
		if l == nil {
			t.Fatal("Latency is nil after 200 calls")
		}
		if l.Samples != 200 {
			t.Errorf("Latency.Samples = %d, want 200", l.Samples)
		}
		for _, c := range []struct {
			name      string
			got, want time.Duration
		}{{"P50", l.P50, 10 * time.Millisecond}, {"P99", l.P99, 19800 * time.Microsecond}, {"P999", l.P999, 20 * time.Millisecond}} {
			if c.got < c.want*97/100 || c.got > c.want*103/100 {
				t.Errorf("Latency.%s = %v, want %v ± 3 %%", c.name, c.got, c.want)
			}
		}
		time.Sleep(time.Minute)
		if l := tr.Snapshot().Hosts[0].Latency; l != nil {
			t.Errorf("a minute later Latency = %+v, want nil", *l)
		}
	})
}

// TestCallCounts: a host counts its calls by final outcome, its routes'
// included, whatever the providers (none here), as the bulwark.requests
// metric labels them: ok (a fallback's answer too), failed, timed out by
// bulwark, refused by a layer, and the rest only in Calls.
func TestCallCounts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &scriptBase{step: func(_ int, req *http.Request) (*http.Response, error) {
			switch req.URL.Path {
			case "/fail":
				return response(req, 503), nil
			case "/bad":
				return response(req, 404), nil
			case "/hang":
				<-req.Context().Done()
				return nil, req.Context().Err()
			}
			return response(req, 200), nil
		}}
		p := only(Policy{Timeout: Timeout{Attempt: 100 * time.Millisecond}, Breaker: Breaker{MinCalls: 3, OpenFor: time.Hour}}, "timeout", "breaker")
		routed := p
		routed.Fallback.Constant = &ConstantResponse{Body: []byte("0")}
		routed.Bulkhead, routed.Retry.NoPushback = Bulkhead{}, false // the host's to set
		tr := mustNew(t, Config{Base: base, Default: p, Routes: map[string]Policy{"a.test/fb/": routed}})
		get := func(path string) {
			t.Helper()
			if resp, err := tr.RoundTrip(testRequest(t, t.Context(), "GET", "http://a.test"+path, noBody, "")); err == nil {
				resp.Body.Close()
			}
		}
		for _, path := range []string{"/ok", "/ok", "/bad", "/fail", "/hang", "/fb/fail"} {
			get(path)
		}
		want := CallCounts{Calls: 6, Succeeded: 3, Failed: 1, TimedOut: 1}
		if got := tr.Snapshot().Hosts[0].Calls; got != want {
			t.Errorf("Calls = %+v, want %+v", got, want)
		}
		// The timeout tripped the host's breaker (2 of its 4 counted
		// calls failed, the 404 ignored; the route has its own): the next
		// three calls are refused.
		get("/fail")
		get("/ok")
		get("/ok")
		want = CallCounts{Calls: 9, Succeeded: 3, Failed: 1, TimedOut: 1, Refused: 3}
		if got := tr.Snapshot().Hosts[0].Calls; got != want {
			t.Errorf("after the breaker opened: Calls = %+v, want %+v", got, want)
		}
	})
}

// BenchmarkCallCounts is what counting a call's final outcome costs a
// call, paired as bench/'s interleave pairs stacks, so that the machine's
// drift falls on both sides: one loop alternates blocks of 64 of each
// side, which goes first alternating too. count-ns/op is the difference
// per call, from every goroutine at once onto one host's counts.
//
//   - call: a call through two Transports alike (the router alone, every
//     layer off, where the count's share of a call is largest, on the stub
//     base that answers from memory), the second's host made not to count
//     (its reporter's counts nil);
//   - add: the judgement of an outcome, the same with the count added
//     (the router judged the outcome already when metrics are on).
func BenchmarkCallCounts(b *testing.B) {
	paired := func(b *testing.B, counted, bare func()) {
		const block = 64
		var with, without, calls atomic.Int64 // ns, ns, of each side
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			first, second := bare, counted
			firstCounts := false
			for more := true; more; {
				for k, f := range [2]func(){first, second} {
					t0 := time.Now()
					for range block {
						f()
					}
					if d := int64(time.Since(t0)); (k == 0) == firstCounts {
						with.Add(d)
					} else {
						without.Add(d)
					}
				}
				first, second, firstCounts = second, first, !firstCounts
				calls.Add(block)
				for range block {
					if more = pb.Next(); !more {
						break
					}
				}
			}
		})
		n := float64(calls.Load())
		b.ReportMetric(float64(with.Load()-without.Load())/n, "count-ns/op")
		b.ReportMetric(float64(without.Load())/n, "bare-ns/op")
	}

	b.Run("call", func(b *testing.B) {
		const url = "http://stub.internal/x"
		off := Policy{Timeout: Timeout{Disabled: true}, Retry: Retry{Disabled: true, NoPushback: true},
			Breaker: Breaker{Disabled: true}, Bulkhead: Bulkhead{Disabled: true}}
		counting, bare := mustNew(b, Config{Base: benchBase{}, Default: off}), mustNew(b, Config{Base: benchBase{}, Default: off})
		u, _ := neturl.Parse(url)
		bare.lookup(u).rep.calls = nil
		req, _ := http.NewRequest("GET", url, nil)
		send := func(tr *Transport) func() {
			return func() {
				resp, err := tr.RoundTrip(req)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
		paired(b, send(counting), send(bare))
		if counting.Snapshot().Hosts[0].Calls.Succeeded == 0 {
			b.Fatal("the counting Transport counted nothing")
		}
	})
	b.Run("add", func(b *testing.B) {
		req, _ := http.NewRequest("GET", "http://a.test/", nil)
		resp := &http.Response{StatusCode: 200, Request: req}
		c, cc := call{}, new(callCounts)
		var sink atomic.Int64
		paired(b, func() { cc.count(c.judge(resp, nil)) }, func() {
			if c.judge(resp, nil).v.Outcome != OutcomeSuccess {
				sink.Add(1)
			}
		})
		if cc.snapshot().Succeeded == 0 || sink.Load() != 0 {
			b.Fatal("nothing counted, or a 200 judged no success")
		}
	})
}

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
