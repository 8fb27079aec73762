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
}
