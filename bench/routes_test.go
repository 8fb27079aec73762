package bench

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/bulwark-http/bulwark"
)

// routeCostRoutes are eight routes that inherit everything from the
// host's policy, so a routed call goes through the same layers as an
// unrouted one and the difference is the routing.
var routeCostRoutes = map[string]bulwark.Policy{
	"POST api.example.com/v1/charges": {}, "GET /v1/rates/{id}": {}, "GET /v1/rates/latest": {},
	"/v1/accounts/": {}, "/static/": {}, "GET /v1/users/{id}/orders": {}, "DELETE /v1/users/{id}": {}, "/{$}": {},
}

// routeCostRequests is one request sent again and again ("same"), or 8192
// with a different ID in each path ("distinct"), so that no memo of
// recent paths can serve them.
func routeCostRequests(b *testing.B, kind string) []*http.Request {
	reqs := make([]*http.Request, 1)
	if kind == "distinct" {
		reqs = make([]*http.Request, 8192)
	}
	for i := range reqs {
		u := "http://api.example.com/v1/rates/42"
		if len(reqs) > 1 {
			u = fmt.Sprintf("http://api.example.com/v1/rates/%d", i)
		}
		req, err := http.NewRequest("GET", u, nil)
		if err != nil {
			b.Fatal(err)
		}
		req.Header.Set("Accept", "application/json")
		reqs[i] = req
	}
	return reqs
}

func routeCostTransport(b *testing.B, routes map[string]bulwark.Policy) *bulwark.Transport {
	tr, err := bulwark.New(bulwark.Config{Base: ctxBase{}, Routes: routes})
	if err != nil {
		b.Fatal(err)
	}
	return tr
}

// BenchmarkRouteCost measures what Config.Routes adds over host routing on
// a realistic base (ctxBase) with the default policy: the same calls to a
// Transport without routes ("hosts") and to one with eight routes that
// inherit everything ("routes"), for one path sent again and again
// ("same") and for paths that are all different, an ID in each
// ("distinct"). The paired cases send through both in one loop, in
// alternating blocks, so that a shared machine's drift falls on both
// alike; their added-ns/req is what routing costs per request.
func BenchmarkRouteCost(b *testing.B) {
	for _, kind := range []string{"same", "distinct"} {
		for _, withRoutes := range []bool{false, true} {
			name := "hosts-" + kind
			var rs map[string]bulwark.Policy
			if withRoutes {
				name, rs = "routes-"+kind, routeCostRoutes
			}
			b.Run(name, func(b *testing.B) {
				tr := routeCostTransport(b, rs)
				reqs := routeCostRequests(b, kind)
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					resp, err := tr.RoundTrip(reqs[i%len(reqs)])
					i++
					if err != nil {
						b.Fatal(err)
					}
					resp.Body.Close()
				}
			})
		}
		b.Run("paired-"+kind, func(b *testing.B) {
			rts := []http.RoundTripper{routeCostTransport(b, nil), routeCostTransport(b, routeCostRoutes)}
			reqs := routeCostRequests(b, kind)
			t := interleaveRequests(b, reqs, pairedBlock, rts...)
			b.ReportMetric(float64(t[0].Nanoseconds())/float64(b.N), "hosts-ns/req")
			b.ReportMetric(float64(t[1].Nanoseconds())/float64(b.N), "routes-ns/req")
			b.ReportMetric(float64((t[1]-t[0]).Nanoseconds())/float64(b.N), "added-ns/req")
		})
	}
}
