package debug

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/bulwark-http/bulwark"
)

// benchBase answers from memory, body included: the cheapest honest base.
type benchBase struct{}

func (benchBase) RoundTrip(req *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok")), Request: req}, nil
}

// discardWriter is an http.ResponseWriter that keeps nothing.
type discardWriter struct{}

func (discardWriter) Header() http.Header         { return http.Header{} }
func (discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (discardWriter) WriteHeader(int)             {}

func pageRequest() *http.Request {
	r, _ := http.NewRequest("GET", "/debug/bulwark/", nil)
	return r
}

// BenchmarkMounted is the default stack on the stub base without and with
// a Handler mounted whose sampler takes a Snapshot every millisecond
// (5,000 times its default rate): the handler adds nothing to the request
// path, so the two should differ only by the sampler's share of the CPU.
func BenchmarkMounted(b *testing.B) {
	b.Run("without", func(b *testing.B) {
		benchRoundTrips(b, mustNew(b, bulwark.Config{Base: benchBase{}}))
	})
	b.Run("with-debug", func(b *testing.B) {
		tr := mustNew(b, bulwark.Config{Base: benchBase{}})
		d := newHandler(tr, time.Millisecond, sampleKeep)
		defer d.Close()
		d.ServeHTTP(discardWriter{}, pageRequest()) // starts the sampler
		benchRoundTrips(b, tr)
	})
}

func benchRoundTrips(b *testing.B, rt http.RoundTripper) {
	req, err := http.NewRequest("GET", "http://stub.internal/x", nil)
	if err != nil {
		b.Fatal(err)
	}
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

// TestAddsNoAllocations: a call allocates as much with a Handler mounted
// and served (its sampler running, idle between ticks) as without.
func TestAddsNoAllocations(t *testing.T) {
	req, _ := http.NewRequest("GET", "http://stub.internal/x", nil)
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
	without := allocs(mustNew(t, bulwark.Config{Base: benchBase{}}))
	tr := mustNew(t, bulwark.Config{Base: benchBase{}})
	d := newHandler(tr, time.Hour, sampleKeep)
	defer d.Close()
	d.ServeHTTP(discardWriter{}, pageRequest())
	if with := allocs(tr); with != without {
		t.Errorf("a call allocates %v times with the debug handler mounted, %v without", with, without)
	}
}

// BenchmarkPage1000Hosts renders the HTML page for 1,000 hosts, each with a
// breaker, a bulkhead, its calls by outcome, latency percentiles, a
// fallback with a stale cache and a full history (five minutes, a sample a
// second, with calls, refusals by the breaker and the bulkhead, and
// fallback answers growing), one in ten failing, one in fifty open with
// a full ring of eight state changes and its last trip, and one in fifty
// passing failures up from below (the others calm, folded):
// the ranking and the
// template, from a Page already taken.
func BenchmarkPage1000Hosts(b *testing.B) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	page := Page{Time: now, SampleEvery: sampleEvery}
	for i := range 1000 {
		st := bulwark.CircuitClosed
		calls, failed := int64(100), int64(i%4) // calm: under 5 %
		switch {
		case i%50 == 0:
			st, calls, failed = bulwark.CircuitOpen, 0, 0
		case i%10 == 0:
			failed = 90
		}
		host := fmt.Sprintf("host-%04d.example.internal:443", i)
		br := &bulwark.BreakerSnapshot{State: st, Calls: calls, Failures: failed, OpenUntil: now.Add(3 * time.Second)}
		if st == bulwark.CircuitOpen {
			trip := bulwark.BreakerChange{At: now.Add(-2 * time.Second), From: bulwark.CircuitHalfOpen, To: bulwark.CircuitOpen,
				Reason: "failure rate 90 % ≥ 50 %", Calls: 100, Failures: 90}
			br.LastTrip = &trip
			for k := range 8 { // a full ring of changes
				br.Changes = append(br.Changes, trip)
				br.Changes[k].At = now.Add(-time.Duration(8-k) * time.Minute)
			}
		}
		var passedUp uint64 // a sample's pass-ups per second
		if i%50 == 25 {
			passedUp = 2
		}
		page.Snapshot.Hosts = append(page.Snapshot.Hosts, bulwark.HostSnapshot{Host: host, Scheme: "https", Upstream: "default",
			PassedUp: passedUp * sampleKeep,
			Breaker:  br,
			Bulkhead: &bulwark.BulkheadSnapshot{InFlight: i % 30, Limit: 64, MaxConcurrent: 64},
			Budget:   &bulwark.BudgetSnapshot{Remaining: 10},
			Pushback: &bulwark.PushbackSnapshot{},
			Latency:  &bulwark.LatencySnapshot{Samples: 900, P50: 4 * time.Millisecond, P99: 40 * time.Millisecond, P999: 90 * time.Millisecond},
			Learned:  &bulwark.LearnedSnapshot{AttemptTimeout: time.Second, AttemptFrom: bulwark.FromLearned},
			Fallback: &bulwark.FallbackSnapshot{Served: 12, StaleEntries: 3, StaleBytes: 900, StaleOldest: now.Add(-time.Minute)},
			Calls:    bulwark.CallCounts{Calls: 30000, Succeeded: 29000, Failed: 900, TimedOut: 60, Refused: 40},
		})
		h := History{Host: host, Scheme: "https"}
		for k := range sampleKeep {
			s := st
			h.Samples = append(h.Samples, Sample{Time: now.Add(time.Duration(k-sampleKeep+1) * sampleEvery), InFlight: (i + k) % 30, Calls: calls, Failures: failed, State: &s,
				Refused: uint64(3 * k), RefusedBy: Refusals{Breaker: uint64(2 * k), Bulkhead: uint64(k)}, PassedUp: passedUp * uint64(k),
				Served: uint64(k), Requests: uint64(100 * k), Succeeded: uint64(90 * k)})
		}
		page.History = append(page.History, h)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := pageTemplate.Execute(io.Discard, newView(page, sampleEvery*sampleKeep)); err != nil {
			b.Fatal(err)
		}
	}
}
