package bulwark

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

func TestRetriedAbove(t *testing.T) {
	for _, tc := range []struct {
		name string
		kv   []string
		want above
		bad  bool
	}{
		{"none", nil, aboveNone, false},
		{"unrelated", []string{"Accept", "*/*"}, aboveNone, false},
		{"amz first", []string{"amz-sdk-request", "attempt=1; max=3"}, aboveFirst, false},
		{"amz resend, not its last", []string{"amz-sdk-request", "attempt=2; max=3"}, aboveFirst, false},
		{"amz last resend", []string{"amz-sdk-request", "attempt=3; max=3"}, aboveResend, false},
		{"amz resend, no max", []string{"amz-sdk-request", "attempt=2"}, aboveResend, false},
		{"amz ttl", []string{"amz-sdk-request", "ttl=20260101T000000Z; attempt=3; max=3"}, aboveResend, false},
		{"amz no max", []string{"amz-sdk-request", "attempt=1"}, aboveFirst, false},
		{"amz max 1: the SDK does not retry", []string{"amz-sdk-request", "attempt=1; max=1"}, aboveNone, false},
		{"amz past max", []string{"amz-sdk-request", "attempt=4; max=3"}, aboveNone, true},
		{"amz zero", []string{"amz-sdk-request", "attempt=0; max=3"}, aboveNone, true},
		{"amz garbage", []string{"amz-sdk-request", "attempt=x"}, aboveNone, true},
		{"amz no attempt", []string{"amz-sdk-request", "max=3"}, aboveNone, true},
		{"amz twice in one", []string{"amz-sdk-request", "attempt=1; attempt=2"}, aboveNone, true},
		{"amz two values", []string{"amz-sdk-request", "attempt=1", "amz-sdk-request", "attempt=2"}, aboveNone, true},
		{"stainless first", []string{"X-Stainless-Retry-Count", "0"}, aboveFirst, false},
		{"stainless resend", []string{"X-Stainless-Retry-Count", "2"}, aboveResend, false},
		{"stainless negative", []string{"X-Stainless-Retry-Count", "-1"}, aboveNone, true},
		{"stainless huge", []string{"X-Stainless-Retry-Count", "99999"}, aboveNone, true},
		{"google first", []string{"X-Goog-Api-Client", "gccl-invocation-id/abc gccl-attempt-count/1 gl-go/1.26 gccl/1.2"}, aboveFirst, false},
		{"google resend", []string{"X-Goog-Api-Client", "gccl-invocation-id/abc gccl-attempt-count/3"}, aboveResend, false},
		{"google without a count", []string{"X-Goog-Api-Client", "gl-go/1.26 gccl/1.2"}, aboveNone, false},
		{"google bad count", []string{"X-Goog-Api-Client", "gccl-attempt-count/x"}, aboveNone, true},
		{"azure", []string{"x-ms-client-request-id", "0f8fad5b-d9cb-469f-a165-70867728950e"}, aboveFirst, false},
		{"azure empty", []string{"x-ms-client-request-id", " "}, aboveNone, true},
		{"stripe", []string{"X-Stripe-Client-User-Agent", `{"lang":"go"}`}, aboveFirst, false},
		{"bulwark above", []string{AttemptHeader, "1"}, aboveFirst, false},
		{"bulwark above resend", []string{AttemptHeader, "2"}, aboveResend, false},
		{"bulwark zero", []string{AttemptHeader, "0"}, aboveNone, true},
		{"bad bulwark, good amz", []string{AttemptHeader, "x", "amz-sdk-request", "attempt=3; max=3"}, aboveResend, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			for i := 0; i+1 < len(tc.kv); i += 2 {
				h.Add(tc.kv[i], tc.kv[i+1])
			}
			var n atomic.Uint64
			if got := retriedAbove(h, &n); got != tc.want {
				t.Errorf("retriedAbove(%v) = %d, want %d", h, got, tc.want)
			}
			if got := n.Load() == 1; got != tc.bad {
				t.Errorf("retriedAbove(%v) counted %d ignored values, want bad=%v", h, n.Load(), tc.bad)
			}
		})
	}
}

