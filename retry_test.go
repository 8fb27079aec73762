package bulwark

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"pgregory.net/rapid"
)

func alwaysErr(err error) func(int, *http.Request) (*http.Response, error) {
	return func(int, *http.Request) (*http.Response, error) { return nil, err }
}

// TestRetryWhatIsRetried is the table of which requests and outcomes are
// sent again, and how many times.
func TestRetryWhatIsRetried(t *testing.T) {
	certErr := &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}
	noHost := &net.DNSError{Err: "no such host", Name: "x.invalid", IsNotFound: true}
	dnsTimeout := &net.DNSError{Err: "i/o timeout", Name: "x.test", IsTimeout: true}
	tests := []struct {
		name      string
		method    string
		url       string
		kind      bodyKind
		body      string
		headers   []string
		policy    Retry
		step      func(int, *http.Request) (*http.Response, error)
		wantCalls int
	}{
		{name: "POST no key 503", method: "POST", kind: replayableBody, body: "charge", step: always(503), wantCalls: 1},
		{name: "POST no key reset", method: "POST", kind: replayableBody, body: "charge", step: alwaysErr(errReset), wantCalls: 1},
		{name: "POST no key attempt timeout", method: "POST", kind: replayableBody, body: "charge", step: alwaysErr(errAttemptTO), wantCalls: 1},
		{name: "POST Idempotency-Key 503", method: "POST", kind: replayableBody, body: "charge", headers: []string{"Idempotency-Key", "k1"}, step: always(503), wantCalls: 3},
		{name: "POST X-Idempotency-Key reset", method: "POST", kind: replayableBody, body: "charge", headers: []string{"X-Idempotency-Key", "k1"}, step: alwaysErr(errReset), wantCalls: 3},
		{name: "POST KeyPOST 503", method: "POST", kind: replayableBody, body: "charge", policy: Retry{KeyPOST: true}, step: always(503), wantCalls: 3},
		{name: "POST KeyPOST one-shot body", method: "POST", kind: oneShotBody, body: "charge", policy: Retry{KeyPOST: true}, step: always(503), wantCalls: 1},
		{name: "PATCH no key 503", method: "PATCH", kind: replayableBody, body: "x", step: always(503), wantCalls: 1},
		{name: "PUT 503", method: "PUT", kind: replayableBody, body: "doc", step: always(503), wantCalls: 3},
		{name: "PUT reset", method: "PUT", kind: replayableBody, body: "doc", step: alwaysErr(errReset), wantCalls: 3},
		{name: "PUT attempt timeout", method: "PUT", kind: replayableBody, body: "doc", step: alwaysErr(errAttemptTO), wantCalls: 3},
		{name: "PUT one-shot body", method: "PUT", kind: oneShotBody, body: "doc", step: always(503), wantCalls: 1},
		{name: "PUT one-shot buffered", method: "PUT", kind: oneShotBody, body: "doc", policy: Retry{BufferBody: 16}, step: always(503), wantCalls: 3},
		{name: "PUT one-shot over buffer", method: "PUT", kind: oneShotBody, body: "a body longer than sixteen bytes", policy: Retry{BufferBody: 16}, step: always(503), wantCalls: 1},
		{name: "DELETE 504", method: "DELETE", step: always(504), wantCalls: 3},
		{name: "GET 502", method: "GET", step: always(502), wantCalls: 3},
		{name: "GET 429", method: "GET", step: always(429), wantCalls: 3},
		{name: "GET 400", method: "GET", step: always(400), wantCalls: 1},
		{name: "GET 401", method: "GET", step: always(401), wantCalls: 1},
		{name: "GET 404", method: "GET", step: always(404), wantCalls: 1},
		{name: "GET 409", method: "GET", step: always(409), wantCalls: 1},
		{name: "GET 422", method: "GET", step: always(422), wantCalls: 1},
		// 500 and 408 are retried since the one classification (classify.go).
		{name: "GET 500", method: "GET", step: always(500), wantCalls: 3},
		{name: "GET 408", method: "GET", step: always(408), wantCalls: 3},
		{name: "POST no key 500", method: "POST", kind: replayableBody, body: "charge", step: always(500), wantCalls: 1},
		{name: "GET 505", method: "GET", step: always(505), wantCalls: 1},
		{name: "GET 501", method: "GET", step: always(501), wantCalls: 1},
		{name: "GET 200", method: "GET", step: always(200), wantCalls: 1},
		{name: "GET 503 no-retry marker", method: "GET", step: always(503, NoRetryHeader, "1"), wantCalls: 1},
		{name: "GET cert error", method: "GET", step: alwaysErr(&net.OpError{Op: "remote error", Err: certErr}), wantCalls: 1},
		{name: "GET hostname error", method: "GET", step: alwaysErr(x509.HostnameError{Certificate: &x509.Certificate{}, Host: "x"}), wantCalls: 1},
		{name: "GET no such host", method: "GET", step: alwaysErr(noHost), wantCalls: 1},
		{name: "GET DNS timeout", method: "GET", step: alwaysErr(dnsTimeout), wantCalls: 3},
		{name: "GET EOF", method: "GET", step: alwaysErr(io.ErrUnexpectedEOF), wantCalls: 3},
		{name: "GET breaker open", method: "GET", step: alwaysErr(fmt.Errorf("breaker: %w", ErrBreakerOpen)), wantCalls: 1},
		{name: "GET bulkhead full", method: "GET", step: alwaysErr(fmt.Errorf("bulkhead: %w", ErrBulkheadFull)), wantCalls: 1},
		{name: "GET deadline too short", method: "GET", step: alwaysErr(ErrDeadlineTooShort), wantCalls: 1},
		{name: "GET unsupported scheme", method: "GET", url: "ftp://files.test/x", step: alwaysErr(errors.New("unsupported protocol scheme")), wantCalls: 1},
		{name: "GET 503 then 200", method: "GET", step: func(n int, req *http.Request) (*http.Response, error) {
			if n == 1 {
				return response(req, 503), nil
			}
			return response(req, 200), nil
		}, wantCalls: 2},
		{name: "GET MaxAttempts 1", method: "GET", policy: Retry{MaxAttempts: 1}, step: always(503), wantCalls: 1},
		{name: "GET MaxAttempts 5", method: "GET", policy: Retry{MaxAttempts: 5}, step: always(503), wantCalls: 5},
		{name: "GET Disabled", method: "GET", policy: Retry{Disabled: true}, step: always(503), wantCalls: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &scriptBase{step: tt.step}
				tr, _, _ := newTestTransport(t, base, Policy{Retry: tt.policy})
				url := tt.url
				if url == "" {
					url = "http://api.test/v1/thing"
				}
				req := testRequest(t, t.Context(), tt.method, url, tt.kind, tt.body, tt.headers...)
				callerKey := req.Header.Get(IdempotencyKeyHeader)
				status, _, err := checkContract(t, tr, req, nil)
				if got := base.calls(); got != tt.wantCalls {
					t.Fatalf("sent %d times, want %d (status %d, err %v)", got, tt.wantCalls, status, err)
				}
				if req.Header.Get(IdempotencyKeyHeader) != callerKey {
					t.Errorf("caller's Idempotency-Key changed")
				}
				for i, s := range base.all() {
					if s.body != tt.body {
						t.Errorf("attempt %d body = %q, want %q", i+1, s.body, tt.body)
					}
					if want := fmt.Sprint(i + 1); !tt.policy.Disabled && s.attempt != want {
						t.Errorf("attempt %d: %s = %q, want %q", i+1, AttemptHeader, s.attempt, want)
					}
					if tt.policy.KeyPOST && tt.wantCalls > 1 && (s.key == "" || s.key != base.all()[0].key) {
						t.Errorf("attempt %d key = %q, want the first attempt's %q", i+1, s.key, base.all()[0].key)
					}
				}
				if err != nil && tt.wantCalls > 1 {
					var re *RetryError
					if !errors.As(err, &re) || re.Attempts != tt.wantCalls {
						t.Errorf("err = %v, want a *RetryError with Attempts %d", err, tt.wantCalls)
					}
					if want := fmt.Sprintf("bulwark: failed after %d attempts: ", tt.wantCalls); !strings.HasPrefix(err.Error(), want) {
						t.Errorf("err = %q, want prefix %q", err, want)
					}
				}
				if err != nil && tt.wantCalls == 1 {
					if _, werr := tt.step(1, req); err != werr {
						t.Errorf("single attempt: err = %v, want the base's error untouched (%v)", err, werr)
					}
				}
			})
		})
	}
}

