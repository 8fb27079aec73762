package bulwark

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// poisson sends Poisson arrivals at rate a second for d through rt, each
// call in its own goroutine, reading and closing every body, and returns
// the calls and the ErrBulkheadFull refusals. Call it inside a bubble.
func poisson(t *testing.T, rt http.RoundTripper, url string, rate float64, d time.Duration, seed uint64) (calls, full int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	var nFull atomic.Int64
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		time.Sleep(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
		calls++
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
			resp, err := rt.RoundTrip(req)
			if errors.Is(err, ErrBulkheadFull) {
				nFull.Add(1)
			}
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
	return calls, int(nFull.Load())
}

// TestDefaultBulkheadHealthyUpstream is the scenario that made the fixed
// 100-slot default refuse a healthy upstream: every answer in 200 ms, 400
// Poisson arrivals a second (80 in flight on average). The package default
// (an adaptive limit) refuses none; the old fixed 100 is run beside it and
// its refusals logged.
func TestDefaultBulkheadHealthyUpstream(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    Bulkhead
		want func(full int) bool
	}{
		{"default", Bulkhead{}, func(full int) bool { return full == 0 }},
		{"fixed 100", Bulkhead{MaxConcurrent: 100}, func(int) bool { return true }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				// The 200 ms are injected at the attempt, under the
				// bulkhead: each call holds its slot for them.
				tr := mustNew(t, Config{Base: okBase{}, Default: Policy{Bulkhead: tc.b,
					Fault: Fault{Delay: 200 * time.Millisecond, DelayRate: 1}}})
				calls, full := poisson(t, tr, "http://healthy.test/", 400, 30*time.Second, 18)
				t.Logf("%s: %d calls, %d ErrBulkheadFull (%.2f %%)", tc.name, calls, full, 100*float64(full)/float64(calls))
				if !tc.want(full) {
					t.Errorf("%s: %d of %d calls refused with ErrBulkheadFull, want none", tc.name, full, calls)
				}
				tr.CloseIdleConnections()
			})
		})
	}
}

// coresBase is an upstream with a number of cores: each request holds one
// for service, the rest wait in the server's own FIFO (a channel's waiters
// are served in order). cores can change while it runs.
type coresBase struct {
	service time.Duration
	tokens  chan struct{} // one per core
}

func newCoresBase(service time.Duration, cores int) *coresBase {
	b := &coresBase{service: service, tokens: make(chan struct{}, 100)}
	for range cores {
		b.tokens <- struct{}{}
	}
	return b
}

// setCores takes cores away (waiting for them to come free) or adds them.
func (b *coresBase) remove(n int) {
	for range n {
		<-b.tokens
	}
}

func (b *coresBase) add(n int) {
	for range n {
		b.tokens <- struct{}{}
	}
}

func (b *coresBase) RoundTrip(req *http.Request) (*http.Response, error) {
	select {
	case <-b.tokens:
	case <-req.Context().Done():
		return nil, req.Context().Err()
	}
	time.Sleep(b.service)
	b.tokens <- struct{}{}
	return &http.Response{StatusCode: 200, Header: http.Header{}, Request: req,
		Body: io.NopCloser(strings.NewReader("ok"))}, nil
}

// TestAdaptiveBulkheadFollowsCapacity is the capacity drop, scaled down:
// an upstream of 20 cores of 20 ms goes to 5 and back, under 600 calls a
// second with 250 ms deadlines. The adaptive limit comes down near what 5
// cores serve and goes back up, on virtual time.
func TestAdaptiveBulkheadFollowsCapacity(t *testing.T) {
	for _, queue := range []int{0, 4} {
		t.Run(fmt.Sprintf("queue %d", queue), func(t *testing.T) { testAdaptiveCapacity(t, queue) })
	}
}

