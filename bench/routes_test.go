package bench

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/bulwark-http/bulwark"
)

// BenchmarkRouteCost measures what Config.Routes adds over host routing on
// a realistic base (ctxBase) with the default policy: the same calls to a
// Transport without routes ("hosts") and to one with eight routes that
// inherit everything ("routes"), for one path sent again and again
// ("same") and for paths that are all different, an ID in each
// ("distinct", 8192 of them, so no route memo can help). Compare routes
// with hosts of the same kind, in one run.
func BenchmarkRouteCost(b *testing.B) {
	routes := map[string]bulwark.Policy{
		"POST api.example.com/v1/charges": {}, "GET /v1/rates/{id}": {}, "GET /v1/rates/latest": {},
		"/v1/accounts/": {}, "/static/": {}, "GET /v1/users/{id}/orders": {}, "DELETE /v1/users/{id}": {}, "/{$}": {},
	}
	for _, kind := range []string{"same", "distinct"} {
		for _, withRoutes := range []bool{false, true} {
			name := "hosts-" + kind
			var rs map[string]bulwark.Policy
			if withRoutes {
				name, rs = "routes-"+kind, routes
			}
			b.Run(name, func(b *testing.B) {
				tr, err := bulwark.New(bulwark.Config{Base: ctxBase{}, Routes: rs})
				if err != nil {
					b.Fatal(err)
				}
				reqs := make([]*http.Request, 1)
				if kind == "distinct" {
					reqs = make([]*http.Request, 8192)
				}
				for i := range reqs {
					u := "http://api.example.com/v1/rates/42"
					if len(reqs) > 1 {
						u = fmt.Sprintf("http://api.example.com/v1/rates/%d", i)
					}
					if reqs[i], err = http.NewRequest("GET", u, nil); err != nil {
						b.Fatal(err)
					}
					reqs[i].Header.Set("Accept", "application/json")
				}
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
	}
}
