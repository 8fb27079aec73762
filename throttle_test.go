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

// TestShadowThrottleMatchesEnforcingTwin: on a host that fails every
// request, a shadow throttle's would-have-refused count equals an
// enforcing twin's refusals (a refused request and a sent one that fails
// count the same), and every request of the shadow one is sent.
func TestShadowThrottleMatchesEnforcingTwin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		run := func(shadow bool) (sent int, refused int, snap ThrottleSnapshot) {
			base := &statusBase{codes: []int{503}}
			tr := mustNew(t, Config{Base: base, Default: only(Policy{Throttle: Throttle{Enabled: true, Shadow: shadow}})})
			tr.randN = func(n int64) int64 { return n / 3 } // a draw of 1/3
			for range 20 {
				if _, err := sendOnce(t, tr, http.MethodGet, "http://th.test/"); errors.Is(err, ErrThrottled) {
					refused++
				}
			}
			return base.sent(), refused, *tr.Snapshot().Hosts[0].Throttle
		}
		_, refused, _ := run(false)
		sent, shadowRefused, snap := run(true)
		if refused == 0 || shadowRefused != 0 || sent != 20 || int(snap.WouldReject) != refused || !snap.Shadow {
			t.Errorf("enforcing refused %d; shadow refused %d, sent %d of 20, WouldReject %d (shadow %v); want WouldReject = %d and all sent",
				refused, shadowRefused, sent, snap.WouldReject, snap.Shadow, refused)
		}
	})
}