func testAdaptiveCapacity(t *testing.T, queue int) {
	synctest.Test(t, func(t *testing.T) {
		base := newCoresBase(20*time.Millisecond, 20)
		tr := mustNew(t, Config{Base: base, Default: only(Policy{Bulkhead: Bulkhead{Adaptive: true, MinConcurrent: 1, MaxConcurrent: 100, MaxQueue: queue}}, "bulkhead")})
		const url = "http://cores.test/"
		limitNow := func() int {
			h := tr.Snapshot().Host("cores.test:80")
			if len(h) != 1 || h[0].Bulkhead == nil {
				t.Fatalf("no bulkhead for cores.test: %+v", h)
			}
			return h[0].Bulkhead.Limit
		}
		var wg sync.WaitGroup
		var ok, failed atomic.Int64
		send := func(d time.Duration) {
			tick := time.NewTicker(time.Second / 600)
			defer tick.Stop()
			end := time.Now().Add(d)
			for time.Now().Before(end) {
				<-tick.C
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(t.Context(), 250*time.Millisecond)
					defer cancel()
					req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
					resp, err := tr.RoundTrip(req)
					if err != nil {
						failed.Add(1)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					ok.Add(1)
				})
			}
		}
		send(3 * time.Second)
		high := limitNow()
		base.remove(15)
		send(3 * time.Second)
		drop := limitNow()
		okDrop := ok.Load()
		send(3 * time.Second)
		low := limitNow()
		okDrop = ok.Load() - okDrop
		base.add(15)
		send(3 * time.Second)
		restored := limitNow()
		wg.Wait()
		t.Logf("limit: high %d, 3 s into the drop %d, 6 s %d, 3 s after the restore %d; ok during the drop's last 3 s %d", high, drop, low, restored, okDrop)
		// 5 cores at 20 ms need 5 in flight: the limit lies within ±25 %
		// of it.
		if drop < 4 || drop > 6 || low < 4 || low > 6 {
			t.Errorf("limit during the drop: %d then %d, want in [3.75, 6.25]", drop, low)
		}
		// 600 a second at 20 ms need 12 in flight, and 20 cores serve 20
		// without a queue: [0.75 × 12, 1.25 × 20].
		if restored < 9 || restored > 25 {
			t.Errorf("limit 3 s after the restore: %d, want in [9, 25]", restored)
		}
		// 5 cores serve 250 a second: 3 s of them, less 10 %.
		if okDrop < 675 {
			t.Errorf("ok calls during the drop's last 3 s: %d, want ≥ 675", okDrop)
		}
		tr.CloseIdleConnections()
	})
}

// TestThrottleProbability follows the SRE formula on scripted counts:
// max(0, (requests − K·accepts) / (requests + 1)).
func TestThrottleProbability(t *testing.T) {
	for _, tc := range []struct {
		k            float64
		maxP         float64
		accepts, not int
	}{
		{2, 0, 10, 0},
		{2, 0, 0, 10},
		{2, 0, 10, 10},
		{2, 0, 10, 30},
		{2, 0, 5, 95},
		{1.5, 0, 20, 80},
		{3, 0, 10, 90},
		{2, 0.5, 0, 100},
	} {
		synctest.Test(t, func(t *testing.T) {
			codes := append(make([]int, 0, tc.accepts+tc.not), func() []int {
				var c []int
				for range tc.accepts {
					c = append(c, 200)
				}
				for range tc.not {
					c = append(c, 503)
				}
				return c
			}()...)
			base := &statusBase{codes: codes}
			tr := mustNew(t, Config{Base: base, Default: only(Policy{Throttle: Throttle{Enabled: true, K: tc.k, MaxProbability: tc.maxP}})})
			tr.randN = func(n int64) int64 { return n - 1 } // never below p < 1: count, never refuse
			for range tc.accepts + tc.not {
				sendOnce(t, tr, http.MethodGet, "http://th.test/")
			}
			req, acc := float64(tc.accepts+tc.not), float64(tc.accepts)
			want := max(0, (req-tc.k*acc)/(req+1))
			if tc.maxP > 0 {
				want = min(want, tc.maxP)
			}
			h := tr.Snapshot().Host("th.test:80")[0].Throttle
			if h == nil || h.Requests != int64(req) || h.Accepts != int64(acc) || math.Abs(h.Probability-want) > 1e-12 {
				t.Errorf("K %v, %d accepts, %d not: throttle %+v, want probability %v", tc.k, tc.accepts, tc.not, h, want)
			}
		})
	}
}