func TestRetryErrorsWrapCause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Every attempt meets a connection reset, injected at the attempt.
		base := &scriptBase{step: always(200)}
		tr, _, waits := newTestTransport(t, base, Policy{Fault: Fault{ResetRate: 1}})
		_, err := tr.RoundTrip(testRequest(t, t.Context(), "GET", "http://api.test/", noBody, ""))
		if len(*waits) != DefaultMaxAttempts-1 || base.calls() != 0 {
			t.Errorf("%d retries, %d sent; want %d retries of injected resets, none sent", len(*waits), base.calls(), DefaultMaxAttempts-1)
		}
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("err = %v, want one wrapping ECONNRESET", err)
		}
		var op *net.OpError
		if !errors.As(err, &op) {
			t.Errorf("err = %v, want errors.As to find the *net.OpError", err)
		}
		if errors.Is(err, ErrRetryBudget) {
			t.Errorf("err = %v matches ErrRetryBudget with the budget untouched", err)
		}
	})
}

// TestRetryFinalResponseUntouched: the caller gets the last attempt's
// response itself, body unread.
func TestRetryFinalResponseUntouched(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var last *http.Response
		base := &scriptBase{step: func(n int, req *http.Request) (*http.Response, error) {
			last = response(req, 503, "X-N", fmt.Sprint(n))
			return last, nil
		}}
		tr, _, _ := newTestTransport(t, base, Policy{})
		resp, err := tr.RoundTrip(testRequest(t, t.Context(), "GET", "http://api.test/", noBody, ""))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp != last || resp.Header.Get("X-N") != "3" {
			t.Fatalf("got response %d (X-N %q), want the third attempt's, untouched", resp.StatusCode, resp.Header.Get("X-N"))
		}
		if b, _ := io.ReadAll(resp.Body); string(b) != "status 503" {
			t.Errorf("body = %q", b)
		}
	})
}

// TestRetryHooks: CheckRetry replaces bulwark's judgement of an outcome
// (here a 505, which bulwark alone does not retry), Backoff replaces its
// waits, a CheckRetry error ends the call with that error, and the safety
// checks still come first.
func TestRetryHooks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &scriptBase{step: always(505)}
		var backoffCalls []int
		tr, _, waits := newTestTransport(t, base, Policy{Retry: Retry{
			CheckRetry: func(ctx context.Context, resp *http.Response, err error) (bool, error) {
				return resp != nil && resp.StatusCode == 505, nil
			},
			Backoff: func(lo, hi time.Duration, n int, resp *http.Response) time.Duration {
				backoffCalls = append(backoffCalls, n)
				return 7 * time.Millisecond
			},
		}})
		resp, err := tr.RoundTrip(testRequest(t, t.Context(), "GET", "http://api.test/", noBody, ""))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if base.calls() != 3 || fmt.Sprint(backoffCalls) != "[0 1]" || fmt.Sprint(*waits) != "[7ms 7ms]" {
			t.Errorf("calls %d, Backoff called with %v, waits %v; want 3, [0 1], [7ms 7ms]", base.calls(), backoffCalls, *waits)
		}
		// And the other way: a CheckRetry that refuses keeps a 503 from
		// being retried.
		base503 := &scriptBase{step: always(503)}
		tr503, _, _ := newTestTransport(t, base503, Policy{Retry: Retry{CheckRetry: func(context.Context, *http.Response, error) (bool, error) { return false, nil }}})
		resp, err = tr503.RoundTrip(testRequest(t, t.Context(), "GET", "http://api.test/", noBody, ""))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if base503.calls() != 1 {
			t.Errorf("503 with a refusing CheckRetry sent %d times, want 1", base503.calls())
		}
		// A CheckRetry error with a true is returned once the attempts
		// run out, as go-retryablehttp does, and the responses it judged
		// are closed.
		stop := errors.New("check: stop")
		var bs bodies
		baseStop := &scriptBase{step: func(_ int, req *http.Request) (*http.Response, error) {
			resp := response(req, 505)
			resp.Body = bs.make("judged")
			return resp, nil
		}}
		trStop, _, _ := newTestTransport(t, baseStop, Policy{Retry: Retry{CheckRetry: func(context.Context, *http.Response, error) (bool, error) { return true, stop }}})
		resp, err = trStop.RoundTrip(testRequest(t, t.Context(), "GET", "http://api.test/", noBody, ""))
		if resp != nil || !errors.Is(err, stop) || baseStop.calls() != 3 {
			t.Errorf("got %v, %v after %d sends; want the CheckRetry error after 3", resp, err, baseStop.calls())
		}
		if !bs.allClosed() {
			t.Error("the response CheckRetry judged was not closed")
		}
		// The safety checks still come first: a POST is still sent once.
		base2 := &scriptBase{step: always(500)}
		tr2, _, _ := newTestTransport(t, base2, Policy{Retry: Retry{CheckRetry: func(context.Context, *http.Response, error) (bool, error) { return true, nil }}})
		resp, err = tr2.RoundTrip(testRequest(t, t.Context(), "POST", "http://api.test/", replayableBody, "x"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if base2.calls() != 1 {
			t.Errorf("POST with a permissive CheckRetry sent %d times, want 1", base2.calls())
		}
	})
}