func TestResponseSignals(t *testing.T) {
	for _, tc := range []struct {
		kv        []string
		stop, bad bool
	}{
		{[]string{"x-should-retry", "false"}, true, false},
		{[]string{"x-should-retry", "False "}, true, false},
		{[]string{"x-should-retry", "true"}, false, false},
		{[]string{"x-should-retry", "maybe"}, false, true},
		{[]string{"x-should-retry", "false", "x-should-retry", "false"}, false, true},
		{[]string{"Stripe-Should-Retry", "false"}, true, false},
		{[]string{"x-should-retry", "maybe", "x-envoy-overloaded", "1"}, true, true},
	} {
		h := http.Header{}
		for i := 0; i+1 < len(tc.kv); i += 2 {
			h.Add(tc.kv[i], tc.kv[i+1])
		}
		if stop, _, bad := noRetry(h); stop != tc.stop || bad != tc.bad {
			t.Errorf("noRetry(%v) = stop %v, bad %v; want %v, %v", h, stop, bad, tc.stop, tc.bad)
		}
	}
	now := time.Now()
	for _, tc := range []struct {
		kv   []string
		want time.Duration
		ok   bool
		bad  bool
	}{
		{[]string{"retry-after-ms", "300"}, 300 * time.Millisecond, true, false},
		{[]string{"retry-after-ms", "12.2"}, 13 * time.Millisecond, true, false},
		{[]string{"retry-after-ms", "12.0"}, 12 * time.Millisecond, true, false},
		{[]string{"x-ms-retry-after-ms", "40"}, 40 * time.Millisecond, true, false},
		{[]string{"X-Amz-Retry-After", "1500"}, 1500 * time.Millisecond, true, false},
		{[]string{"retry-after-ms", "300", "Retry-After", "1"}, time.Second, true, false},
		{[]string{"retry-after-ms", "1300", "Retry-After", "1"}, 1300 * time.Millisecond, true, false},
		{[]string{"retry-after-ms", "-5"}, 0, false, true},
		{[]string{"retry-after-ms", "1e3"}, 0, false, true},
		{[]string{"retry-after-ms", "1."}, 0, false, true},
		{[]string{"retry-after-ms", "999999999"}, 0, false, true},
		{[]string{"retry-after-ms", "oops", "Retry-After", "2"}, 2 * time.Second, true, true},
		{[]string{"retry-after-ms", "oops", "X-Amz-Retry-After", "20"}, 20 * time.Millisecond, true, true},
	} {
		h := http.Header{}
		for i := 0; i+1 < len(tc.kv); i += 2 {
			h.Add(tc.kv[i], tc.kv[i+1])
		}
		var n atomic.Uint64
		d, ok := retryAfter(&http.Response{StatusCode: 429, Header: h}, now, &n)
		if d != tc.want || ok != tc.ok || (n.Load() == 1) != tc.bad {
			t.Errorf("retryAfter(429, %v) = %v, %v (counted %d); want %v, %v (bad %v)", h, d, ok, n.Load(), tc.want, tc.ok, tc.bad)
		}
		if d, ok := retryAfter(&http.Response{StatusCode: 500, Header: h}, now, &n); ok || d != 0 {
			t.Errorf("retryAfter(500, %v) = %v, %v; want nothing: only 429 and 503 carry a wait", h, d, ok)
		}
	}
}

// sdkHeaders are one request header of each retrying client bulwark
// recognises, as that client sends its first try.
var sdkHeaders = [][2]string{
	{"Amz-Sdk-Request", "attempt=1; max=3"},
	{"X-Stainless-Retry-Count", "0"},
	{"X-Goog-Api-Client", "gccl-invocation-id/abc gccl-attempt-count/1"},
	{"X-Ms-Client-Request-Id", "0f8fad5b-d9cb-469f-a165-70867728950e"},
	{"X-Stripe-Client-User-Agent", `{"lang":"go"}`},
	{AttemptHeader, "1"},
}