// TestThrottleRefuses: with the draw below the probability, a request is
// refused locally with a *ThrottledError, never sent, answered by the
// fallback like a breaker refusal; the counts expire with the window.
func TestThrottleRefuses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &statusBase{codes: []int{503}}
		p := only(Policy{Throttle: Throttle{Enabled: true, Window: 10 * time.Second}})
		tr := mustNew(t, Config{Base: base, Default: p})
		tr.randN = func(int64) int64 { return 0 }
		// The first request: p = 0, sent; 503, not accepted: p = 1/2.
		if code, err := sendOnce(t, tr, http.MethodGet, "http://th.test/"); err != nil || code != 503 {
			t.Fatalf("first: %d, %v; want a 503", code, err)
		}
		_, err := sendOnce(t, tr, http.MethodGet, "http://th.test/")
		var te *ThrottledError
		if !errors.Is(err, ErrThrottled) || !errors.As(err, &te) || te.Host != "th.test:80" {
			t.Fatalf("second: %v, want a *ThrottledError for th.test:80", err)
		}
		if n := base.sent(); n != 1 {
			t.Errorf("base got %d requests, want 1", n)
		}
		if k := classify(nil, err); reached(k) || !k.failed() || k.label() != outcomeThrottled {
			t.Errorf("kind %v: reached %v, failed %v, label %q", k, reached(k), k.failed(), k.label())
		}
		// After the window, the counts are gone and requests go again.
		time.Sleep(11 * time.Second)
		if _, err := sendOnce(t, tr, http.MethodGet, "http://th.test/"); err != nil {
			t.Errorf("after the window: %v, want it sent", err)
		}

		// The fallback answers a refusal.
		p.Fallback = Fallback{Constant: &ConstantResponse{StatusCode: 299}}
		tr = mustNew(t, Config{Base: &statusBase{codes: []int{503}}, Default: p})
		tr.randN = func(int64) int64 { return 0 }
		sendOnce(t, tr, http.MethodGet, "http://th.test/")
		if code, err := sendOnce(t, tr, http.MethodGet, "http://th.test/"); err != nil || code != 299 {
			t.Errorf("with a fallback: %d, %v; want its 299", code, err)
		}
	})
}

func TestAdaptiveConfigErrors(t *testing.T) {
	for _, p := range []Policy{
		{Bulkhead: Bulkhead{Adaptive: true, MinConcurrent: 20, MaxConcurrent: 10}},
		{Bulkhead: Bulkhead{MinConcurrent: -1}},
		{Throttle: Throttle{Enabled: true, K: 0.5}},
		{Throttle: Throttle{Enabled: true, MaxProbability: 1.5}},
		{Throttle: Throttle{Enabled: true, MaxProbability: -0.1}},
		{Throttle: Throttle{Enabled: true, MaxProbability: math.NaN()}},
		{Throttle: Throttle{Enabled: true, Window: time.Millisecond}},
		{Throttle: Throttle{Enabled: true, Disabled: true}},
	} {
		var ce *ConfigError
		if _, err := New(Config{Default: p}); !errors.As(err, &ce) {
			t.Errorf("New(%+v) = %v, want a *ConfigError", p, err)
		}
	}
}

func TestThrottleContract(t *testing.T) {
	runContract(t, func(base http.RoundTripper) http.RoundTripper {
		return mustNew(t, Config{Base: base, Default: only(Policy{Throttle: Throttle{Enabled: true}})})
	})
}

// TestThrottleRealRandomness: a Transport without a test's randN throttles
// with the package's randomness (a 503-only backend: most of 200 calls are
// refused locally, some still go).
func TestThrottleRealRandomness(t *testing.T) {
	base := &statusBase{codes: []int{503}}
	tr := mustNew(t, Config{Base: base, Default: only(Policy{Throttle: Throttle{Enabled: true}})})
	refused := 0
	for range 200 {
		if _, err := sendOnce(t, tr, http.MethodGet, "http://th.test/"); errors.Is(err, ErrThrottled) {
			refused++
		}
	}
	// On a host that accepts nothing, the n-th request is sent with
	// probability 1/n, so about ln 200 ≈ 6 are sent, but only 1 with
	// probability 1/200: asking for 2 would fail one run in 200.
	if refused < 100 || base.sent() < 1 || refused+base.sent() != 200 {
		t.Errorf("%d refused, %d sent; want most of the 200 refused, the first sent", refused, base.sent())
	}
}

// TestUpdateKeepsThrottleCounts: an Update that leaves Throttle alone
// keeps its counts; one that changes it starts them afresh.
func TestUpdateKeepsThrottleCounts(t *testing.T) {
	cfg := Config{Base: &statusBase{codes: []int{503}}, Default: only(Policy{Throttle: Throttle{Enabled: true}})}
	tr := mustNew(t, cfg)
	tr.randN = func(n int64) int64 { return n - 1 }
	for range 5 {
		sendOnce(t, tr, http.MethodGet, "http://th.test/")
	}
	reqs := func() int64 { return tr.Snapshot().Host("th.test:80")[0].Throttle.Requests }
	cfg.Default.Breaker.FailureRate = 0.9 // another layer's change
	if err := tr.Update(cfg); err != nil {
		t.Fatal(err)
	}
	if got := reqs(); got != 5 {
		t.Errorf("after an unrelated Update: %d requests counted, want the 5 before it", got)
	}
	cfg.Default.Throttle.K = 3
	if err := tr.Update(cfg); err != nil {
		t.Fatal(err)
	}
	if got := reqs(); got != 0 {
		t.Errorf("after a Throttle change: %d requests counted, want 0", got)
	}
}