func TestRetryBackoffJitter(t *testing.T) {
	const base, cap = 100 * time.Millisecond, time.Second
	tests := []struct {
		jitter Jitter
		pick   string // "top" or "bottom" of each random range
		want   []time.Duration
	}{
		{JitterNone, "top", []time.Duration{100e6, 200e6, 400e6, 800e6, 1e9, 1e9}},
		{JitterFull, "top", []time.Duration{100e6, 200e6, 400e6, 800e6, 1e9, 1e9}},
		{JitterFull, "bottom", []time.Duration{0, 0, 0, 0, 0, 0}},
		{JitterEqual, "top", []time.Duration{100e6, 200e6, 400e6, 800e6, 1e9, 1e9}},
		{JitterEqual, "bottom", []time.Duration{50e6, 100e6, 200e6, 400e6, 500e6, 500e6}},
		// random(base, 3 × previous), previous starting at base.
		{JitterDecorrelated, "top", []time.Duration{300e6, 900e6, 1e9, 1e9, 1e9, 1e9}},
		{JitterDecorrelated, "bottom", []time.Duration{100e6, 100e6, 100e6, 100e6, 100e6, 100e6}},
	}
	for _, tt := range tests {
		t.Run(tt.jitter.String()+"/"+tt.pick, func(t *testing.T) {
			tr := mustNew(t, Config{Base: &stubBase{}, Default: only(Policy{Retry: Retry{Base: base, Cap: cap, Jitter: tt.jitter}}, "retry")})
			// Set before the host's stack is built, which takes it.
			tr.randN = func(n int64) int64 {
				if tt.pick == "top" {
					return n - 1
				}
				return 0
			}
			r := layerOf[*retryLayer](t, tr, "http://api.test/")
			prev := base
			for n, want := range tt.want {
				if got := r.backoffWait(n, nil, &prev, math.MaxInt64); got != want {
					t.Errorf("backoffWait(%d) = %v, want %v", n, got, want)
				}
			}
		})
	}
	// Huge Base and many retries must not overflow.
	tr := mustNew(t, Config{Base: &stubBase{}, Default: only(Policy{Retry: Retry{Base: time.Hour, Cap: 2 * time.Hour, Jitter: JitterNone}}, "retry")})
	r := layerOf[*retryLayer](t, tr, "http://api.test/")
	prev := r.base
	if got := r.backoffWait(9, nil, &prev, math.MaxInt64); got != 2*time.Hour {
		t.Errorf("backoffWait with a huge base = %v, want the cap", got)
	}
}

// TestRetryBackoffRoom: the jitter draws the first retry's wait (Base 100
// ms) from the part of its range that fits the room before the deadline;
// a range wholly above the room is drawn as ever (decide finds it late).
func TestRetryBackoffRoom(t *testing.T) {
	const base, cap = 100 * time.Millisecond, time.Second
	for _, tc := range []struct {
		jitter Jitter
		room   time.Duration
		want   time.Duration // at the top of the range drawn from
	}{
		{JitterFull, 30 * time.Millisecond, 30 * time.Millisecond},
		{JitterFull, 0, 0},
		{JitterFull, -time.Millisecond, 100 * time.Millisecond}, // nothing fits: drawn as ever, late
		{JitterFull, time.Second, 100 * time.Millisecond},
		{JitterEqual, 70 * time.Millisecond, 70 * time.Millisecond},
		{JitterEqual, 30 * time.Millisecond, 100 * time.Millisecond}, // below its half: late
		{JitterDecorrelated, 150 * time.Millisecond, 150 * time.Millisecond},
		{JitterDecorrelated, 50 * time.Millisecond, 300 * time.Millisecond}, // below Base: late
		{JitterNone, 30 * time.Millisecond, 100 * time.Millisecond},
	} {
		tr := mustNew(t, Config{Base: &stubBase{}, Default: only(Policy{Retry: Retry{Base: base, Cap: cap, Jitter: tc.jitter}}, "retry")})
		tr.randN = func(n int64) int64 { return n - 1 }
		r := layerOf[*retryLayer](t, tr, "http://api.test/")
		prev := base
		if got := r.backoffWait(0, nil, &prev, tc.room); got != tc.want {
			t.Errorf("%v: backoffWait(0) with %v of room = %v, want %v", tc.jitter, tc.room, got, tc.want)
		}
	}
}

// TestRetryBackoffRoomProperty: over random policies, retry numbers,
// rooms and random draws, a retry's wait (1) stays within its jitter's
// range; (2) fits the room whenever some of the range does; (3) is what
// it would have been without a deadline whenever the whole range fits,
// the same draws given.
func TestRetryBackoffRoomProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		jitter := Jitter(rapid.IntRange(1, 4).Draw(rt, "jitter"))
		base := time.Duration(rapid.Int64Range(1, int64(time.Second)).Draw(rt, "base"))
		cap := base + time.Duration(rapid.Int64Range(0, int64(10*time.Second)).Draw(rt, "capOver"))
		n := rapid.IntRange(0, 12).Draw(rt, "retry")
		prev := base + time.Duration(rapid.Int64Range(0, int64(cap-base)).Draw(rt, "prevOver"))
		room := time.Duration(rapid.Int64Range(-int64(time.Second), int64(20*time.Second)).Draw(rt, "room"))
		picks := rapid.SliceOfN(rapid.Float64Range(0, 1), 1, 1).Draw(rt, "pick")
		tr, err := New(Config{Base: &stubBase{}, Default: only(Policy{Retry: Retry{Base: base, Cap: cap, Jitter: jitter}}, "retry")})
		if err != nil {
			rt.Fatal(err)
		}
		tr.randN = func(k int64) int64 { return min(int64(picks[0]*float64(k)), k-1) }
		r := layerOf[*retryLayer](t, tr, "http://api.test/")
		// The jitter's range, as its documentation gives it.
		exp := min(cap, base<<min(n, 40))
		if n > 40 || base > cap>>min(n, 62) {
			exp = cap
		}
		lo, hi := time.Duration(0), exp
		switch jitter {
		case JitterEqual:
			lo = exp / 2
			hi = 2 * lo
		case JitterDecorrelated:
			lo, hi = base, min(cap, 3*prev)
		case JitterNone:
			lo = exp
		}
		p1, p2 := prev, prev
		got := r.backoffWait(n, nil, &p1, room)
		free := r.backoffWait(n, nil, &p2, math.MaxInt64)
		if got < lo || got > hi {
			rt.Fatalf("%v retry %d: wait %v outside [%v, %v]", jitter, n, got, lo, hi)
		}
		if room >= lo && got > room {
			rt.Fatalf("%v retry %d: wait %v past the room %v, though [%v, %v] reaches into it", jitter, n, got, room, lo, hi)
		}
		if (room >= hi || room < lo) && got != free {
			rt.Fatalf("%v retry %d: wait %v with a room of %v, %v without; want the same", jitter, n, got, room, free)
		}
	})
}