// TestSDKAboveSentOnce: with zero config, a request a retrying client
// above marks is sent once however it fails (no retry, no hedge), a keyed
// POST included; without the mark, the same request is retried.
func TestSDKAboveSentOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, kv := range append(sdkHeaders, [2]string{}) {
			for _, method := range []string{http.MethodGet, http.MethodPost} {
				sb := &scriptBase{step: always(503)}
				tr, err := New(Config{Base: sb, Default: Policy{Hedge: Hedge{Enabled: true, Delay: time.Millisecond}}})
				if err != nil {
					t.Fatal(err)
				}
				req, _ := http.NewRequestWithContext(t.Context(), method, "http://sdk.test/x", nil)
				req.Header.Set(IdempotencyKeyHeader, "k1")
				if kv[0] != "" {
					req.Header.Set(kv[0], kv[1])
				}
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatalf("%s %s: %v", method, kv[0], err)
				}
				resp.Body.Close()
				want := 1
				if kv[0] == "" {
					want = DefaultMaxAttempts
				}
				if n := sb.calls(); n < want || kv[0] != "" && n != 1 {
					t.Errorf("%s with %q: sent %d times, want %d", method, kv[0], n, want)
				}
				if kv[0] == AttemptHeader {
					if got := sb.all()[0].attempt; got != "1" {
						t.Errorf("Bulwark-Attempt from above reached the host as %q, want it kept as sent (1)", got)
					}
				}
				tr.Close()
			}
		}
	})
}

// TestSDKAboveBulwarkOverBulwark: a bulwark Transport whose Base is
// another: the outer retries, the inner sends each of its attempts once,
// and the host sees the outer's attempt numbers.
func TestSDKAboveBulwarkOverBulwark(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sb := &scriptBase{step: always(503)}
		inner, err := New(Config{Base: sb})
		if err != nil {
			t.Fatal(err)
		}
		defer inner.Close()
		outer, err := New(Config{Base: inner, Default: Policy{Retry: Retry{Budget: Budget{Disabled: true}}}})
		if err != nil {
			t.Fatal(err)
		}
		defer outer.Close()
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://nested.test/x", nil)
		resp, err := outer.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		got := sb.all()
		if len(got) != DefaultMaxAttempts {
			t.Fatalf("host got %d attempts, want %d (the outer's alone)", len(got), DefaultMaxAttempts)
		}
		for i, s := range got {
			if want := string(rune('1' + i)); s.attempt != want {
				t.Errorf("attempt %d reached the host as Bulwark-Attempt %q, want %q", i+1, s.attempt, want)
			}
		}
	})
}

// TestSDKShouldRetryFalse: a 500 with x-should-retry: false is sent
// exactly once; a malformed value is counted and changes nothing.
func TestSDKShouldRetryFalse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, tc := range []struct {
			val  string
			want int
		}{{"false", 1}, {"true", DefaultMaxAttempts}, {"nope", DefaultMaxAttempts}} {
			sb := &scriptBase{step: always(500, "x-should-retry", tc.val)}
			tr, err := New(Config{Base: sb})
			if err != nil {
				t.Fatal(err)
			}
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://should.test/x", nil)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if n := sb.calls(); n != tc.want {
				t.Errorf("x-should-retry: %s: sent %d times, want %d", tc.val, n, tc.want)
			}
			wantBad := uint64(0)
			if tc.val == "nope" {
				wantBad = DefaultMaxAttempts // each response that carried it
			}
			if got := tr.Snapshot().RetryAfterIgnored; got != wantBad {
				t.Errorf("x-should-retry: %s: RetryAfterIgnored = %d, want %d", tc.val, got, wantBad)
			}
			tr.Close()
		}
	})
}

// TestSDKRetryAfterMs: a 429 with retry-after-ms: 300 makes bulwark's own
// retry wait 300 ms, and pauses the host: a call in between is refused
// without being sent.
func TestSDKRetryAfterMs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var sentAt []time.Time
		sb := &scriptBase{step: func(n int, req *http.Request) (*http.Response, error) {
			mu.Lock()
			defer mu.Unlock()
			sentAt = append(sentAt, time.Now())
			if n == 1 {
				return response(req, 429, "retry-after-ms", "300"), nil
			}
			return response(req, 200), nil
		}}
		tr, err := New(Config{Base: sb})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		done := make(chan error, 1)
		go func() {
			req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, "http://ms.test/x", nil)
			resp, err := tr.RoundTrip(req)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			done <- err
		}()
		time.Sleep(100 * time.Millisecond)
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://ms.test/y", nil)
		if _, err := tr.RoundTrip(req); !errors.Is(err, ErrPushback) {
			t.Errorf("a call 100 ms into a 300 ms retry-after-ms: %v, want ErrPushback", err)
		}
		// A request a retrying client above marks waits the pause out
		// instead of spending one of that client's tries, and is sent
		// when it ends.
		sdkDone := make(chan time.Time, 1)
		go func() {
			req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, "http://ms.test/sdk", nil)
			req.Header.Set("X-Stainless-Retry-Count", "0")
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Errorf("an SDK's request during the pause: %v, want it sent when the pause ends", err)
			} else {
				resp.Body.Close()
			}
			sdkDone <- time.Now()
		}()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		at := <-sdkDone
		mu.Lock()
		defer mu.Unlock()
		if len(sentAt) != 3 || sentAt[2].Before(sentAt[0].Add(300*time.Millisecond)) || at.Before(sentAt[2]) {
			t.Errorf("the SDK's request was sent at %v, want one sent no sooner than 300ms after the 429 at %v", sentAt[len(sentAt)-1], sentAt[0])
		}
		sentAt = sentAt[:2]
		if len(sentAt) != 2 {
			t.Fatalf("sent %d times, want 2", len(sentAt))
		}
		if gap := sentAt[1].Sub(sentAt[0]); gap < 300*time.Millisecond {
			t.Errorf("retry went %v after a retry-after-ms of 300, want ≥ 300ms", gap)
		}
	})
}

