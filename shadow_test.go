package bulwark

import (
	"errors"
	"net/http"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// holdBase holds each attempt for the duration in its "d" query parameter
// (bubble time), counting the attempts it holds at once.
type holdBase struct {
	mu        sync.Mutex
	now, peak int
}

func (b *holdBase) RoundTrip(req *http.Request) (*http.Response, error) {
	d, _ := time.ParseDuration(req.URL.Query().Get("d"))
	b.mu.Lock()
	b.now++
	b.peak = max(b.peak, b.now)
	b.mu.Unlock()
	time.Sleep(d)
	b.mu.Lock()
	b.now--
	b.mu.Unlock()
	return response(req, http.StatusOK), nil
}

// TestShadowBulkheadMatchesEnforcingTwin: bursts of concurrent calls, each
// held a scripted time; the shadow bulkhead's WouldReject equals the
// enforcing twin's refusals, and every shadow call is sent.
func TestShadowBulkheadMatchesEnforcingTwin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, queue := range []int{0, 2} {
			p := only(Policy{}, "bulkhead")
			p.Bulkhead = Bulkhead{MaxConcurrent: 3, MaxQueue: queue, MaxWait: 15 * time.Millisecond}
			sp := p
			sp.Bulkhead.Shadow = true
			enforcing := mustNew(t, Config{Base: &holdBase{}, Default: p})
			shadowBase := &holdBase{}
			shadow := mustNew(t, Config{Base: shadowBase, Default: sp})
			var mu sync.Mutex
			refused, shadowErrs := 0, 0
			var wg sync.WaitGroup
			for i := range 120 {
				// Arrivals and holds on a 10 ms grid, queue timeouts at
				// 15 ms: a release never comes at the instant a wait
				// ends, and the releases at an arrival's instant are done
				// (synctest.Wait) before it, so both Transports see the
				// same order.
				n := 1 + (i*7)%5 // 1..5 calls at once
				hold := time.Duration(10*(1+(i*3)%4)) * time.Millisecond
				url := "http://api.test/?d=" + hold.String()
				for range n {
					wg.Go(func() {
						if _, err := sendOnce(t, enforcing, "GET", url); errors.Is(err, ErrBulkheadFull) {
							mu.Lock()
							refused++
							mu.Unlock()
						}
					})
					wg.Go(func() {
						if _, err := sendOnce(t, shadow, "GET", url); err != nil {
							mu.Lock()
							shadowErrs++
							mu.Unlock()
						}
					})
				}
				synctest.Wait()
				time.Sleep(10 * time.Millisecond)
				synctest.Wait()
			}
			wg.Wait()
			if refused == 0 {
				t.Fatalf("queue %d: the enforcing bulkhead refused nothing: the test proves nothing", queue)
			}
			b := shadow.Snapshot().Hosts[0].Bulkhead
			if shadowErrs != 0 || b.WouldReject != uint64(refused) || b.InFlight != 0 {
				t.Errorf("queue %d: shadow errors %d, WouldReject %d, in flight %d; the enforcing twin refused %d",
					queue, shadowErrs, b.WouldReject, b.InFlight, refused)
			}
			if shadowBase.peak <= 3 {
				t.Errorf("queue %d: the shadow bulkhead's base never held more than its limit (%d): it limited", queue, shadowBase.peak)
			}
		}
	})
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
