package bench

import (
	"net/http"
	"testing"
	"time"

	"github.com/bulwark-http/bulwark"
)

// BenchmarkHedgeCost is the hedge scheduler's cost when no hedge fires:
// bulwark's default stack over ctxBase, without hedging and with
// HedgePolicy (whose delay, at least 8 ms, never passes before ctxBase
// answers). The difference is the scheduler's: a pooled round, its timer
// armed and stopped, and the latency sample.
func BenchmarkHedgeCost(b *testing.B) {
	for _, s := range []struct {
		name  string
		hedge bulwark.Hedge
	}{
		{"off", bulwark.Hedge{}},
		{"quantile", HedgePolicy},
		{"fixed", bulwark.Hedge{Delay: 10 * time.Millisecond}},
	} {
		p := BulwarkPolicy(Defaults)
		p.Hedge = s.hedge
		tr, err := bulwark.New(bulwark.Config{Base: ctxBase{}, Default: p})
		if err != nil {
			b.Fatal(err)
		}
		var rt http.RoundTripper = tr
		b.Run(s.name, func(b *testing.B) { roundTrips(b, rt, "http://stub.internal/x", nil) })
	}
	// paired: off and quantile in one loop (interleave), so that the drift
	// of a shared machine between two benchmarks falls on both alike; the
	// metric added-ns/req is the scheduler's cost per request.
	b.Run("paired", func(b *testing.B) {
		off, err := bulwark.New(bulwark.Config{Base: ctxBase{}, Default: BulwarkPolicy(Defaults)})
		if err != nil {
			b.Fatal(err)
		}
		p := BulwarkPolicy(Defaults)
		p.Hedge = HedgePolicy
		on, err := bulwark.New(bulwark.Config{Base: ctxBase{}, Default: p})
		if err != nil {
			b.Fatal(err)
		}
		req := httptestRequest(b, "http://stub.internal/x")
		req.Header.Set("Accept", "application/json")
		t := interleave(b, req, pairedBlock, off, on)
		b.ReportMetric(float64(t[0].Nanoseconds())/float64(b.N), "off-ns/req")
		b.ReportMetric(float64(t[1].Nanoseconds())/float64(b.N), "hedge-ns/req")
		b.ReportMetric(float64((t[1]-t[0]).Nanoseconds())/float64(b.N), "added-ns/req")
	})
}