// slowFirstByte is a host whose answers take quick, except for requests
// to /complete, which take slow; each waits until the attempt's context
// ends, if sooner.
type slowFirstByte struct {
	quick, slow time.Duration
	complete    atomic.Int64 // attempts at /complete
}

func (h *slowFirstByte) RoundTrip(req *http.Request) (*http.Response, error) {
	d := h.quick
	if req.URL.Path == "/complete" {
		h.complete.Add(1)
		d = h.slow
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return response(req, 200), nil
	case <-req.Context().Done():
		return nil, context.Cause(req.Context())
	}
}

// TestSDKLearnedBoundLongCompletion: with zero config, after 300 quick
// calls a host's learned attempt timeout is a few times their p99.9; a
// completion whose first byte comes far later is cut by it when bulwark
// retries the call itself (a plain GET: three cut attempts), and not when
// a retrying client above sends it (the SDK's mark): it is sent once, and
// answered as a plain client would have it answered. The second case is
// the 30 s completion on a host whose quick calls take 2 s, under an SDK
// whose request timeout is a minute: not cut by the learned 6 s, nor by
// the default Total of 30 s (the SDK's deadline bounds it).
func TestSDKLearnedBoundLongCompletion(t *testing.T) {
	for _, tc := range []struct {
		quick, slow time.Duration
	}{{50 * time.Millisecond, 1500 * time.Millisecond}, {2 * time.Second, 30 * time.Second}} {
		synctest.Test(t, func(t *testing.T) {
			h := &slowFirstByte{quick: tc.quick, slow: tc.slow}
			tr, err := New(Config{Base: h})
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			get := func(path string, kv ...string) (time.Duration, error) {
				// The SDK's own request timeout, as OpenAI's
				// WithRequestTimeout sets it.
				ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://llm.test"+path, nil)
				for i := 0; i+1 < len(kv); i += 2 {
					req.Header.Set(kv[i], kv[i+1])
				}
				start := time.Now()
				resp, err := tr.RoundTrip(req)
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				return time.Since(start), err
			}
			for range 300 {
				if _, err := get("/quick"); err != nil {
					t.Fatal(err)
				}
			}
			l := tr.Snapshot().Hosts[0].Learned
			if l.AttemptFrom != FromLearned || l.AttemptTimeout >= tc.slow {
				t.Fatalf("after 300 quick calls: attempt timeout %v (%s), want one learned below %v", l.AttemptTimeout, l.AttemptFrom, tc.slow)
			}
			took, err := get("/complete", "X-Stainless-Retry-Count", "0")
			if err != nil || took != tc.slow || h.complete.Load() != 1 {
				t.Errorf("completion of %v under an SDK, learned timeout %v: took %v, err %v, %d attempts; want it answered in %v, sent once",
					tc.slow, l.AttemptTimeout, took, err, h.complete.Load(), tc.slow)
			}
			h.complete.Store(0)
			if _, err := get("/complete"); !errors.Is(err, ErrAttemptTimeout) || h.complete.Load() != DefaultMaxAttempts {
				t.Errorf("completion of %v retried by bulwark itself: err %v after %d attempts; want ErrAttemptTimeout after %d (its learned timeout is its retransmission timer)",
					tc.slow, err, h.complete.Load(), DefaultMaxAttempts)
			}
			t.Logf("quick %v, learned attempt timeout %v; a %v completion under an SDK answered", tc.quick, l.AttemptTimeout, tc.slow)
		})
	}
}