func TestRetryConfig(t *testing.T) {
	bad := []struct {
		p     Retry
		field string
	}{
		{Retry{MaxAttempts: -1}, "Retry.MaxAttempts"},
		{Retry{MaxAttempts: 11}, "Retry.MaxAttempts"},
		{Retry{Base: -time.Second}, "Retry.Base"},
		{Retry{Base: time.Second, Cap: time.Millisecond}, "Retry.Cap"},
		{Retry{MaxRetryAfter: -1}, "Retry.MaxRetryAfter"},
		{Retry{Jitter: JitterNone + 1}, "Retry.Jitter"},
		{Retry{BufferBody: -1}, "Retry.BufferBody"},
		{Retry{BufferBody: maxBufferBody + 1}, "Retry.BufferBody"},
		{Retry{Budget: Budget{Ratio: 1.5}}, "Retry.Budget.Ratio"},
		{Retry{Budget: Budget{Ratio: -0.1}}, "Retry.Budget.Ratio"},
		{Retry{Budget: Budget{Window: time.Millisecond}}, "Retry.Budget.Window"},
	}
	for _, b := range bad {
		_, err := New(Config{Default: Policy{Retry: b.p}})
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != b.field || !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("New with %+v: err = %v, want a ConfigError for %s", b.p, err, b.field)
		}
		_, err = New(Config{Upstreams: map[string]Policy{"api.test": {Retry: b.p}}})
		if !errors.As(err, &ce) || ce.Upstream != "api.test" {
			t.Errorf("New with upstream %+v: err = %v, want it to name the upstream", b.p, err)
		}
	}
	// Defaults, and inheritance of zero fields and OR-wise booleans.
	tr, err := New(Config{
		Default:   Policy{Retry: Retry{MaxAttempts: 5, Jitter: JitterEqual, KeyPOST: true, Budget: Budget{Ratio: 0.5}}},
		Upstreams: map[string]Policy{"api.test": {Retry: Retry{Base: 20 * time.Millisecond, NoPushback: true}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	got := tr.byHost["api.test"].policy.Retry
	want := Retry{MaxAttempts: 5, Base: 20 * time.Millisecond, Cap: DefaultRetryCap, MaxRetryAfter: DefaultMaxRetryAfter,
		Jitter: JitterEqual, KeyPOST: true, NoPushback: true,
		Budget: Budget{Ratio: 0.5, Window: DefaultBudgetWindow, MinPerSecond: DefaultBudgetMinPerSecond}}
	if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
		t.Errorf("inherited policy\n got %+v\nwant %+v", got, want)
	}
	if d := tr.def.policy.Retry; d.MaxAttempts != 5 || d.Base != DefaultRetryBase || d.Jitter != JitterEqual {
		t.Errorf("default policy = %+v", d)
	}
}

// TestRetryAfterHonoured runs with real timers inside a synctest bubble:
// the wait between attempts is exactly what Retry-After asked for, capped.
func TestRetryAfterHonoured(t *testing.T) {
	tests := []struct {
		name       string
		status     int
		retryAfter func(now time.Time) string
		policy     Policy
		wantCalls  int
		wantGap    time.Duration // between the first and second attempt
	}{
		{name: "503 seconds", status: 503, retryAfter: func(time.Time) string { return "2" }, wantCalls: 2, wantGap: 2 * time.Second},
		{name: "429 seconds", status: 429, retryAfter: func(time.Time) string { return "3" }, wantCalls: 2, wantGap: 3 * time.Second},
		{name: "503 zero", status: 503, retryAfter: func(time.Time) string { return "0" }, wantCalls: 2, wantGap: 0},
		{name: "503 date", status: 503, retryAfter: func(now time.Time) string { return now.Add(5 * time.Second).UTC().Format(http.TimeFormat) }, wantCalls: 2, wantGap: 5 * time.Second},
		{name: "503 past date", status: 503, retryAfter: func(now time.Time) string { return now.Add(-time.Hour).UTC().Format(http.TimeFormat) }, wantCalls: 2, wantGap: 0},
		{name: "capped at MaxRetryAfter", status: 503, retryAfter: func(time.Time) string { return "120" },
			policy: Policy{Timeout: Timeout{Total: 2 * time.Minute}}, wantCalls: 2, wantGap: DefaultMaxRetryAfter},
		{name: "capped, custom", status: 503, retryAfter: func(time.Time) string { return "120" },
			policy: Policy{Retry: Retry{MaxRetryAfter: 4 * time.Second}}, wantCalls: 2, wantGap: 4 * time.Second},
		{name: "past the deadline: return now", status: 503, retryAfter: func(time.Time) string { return "20" },
			policy: Policy{Timeout: Timeout{Total: 10 * time.Second}}, wantCalls: 1},
		{name: "no pushback layer", status: 503, retryAfter: func(time.Time) string { return "2" },
			policy: Policy{Retry: Retry{NoPushback: true}}, wantCalls: 2, wantGap: 2 * time.Second},
		// A 500 is retried since the one classification, but on the
		// backoff: only 429 and 503 carry a Retry-After bulwark obeys.
		{name: "500 ignores Retry-After", status: 500, retryAfter: func(time.Time) string { return "2" },
			policy: Policy{Retry: Retry{Jitter: JitterNone}}, wantCalls: 2, wantGap: DefaultRetryBase},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var times []time.Time
				base := &scriptBase{step: func(n int, req *http.Request) (*http.Response, error) {
					times = append(times, time.Now())
					if n == 1 {
						return response(req, tt.status, "Retry-After", tt.retryAfter(time.Now())), nil
					}
					return response(req, 200), nil
				}}
				tr, err := New(Config{Base: base, Default: tt.policy})
				if err != nil {
					t.Fatal(err)
				}
				start := time.Now()
				resp, err := tr.RoundTrip(testRequest(t, t.Context(), "GET", "http://api.test/", noBody, ""))
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if len(times) != tt.wantCalls {
					t.Fatalf("sent %d times, want %d", len(times), tt.wantCalls)
				}
				if tt.wantCalls == 1 {
					if resp.StatusCode != tt.status || time.Since(start) != 0 {
						t.Errorf("got %d after %v, want the %d at once", resp.StatusCode, time.Since(start), tt.status)
					}
					return
				}
				if gap := times[1].Sub(times[0]); gap != tt.wantGap {
					t.Errorf("retried after %v, want %v", gap, tt.wantGap)
				}
				if tr.Snapshot().RetryAfterIgnored != 0 {
					t.Errorf("RetryAfterIgnored = %d, want 0", tr.Snapshot().RetryAfterIgnored)
				}
			})
		})
	}
}

func TestRetryAfterIgnoredCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, np := range []bool{false, true} {
			base := &scriptBase{step: always(503, "Retry-After", "soon")}
			tr, _, waits := newTestTransport(t, base, Policy{Retry: Retry{NoPushback: np}})
			resp, err := tr.RoundTrip(testRequest(t, t.Context(), "GET", "http://api.test/", noBody, ""))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			// Counted once per response, whichever layer parsed it; the
			// backoff (top of the range: 100ms, 200ms) applied instead.
			// Without pushback the last response is not parsed: no retry
			// follows it.
			want := uint64(3)
			if np {
				want = 2
			}
			if got := tr.Snapshot().RetryAfterIgnored; got != want {
				t.Errorf("NoPushback=%v: RetryAfterIgnored = %d, want %d", np, got, want)
			}
			if fmt.Sprint(*waits) != "[100ms 200ms]" {
				t.Errorf("NoPushback=%v: waits = %v, want the backoff's", np, *waits)
			}
		}
	})
}

