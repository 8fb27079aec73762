package bulwark

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sony/gobreaker/v2"
)

// BenchmarkTransport compares the bare base with bulwark over it: the router
// alone (every layer off), the router with the deadline layers, and the
// default stack. stub is the pure middleware cost, loopback a real HTTP
// exchange with an httptest server on 127.0.0.1. Compare ratios within one
// run; the absolute figures depend on the machine.
func BenchmarkTransport(b *testing.B) {
	b.Run("stub/bare", func(b *testing.B) { benchRoundTrips(b, benchBase{}, "http://stub.internal/x") })
	off := Policy{
		Timeout:  Timeout{Disabled: true},
		Retry:    Retry{Disabled: true, NoPushback: true},
		Breaker:  Breaker{Disabled: true},
		Bulkhead: Bulkhead{Disabled: true},
	}
	b.Run("stub/router", func(b *testing.B) {
		benchRoundTrips(b, mustNew(b, Config{Base: benchBase{}, Default: off}), "http://stub.internal/x")
	})
	deadlines := off
	deadlines.Timeout = Timeout{}
	b.Run("stub/router+deadlines", func(b *testing.B) {
		benchRoundTrips(b, mustNew(b, Config{Base: benchBase{}, Default: deadlines}), "http://stub.internal/x")
	})
	b.Run("stub/defaults", func(b *testing.B) {
		benchRoundTrips(b, mustNew(b, Config{Base: benchBase{}}), "http://stub.internal/x")
	})

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer srv.Close()
	base := http.DefaultTransport.(*http.Transport).Clone()
	base.MaxIdleConnsPerHost = 64
	defer base.CloseIdleConnections()
	b.Run("loopback/bare", func(b *testing.B) { benchRoundTrips(b, base, srv.URL) })
	b.Run("loopback/bulwark", func(b *testing.B) { benchRoundTrips(b, mustNew(b, Config{Base: base}), srv.URL) })
}

