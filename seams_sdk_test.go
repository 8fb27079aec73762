package bulwark_test

// Seam rows where a retrying client above bulwark (an SDK's attempt
// header) meets bulwark's own retry, hedge, budget and breaker, and where
// a server's retry-after-ms meets the pushback layer. Listed in seamRows.

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/bulwark-http/bulwark"
)

// stainless is the attempt header OpenAI's and Anthropic's SDKs send,
// with the number of the SDK's retry (0 on its first try).
const stainless = "X-Stainless-Retry-Count"

// An SDK's request answered 503 is sent once, where the same request
// unmarked is retried; inside a served request, the SDK's resend that
// fails marks the record (the SDK retried it below), its first try does
// not (the layer above may still retry).
func seamSDKRetry(t *testing.T) {
	base := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) { return seamAnswer(req, 0, 503) }}
	tr := seamNew(t, bulwark.Config{Base: base})
	if code, _ := seamSend(t, tr, "GET", "http://sdk.test/", stainless, "0"); code != 503 || base.sent() != 1 {
		t.Fatalf("SDK-marked GET: %d after %d attempts; want its 503 after 1", code, base.sent())
	}
	if code, _ := seamSend(t, tr, "GET", "http://sdk.test/"); code != 503 || base.sent() != 1+bulwark.DefaultMaxAttempts {
		t.Fatalf("unmarked GET: %d, %d attempts in all; want 503 after %d of its own", code, base.sent(), bulwark.DefaultMaxAttempts)
	}
	for _, tc := range []struct {
		count string
		want  bool
	}{{"0", false}, {"2", true}} {
		var rec bulwark.CallRecord
		req, _ := http.NewRequestWithContext(rec.Attach(t.Context()), "GET", "http://sdk.test/", nil)
		req.Header.Set(stainless, tc.count)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if rec.FailedBelow() != tc.want {
			t.Errorf("SDK try %s failed: record says failed below %v, want %v", tc.count, rec.FailedBelow(), tc.want)
		}
	}
}

// A hedging policy sends no hedge of an SDK's request: the SDK resends it
// itself, and a hedge would be one more copy than the SDK alone sends.
func seamSDKHedge(t *testing.T) {
	base := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) {
		return seamAnswer(req, 100*time.Millisecond, 200)
	}}
	tr := seamNew(t, bulwark.Config{Base: base, Default: bulwark.Policy{Hedge: bulwark.Hedge{Delay: 10 * time.Millisecond}}})
	if code, _ := seamSend(t, tr, "GET", "http://sdk.test/", stainless, "0"); code != 200 || base.sent() != 1 {
		t.Fatalf("SDK-marked slow GET: %d after %d attempts; want 200 after 1", code, base.sent())
	}
	if h := seamHost(t, tr, "sdk.test:80").Hedge; h.Sent != 0 {
		t.Fatalf("hedge %+v; want none sent", h)
	}
	if code, _ := seamSend(t, tr, "GET", "http://sdk.test/"); code != 200 || seamHost(t, tr, "sdk.test:80").Hedge.Sent != 1 {
		t.Fatalf("unmarked slow GET: %d, hedges %+v; want one sent", code, seamHost(t, tr, "sdk.test:80").Hedge)
	}
}

// The budget counts an SDK's requests as calls and draws no retry for
// them: they give room to the retries of the host's other calls.
func seamSDKBudget(t *testing.T) {
	base := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) { return seamAnswer(req, 0, 503) }}
	tr := seamNew(t, bulwark.Config{Base: base})
	for range 20 {
		seamSend(t, tr, "GET", "http://sdk.test/", "Amz-Sdk-Request", "attempt=1; max=3")
	}
	if b := seamHost(t, tr, "sdk.test:80").Budget; b.Calls != 20 || b.Retries != 0 || b.Refused != 0 {
		t.Fatalf("budget %+v after 20 failed SDK calls; want 20 calls, no retry drawn or refused", b)
	}
}

// The breaker sees an SDK's failed requests: it opens on them, and then
// refuses the SDK's next try without sending it, as any other request.
func seamSDKBreaker(t *testing.T) {
	base := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) { return seamAnswer(req, 0, 503) }}
	tr := seamNew(t, bulwark.Config{Base: base, Default: bulwark.Policy{Breaker: bulwark.Breaker{MinCalls: 10, WindowCalls: 10}}})
	for i := range 10 {
		seamSend(t, tr, "GET", "http://sdk.test/", stainless, "0")
		if i < 9 && seamHost(t, tr, "sdk.test:80").Breaker.State != bulwark.CircuitClosed {
			t.Fatalf("breaker opened after %d SDK failures, want 10", i+1)
		}
	}
	if st := seamHost(t, tr, "sdk.test:80").Breaker.State; st != bulwark.CircuitOpen {
		t.Fatalf("breaker %v after 10 failed SDK requests; want open", st)
	}
	if _, err := seamSend(t, tr, "GET", "http://sdk.test/", stainless, "1"); !errors.Is(err, bulwark.ErrBreakerOpen) || base.sent() != 10 {
		t.Fatalf("the SDK's retry: %v, %d sent; want ErrBreakerOpen, nothing more sent", err, base.sent())
	}
}

// A 429's retry-after-ms pauses the host as Retry-After does: an unmarked
// request in the pause is refused unsent, an SDK's waits the pause out
// and is sent when it ends (refused, it would spend one of the SDK's
// tries), and the pause shows in the snapshot.
func seamRetryAfterMsPushback(t *testing.T) {
	var mu sync.Mutex
	var at []time.Time
	base := &seamBase{answer: func(n int, req *http.Request) (*http.Response, error) {
		mu.Lock()
		at = append(at, time.Now())
		mu.Unlock()
		if n == 1 {
			return seamAnswer(req, 0, 429, "retry-after-ms", "300")
		}
		return seamAnswer(req, 0, 200)
	}}
	tr := seamNew(t, bulwark.Config{Base: base, Default: bulwark.Policy{Retry: bulwark.Retry{Disabled: true}}})
	start := time.Now()
	if code, _ := seamSend(t, tr, "GET", "http://sdk.test/"); code != 429 {
		t.Fatalf("first call: %d, want 429", code)
	}
	if until := seamHost(t, tr, "sdk.test:80").Pushback.Until; !until.Equal(start.Add(300 * time.Millisecond)) {
		t.Fatalf("pause until %v, want %v", until, start.Add(300*time.Millisecond))
	}
	if _, err := seamSend(t, tr, "GET", "http://sdk.test/"); !errors.Is(err, bulwark.ErrPushback) {
		t.Fatalf("unmarked call in the pause: %v, want ErrPushback", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://sdk.test/", nil)
	req.Header.Set(stainless, "1")
	if _, err := tr.RoundTrip(req); !errors.Is(err, bulwark.ErrPushback) {
		t.Fatalf("SDK call whose deadline ends in the pause: %v, want ErrPushback at once", err)
	}
	if code, _ := seamSend(t, tr, "GET", "http://sdk.test/", stainless, "1"); code != 200 {
		t.Fatalf("SDK call in the pause: %d, want 200 once it ends", code)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(at) != 2 || at[1].Sub(at[0]) != 300*time.Millisecond {
		t.Fatalf("sent at %v; want the SDK's request 300ms after the 429", at)
	}
}
