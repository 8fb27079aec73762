package bulwark

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"
)

func TestTransportContract(t *testing.T) {
	runContract(t, func(base http.RoundTripper) http.RoundTripper {
		tr, err := New(Config{Base: base})
		if err != nil {
			t.Fatal(err)
		}
		return tr
	})
}

func TestRoundTripBadInput(t *testing.T) {
	base := &stubBase{}
	tr, err := New(Config{Base: base})
	if err != nil {
		t.Fatal(err)
	}
	var bs bodies
	req := &http.Request{Method: "POST", Header: http.Header{}, Body: bs.make("x")}
	resp, err := tr.RoundTrip(req)
	if resp != nil || !errors.Is(err, errNilURL) {
		t.Errorf("nil URL: RoundTrip = %v, %v; want nil, errNilURL", resp, err)
	}
	if !bs.allClosed() {
		t.Error("nil URL: request body not closed")
	}
	if base.calls.Load() != 0 {
		t.Error("nil URL: base was called")
	}
}

// TestInvalidRequestAgreesWithNetHTTP holds the hand-written checks of
// invalidRequest to net/http's own: for methods, schemes, header and
// trailer fields drawn from bytes near the RFC's edges, invalidRequest
// refuses a request exactly when an http.Transport refuses it before
// dialing (its dialer, which fails every dial with errDialed, is never
// reached).
func TestInvalidRequestAgreesWithNetHTTP(t *testing.T) {
	errDialed := errors.New("dialed")
	base := &http.Transport{
		Proxy:       nil,
		DialContext: func(context.Context, string, string) (net.Conn, error) { return nil, errDialed },
	}
	t.Cleanup(base.CloseIdleConnections)
	edge := []byte("aZ09-_.!~`|#'*+^%&$ \t\r\n\x00\x01\x1f\x7f\x80\xff:;\"(),/<>=?@[]{}\\")
	field := rapid.Custom(func(t *rapid.T) string {
		return string(rapid.SliceOfN(rapid.SampledFrom(edge), 0, 4).Draw(t, "bytes"))
	})
	// Most draws are well formed, so that both sides are reached often;
	// the rest come from the edge bytes.
	name := rapid.OneOf(rapid.SampledFrom([]string{"X-Id", "Accept"}), rapid.SampledFrom([]string{"X-Id", "Accept"}), field)
	value := rapid.OneOf(rapid.SampledFrom([]string{"", "v 1"}), rapid.SampledFrom([]string{"", "v 1"}), field)
	var refused, sent int
	rapid.Check(t, func(rt *rapid.T) {
		req := &http.Request{
			Method: rapid.OneOf(rapid.SampledFrom([]string{"", "GET", "POST"}), rapid.SampledFrom([]string{"", "GET", "POST"}), field).Draw(rt, "method"),
			URL: &url.URL{
				Scheme: rapid.SampledFrom([]string{"http", "https", "http", "https", "ftp", ""}).Draw(rt, "scheme"),
				Host:   rapid.SampledFrom([]string{"127.0.0.1:1", "127.0.0.1:1", "127.0.0.1:1", ""}).Draw(rt, "host"),
				Path:   "/",
			},
			Header: http.Header{},
		}
		for range rapid.IntRange(0, 2).Draw(rt, "headers") {
			req.Header[name.Draw(rt, "name")] = []string{value.Draw(rt, "value")}
		}
		if rapid.Bool().Draw(rt, "trailer") {
			req.Trailer = http.Header{name.Draw(rt, "tname"): {value.Draw(rt, "tvalue")}}
		}
		_, netErr := base.RoundTrip(req.WithContext(context.Background()))
		ours := invalidRequest(req, true)
		netRefused := netErr != nil && !errors.Is(netErr, errDialed)
		if (ours != nil) != netRefused {
			rt.Fatalf("invalidRequest = %v, net/http = %v: they disagree on %q %s %q trailer %q",
				ours, netErr, req.Method, req.URL, req.Header, req.Trailer)
		}
		if ours != nil && !errors.Is(ours, ErrInvalidRequest) {
			rt.Fatalf("invalidRequest = %v, not ErrInvalidRequest", ours)
		}
		if netRefused {
			refused++
		} else {
			sent++
		}
	})
	// The draws must reach both sides, or the agreement says nothing.
	t.Logf("%d refused before dialing, %d dialed", refused, sent)
	if refused == 0 || sent == 0 {
		t.Fatalf("%d refused, %d sent: the draws missed one side", refused, sent)
	}
}