// TestCallAllocations pins what a call costs in allocations over the base,
// for a call whose first attempt succeeds on a base that never waits on its
// context (the stub of BenchmarkTransport): none for the router alone, and
// ten for the default stack, all the attempt layer's: its attemptRun; the
// two of its context.WithCancelCause and the one of its timer; its copy of
// the request and the two of its copy of the header's map; the header
// values; and the body wrapper. Both sides are measured in the same run, so
// the race detector's bookkeeping, if any, falls on both.
func TestCallAllocations(t *testing.T) {
	off := Policy{
		Timeout:  Timeout{Disabled: true},
		Retry:    Retry{Disabled: true, NoPushback: true},
		Breaker:  Breaker{Disabled: true},
		Bulkhead: Bulkhead{Disabled: true},
	}
	req, err := http.NewRequest("GET", "http://stub.internal/x", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/json")
	allocs := func(rt http.RoundTripper) float64 {
		return testing.AllocsPerRun(500, func() {
			resp, err := rt.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		})
	}
	bare := allocs(benchBase{})
	for _, tc := range []struct {
		name string
		cfg  Config
		max  float64
	}{
		{"router", Config{Base: benchBase{}, Default: off}, 0},
		{"defaults", Config{Base: benchBase{}}, 10},
	} {
		if added := allocs(mustNew(t, tc.cfg)) - bare; added > tc.max {
			t.Errorf("%s: %v allocations per call over the base, want at most %v", tc.name, added, tc.max)
		}
	}
}

// BenchmarkRouteLookup measures what Config.Routes adds to the router: the
// same call with all layers off, to a Transport without routes and to one
// with eight, for a literal pattern, a wildcard pattern and a path that
// matches none. Compare the routes cases with "hosts" in one run.
func BenchmarkRouteLookup(b *testing.B) {
	off := only(Policy{})
	// The route's own layers off; the bulkhead and pushback are the host's.
	roff := Policy{Timeout: off.Timeout, Retry: Retry{Disabled: true}, Breaker: off.Breaker}
	routes := map[string]Policy{
		"POST api.example.com/v1/charges": roff,
		"GET /v1/rates/{id}":              roff,
		"GET /v1/rates/latest":            roff,
		"/v1/accounts/":                   roff,
		"/static/":                        roff,
		"GET /v1/users/{id}/orders":       roff,
		"DELETE /v1/users/{id}":           roff,
		"/{$}":                            roff,
	}
	for _, bc := range []struct {
		name, method, url string
		routes            map[string]Policy
	}{
		{"hosts", "GET", "http://api.example.com/v1/rates/latest", nil},
		{"literal", "GET", "http://api.example.com/v1/rates/latest", routes},
		{"literal-host", "POST", "http://api.example.com/v1/charges", routes},
		{"wildcard", "GET", "http://api.example.com/v1/rates/42", routes},
		{"miss", "GET", "http://api.example.com/v2/other", routes},
		// Every request a different ID: the memo never hits.
		{"wildcard-distinct", "GET", "http://api.example.com/v1/rates/%d", routes},
	} {
		b.Run(bc.name, func(b *testing.B) {
			tr := mustNew(b, Config{Base: benchBase{}, Default: off, Routes: bc.routes})
			reqs := benchRequests(b, bc.method, bc.url)
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

// benchRequests makes the requests a benchmark sends in turn: one for url,
// or, when url has a %d, 8192 with a different number in each (an ID in
// the path), so that no memo of recent paths can serve them.
func benchRequests(b *testing.B, method, url string) []*http.Request {
	reqs := make([]*http.Request, 1)
	if strings.Contains(url, "%d") {
		reqs = make([]*http.Request, 8192)
	}
	for i := range reqs {
		u := url
		if len(reqs) > 1 {
			u = fmt.Sprintf(url, i)
		}
		var err error
		if reqs[i], err = http.NewRequest(method, u, nil); err != nil {
			b.Fatal(err)
		}
	}
	return reqs
}

// BenchmarkRouteMatch measures the route lookup alone (routeStack, on a
// host already looked up), the part of BenchmarkRouteLookup that routes
// add, with less of the machine's noise around it.
func BenchmarkRouteMatch(b *testing.B) {
	roff := Policy{Retry: Retry{Disabled: true}}
	routes := map[string]Policy{
		"POST api.example.com/v1/charges": roff, "GET /v1/rates/{id}": roff, "GET /v1/rates/latest": roff,
		"/v1/accounts/": roff, "/static/": roff, "GET /v1/users/{id}/orders": roff, "DELETE /v1/users/{id}": roff, "/{$}": roff,
	}
	for _, bc := range []struct{ name, url string }{
		{"literal", "http://api.example.com/v1/rates/latest"},
		{"wildcard", "http://api.example.com/v1/rates/42"},
		{"subtree", "http://api.example.com/v1/accounts/7"},
		{"miss", "http://api.example.com/v2/other"},
		// Every request a different ID: the memo never hits.
		{"wildcard-distinct", "http://api.example.com/v1/rates/%d"},
		{"miss-distinct", "http://api.example.com/v2/other/%d"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			tr := mustNew(b, Config{Base: benchBase{}, Routes: routes})
			reqs := benchRequests(b, "GET", bc.url)
			hs := tr.lookup(reqs[0].URL)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				tr.routeStack(hs, reqs[i%len(reqs)])
				i++
			}
		})
	}
}

// BenchmarkLearned pairs the default stack, whose attempt timeout and
// slow-call threshold are learned from the host (read from atomics on
// every attempt), with the same stack whose two bounds are set, which only
// records the host's latency (one attempt in eight once the host is busy):
// the difference is what reading the learned bounds costs. What recording
// costs is internal/learn's BenchmarkRecord, over eight. Compare with
// BenchmarkTransport's stub/defaults at the commit before learning for the
// whole.
func BenchmarkLearned(b *testing.B) {
	b.Run("set", func(b *testing.B) {
		p := Policy{Timeout: Timeout{Attempt: attemptCeiling}, Breaker: Breaker{SlowCall: attemptCeiling / 2}}
		benchRoundTrips(b, mustNew(b, Config{Base: benchBase{}, Default: p}), "http://stub.internal/x")
	})
	b.Run("learned", func(b *testing.B) {
		benchRoundTrips(b, mustNew(b, Config{Base: benchBase{}}), "http://stub.internal/x")
	})
}

// BenchmarkCallRecord is the outgoing cost of the server half's record
// (CallRecord), paired in one run: the same call with the package
// defaults over the stub base, its context without a record and with
// one, for a call that succeeds (nothing is noted: the record only makes
// the context one level deeper) and for one an open breaker refuses (the
// refusal is noted: one context lookup and an atomic or).
func BenchmarkCallRecord(b *testing.B) {
	run := func(b *testing.B, tr http.RoundTripper, record bool) {
		ctx := b.Context()
		if record {
			var rec CallRecord
			ctx = rec.Attach(ctx)
		}
		req, err := http.NewRequestWithContext(ctx, "GET", "http://stub.internal/x", nil)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			resp, err := tr.RoundTrip(req)
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
	}
	ok := mustNew(b, Config{Base: benchBase{}})
	b.Run("success/no-record", func(b *testing.B) { run(b, ok, false) })
	b.Run("success/record", func(b *testing.B) { run(b, ok, true) })
	// Open for an hour: every call is refused, no timer probe comes due.
	open := mustNew(b, Config{Base: &staticBase{&http.Response{StatusCode: 503, Body: http.NoBody}},
		Default: Policy{Breaker: Breaker{MinCalls: 1, OpenFor: time.Hour}, Retry: Retry{Disabled: true}}})
	req, _ := http.NewRequest("GET", "http://stub.internal/x", nil)
	if resp, err := open.RoundTrip(req); err == nil {
		resp.Body.Close()
	}
	b.Run("refused/no-record", func(b *testing.B) { run(b, open, false) })
	b.Run("refused/record", func(b *testing.B) { run(b, open, true) })
}

// BenchmarkNoteBelow is the record's own work on a call that failed, apart
// from the call, whose noise (BenchmarkCallRecord) hides it: finding the
// record in a context three levels below it (a deadline and a value
// between, as a handler's outgoing call has) and noting in it, against
// the same lookup in a context without one.
func BenchmarkNoteBelow(b *testing.B) {
	type key struct{}
	derive := func(ctx context.Context) context.Context {
		ctx, cancel := context.WithTimeout(ctx, time.Hour)
		b.Cleanup(cancel)
		return context.WithValue(ctx, key{}, 1)
	}
	var rec CallRecord
	with, without := derive(rec.Attach(context.Background())), derive(context.Background())
	b.Run("no-record", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			noteBelow(without, noteRefused)
		}
	})
	b.Run("record", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			noteBelow(with, noteRefused)
		}
	})
}

