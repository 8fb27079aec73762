package bulwark

import (
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

func budgetPolicy() Policy {
	p := only(Policy{}, "retry")
	p.Retry.MaxAttempts = 3
	p.Retry.Base, p.Retry.Cap = time.Millisecond, 5*time.Millisecond
	// A floor of 5 retries a second over a 2 s window: 10 retries a
	// window; a ratio too small to matter at this traffic.
	p.Retry.Budget = Budget{Ratio: 0.01, Window: 2 * time.Second, MinPerSecond: 5}
	return p
}

// TestFleetRetryBudget: four pods calling a host, each with a budget
// floor of 10 retries a window, retry about 10 times in all when they
// share the budget through a Fleet, against about 40 each alone. Each
// pod's fourth of its 36 calls fail at every attempt (7 retries each, 28
// wanted): few enough that the retry throttle, which holds every retry
// once five calls in a row failed, never holds, so the floor is what
// bounds them. A fifth pod that calls without retrying answers with its
// calls.
func TestFleetRetryBudget(t *testing.T) {
	for _, shared := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			hub := &memHub{}
			base := &scriptBase{step: func(_ int, req *http.Request) (*http.Response, error) {
				if req.URL.RawQuery == "fail" {
					return response(req, 500), nil
				}
				return response(req, 200), nil
			}}
			var pods []*Transport
			for range 4 {
				p := budgetPolicy()
				p.Retry.MaxAttempts = 8
				cfg := Config{Base: base, Default: p}
				if shared {
					cfg.Fleet = &memFleet{hub: hub}
				}
				tr := mustNew(t, cfg)
				t.Cleanup(func() { _ = tr.Close() })
				pods = append(pods, tr)
			}
			healthy := &statusBase{codes: []int{200}}
			var h *Transport
			if shared {
				h = mustNew(t, Config{Base: healthy, Default: budgetPolicy(), Fleet: &memFleet{hub: hub}})
				t.Cleanup(func() { _ = h.Close() })
			}
			calls := 0
			var wg sync.WaitGroup
			var mu sync.Mutex
			for _, tr := range pods {
				wg.Go(func() {
					for i := range 36 { // one every 50 ms: under the 2 s window
						url := "http://api.test/"
						if i%9 == 0 {
							url += "?fail"
						}
						_, _ = sendOnce(t, tr, "GET", url)
						mu.Lock()
						calls++
						mu.Unlock()
						time.Sleep(50 * time.Millisecond)
					}
				})
			}
			if h != nil {
				wg.Go(func() {
					for range 36 {
						_, _ = sendOnce(t, h, "GET", "http://api.test/")
						time.Sleep(50 * time.Millisecond)
					}
				})
			}
			wg.Wait()
			retries := base.calls() - calls
			t.Logf("shared %v: %d calls, %d retries", shared, calls, retries)
			if shared {
				// The fleet's floor is 10 a window (plus the ratio's 1 or
				// 2, the healthy pod's calls counted); a retry taken
				// before another pod's count arrived may add one.
				if retries > 10+2+2 || retries < 8 {
					t.Fatalf("shared budget: %d retries, want about 10", retries)
				}
				bs := pods[0].Snapshot().Host("api.test:80")[0].Budget
				if bs.FleetCalls == 0 || bs.FleetRetries == 0 {
					t.Fatalf("pod 0's budget %+v, want the fleet's counts", bs)
				}
				hs := h.Snapshot()
				if b := hs.Host("api.test:80")[0].Budget; b.FleetRetries == 0 || hs.Fleet.Published == 0 {
					t.Fatalf("healthy pod: budget %+v, fleet %+v; want it to hold the others' counts and answer with its own", b, hs.Fleet)
				}
			} else if retries < 30 {
				t.Fatalf("local budgets: %d retries, want about 4 × 10", retries)
			}
		})
	}
}
