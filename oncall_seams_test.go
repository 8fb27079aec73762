package bulwark_test

// The seam table's rows for issue 29's counts and history (see seamRows).

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/bulwark-http/bulwark"
)

// A call counts once in CallCounts, by what its caller got: retried to a
// success, one success; every attempt failed and the fallback answered,
// one success too (the fallback counts its answer apart); a request that
// cannot be written, refused before it reaches the host, not at all.
func seamCallCountsRetryFallback(t *testing.T) {
	base := &seamBase{answer: func(n int, req *http.Request) (*http.Response, error) {
		if n == 2 {
			return seamAnswer(req, 0, 200)
		}
		return seamAnswer(req, 0, 503)
	}}
	tr := seamNew(t, bulwark.Config{Base: base, Default: bulwark.Policy{
		Retry:    bulwark.Retry{MaxAttempts: 3, Base: time.Millisecond, Jitter: bulwark.JitterNone},
		Breaker:  bulwark.Breaker{Disabled: true},
		Fallback: bulwark.Fallback{Constant: &bulwark.ConstantResponse{Body: []byte("0")}}}})
	for _, want := range []int{200, 200} {
		if code, err := seamSend(t, tr, "GET", "http://api.test/"); code != want || err != nil {
			t.Fatalf("got %d, %v; want %d", code, err, want)
		}
	}
	if _, err := seamSend(t, tr, "GET", "http://api.test/", "X-Bad\x01Name", "v"); !errors.Is(err, bulwark.ErrInvalidRequest) {
		t.Fatalf("bad header name: %v; want ErrInvalidRequest", err)
	}
	h := seamHost(t, tr, "api.test:80")
	if want := (bulwark.CallCounts{Calls: 2, Succeeded: 2}); h.Calls != want || base.sent() != 5 {
		t.Errorf("Calls = %+v after %d sends, want %+v after 5 (2 attempts, then 3 answered by the fallback)", h.Calls, base.sent(), want)
	}
	if h.Fallback == nil || h.Fallback.Served != 1 {
		t.Errorf("Fallback = %+v, want 1 served", h.Fallback)
	}
}

// The breaker's history is its state's: an Update that moves only its
// thresholds keeps it (and the window at its last trip), one that changes
// its window builds a new breaker, with none.
func seamBreakerHistoryUpdate(t *testing.T) {
	base := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) { return seamAnswer(req, 0, 503) }}
	cfg := bulwark.Config{Base: base, Default: bulwark.Policy{Retry: bulwark.Retry{Disabled: true}, Breaker: seamBreaker}}
	tr := seamNew(t, cfg)
	for range 6 {
		_, _ = seamSend(t, tr, "GET", "http://api.test/")
	}
	b := seamHost(t, tr, "api.test:80").Breaker
	if len(b.Changes) != 1 || b.LastTrip == nil || b.LastTrip.Calls != 5 {
		t.Fatalf("after the trip: Changes %+v, LastTrip %+v; want one trip on 5 calls", b.Changes, b.LastTrip)
	}
	cfg.Default.Breaker.FailureRate = 0.9
	if err := tr.Update(cfg); err != nil {
		t.Fatal(err)
	}
	if b := seamHost(t, tr, "api.test:80").Breaker; len(b.Changes) != 1 || b.LastTrip == nil {
		t.Errorf("after an Update of its rate: Changes %+v, LastTrip %+v; want them kept", b.Changes, b.LastTrip)
	}
	cfg.Default.Breaker.WindowCalls = 20
	if err := tr.Update(cfg); err != nil {
		t.Fatal(err)
	}
	if b := seamHost(t, tr, "api.test:80").Breaker; len(b.Changes) != 0 || b.LastTrip != nil {
		t.Errorf("after an Update of its window: Changes %+v, LastTrip %+v; want a new breaker's, none", b.Changes, b.LastTrip)
	}
}

// An Attempt below the least time a request is sent with (10 ms) is
// sent, times out and is retried like any other; only the call's own
// deadline that close refuses it (ErrDeadlineTooShort).
func seamShortAttemptRetry(t *testing.T) {
	base := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) { return seamAnswer(req, time.Hour, 200) }}
	tr := seamNew(t, bulwark.Config{Base: base, Default: bulwark.Policy{
		Timeout: bulwark.Timeout{Attempt: 5 * time.Millisecond},
		Retry:   bulwark.Retry{MaxAttempts: 3, Base: time.Millisecond, Jitter: bulwark.JitterNone},
		Breaker: bulwark.Breaker{Disabled: true}}})
	if _, err := seamSend(t, tr, "GET", "http://api.test/"); !errors.Is(err, bulwark.ErrAttemptTimeout) || base.sent() != 3 {
		t.Fatalf("got %v after %d sends; want ErrAttemptTimeout after 3", err, base.sent())
	}
	h := seamHost(t, tr, "api.test:80")
	if h.DeadlineTooShort != 0 || h.Calls.TimedOut != 1 {
		t.Errorf("DeadlineTooShort %d, Calls %+v; want 0 and one call timed out", h.DeadlineTooShort, h.Calls)
	}
}