// TestRetryDeadlineNeverOverrun: no sleep ends past the call's deadline,
// whether it is Timeout.Total's or the caller's, whatever the jitter picks.
func TestRetryDeadlineNeverOverrun(t *testing.T) {
	for _, jitter := range []Jitter{JitterNone, JitterFull, JitterEqual, JitterDecorrelated} {
		for _, callerDL := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/callerDeadline=%v", jitter, callerDL), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					const limit = 2 * time.Second
					base := &scriptBase{step: always(503)}
					p := Policy{Retry: Retry{MaxAttempts: 10, Base: 300 * time.Millisecond, Jitter: jitter, Budget: Budget{Disabled: true}}}
					ctx := t.Context()
					if callerDL {
						var cancel context.CancelFunc
						ctx, cancel = context.WithTimeout(ctx, limit)
						defer cancel()
					} else {
						p.Timeout.Total = limit
					}
					tr, err := New(Config{Base: base, Default: p})
					if err != nil {
						t.Fatal(err)
					}
					// Seeded, so that each run picks the same waits.
					tr.randN = mrand.New(mrand.NewPCG(1, uint64(jitter))).Int64N
					start := time.Now()
					resp, err := tr.RoundTrip(testRequest(t, ctx, "GET", "http://api.test/", noBody, ""))
					if err != nil {
						t.Fatalf("err = %v, want the last 503 returned before the deadline", err)
					}
					resp.Body.Close()
					if el := time.Since(start); el > limit-minSendTime || resp.StatusCode != 503 {
						t.Errorf("returned %d after %v, want the 503 before %v", resp.StatusCode, el, limit-minSendTime)
					}
					if base.calls() < 2 {
						t.Errorf("sent %d times, want retries", base.calls())
					}
				})
			})
		}
	}
	// The worked case with no jitter: waits 300ms and 600ms end at 900ms;
	// the next, 1.2s, would end at 2.1s, past the 2s deadline.
	synctest.Test(t, func(t *testing.T) {
		base := &scriptBase{step: always(503)}
		tr, _ := New(Config{Base: base, Default: Policy{Timeout: Timeout{Total: 2 * time.Second},
			Retry: Retry{MaxAttempts: 10, Base: 300 * time.Millisecond, Jitter: JitterNone}}})
		start := time.Now()
		resp, err := tr.RoundTrip(testRequest(t, t.Context(), "GET", "http://api.test/", noBody, ""))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if base.calls() != 3 || time.Since(start) != 900*time.Millisecond {
			t.Errorf("sent %d times over %v, want 3 over 900ms", base.calls(), time.Since(start))
		}
	})
}

// TestRetryRealAttemptTimeout: the attempt deadline layer's own timeout is
// retried for a GET and never for a POST without a key.
func TestRetryRealAttemptTimeout(t *testing.T) {
	for _, tc := range []struct {
		method string
		kind   bodyKind
		want   int64
	}{{"GET", noBody, 3}, {"POST", replayableBody, 1}} {
		t.Run(tc.method, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &stubBase{block: true}
				tr, err := New(Config{Base: base, Default: Policy{Timeout: Timeout{Attempt: time.Second}}})
				if err != nil {
					t.Fatal(err)
				}
				_, err = tr.RoundTrip(testRequest(t, t.Context(), tc.method, "http://api.test/", tc.kind, "x"))
				if !errors.Is(err, ErrAttemptTimeout) || base.calls.Load() != tc.want {
					t.Errorf("sent %d times, err %v; want %d and ErrAttemptTimeout", base.calls.Load(), err, tc.want)
				}
			})
		})
	}
}

// TestRetryCancelDuringSleep: a caller that gives up while the retry layer
// waits gets its cancellation at once.
func TestRetryCancelDuringSleep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &scriptBase{step: always(503)}
		tr, _ := New(Config{Base: base, Default: Policy{Retry: Retry{Base: 5 * time.Second, Jitter: JitterNone}}})
		ctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(time.Second, cancel)
		start := time.Now()
		_, err := tr.RoundTrip(testRequest(t, ctx, "GET", "http://api.test/", noBody, ""))
		if !errors.Is(err, context.Canceled) || errors.Is(err, ErrAttemptTimeout) {
			t.Errorf("err = %v, want context.Canceled (and not ErrAttemptTimeout)", err)
		}
		if el := time.Since(start); el != time.Second || base.calls() != 1 {
			t.Errorf("returned after %v with %d sends, want 1s and 1", el, base.calls())
		}
	})
}

// TestRetryBudget: under a sustained outage, requests reaching the upstream
// stay within 1.2× those offered with the default budget (the naive three
// attempts would give 3×, three retries on top of the call 4×).
func TestRetryBudget(t *testing.T) {
	for _, tc := range []struct {
		name string
		step func(int, *http.Request) (*http.Response, error)
	}{{"503", always(503)}, {"reset", alwaysErr(errReset)}} {
		t.Run(tc.name, func(t *testing.T) {
			ratio, lastErr := amplification(t, tc.step, 1000, 30*time.Second)
			t.Logf("upstream/offered = %.6f at 1000 rps for 30s", ratio)
			if ratio > 1.2 {
				t.Errorf("upstream/offered = %.4f, want ≤ 1.2", ratio)
			}
			if lastErr != nil && !errors.Is(lastErr, ErrRetryBudget) {
				t.Errorf("last call's err = %v, want one matching ErrRetryBudget", lastErr)
			}
		})
	}
	// A host that fails every call is sent each call once after the first
	// five: the fifth failed call takes the retry throttle to half its
	// tokens, and from then on no retry is funded, the floor's neither
	// (gRFC A6). At 2 calls a second for 30 s: 60 calls, and calls 1–4
	// retried twice each.
	ratio, _ := amplification(t, always(503), 2, 30*time.Second)
	if want := 68.0 / 60; math.Abs(ratio-want) > 1e-9 {
		t.Errorf("at 2 rps, every call failing: upstream/offered = %.3f, want %.3f (retries stop after five failed calls)", ratio, want)
	}
	// At light traffic the floor funds what the ratio cannot: one call a
	// second, every fifth failing at every attempt (too few to hold the
	// throttle). The window holds 10 calls, so the ratio funds 2 retries
	// in 10 s, where two failed calls want 4; with the floor each of the
	// six failed calls is retried twice.
	var firsts atomic.Int64
	fifth := func(_ int, req *http.Request) (*http.Response, error) {
		if a := req.Header.Get(AttemptHeader); a != "" && a != "1" || firsts.Add(1)%5 == 0 {
			return response(req, 503), nil
		}
		return response(req, 200), nil
	}
	ratio, _ = amplification(t, fifth, 1, 30*time.Second)
	if want := 42.0 / 30; math.Abs(ratio-want) > 1e-9 {
		t.Errorf("floor, one call in five failing: upstream/offered = %.3f, want %.3f (every failed call retried twice)", ratio, want)
	}
	// Without the floor, the same traffic gets the ratio alone.
	firsts.Store(0)
	ratio, _ = amplification(t, fifth, 1, 30*time.Second, Policy{Retry: Retry{Budget: Budget{MinPerSecond: -1}}})
	t.Logf("no floor, one call in five failing: upstream/offered = %.3f", ratio)
	if ratio >= 42.0/30 || ratio <= 1 {
		t.Errorf("no floor, one call in five failing: upstream/offered = %.3f, want some retries refused (above 1, under %.3f)", ratio, 42.0/30)
	}
	// A disabled budget leaves MaxAttempts as the only bound.
	ratio, _ = amplification(t, always(503), 100, 5*time.Second, Policy{Retry: Retry{Budget: Budget{Disabled: true}}})
	if ratio != 3 {
		t.Errorf("budget disabled: upstream/offered = %.3f, want 3", ratio)
	}
}