// BenchmarkOpenRefusal is what a call costs that an open breaker refuses,
// through the whole default stack (New(Config{}) over the stub), one
// caller at a time: the breaker held open by ControlBreaker, and one
// tripped by its host's failures (held open for an hour, so no probe comes
// due). A refusal is what a service pays most of in an outage. gobreaker
// is the reference, paired in the same run: its open breaker in a
// RoundTripper of a few lines, nothing else.
func BenchmarkOpenRefusal(b *testing.B) {
	run := func(b *testing.B, tr http.RoundTripper) {
		req, err := http.NewRequest("GET", "http://stub.internal/x", nil)
		if err != nil {
			b.Fatal(err)
		}
		req.Header.Set("Accept", "application/json")
		b.ReportAllocs()
		for b.Loop() {
			if _, err := tr.RoundTrip(req); !errors.Is(err, ErrBreakerOpen) && !errors.Is(err, gobreaker.ErrOpenState) {
				b.Fatalf("RoundTrip: %v, want an open breaker's refusal", err)
			}
		}
	}
	b.Run("gobreaker", func(b *testing.B) {
		cb := gobreaker.NewCircuitBreaker[*http.Response](gobreaker.Settings{Timeout: time.Hour,
			ReadyToTrip: func(gobreaker.Counts) bool { return true }})
		rt := roundTripFunc(func(req *http.Request) (*http.Response, error) {
			return cb.Execute(func() (*http.Response, error) { return nil, errors.New("down") })
		})
		req, _ := http.NewRequest("GET", "http://stub.internal/x", nil)
		_, _ = rt.RoundTrip(req) // trips it
		run(b, rt)
	})
	b.Run("forced", func(b *testing.B) {
		tr := mustNew(b, Config{Base: benchBase{}})
		if err := tr.ControlBreaker("stub.internal:80", BreakerForceOpen); err != nil {
			b.Fatal(err)
		}
		run(b, tr)
	})
	b.Run("tripped", func(b *testing.B) {
		tr := mustNew(b, Config{Base: &staticBase{&http.Response{StatusCode: 503, Body: http.NoBody}},
			Default: Policy{Breaker: Breaker{MinCalls: 1, OpenFor: time.Hour}}})
		req, _ := http.NewRequest("GET", "http://stub.internal/x", nil)
		for range 10 {
			if resp, err := tr.RoundTrip(req); err == nil {
				resp.Body.Close()
			} else if errors.Is(err, ErrBreakerOpen) {
				break
			}
		}
		run(b, tr)
	})
}

// BenchmarkCallCancellable is the default stack's healthy call under a
// caller's context that can be cancelled (a server's request, a
// WithTimeout): what the body's watch on that context costs (body.watch),
// with the context made once, as a server's request makes one for all its
// calls. Compare with the same benchmark on a tree without the watch.
func BenchmarkCallCancellable(b *testing.B) {
	tr := mustNew(b, Config{Base: benchBase{}})
	ctx, cancel := context.WithCancel(b.Context())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", "http://stub.internal/x", nil)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		resp, err := tr.RoundTrip(req)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}
