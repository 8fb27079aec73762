package bulwark

import (
	"context"
	"io"
	"net/http"
	neturl "net/url"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

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

// TestRefusalMetricsMatchSnapshot: every layer's refusals, and the
// fallback's answers, are counted in OTel (bulwark.rejections by
// bulwark.layer, bulwark.fallbacks by kind) exactly as the host's
// Snapshot counts them, so the page and a dashboard agree. Read with the
// SDK's ManualReader.
func TestRefusalMetricsMatchSnapshot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		get := func(tr *Transport, ctx context.Context) {
			t.Helper()
			if resp, err := tr.RoundTrip(testRequest(t, ctx, "GET", "http://a.test/", noBody, "")); err == nil {
				resp.Body.Close()
			}
		}
		for _, c := range []struct {
			layer  string // bulwark.layer, or "fallback"
			base   func(int, *http.Request) (*http.Response, error)
			policy Policy
			calls  int
			left   time.Duration // the caller's deadline; 0: none
			snap   func(HostSnapshot) uint64
		}{
			{layerBreaker, always(500), only(Policy{Breaker: Breaker{MinCalls: 1, OpenFor: time.Hour}}, "breaker"), 5, 0,
				func(h HostSnapshot) uint64 { return h.Breaker.Refused }},
			{layerPushback, always(503, "Retry-After", "60"), only(Policy{Retry: Retry{MaxAttempts: 1}}, "pushback"), 5, 0,
				func(h HostSnapshot) uint64 { return h.Pushback.Refused }},
			{layerBudget, always(503), only(Policy{Retry: Retry{MaxAttempts: 2, NoPushback: true, Budget: Budget{Ratio: 0.001, MinPerSecond: -1}}}, "retry"), 5, 0,
				func(h HostSnapshot) uint64 { return h.Budget.Refused }},
			{layerThrottle, always(503), only(Policy{Throttle: Throttle{Enabled: true, K: 1}}), 200, 0,
				func(h HostSnapshot) uint64 { return h.Throttle.Refused }},
			{layerDeadline, always(200), only(Policy{}, "timeout"), 5, 5 * time.Millisecond,
				func(h HostSnapshot) uint64 { return h.DeadlineTooShort }},
			{"fallback", always(500), only(Policy{Fallback: Fallback{Constant: &ConstantResponse{Body: []byte("0")}}}), 5, 0,
				func(h HostSnapshot) uint64 { return h.Fallback.Served }},
		} {
			k := newOtelKit(t)
			tr := mustNew(t, Config{Base: &scriptBase{step: c.base}, MeterProvider: k.mp, Default: c.policy})
			for range c.calls {
				ctx, cancel := t.Context(), context.CancelFunc(func() {})
				if c.left > 0 {
					ctx, cancel = context.WithTimeout(ctx, c.left)
				}
				get(tr, ctx)
				cancel()
			}
			want := c.snap(tr.Snapshot().Hosts[0])
			var got int64
			if c.layer == "fallback" {
				got = counter(t, k.collect(t), "bulwark.fallbacks", upDefault, keyFallbackKind.String("constant"))
			} else {
				got = counter(t, k.collect(t), "bulwark.rejections", upDefault, keyLayer.String(c.layer))
			}
			if want == 0 || got != int64(want) {
				t.Errorf("%s: the metric counts %d, the Snapshot %d; want them equal and above 0", c.layer, got, want)
			}
		}

		// The bulkhead: one slot, held; the next call is refused.
		k := newOtelKit(t)
		release := make(chan struct{})
		held := &scriptBase{step: func(_ int, req *http.Request) (*http.Response, error) {
			<-release
			return response(req, 200), nil
		}}
		tr := mustNew(t, Config{Base: held, MeterProvider: k.mp, Default: only(Policy{Bulkhead: Bulkhead{MaxConcurrent: 1}}, "bulkhead")})
		done := make(chan struct{})
		go func() { get(tr, t.Context()); close(done) }()
		synctest.Wait()
		get(tr, t.Context())
		get(tr, t.Context())
		want := tr.Snapshot().Hosts[0].Bulkhead.Refused
		if got := counter(t, k.collect(t), "bulwark.rejections", upDefault, keyLayer.String(layerBulkhead)); want != 2 || got != 2 {
			t.Errorf("bulkhead: the metric counts %d, the Snapshot %d; want 2 and 2", got, want)
		}
		close(release)
		<-done
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
