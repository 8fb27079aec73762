package bulwark

import (
	"context"
	"errors"
	"io"
	"net/http"
	"testing"
	"testing/synctest"
	"time"
)

// recordedCall makes one call of method through tr with a context carrying
// a fresh CallRecord, and reports whether the call noted a failure in it.
func recordedCall(t *testing.T, tr http.RoundTripper, method string) bool {
	t.Helper()
	var rec CallRecord
	req, err := http.NewRequestWithContext(rec.Attach(t.Context()), method, "http://h.test/x", nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := tr.RoundTrip(req); err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	return rec.FailedBelow()
}

// TestCallRecordNotes: which outcomes of a call made with a CallRecord's
// context note a failure the tier below dealt with, and which do not (see
// NoRetryFromBelow's rules).
func TestCallRecordNotes(t *testing.T) {
	noRetries := Policy{Retry: Retry{Disabled: true}}
	for _, tc := range []struct {
		name   string
		p      Policy
		status int
		header http.Header
		method string
		want   bool
	}{
		{"success", Policy{}, 200, nil, "GET", false},
		{"a wrong request", Policy{}, 404, nil, "GET", false},
		{"retried and still failed", Policy{}, 503, nil, "GET", true},
		{"a 500 retried and still failed", Policy{}, 500, nil, "GET", true},
		{"a POST sent once", Policy{}, 503, nil, "POST", false},
		{"retries off, sent once", noRetries, 503, nil, "GET", false},
		{"a 505, not retryable", Policy{}, 505, nil, "GET", false},
		{"a shed answer", noRetries, 503, http.Header{NoRetryHeader: {"1"}}, "GET", true},
		{"a pass-up from further down", noRetries, 503, http.Header{NoRetryHeader: {NoRetryFromBelow}}, "GET", true},
		{"x-envoy-overloaded", noRetries, 503, http.Header{"X-Envoy-Overloaded": {"true"}}, "GET", true},
		{"a negative gRPC pushback", noRetries, 503, http.Header{"Grpc-Retry-Pushback-Ms": {"-1"}}, "GET", true},
		{"a don't-retry header on a success", Policy{}, 200, http.Header{NoRetryHeader: {"1"}}, "GET", false},
		// A failure a fallback answered is not the service's failure from
		// below; one it answered with a failure, or had no answer for, is.
		{"retried and still failed, a fallback answered", withFallback(200), 503, nil, "GET", false},
		{"retried, a fallback answered 503", withFallback(503), 503, nil, "GET", true},
		{"retried, a fallback answered 429", withFallback(429), 503, nil, "GET", true},
		{"retried, an empty stale cache", Policy{Fallback: Fallback{Stale: StaleCache{MaxAge: time.Minute}}}, 503, nil, "GET", true},
		{"a shed answer, a fallback answered", withFallback(200), 503, http.Header{NoRetryHeader: {"1"}}, "GET", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &headerBase{status: tc.status, header: tc.header}
				tr := mustNew(t, Config{Base: base, Default: tc.p})
				if got := recordedCall(t, tr, tc.method); got != tc.want {
					t.Errorf("noted = %v, want %v (%d requests sent)", got, tc.want, base.calls.Load())
				}
			})
		})
	}
	t.Run("budget spent, a fallback answered", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			// No floor, a ratio of a tenth: the first few calls' retries
			// find no room.
			p := withFallback(200)
			p.Retry.Budget = Budget{Ratio: 0.1, MinPerSecond: -1}
			tr := mustNew(t, Config{Base: &headerBase{status: 503}, Default: p})
			if recordedCall(t, tr, "GET") {
				t.Error("a call the budget refused a retry, answered by the fallback, noted a failure")
			}
			p.Fallback = Fallback{}
			tr = mustNew(t, Config{Base: &headerBase{status: 503}, Default: p})
			if !recordedCall(t, tr, "GET") {
				t.Error("a call the budget refused a retry, with no fallback, noted nothing")
			}
		})
	})
	t.Run("refused by an open breaker", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			tr := testBreaker(t, Breaker{MinCalls: 1, OpenFor: time.Hour}, &headerBase{status: 503})
			if recordedCall(t, tr, "GET") {
				t.Error("the call that tripped the breaker, sent once, noted a failure")
			}
			if !recordedCall(t, tr, "GET") {
				t.Error("a call the open breaker refused noted nothing")
			}
		})
	})
	t.Run("no record", func(t *testing.T) {
		// Without the server half a call behaves as it always did: the
		// same 503s, retried as before.
		synctest.Test(t, func(t *testing.T) {
			base := &headerBase{status: 503}
			tr := mustNew(t, Config{Base: base})
			if _, err := send(t, tr, t.Context(), "http://h.test/x", ""); err != nil {
				t.Fatal(err)
			}
			if n := base.calls.Load(); n != DefaultMaxAttempts {
				t.Errorf("%d requests sent, want %d", n, DefaultMaxAttempts)
			}
		})
	})
}

