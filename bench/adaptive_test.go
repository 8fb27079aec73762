package bench

import (
	"io"
	"net/http"
	"testing"

	"github.com/bulwark-http/bulwark"
	"github.com/failsafe-go/failsafe-go/adaptivelimiter"
	"github.com/failsafe-go/failsafe-go/adaptivethrottler"
	"github.com/failsafe-go/failsafe-go/failsafehttp"
)

// adaptiveBlock is how many requests BenchmarkAdaptiveCost sends through
// one stack of a pair before it switches to the other.
const adaptiveBlock = 64

// BenchmarkAdaptiveCost is what each adaptive layer adds per request over
// ctxBase, measured in pairs: the stack without the layer and the stack
// with it, in one loop, blocks of adaptiveBlock requests alternating (see
// interleave), so that drift on a shared machine falls on both alike. For
// bulwark the pair is the router with every layer off but retry against
// the same with one layer on (the adaptive bulkhead; the fixed bulkhead beside it
// for reference; the throttle), and the fixed bulkhead against the
// adaptive one (what adaptivity adds to the layer); for failsafe-go, ctxBase alone against its
// adaptivelimiter or adaptivethrottler over it. An op is one request
// through each side of the pair. The metrics: each side's ns per request,
// added-ns/req (their difference) and added-allocs/req (the difference of
// testing.AllocsPerRun of each side, taken before the timed loop).
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
	// The retry layer is on (as by default) in every bulwark stack: it
	// hands its reading of when it sent an attempt down, which the layers
	// measured here use instead of reading the clock again.
	retry := func(p *bulwark.Policy) { p.Retry = bulwark.Retry{} }
	router := with(retry)
	fixed := with(func(p *bulwark.Policy) { retry(p); p.Bulkhead = bulwark.Bulkhead{MaxConcurrent: 1000} })
	adaptive := with(func(p *bulwark.Policy) {
		retry(p)
		p.Bulkhead = bulwark.Bulkhead{Adaptive: true, MaxConcurrent: 1000}
	})
	for _, pr := range []struct {
		name          string
		without, with http.RoundTripper
	}{
		{"bulkhead-adaptive", router, adaptive},
		{"bulkhead-fixed", router, fixed},
		{"bulkhead-adaptive-vs-fixed", fixed, adaptive},
		{"throttle", router, with(func(p *bulwark.Policy) { retry(p); p.Throttle = bulwark.Throttle{Enabled: true} })},
		{"failsafe-adaptivelimiter", ctxBase{}, failsafehttp.NewRoundTripper(ctxBase{}, adaptivelimiter.NewBuilder[*http.Response]().WithLimits(1, 1000, 1000).Build())},
		{"failsafe-adaptivethrottler", ctxBase{}, failsafehttp.NewRoundTripper(ctxBase{}, adaptivethrottler.NewWithDefaults[*http.Response]())},
	} {
		b.Run(pr.name, func(b *testing.B) {
			req := httptestRequest(b, "http://stub.internal/x")
			req.Header.Set("Accept", "application/json")
			allocs := func(rt http.RoundTripper) float64 {
				return testing.AllocsPerRun(1000, func() {
					resp, err := rt.RoundTrip(req)
					if err != nil {
						b.Fatal(err)
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				})
			}
			added := allocs(pr.with) - allocs(pr.without)
			t := interleave(b, req, adaptiveBlock, pr.without, pr.with)
			b.ReportMetric(float64(t[0].Nanoseconds())/float64(b.N), "without-ns/req")
			b.ReportMetric(float64(t[1].Nanoseconds())/float64(b.N), "with-ns/req")
			b.ReportMetric(float64((t[1]-t[0]).Nanoseconds())/float64(b.N), "added-ns/req")
			b.ReportMetric(added, "added-allocs/req")
		})
	}
}