// amplification offers calls at rps, evenly spaced in a synctest bubble
// of its own, to an upstream that always fails, and returns upstream
// sends ÷ calls and the last call's error. Each call runs on a goroutine of
// its own, as an open-loop load does, so that its retries' waits (fake
// time) do not slow the offered rate.
func amplification(t *testing.T, step func(int, *http.Request) (*http.Response, error), rps int, d time.Duration, p ...Policy) (float64, error) {
	t.Helper()
	var ratio float64
	var lastErr error
	synctest.Test(t, func(t *testing.T) {
		base := &scriptBase{step: step}
		tr, clk, _ := newTestTransport(t, base, append(p, Policy{})[0])
		n := int(d.Seconds()) * rps
		// Built here, where testRequest may stop the test; the callers only
		// record.
		reqs := make([]*http.Request, n)
		for i := range reqs {
			reqs[i] = testRequest(t, context.Background(), "GET", "http://api.test/", noBody, "")
		}
		var wg sync.WaitGroup
		for i, req := range reqs {
			wg.Go(func() {
				resp, err := tr.RoundTrip(req)
				if err == nil {
					resp.Body.Close()
				}
				if i == n-1 {
					lastErr = err
				}
			})
			clk.advance(time.Second / time.Duration(rps))
		}
		wg.Wait()
		ratio = float64(base.calls()) / float64(n)
	})
	return ratio, lastErr
}

// TestRetryContract runs outside a bubble (runContract calls t.Run): the
// retries wait nothing, through Backoff, instead of sleeping for real.
func TestRetryContract(t *testing.T) {
	for _, p := range []Policy{{}, {Timeout: Timeout{Disabled: true}}, {Retry: Retry{KeyPOST: true, BufferBody: 64}}} {
		p.Retry.Backoff = noWait
		p.Breaker.Disabled = true // as newTestTransport does: retry is what is tested
		// Checked here, on the test's goroutine; build runs on runContract's.
		mustNew(t, Config{Default: p})
		runContract(t, func(base http.RoundTripper) http.RoundTripper {
			tr, _ := New(Config{Base: base, Default: p})
			return tr
		})
	}
	// The retry and pushback layers alone, over the base, without the
	// Transport's other layers.
	alone := only(Policy{Retry: Retry{Backoff: noWait}}, "retry", "pushback")
	mustNew(t, Config{Default: alone})
	runContract(t, func(base http.RoundTripper) http.RoundTripper {
		tr, _ := New(Config{Base: base, Default: alone})
		return tr
	})
}

// TestRetryBodyBuffering: a one-shot body under the limit is replayed byte
// for byte and the original closed; one over the limit arrives whole, once.
func TestRetryBodyBuffering(t *testing.T) {
	for _, size := range []int{0, 1, 100, 101, 5000} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				payload := strings.Repeat("b", size)
				base := &scriptBase{step: always(503)}
				tr, _, _ := newTestTransport(t, base, Policy{Retry: Retry{BufferBody: 100}})
				var bs bodies
				req, _ := http.NewRequestWithContext(t.Context(), "PUT", "http://api.test/", nil)
				req.Body = bs.make(payload)
				checkContract(t, tr, req, &bs)
				want := 3
				if size > 100 {
					want = 1
				}
				if base.calls() != want {
					t.Fatalf("sent %d times, want %d", base.calls(), want)
				}
				for _, s := range base.all() {
					if s.body != payload {
						t.Errorf("sent %d bytes, want %d", len(s.body), size)
					}
				}
			})
		})
	}
}

// Example_retry: a GET that meets a 503 is sent again once the server's
// Retry-After (here zero) has passed; the caller sees only the success.
func Example_retry() {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hits.Add(1) == 1 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintf(w, "served attempt %s", r.Header.Get(AttemptHeader))
	}))
	defer srv.Close()
	base := &http.Transport{}
	defer base.CloseIdleConnections()

	client, err := NewClient(Config{Base: base, Default: Policy{Retry: Retry{MaxAttempts: 3}}})
	if err != nil {
		panic(err)
	}
	resp, err := client.Get(srv.URL)
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, string(b))
	// Output: 200 served attempt 2
}

// BenchmarkRetry measures the success path, where no retry happens: the
// base alone, the Transport without the retry and pushback layers, and the
// Transport with them (the defaults). The difference between the last two
// is what the layers cost.
func BenchmarkRetry(b *testing.B) {
	off := Policy{Retry: Retry{Disabled: true, NoPushback: true}}
	for _, bc := range []struct {
		name  string
		build func(base http.RoundTripper) http.RoundTripper
	}{
		{"bare", func(base http.RoundTripper) http.RoundTripper { return base }},
		{"stack-without-retry", func(base http.RoundTripper) http.RoundTripper {
			tr, _ := New(Config{Base: base, Default: off})
			return tr
		}},
		{"stack-with-retry", func(base http.RoundTripper) http.RoundTripper {
			tr, _ := New(Config{Base: base})
			return tr
		}},
		{"stack-with-retry-no-timeout", func(base http.RoundTripper) http.RoundTripper {
			tr, _ := New(Config{Base: base, Default: Policy{Timeout: Timeout{Disabled: true}}})
			return tr
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			rt := bc.build(&stubBase{})
			req, _ := http.NewRequestWithContext(context.Background(), "GET", "http://api.test/x", nil)
			b.ReportAllocs()
			for b.Loop() {
				resp, err := rt.RoundTrip(req)
				if err != nil {
					b.Fatal(err)
				}
				resp.Body.Close()
			}
		})
	}
}

