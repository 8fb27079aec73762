package bulwark

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// benchBase is the cheapest honest base: a fixed response, body included,
// like a transport that answers from memory.
type benchBase struct{}

func (benchBase) RoundTrip(req *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok")), Request: req}, nil
}

func benchRoundTrips(b *testing.B, rt http.RoundTripper, url string) {
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set("Accept", "application/json")
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := rt.RoundTrip(req)
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	})
}

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
