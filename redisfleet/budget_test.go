package redisfleet

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/bulwark-http/bulwark"
)

// budgetPod is a process whose retries spend from a budget with a floor
// of 5 a second over a 2 s window (10 a window) and a negligible ratio;
// shared through Redis when s is not nil.
func budgetPod(t *testing.T, s *redisServer, prefix string) *bulwark.Transport {
	t.Helper()
	p := bulwark.Policy{}
	p.Breaker.Disabled = true
	p.Bulkhead.Disabled = true
	p.Retry.MaxAttempts = 8
	p.Retry.Base, p.Retry.Cap = time.Millisecond, 2*time.Millisecond
	p.Retry.Budget = bulwark.Budget{Ratio: 0.01, Window: 2 * time.Second, MinPerSecond: 5}
	cfg := bulwark.Config{Default: p}
	if s != nil {
		f, err := New(s.client(t), Options{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		cfg.Fleet = f
	}
	return newTransport(t, cfg)
}

// TestRetryBudgetShared: three pods calling a host retry about the
// fleet's floor in all when they share the budget, and about three floors
// when each keeps its own. Each pod's 36 calls come 50 ms apart, inside
// one window, and a ninth of them fail at every attempt (7 retries each,
// 28 wanted a pod): few enough that the retry throttle, which holds every
// retry once five calls in a row failed, never holds, so the floor is
// what bounds them.
func TestRetryBudgetShared(t *testing.T) {
	s := startRedis(t)
	retries := map[bool]int64{}
	for _, shared := range []bool{false, true} {
		sick := &upstream{}
		sick.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			sick.hits.Add(1)
			if r.URL.RawQuery == "fail" {
				w.WriteHeader(500)
			}
		}))
		t.Cleanup(sick.Close)
		var pods []*bulwark.Transport
		for range 3 {
			if shared {
				pods = append(pods, budgetPod(t, s, "b1:"))
			} else {
				pods = append(pods, budgetPod(t, nil, ""))
			}
		}
		if shared {
			eventually(t, "pods subscribed", func() bool { return connected(pods[0]) && connected(pods[1]) && connected(pods[2]) })
		}
		var wg sync.WaitGroup
		calls := int64(0)
		var mu sync.Mutex
		for _, tr := range pods {
			wg.Go(func() {
				for i := range 36 {
					url := sick.URL
					if i%9 == 0 {
						url += "/?fail"
					}
					_, _ = get(t, tr, url)
					mu.Lock()
					calls++
					mu.Unlock()
					time.Sleep(50 * time.Millisecond)
				}
			})
		}
		wg.Wait()
		retries[shared] = sick.hits.Load() - calls
		if shared {
			b := pods[0].Snapshot().Host(sick.host())[0].Budget
			if b.FleetCalls == 0 || b.FleetRetries == 0 {
				t.Fatalf("pod 0's budget %+v, want the other pods' counts", b)
			}
		}
	}
	t.Logf("retries: local %d, shared %d", retries[false], retries[true])
	// Local: up to 10 a pod within a window. Shared: 10 for the fleet,
	// plus those taken before a peer's count arrived (a round trip).
	if retries[false] < 20 || retries[true] > 18 || retries[true] < 5 {
		t.Fatalf("retries: local %d (want about 30), shared %d (want about 10)", retries[false], retries[true])
	}
}