// TestHostileRedirectLoop: http.Client stops a redirect loop with an error
// after its ten hops; every hop is a bounded call of its own.
func TestHostileRedirectLoop(t *testing.T) {
	var hops atomic.Int64
	up := newCountedUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		hops.Add(1)
		http.Redirect(w, r, r.URL.Path, http.StatusFound)
	})
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	c := &http.Client{Transport: mustNew(t, Config{Base: base})}
	resp, err := c.Get(up.srv.URL + "/loop")
	if err == nil {
		resp.Body.Close()
		t.Fatal("a redirect loop succeeded")
	}
	if !strings.Contains(err.Error(), "redirects") || hops.Load() > 11 {
		t.Errorf("err = %v after %d hops; want the client's redirect limit", err, hops.Load())
	}
}

// The race-detector stress: many goroutines, several hosts, random faults
// from a stub base (no network), every layer on, and the invariants of
// TestPropertyCalls (contract_test.go) checked on every call. Throughput is
// reported by BenchmarkStress, never asserted.

// stressPolicy turns every layer on with small real-time bounds, so hangs
// and pauses cost milliseconds and the breaker cycles through its states.
func stressPolicy() Policy {
	return Policy{
		Timeout:  Timeout{Total: 200 * time.Millisecond, Attempt: 20 * time.Millisecond},
		Retry:    Retry{MaxAttempts: 3, Base: 100 * time.Microsecond, Cap: time.Millisecond, MaxRetryAfter: time.Millisecond},
		Bulkhead: Bulkhead{MaxConcurrent: 8, MaxQueue: 4},
		Breaker:  Breaker{MinCalls: 20, FailureRate: 0.6, Window: time.Second, OpenFor: 20 * time.Millisecond, HalfOpenCalls: 2},
		Fallback: Fallback{Stale: StaleCache{MaxAge: time.Minute}},
	}
}

