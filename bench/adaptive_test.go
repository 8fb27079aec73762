package bench

import (
	"net/http"
	"testing"

	"github.com/bulwark-http/bulwark"
	"github.com/failsafe-go/failsafe-go/adaptivelimiter"
	"github.com/failsafe-go/failsafe-go/adaptivethrottler"
	"github.com/failsafe-go/failsafe-go/failsafehttp"
)

// BenchmarkAdaptiveCost is the cost of each adaptive layer alone over
// ctxBase: the router with every layer off, then one layer on (a fixed
// bulkhead beside the adaptive one, the throttle), and failsafe-go's
// adaptivelimiter and adaptivethrottler over the same base. Compare
// within one run: the layer's cost is its row less "router".
func BenchmarkAdaptiveCost(b *testing.B) {
	off := bulwark.Policy{
		Timeout:  bulwark.Timeout{Disabled: true},
		Breaker:  bulwark.Breaker{Disabled: true},
		Bulkhead: bulwark.Bulkhead{Disabled: true},
		Retry:    bulwark.Retry{Disabled: true, NoPushback: true},
	}
	with := func(f func(*bulwark.Policy)) http.RoundTripper {
		p := off
		f(&p)
		tr, err := bulwark.New(bulwark.Config{Base: ctxBase{}, Default: p})
		if err != nil {
			b.Fatal(err)
		}
		return tr
	}
	for _, s := range []Stack{
		{"router", with(func(*bulwark.Policy) {})},
		{"bulkhead-fixed", with(func(p *bulwark.Policy) { p.Bulkhead = bulwark.Bulkhead{MaxConcurrent: 1000} })},
		{"bulkhead-adaptive", with(func(p *bulwark.Policy) { p.Bulkhead = bulwark.Bulkhead{Adaptive: true, MaxConcurrent: 1000} })},
		{"throttle", with(func(p *bulwark.Policy) { p.Throttle = bulwark.Throttle{Enabled: true} })},
		{"failsafe-adaptivelimiter", failsafehttp.NewRoundTripper(ctxBase{}, adaptivelimiter.NewBuilder[*http.Response]().WithLimits(1, 1000, 1000).Build())},
		{"failsafe-adaptivethrottler", failsafehttp.NewRoundTripper(ctxBase{}, adaptivethrottler.NewWithDefaults[*http.Response]())},
	} {
		b.Run(s.Name, func(b *testing.B) { roundTrips(b, s.RT, "http://stub.internal/x", nil) })
	}
}
