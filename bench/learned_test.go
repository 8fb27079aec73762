package bench

import (
	"io"
	"net/http"
	"testing"

	"github.com/bulwark-http/bulwark"
)

// BenchmarkLearnedCost is what learning a host's bounds costs a call
// (issue 28: at most 100 ns and no allocation over the same stack with
// the bounds set, on ctxBase). "learned" is bulwark's package defaults,
// whose attempt timeout and slow-call threshold follow the host; "set" is
// the same stack with Timeout.Attempt and Breaker.SlowCall set to the
// static defaults, so that neither bound is learned. Both record the
// host's latency (the snapshot shows it either way: one attempt in eight
// once the host is busy; internal/learn's BenchmarkRecord is a sample's
// cost), so the difference is what reading the learned bounds costs on
// every attempt. serial and parallel run each stack on its own; paired
// runs both in one loop (interleave), so that a shared machine's drift
// falls on both alike, and reports the difference as added-ns/req.
func BenchmarkLearnedCost(b *testing.B) {
	set := bulwark.Policy{
		Timeout: bulwark.Timeout{Attempt: Defaults.Attempt},
		Breaker: bulwark.Breaker{SlowCall: Defaults.SlowCall},
	}
	stacks := []struct {
		name string
		cfg  bulwark.Config
	}{
		{"set", bulwark.Config{Base: ctxBase{}, Default: set}},
		{"learned", bulwark.Config{Base: ctxBase{}}},
	}
	rts := make([]http.RoundTripper, len(stacks))
	for i, s := range stacks {
		tr, err := bulwark.New(s.cfg)
		if err != nil {
			b.Fatal(err)
		}
		rts[i] = tr
	}
	for i, s := range stacks {
		b.Run("serial/"+s.name, func(b *testing.B) {
			req := httptestRequest(b, "http://stub.internal/x")
			req.Header.Set("Accept", "application/json")
			b.ReportAllocs()
			for b.Loop() {
				resp, err := rts[i].RoundTrip(req)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	for i, s := range stacks {
		b.Run("parallel/"+s.name, func(b *testing.B) { roundTrips(b, rts[i], "http://stub.internal/x", nil) })
	}
	b.Run("paired", func(b *testing.B) {
		req := httptestRequest(b, "http://stub.internal/x")
		req.Header.Set("Accept", "application/json")
		t := interleave(b, req, pairedBlock, rts...)
		b.ReportMetric(float64(t[0].Nanoseconds())/float64(b.N), "set-ns/req")
		b.ReportMetric(float64(t[1].Nanoseconds())/float64(b.N), "learned-ns/req")
		b.ReportMetric(float64((t[1]-t[0]).Nanoseconds())/float64(b.N), "added-ns/req")
	})
}