// BenchmarkRetryLayers measures the retry and pushback layers alone on the
// success path, over a base that costs nothing, with the call state an
// outer layer (the total deadline) would have made.
func BenchmarkRetryLayers(b *testing.B) {
	base := &staticBase{resp: &http.Response{StatusCode: 200, Body: http.NoBody, Header: http.Header{}}}
	tr := mustNew(b, Config{Base: base, Default: only(Policy{}, "retry", "pushback")})
	layers := layerOf[*retryLayer](b, tr, "http://api.test/x")
	req, _ := http.NewRequestWithContext(context.Background(), "GET", "http://api.test/x", nil)
	now := time.Now()
	c := call{start: now, total: now.Add(DefaultTotalTimeout)} // as the router and the total deadline layer set it
	b.Run("bare", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := base.RoundTrip(req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("retry+pushback", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := layers.roundTrip(req, c); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestRetryWaitLeavesP99: under a deadline, the backoff's draw leaves the
// host's p99 latency to answer in, not its median, so that a retry slower
// than the median is not cut; when the p99 fits with no wait but the
// median does, the retry is made at once. The host's median is 10 ms, its
// p99 30 ms, and the jitter draws the longest wait its range allows.
func TestRetryWaitLeavesP99(t *testing.T) {
	for _, c := range []struct {
		deadline, want time.Duration
	}{
		{100 * time.Millisecond, 100*time.Millisecond - 30*time.Millisecond - retryFitMargin}, // the median left: 85 ms
		{35 * time.Millisecond, 0}, // the median left: 20 ms
	} {
		t.Run(fmt.Sprint(c.deadline), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var at []time.Time
				base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
					at = append(at, time.Now())
					status := http.StatusServiceUnavailable
					if len(at) > 1 {
						status = http.StatusOK
					}
					return &http.Response{StatusCode: status, Body: http.NoBody, Header: http.Header{}, Request: req}, nil
				})
				tr, err := New(Config{Base: base, Default: only(Policy{}, "retry")})
				if err != nil {
					t.Fatal(err)
				}
				tr.randN = func(k int64) int64 { return k - 1 }
				r := layerOf[*retryLayer](t, tr, "http://api.test/")
				now := time.Now()
				for i := range 100 {
					d := 10 * time.Millisecond
					if i < 10 {
						d = 30 * time.Millisecond
					}
					r.lat.Record(d, now)
				}
				if m, q := r.sendTime(), r.tailTime(); m != 10*time.Millisecond || q < 29*time.Millisecond || q > 31*time.Millisecond {
					t.Fatalf("median %v, p99 %v; want 10 ms and 30 ms", m, q)
				}
				ctx, cancel := context.WithTimeout(t.Context(), c.deadline)
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://api.test/", nil)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || len(at) != 2 {
					t.Fatalf("deadline %v: %d after %d attempts; want the retry's 200", c.deadline, resp.StatusCode, len(at))
				}
				// The p99 is read within the sketch's 1 %.
				if wait := at[1].Sub(at[0]); wait < c.want-time.Millisecond || wait > c.want+time.Millisecond {
					t.Errorf("deadline %v: the retry waited %v, want %v", c.deadline, wait, c.want)
				}
			})
		})
	}
}

// TestRetryDefaultStatuses: with package defaults, a replayable request is
// retried on 408, 429, 500, 502, 503 and 504 (Polly's standard pipeline
// and go-retryablehttp retry the same), and on no other status; a POST
// without a key is sent once whatever it gets.
func TestRetryDefaultStatuses(t *testing.T) {
	for _, tt := range []struct {
		code  int
		retry bool
	}{
		{408, true}, {429, true}, {500, true}, {502, true}, {503, true}, {504, true},
		{400, false}, {404, false}, {501, false}, {505, false},
	} {
		synctest.Test(t, func(t *testing.T) {
			base := &statusBase{codes: []int{tt.code, 200}}
			tr := mustNew(t, Config{Base: base})
			code, err := sendOnce(t, tr, http.MethodGet, "http://h.test/")
			want, wantSent := tt.code, 1
			if tt.retry {
				want, wantSent = 200, 2
			}
			if err != nil || code != want || base.sent() != wantSent {
				t.Errorf("GET after %d: status %d, err %v, sent %d; want %d, sent %d", tt.code, code, err, base.sent(), want, wantSent)
			}
			post := &statusBase{codes: []int{tt.code, 200}}
			tr = mustNew(t, Config{Base: post})
			if code, err := sendOnce(t, tr, http.MethodPost, "http://h.test/"); err != nil || code != tt.code || post.sent() != 1 {
				t.Errorf("POST after %d: status %d, err %v, sent %d; want %d, sent once", tt.code, code, err, post.sent(), tt.code)
			}
		})
	}
}

// TestRetryAlternating500: a GET to a server failing every other request
// with 500 succeeds on its retry, with the package defaults.
func TestRetryAlternating500(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &statusBase{codes: []int{500, 200}}
		tr := mustNew(t, Config{Base: base})
		if code, err := sendOnce(t, tr, http.MethodGet, "http://h.test/"); err != nil || code != 200 || base.sent() != 2 {
			t.Fatalf("GET: status %d, err %v, sent %d; want 200 after 2 attempts", code, err, base.sent())
		}
	})
}

// TestCheckRetryError: a go-retryablehttp CheckRetry keeps its meaning:
// the bool decides, and its error is what the caller gets once the call
// ends after that attempt, with the response closed, as go-retryablehttp's
// Client.Do does; an error beside a true that a later attempt answers is
// forgotten.
func TestCheckRetryError(t *testing.T) {
	errStop := errors.New("stop here")
	for _, tc := range []struct {
		name      string
		codes     []int
		retry     bool
		sent      int
		wantErr   bool
		wantClose int
	}{
		{"true with an error retries, error after the last", []int{503}, true, 3, true, 3},
		{"false with an error ends at once", []int{503}, false, 1, true, 1},
		{"error forgotten when a retry succeeds", []int{503, 200}, true, 2, false, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var seen int
				base := &statusBase{codes: tc.codes}
				tr := mustNew(t, Config{Base: base, Default: Policy{Retry: Retry{
					CheckRetry: func(ctx context.Context, resp *http.Response, err error) (bool, error) {
						seen++
						if resp != nil && resp.StatusCode == 503 {
							return tc.retry, errStop
						}
						return false, nil
					},
				}}})
				code, err := sendOnce(t, tr, http.MethodGet, "http://h.test/")
				if tc.wantErr != errors.Is(err, errStop) || (!tc.wantErr && code != 200) {
					t.Fatalf("status %d, err = %v; want the CheckRetry error: %v", code, err, tc.wantErr)
				}
				if base.sent() != tc.sent || seen != tc.sent {
					t.Errorf("sent %d, CheckRetry called %d; want %d and %d", base.sent(), seen, tc.sent, tc.sent)
				}
				if base.closed != tc.wantClose {
					t.Errorf("%d response bodies closed, want %d", base.closed, tc.wantClose)
				}
			})
		})
	}
}

// TestOnRetry: the hook is told of each retry before its wait, with the
// request, the attempt about to be sent, the wait and what failed.
func TestOnRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var evs []RetryEvent
		var reqs []*http.Request
		base := &statusBase{codes: []int{503, 500, 200}}
		tr := mustNew(t, Config{Base: base, Default: Policy{Retry: Retry{
			Jitter: JitterNone, Base: 100 * time.Millisecond,
			OnRetry: func(req *http.Request, ev RetryEvent) { reqs = append(reqs, req); evs = append(evs, ev) },
		}}})
		start := time.Now()
		if code, err := sendOnce(t, tr, http.MethodGet, "http://h.test/x"); err != nil || code != 200 {
			t.Fatalf("status %d, err %v; want 200", code, err)
		}
		want := []RetryEvent{
			{Host: "h.test:80", Upstream: "default", Attempt: 2, Wait: 100 * time.Millisecond, StatusCode: 503},
			{Host: "h.test:80", Upstream: "default", Attempt: 3, Wait: 200 * time.Millisecond, StatusCode: 500},
		}
		if len(evs) != len(want) {
			t.Fatalf("OnRetry called %d times, want %d: %+v", len(evs), len(want), evs)
		}
		for i := range want {
			if evs[i] != want[i] {
				t.Errorf("event %d = %+v, want %+v", i, evs[i], want[i])
			}
			if reqs[i].URL.Path != "/x" {
				t.Errorf("event %d: request %v, want the caller's", i, reqs[i].URL)
			}
		}
		if took := time.Since(start); took != 300*time.Millisecond {
			t.Errorf("call took %v, want the two waits, 300ms", took)
		}
	})
}

