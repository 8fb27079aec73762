package bulwark_test

import (
	"errors"
	"io"
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
