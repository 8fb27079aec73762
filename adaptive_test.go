package bulwark

import (
	"errors"
	"math"
	"net/http"
	"testing"
	"testing/synctest"
	"time"
)

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
