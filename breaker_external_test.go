package bulwark_test

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bulwark-http/bulwark"
)

// slowPastBase is an in-memory host that answers 200 after latency until
// sick is set, then fails every request after 1 ms: with a connection
// reset, or with a 503 when answer is set.
type slowPastBase struct {
	latency time.Duration
	answer  bool
	sick    atomic.Bool
	sent    atomic.Int64 // requests while sick
}

func (s *slowPastBase) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		req.Body.Close()
	}
	code := http.StatusOK
	if !s.sick.Load() {
		time.Sleep(s.latency)
	} else {
		s.sent.Add(1)
		time.Sleep(time.Millisecond)
		if !s.answer {
			return nil, &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
		}
		code = http.StatusServiceUnavailable
	}
	return &http.Response{
		StatusCode: code, Status: http.StatusText(code), Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{}, Body: io.NopCloser(strings.NewReader("")), Request: req,
	}, nil
}

// refusedAt drives up to calls sequential calls, gap apart, and returns the
// 1-based number of the first one the breaker refused, or 0.
func refusedAt(t *testing.T, tr *bulwark.Transport, calls int, gap time.Duration) int {
	t.Helper()
	for i := range calls {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://sick.test/x", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := tr.RoundTrip(req)
		if errors.Is(err, bulwark.ErrBreakerOpen) {
			return i + 1
		}
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		time.Sleep(gap)
	}
	return 0
}

// TestBreakerHoldsOnlyWhatAQueueMakes: with Config{}, after 1,500 healthy
// calls the breaker has learned a hold (12 × the p99.9, at most 10 s),
// which only slow calls and bulwark's own timeouts wait for. A host that
// then resets every connection is cut off within a few calls, and one
// that answers 503 to every call, however fast the calls come, within
// 110: neither is a queue's artefact.
func TestBreakerHoldsOnlyWhatAQueueMakes(t *testing.T) {
	for _, c := range []struct {
		name         string
		latency, gap time.Duration
		answer       bool
		within       int
	}{
		{"1 s host, then connection resets", time.Second, 0, false, 10},
		{"300 ms host, then connection resets", 300 * time.Millisecond, 0, false, 10},
		{"5 ms host, then 503s 1 ms apart", 5 * time.Millisecond, time.Millisecond, true, 110},
		{"1 s host, then 503s 10 ms apart", time.Second, 10 * time.Millisecond, true, 110},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &slowPastBase{latency: c.latency, answer: c.answer}
				tr, err := bulwark.New(bulwark.Config{Base: base})
				if err != nil {
					t.Fatal(err)
				}
				defer tr.Close()
				if n := refusedAt(t, tr, 1500, 0); n != 0 {
					t.Fatalf("healthy call %d refused", n)
				}
				base.sick.Store(true)
				n := refusedAt(t, tr, 20_000, c.gap)
				t.Logf("first refused at call %d of the change (0: never in 20,000), %d requests sent", n, base.sent.Load())
				if n == 0 || n > c.within {
					t.Errorf("first refused at call %d (0: never), want within %d", n, c.within)
				}
			})
		})
	}
}

// TestBreakerSlowCallerSeesProbes holds what the contract says of a caller
// that calls less often than the open time (1 s): a host failing in bursts
// of 50 calls, called once every 3 s, trips the breaker, and each call
// after a trip goes as a probe, so none is refused.
func TestBreakerSlowCallerSeesProbes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &patternBase{fail: func(n int64) bool { return n/50%2 == 1 }}
		base.sick.Store(true)
		tr, err := bulwark.New(bulwark.Config{Base: base})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		n := refusedAt(t, tr, 600, 3*time.Second)
		hs := tr.Snapshot().Host("sick.test:80")
		if len(hs) != 1 || hs[0].Breaker == nil {
			t.Fatalf("no breaker for sick.test: %+v", hs)
		}
		trips := hs[0].Breaker.TotalTrips
		t.Logf("600 calls 3 s apart: %d trips, first refused at call %d (0: never)", trips, n)
		if trips == 0 || n != 0 {
			t.Errorf("%d trips, first refused at call %d; want trips and no refusal", trips, n)
		}
	})
}

// patternBase is an in-memory host that answers at once: 200, or 503 when
// fail says the n-th request it sees (from 0) fails. Until sick is set it
// answers every request 200, and n counts from the first request after.
type patternBase struct {
	fail func(n int64) bool
	sick atomic.Bool
	n    atomic.Int64
	// last100 is a bit per answer, 1 for a 503, of the last 100 (calls
	// are sequential in these tests).
	last100 [100]bool
	answers int
}

// failedOfLast100 is how many of the last 100 answers were 503s.
func (p *patternBase) failedOfLast100() int {
	n := 0
	for _, f := range p.last100 {
		if f {
			n++
		}
	}
	return n
}