// TestRetryThrottle: a window's healthy past does not fund a burst of
// retries into a sudden outage. After 10 s of healthy calls at 200 a
// second (2,000 in the window: room for 400 retries by the ratio alone), a
// 2 s outage draws few retries: five failed calls stop the ratio's, and
// the floor (10 a second) funds the rest. Once the host answers again,
// successes refill the throttle and a failure is retried again.
func TestRetryThrottle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var failing atomic.Bool
		var sent atomic.Int64
		base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
			closeBody(req)
			sent.Add(1)
			code := 200
			if failing.Load() {
				code = 503
			}
			return &http.Response{StatusCode: code, Header: http.Header{}, Body: http.NoBody, Request: req}, nil
		})
		tr := mustNew(t, Config{Base: base, Default: Policy{Breaker: Breaker{Disabled: true}}})
		offer := func(d time.Duration) (calls int64) {
			end := time.Now().Add(d)
			for time.Now().Before(end) {
				go func() { _, _ = send(t, tr, context.Background(), "http://h.test/x", "") }()
				calls++
				time.Sleep(5 * time.Millisecond)
			}
			synctest.Wait()
			return calls
		}
		offer(10 * time.Second)
		failing.Store(true)
		before := sent.Load()
		calls := offer(2 * time.Second)
		time.Sleep(time.Second) // the last retries' waits
		load := float64(sent.Load()-before) / float64(calls)
		t.Logf("a 2 s outage after 10 s healthy: %.3f requests per call", load)
		// The floor's 10 a second and its burst of 10, and the ratio's
		// retries of the first few failures: about 35 retries over 400
		// calls (1.09); the ratio alone would have allowed 400 (2.0).
		if load > 1.15 {
			t.Errorf("%.3f requests per call during the outage, want ≤ 1.15", load)
		}
		// Recovered: 100 successes refill the throttle (each gives back
		// 0.2 of a token), then a lone failure is retried.
		failing.Store(false)
		offer(500 * time.Millisecond)
		failing.Store(true)
		before = sent.Load()
		if _, err := send(t, tr, t.Context(), "http://h.test/x", ""); err != nil {
			t.Fatal(err)
		}
		if n := sent.Load() - before; n != DefaultMaxAttempts {
			t.Errorf("a failure after the host recovered was sent %d times, want %d", n, DefaultMaxAttempts)
		}
	})
}

// lazyBody yields n bytes without holding them: a 1 GB upload that costs
// no memory to offer.
type lazyBody struct {
	left   int64
	closed atomic.Bool
}

func (b *lazyBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, io.EOF
	}
	n := int64(len(p))
	if n > b.left {
		n = b.left
	}
	b.left -= n
	return int(n), nil
}

func (b *lazyBody) Close() error { b.closed.Store(true); return nil }

// TestHostileHugeBodyWithoutGetBody: a 1 GB body of unknown length without
// GetBody is sent once, streamed, even with BufferBody on and a retryable
// failure, and bulwark holds at most BufferBody of it.
func TestHostileHugeBodyWithoutGetBody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const size = 1 << 30
		var read atomic.Int64
		base := &scriptBase{step: always(503)}
		counting := roundTripFunc(func(req *http.Request) (*http.Response, error) {
			n, _ := io.Copy(io.Discard, req.Body)
			read.Add(n)
			req.Body.Close()
			req.Body = http.NoBody
			return base.RoundTrip(req)
		})
		tr, _, _ := newTestTransport(t, counting, Policy{Retry: Retry{BufferBody: 1 << 20}})
		body := &lazyBody{left: size}
		req := testRequest(t, t.Context(), "PUT", "http://api.test/upload", noBody, "")
		req.Body, req.ContentLength = body, -1

		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		resp, err := tr.RoundTrip(req)
		runtime.ReadMemStats(&after)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if base.calls() != 1 || read.Load() != size {
			t.Errorf("sent %d times, %d bytes; want once, all %d", base.calls(), read.Load(), size)
		}
		if !body.closed.Load() {
			t.Error("the request body was not closed")
		}
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
			t.Errorf("allocated %d MiB to send it; want the body streamed, not buffered", grew>>20)
		}
	})
}

// TestPropertyAmplification: against a host that always fails, requests
// reaching it within one budget window never exceed the calls offered times
// (1 + Ratio), plus the floor's MinPerSecond × Window.
func TestPropertyAmplification(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		{
			ratio := rapid.Float64Range(0.01, 1).Draw(rt, "ratio")
			floor := rapid.SampledFrom([]float64{-1, 0.5, 2}).Draw(rt, "floor")
			window := 10 * time.Second
			const backoffCap = 4 * time.Millisecond
			gap := time.Duration(rapid.IntRange(1, 25).Draw(rt, "gapMs")) * time.Millisecond
			fault := rapid.SampledFrom([]int{out503, outReset}).Draw(rt, "fault")
			maxAttempts := rapid.IntRange(2, maxAttemptsLimit).Draw(rt, "maxAttempts")
			// The bound is for one budget window, so the run is drawn to fit
			// one: on the virtual clock a call takes its gap and at most
			// Cap before each retry, the upstream answering at once.
			perCall := gap + time.Duration(maxAttempts-1)*backoffCap
			n := rapid.IntRange(20, min(300, int(window/perCall))).Draw(rt, "calls")
			var f propFailure
			defer f.report(rt)
			synctest.Test(t, func(t *testing.T) {
				rt := &f
				base := &propBase{scripts: map[string][]int{"": {fault}}, got: map[string][]sent{}}
				tr, err := New(Config{Base: base, Default: Policy{
					Retry: Retry{
						MaxAttempts: maxAttempts,
						Base:        time.Millisecond, Cap: backoffCap,
						Budget: Budget{Ratio: ratio, Window: window, MinPerSecond: floor},
					},
					Breaker: Breaker{Disabled: true},
				}})
				if err != nil {
					rt.Fatalf("%v", err)
					return
				}
				start := time.Now()
				for i := 0; i < n; i++ {
					req, _ := http.NewRequest("GET", "http://amp.test/", nil)
					if resp, err := tr.RoundTrip(req); err == nil {
						resp.Body.Close()
					}
					time.Sleep(gap)
				}
				if took := time.Since(start); took > window {
					rt.Fatalf("%d calls took %v, past the %v window the bound is for, which the draws rule out", n, took, window)
					return
				}
				sent := len(base.got[""])
				allowed := float64(n) * (1 + ratio)
				if floor > 0 {
					allowed += floor * window.Seconds()
				}
				if float64(sent) > allowed+1e-9 {
					rt.Fatalf("%d calls became %d requests; the budget allows %.1f (ratio %.3f, floor %v)", n, sent, allowed, ratio, floor)
				}
			})
		}
	})
}