// stress sends n calls from workers goroutines to five hosts, checks every
// call's invariants, and returns how long the calls took.
func stress(tb testing.TB, n, workers int, seed uint64) time.Duration {
	tb.Helper()
	const body = "stress body \x00\x01\x02"
	base := &propBase{scripts: map[string][]int{}, got: map[string][]sent{}}
	rng := rand.New(rand.NewPCG(seed, 1))
	type call struct {
		method string
		kind   bodyKind
		key    string
		host   int
	}
	calls := make([]call, n)
	for i := range calls {
		// Mostly healthy, as a real fleet is: faults are the exception, so
		// the breaker opens and closes rather than staying open.
		script := make([]int, 1+rng.IntN(3))
		for j := range script {
			switch r := rng.IntN(100); {
			case r < 70:
				script[j] = outOK
			case r < 82:
				script[j] = out503
			case r < 88:
				script[j] = out429
			case r < 98:
				script[j] = outReset
			default:
				script[j] = outHang
			}
		}
		base.scripts[fmt.Sprint(i)] = script
		c := call{method: []string{"GET", "GET", "POST", "PUT"}[rng.IntN(4)], kind: bodyKind(rng.IntN(3)), host: rng.IntN(5)}
		if rng.IntN(3) == 0 {
			c.key = fmt.Sprintf("k%d", i)
		}
		calls[i] = c
	}
	tr, err := New(Config{Base: base, Default: stressPolicy()})
	if err != nil {
		tb.Fatal(err)
	}
	var f propFailure
	var next atomic.Int64
	var ok, fellBack, refused, failed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < workers; w++ {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				c := calls[i]
				req, _ := http.NewRequestWithContext(context.Background(), c.method, fmt.Sprintf("http://h%d.stress/x", c.host), nil)
				req.Header.Set("X-Call", fmt.Sprint(i))
				if c.key != "" {
					req.Header.Set(IdempotencyKeyHeader, c.key)
				}
				var bs bodies
				switch c.kind {
				case replayableBody:
					req.Body, req.ContentLength = bs.make(body), int64(len(body))
					req.GetBody = func() (io.ReadCloser, error) { return bs.make(body), nil }
				case oneShotBody:
					req.Body = bs.make(body)
				}
				snap := snapshot(req)
				resp, err := tr.RoundTrip(req)
				if (resp == nil) == (err == nil) {
					f.Fatalf("call %d: RoundTrip = %v, %v", i, resp, err)
				}
				switch {
				case resp != nil && resp.Header.Get(FallbackHeader) != "":
					fellBack.Add(1)
				case resp != nil:
					ok.Add(1)
				case errors.Is(err, ErrBreakerOpen), errors.Is(err, ErrBulkheadFull), errors.Is(err, ErrPushback):
					refused.Add(1)
				default:
					failed.Add(1)
				}
				if resp != nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				if d := snap.diff(req); d != "" {
					f.Fatalf("call %d: request modified: %s", i, d)
				}
				if !bs.allClosed() {
					f.Fatalf("call %d: a request body was left open", i)
				}
				base.mu.Lock()
				got := base.got[fmt.Sprint(i)]
				base.mu.Unlock()
				replayable := (idempotentMethod(c.method) || c.key != "") && c.kind != oneShotBody
				if !replayable && len(got) > 1 {
					f.Fatalf("call %d (%s, body %d) not replayable, sent %d times", i, c.method, c.kind, len(got))
				}
				for _, s := range got {
					if (c.kind != noBody && s.body != body) || s.key != c.key {
						f.Fatalf("call %d: an attempt carried body %q key %q", i, s.body, s.key)
					}
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	if f.msg != "" {
		tb.Fatal(f.msg)
	}
	checked := 0
	for _, h := range tr.Snapshot().Hosts {
		for _, st := range h.bulkheads() {
			checked++
			if st.InFlight != 0 || st.Queued != 0 {
				tb.Fatalf("bulkhead %s: %d in flight, %d queued after all calls", h.Host, st.InFlight, st.Queued)
			}
		}
	}
	if checked != 5 {
		tb.Fatalf("%d bulkheads checked after all calls, want the five hosts'", checked)
	}
	if t, isT := tb.(*testing.T); isT {
		t.Logf("responses %d (fallback %d), refused by breaker/bulkhead/pushback %d, errors %d",
			ok.Load(), fellBack.Load(), refused.Load(), failed.Load())
	}
	sentTotal := 0
	for _, g := range base.got {
		sentTotal += len(g)
	}
	// Each call makes at most MaxAttempts attempts; most make one.
	if sentTotal > 3*n {
		tb.Fatalf("%d calls made %d attempts, more than 3 each", n, sentTotal)
	}
	return took
}

// TestStress: 10,000 calls, 50 goroutines, five hosts, random faults.
func TestStress(t *testing.T) {
	n := 10000
	if testing.Short() {
		n = 2000
	}
	took := stress(t, n, 50, 1)
	t.Logf("%d calls in %v", n, took.Round(time.Millisecond))
}

// BenchmarkStress reports the stress mix's throughput; b.N is the number
// of calls, spread over 50 goroutines.
func BenchmarkStress(b *testing.B) {
	b.ReportAllocs()
	took := stress(b, max(b.N, 50), 50, 2)
	b.ReportMetric(float64(max(b.N, 50))/took.Seconds(), "req/s")
}