// TestSDKHungHostBounded: a request a retrying client above marks, with no
// deadline of its own (an SDK that sets no timeout, or any caller that
// sends the header), to a host that never answers, still ends at the
// default Total, and such calls in a row trip the breaker: a header
// cannot lift the bound on a hung host.
func TestSDKHungHostBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var sent atomic.Int64
		hung := roundTripFunc(func(req *http.Request) (*http.Response, error) {
			sent.Add(1)
			<-req.Context().Done()
			return nil, context.Cause(req.Context())
		})
		tr, err := New(Config{Base: hung})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		call := func() (time.Duration, error) {
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://hung.test/", nil)
			req.Header.Set("X-Stainless-Retry-Count", "0")
			start := time.Now()
			resp, err := tr.RoundTrip(req)
			if err == nil {
				resp.Body.Close()
			}
			return time.Since(start), err
		}
		took, err := call()
		if !errors.Is(err, ErrTotalTimeout) || took != DefaultTotalTimeout || sent.Load() != 1 {
			t.Fatalf("a marked call to a hung host: err %v after %v, %d sent; want ErrTotalTimeout after %v, sent once", err, took, sent.Load(), DefaultTotalTimeout)
		}
		for i := 2; i <= 20; i++ {
			if _, err := call(); errors.Is(err, ErrBreakerOpen) {
				t.Logf("refused at call %d, %d sent", i, sent.Load())
				return
			}
		}
		t.Fatalf("20 marked calls to a hung host, %d sent, none refused; want the breaker to trip on the unanswered run", sent.Load())
	})
}

// BenchmarkRetriedAbove is what reading the signals of a client above
// costs each call: a request of a few headers, none of them an SDK's, and
// one of an SDK's first try.
func BenchmarkRetriedAbove(b *testing.B) {
	plain := http.Header{"Accept": {"*/*"}, "User-Agent": {"Go-http-client/1.1"}, "Authorization": {"Bearer x"}, "Content-Type": {"application/json"}}
	sdk := plain.Clone()
	sdk["Amz-Sdk-Request"] = []string{"attempt=1; max=3"}
	for _, bc := range []struct {
		name string
		h    http.Header
	}{{"plain", plain}, {"aws", sdk}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			var n atomic.Uint64
			for b.Loop() {
				retriedAbove(bc.h, &n)
			}
		})
	}
}

// FuzzSDKSignals: whatever a client above or a server puts in the
// headers bulwark reads, reading them never panics, counts at most one
// ignored value per request, marks a request only as one of the three
// kinds, and obeys no wait past a day or below zero.
func FuzzSDKSignals(f *testing.F) {
	for _, s := range []string{"attempt=1; max=3", "0", "gccl-attempt-count/2", "x", "", "12.5", "-1", "attempt=3; max=2", "999999999", "1."} {
		f.Add(s, s)
	}
	f.Fuzz(func(t *testing.T, req, resp string) {
		for _, k := range []string{hdrBulwarkAttempt, hdrAmzSDKRequest, hdrStainlessRetries, hdrGoogAPIClient, hdrMSClientReqID, hdrStripeClientUA} {
			var n atomic.Uint64
			a := retriedAbove(http.Header{k: {req}}, &n)
			if a > aboveResend || n.Load() > 1 {
				t.Fatalf("%s: %q gave %d, %d counted", k, req, a, n.Load())
			}
		}
		for _, k := range []string{hdrRetryAfterMs, hdrMSRetryAfterMs, hdrAmzRetryAfter} {
			var n atomic.Uint64
			d, ok := retryAfter(&http.Response{StatusCode: 429, Header: http.Header{k: {resp}}}, time.Now(), &n)
			if d < 0 || d > 24*time.Hour || ok == (n.Load() == 1) && resp != "" {
				t.Fatalf("%s: %q gave %v, %v with %d counted", k, resp, d, ok, n.Load())
			}
		}
		noRetry(http.Header{hdrShouldRetry: {resp}, hdrStripeShouldRetry: {req}})
	})
}
