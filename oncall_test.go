package bulwark

import (
	"context"
	"net/http"
	"testing"
	"testing/synctest"
	"time"
)

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