// withFallback is the package defaults with a constant fallback of status.
func withFallback(status int) Policy {
	return Policy{Fallback: Fallback{Constant: &ConstantResponse{StatusCode: status}}}
}

// TestCallRecordContext: a record's context keeps its parent's deadline,
// cancellation and values, a context derived from it finds the record,
// and deriving one starts no goroutine (checked by goleak in TestMain and
// by the bubble, which would not end with one running).
func TestCallRecordContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		type key struct{}
		parent, cancel := context.WithTimeout(context.WithValue(context.Background(), key{}, "v"), time.Second)
		defer cancel()
		var rec CallRecord
		ctx := rec.Attach(parent)
		if d, ok := ctx.Deadline(); !ok || !d.Equal(time.Now().Add(time.Second)) {
			t.Errorf("Deadline = %v, %v; want the parent's", d, ok)
		}
		if ctx.Value(key{}) != "v" {
			t.Error("the parent's value is lost")
		}
		child, cc := context.WithCancel(ctx)
		defer cc()
		noteBelow(child, noteRefused)
		if !rec.FailedBelow() {
			t.Error("a note through a derived context did not reach the record")
		}
		cancel()
		if child.Err() == nil || ctx.Err() == nil {
			t.Error("the parent's cancellation did not reach the record's context and its child")
		}
	})
}

// TestPassedUpNotCounted: an answer marked NoRetryFromBelow is neither
// retried nor counted against the host by the breaker, however many
// arrive; it is counted apart. The Shedder's "1", and any other value, is
// the host's own failure: not retried, but counted, so the breaker trips.
// A marked answer is matched in any case and spacing, and only on a 429 or
// 5xx other than 501.
func TestPassedUpNotCounted(t *testing.T) {
	for _, tc := range []struct {
		name      string
		value     []string
		status    int
		passedUp  bool
		wantTrips bool
	}{
		{"below", []string{"below"}, 503, true, false},
		{"BELOW, spaced", []string{" BELOW\t"}, 503, true, false},
		{"a 429 below", []string{"below"}, 429, true, false},
		{"the first of two values", []string{"below", "1"}, 502, true, false},
		{"the shed's 1", []string{"1"}, 503, false, true},
		{"garbage", []string{"\x00\xffbelowish"}, 503, false, true},
		{"empty", []string{""}, 503, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &headerBase{status: tc.status, header: http.Header{NoRetryHeader: tc.value}}
				tr := mustNew(t, Config{Base: base, Default: Policy{Breaker: Breaker{MinCalls: 10, WindowCalls: 10}}})
				for range 30 {
					if _, err := send(t, tr, t.Context(), "http://h.test/x", ""); err != nil && !errors.Is(err, ErrBreakerOpen) {
						t.Fatal(err)
					}
				}
				h := tr.Snapshot().Host("h.test:80")[0]
				if tripped := h.Breaker.TotalTrips > 0; tripped != tc.wantTrips {
					t.Errorf("breaker trips %d, want tripped %v", h.Breaker.TotalTrips, tc.wantTrips)
				}
				if h.Budget.Retries != 0 {
					t.Errorf("%d retries of a don't-retry answer", h.Budget.Retries)
				}
				want := uint64(0)
				if tc.passedUp {
					want = 30
				}
				if h.PassedUp != want {
					t.Errorf("PassedUp = %d, want %d", h.PassedUp, want)
				}
			})
		})
	}
	t.Run("a classifier cannot count it", func(t *testing.T) {
		strict := func(resp *http.Response, err error) Verdict {
			return Verdict{Outcome: OutcomeFailure, Retryable: true}
		}
		j := judge(strict, &http.Response{StatusCode: 503, Header: http.Header{NoRetryHeader: {"below"}}}, nil)
		if j.v != (Verdict{Outcome: OutcomeIgnored}) || !j.failed() || j.label() != "passed_up" {
			t.Errorf("judged %+v (failed %v, label %q), want ignored, not retryable, failed for a fallback, labelled passed_up", j.v, j.failed(), j.label())
		}
	})
}

