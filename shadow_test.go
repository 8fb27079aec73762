package bulwark

import (
	"errors"
	"net/http"
	"testing"
	"testing/synctest"
)

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