func (p *patternBase) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		req.Body.Close()
	}
	code := http.StatusOK
	if p.sick.Load() && p.fail(p.n.Add(1)-1) {
		code = http.StatusServiceUnavailable
	}
	p.last100[p.answers%100] = code != http.StatusOK
	p.answers++
	return &http.Response{
		StatusCode: code, Status: http.StatusText(code), Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{}, Body: io.NopCloser(strings.NewReader("")), Request: req,
	}, nil
}

// failurePatterns are the ways a host fails that a user meets: a round
// robin over five instances of which three are dead, the same shifted by
// one request, every other request, and failures at random.
func failurePatterns() []struct {
	name string
	rate float64 // the share of requests that fail
	fail func(n int64) bool
} {
	random := func(p float64, seed uint64) func(int64) bool {
		r := rand.New(rand.NewPCG(seed, 36))
		return func(int64) bool { return r.Float64() < p }
	}
	return []struct {
		name string
		rate float64
		fail func(n int64) bool
	}{
		{"round robin fail,fail,fail,ok,ok", 0.6, func(n int64) bool { return n%5 < 3 }},
		{"round robin shifted by one", 0.6, func(n int64) bool { return (n+1)%5 < 3 }},
		{"every other call", 0.5, func(n int64) bool { return n%2 == 0 }},
		{"60 % at random", 0.6, random(0.6, 1)},
		{"80 % at random", 0.8, random(0.8, 2)},
		{"30 % at random", 0.3, random(0.3, 3)},
	}
}

// TestBreakerCutsOffAHostFailingHalfItsCalls: with Config{} and nothing
// else, a host that starts failing half its requests or more, in whatever
// pattern, is refused within 110 calls of the change, whether it starts
// sick or after 1,500 healthy calls; one failing 30 % at random is never
// refused. One call every 50 ms, each answered at once.
func TestBreakerCutsOffAHostFailingHalfItsCalls(t *testing.T) {
	for _, warm := range []int{0, 1500} {
		for _, p := range failurePatterns() {
			name := p.name + "/cold"
			if warm > 0 {
				name = p.name + "/after 1,500 healthy calls"
			}
			t.Run(name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					base := &patternBase{fail: p.fail}
					tr, err := bulwark.New(bulwark.Config{Base: base})
					if err != nil {
						t.Fatal(err)
					}
					defer tr.Close()
					if n := refusedAt(t, tr, warm, 50*time.Millisecond); n != 0 {
						t.Fatalf("healthy call %d refused", n)
					}
					base.sick.Store(true)
					n := refusedAt(t, tr, 1000, 50*time.Millisecond)
					t.Logf("first refused at call %d of the change (0: never), after %d requests to the host", n, base.n.Load())
					switch {
					case p.rate >= 0.5 && (n == 0 || n > 110):
						t.Errorf("failing %.0f %%: first refused at call %d of the change (0: never), want within 110", 100*p.rate, n)
					case p.rate < 0.5 && n != 0:
						t.Errorf("failing %.0f %%: refused at call %d, want never", 100*p.rate, n)
					}
				})
			})
		}
	}
}

// TestBreakerSparesAHostFailingUnderHalf: a zero-config client refuses a
// host failing 30 to 45 % of its requests at random only as its contract
// says: when the last 100 requests held 50 failures or more. A 100-call
// window cannot promise more: at 40 % a stretch of 100 calls with 50
// failures comes within a few thousand calls, at 30 % about once in
// run in a hundred of 10,000 calls (a simulation of the rule with its
// 4-call hold: 2 of 200 seeds).
// These fixed seeds see none at 30 % in 10,000 calls.
func TestBreakerSparesAHostFailingUnderHalf(t *testing.T) {
	for i, rate := range []float64{0.30, 0.35, 0.40, 0.45} {
		t.Run(fmt.Sprintf("%.0f %%", 100*rate), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := rand.New(rand.NewPCG(uint64(i), 45))
				base := &patternBase{fail: func(int64) bool { return r.Float64() < rate }}
				base.sick.Store(true)
				tr, err := bulwark.New(bulwark.Config{Base: base})
				if err != nil {
					t.Fatal(err)
				}
				defer tr.Close()
				n := refusedAt(t, tr, 10_000, 50*time.Millisecond)
				t.Logf("failing %.0f %% at random: first refused at call %d (0: never), the last 100 answers holding %d failures", 100*rate, n, base.failedOfLast100())
				switch {
				case n != 0 && base.failedOfLast100() < 50:
					t.Errorf("refused at call %d with %d failures in the last 100 answers, want ≥ 50", n, base.failedOfLast100())
				case rate == 0.30 && n != 0:
					t.Errorf("failing 30 %% at random: refused at call %d, want never in 10,000", n)
				}
			})
		})
	}
}