// TestInteropDontRetry: Envoy's x-envoy-overloaded and gRPC's
// grpc-retry-pushback-ms read as bulwark's own signals. A negative or
// malformed pushback stops the retry (gRFC A6) and a malformed one is
// counted; a valid one makes the retry wait at least that long, within
// Retry.MaxRetryAfter; none of them is an error or a pause of the host.
func TestInteropDontRetry(t *testing.T) {
	for _, tc := range []struct {
		name     string
		header   http.Header
		attempts int64
		minWait  time.Duration
		maxWait  time.Duration
		bad      uint64
	}{
		{"envoy overloaded", http.Header{"X-Envoy-Overloaded": {"true"}}, 1, 0, 0, 0},
		{"envoy overloaded, empty", http.Header{"X-Envoy-Overloaded": {""}}, 1, 0, 0, 0},
		{"pushback -1", http.Header{"Grpc-Retry-Pushback-Ms": {"-1"}}, 1, 0, 0, 0},
		{"pushback 250", http.Header{"Grpc-Retry-Pushback-Ms": {"250"}}, 2, 250 * time.Millisecond, 250 * time.Millisecond, 0},
		{"pushback past the cap", http.Header{"Grpc-Retry-Pushback-Ms": {"9999999999"}}, 2, time.Second, time.Second, 0},
		{"pushback 0", http.Header{"Grpc-Retry-Pushback-Ms": {"0"}}, 2, 0, 100 * time.Millisecond, 0},
		{"pushback malformed", http.Header{"Grpc-Retry-Pushback-Ms": {"1e3"}}, 1, 0, 0, 1},
		{"pushback too long", http.Header{"Grpc-Retry-Pushback-Ms": {"12345678901"}}, 1, 0, 0, 1},
		{"pushback empty", http.Header{"Grpc-Retry-Pushback-Ms": {""}}, 1, 0, 0, 1},
		{"pushback a lone minus", http.Header{"Grpc-Retry-Pushback-Ms": {"-"}}, 1, 0, 0, 1},
		{"two pushbacks", http.Header{"Grpc-Retry-Pushback-Ms": {"1", "2"}}, 1, 0, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &headerBase{status: 503, header: tc.header, mu: make(chan struct{}, 1)}
				tr := mustNew(t, Config{Base: base, Default: Policy{
					Retry:   Retry{MaxAttempts: 2, MaxRetryAfter: time.Second},
					Breaker: Breaker{Disabled: true},
				}})
				code, err := send(t, tr, t.Context(), "http://h.test/x", "")
				if err != nil || code != 503 {
					t.Fatalf("got %d, %v; want the 503, no error of its own", code, err)
				}
				if n := base.calls.Load(); n != tc.attempts {
					t.Fatalf("%d attempts, want %d", n, tc.attempts)
				}
				if tc.attempts == 2 {
					if w := base.times[1].Sub(base.times[0]); w < tc.minWait || w > tc.maxWait {
						t.Errorf("retry waited %v, want in [%v, %v]", w, tc.minWait, tc.maxWait)
					}
				}
				if n := tr.Snapshot().RetryAfterIgnored; n != tc.bad {
					t.Errorf("RetryAfterIgnored = %d, want %d", n, tc.bad)
				}
				// No pause of the host: the next call goes at once.
				before := base.calls.Load()
				if _, err := send(t, tr, t.Context(), "http://h.test/x", ""); err != nil {
					t.Fatalf("the next call: %v", err)
				}
				if base.calls.Load() == before {
					t.Error("the next call was not sent")
				}
			})
		})
	}
}
