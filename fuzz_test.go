package bulwark

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// FuzzNewConfig builds configs from arbitrary numbers and strings: New
// returns a Transport or an error, never panics, and a Transport it returns
// serves a request.
func FuzzNewConfig(f *testing.F) {
	f.Add(int64(0), int64(0), "", "tax.internal", int64(0), int64(0), 0, int64(0))
	f.Add(int64(-1), int64(5), "X Bad", "http://x/", int64(1), int64(2), -3, int64(-9))
	f.Add(int64(time.Second), int64(2*time.Second), "x-deadline", "[::1]:0", int64(3), int64(1), 1<<20, int64(time.Hour))
	f.Fuzz(func(t *testing.T, total, attempt int64, header, key string, upTotal, upAttempt int64, maxHosts int, idle int64) {
		cfg := Config{
			Base:    &stubBase{},
			Default: Policy{Timeout: Timeout{Total: time.Duration(total), Attempt: time.Duration(attempt), Header: header}},
			Upstreams: map[string]Policy{
				key: {Timeout: Timeout{Total: time.Duration(upTotal), Attempt: time.Duration(upAttempt)}},
			},
			MaxHosts: maxHosts % 4096,
			HostIdle: time.Duration(idle),
		}
		tr, err := New(cfg)
		if err != nil {
			if tr != nil {
				t.Fatalf("New returned a Transport with error %v", err)
			}
			return
		}
		for _, u := range []string{"http://tax.internal/", "http://" + key + "/"} {
			req, err := http.NewRequest("GET", u, nil)
			if err != nil {
				continue // a key New accepts may still not make a URL on its own
			}
			if resp, err := tr.RoundTrip(req); err == nil {
				resp.Body.Close()
			}
		}
	})
}

// FuzzPolicyConfig builds a policy from arbitrary numbers for the retry,
// breaker, bulkhead and fallback fields, on Default and on an upstream that
// inherits from it: New returns a Transport or a *ConfigError, never
// panics, and a Transport it returns serves calls without panicking or
// hanging (the base answers at once; the deadline below bounds any wait).
func FuzzPolicyConfig(f *testing.F) {
	f.Add(int64(3), int64(100e6), int64(10e9), int64(30e9), uint8(1), 0.2, int64(10e9), 10.0, int64(0),
		0.5, 0.5, int64(5e9), int64(60e9), int64(100), int64(60e9), int64(10),
		int64(100), int64(0), int64(0), 0.0, int64(0), int64(0), int64(0), int64(0), false)
	f.Add(int64(-1), int64(-5), int64(-9), int64(-1), uint8(9), -0.5, int64(1), -1.0, int64(-3),
		1.5, -0.1, int64(-1), int64(-1), int64(-1), int64(-1), int64(-1),
		int64(-1), int64(-1), int64(-1), -1.0, int64(-1), int64(-1), int64(-1), int64(-1), true)
	f.Add(int64(10), int64(1), int64(1), int64(0), uint8(3), 1.0, int64(100e6), 0.0, int64(64<<20),
		1.0, 1.0, int64(1), int64(100e6), int64(1), int64(1), int64(1),
		int64(1), int64(2), int64(1e6), 1e9, int64(5), int64(1e9), int64(1), int64(1<<40), false)
	f.Fuzz(func(t *testing.T, maxAttempts, base, capd, maxRA int64, jitter uint8, ratio float64, window int64, minPerSec float64, bufferBody int64,
		failRate, slowRate float64, slowCall, bWindow, minCalls, openFor, halfOpen int64,
		maxConc, maxQueue, maxWait int64, rateLimit float64, burst int64,
		staleAge, staleEntries, staleBytes int64, constant bool) {
		p := Policy{
			Retry: Retry{MaxAttempts: int(maxAttempts), Base: time.Duration(base), Cap: time.Duration(capd), MaxRetryAfter: time.Duration(maxRA),
				Jitter: Jitter(jitter), BufferBody: bufferBody,
				Budget: Budget{Ratio: ratio, Window: time.Duration(window), MinPerSecond: minPerSec}},
			Breaker: Breaker{FailureRate: failRate, SlowCallRate: slowRate, SlowCall: time.Duration(slowCall), Window: time.Duration(bWindow),
				MinCalls: int(minCalls), OpenFor: time.Duration(openFor), HalfOpenCalls: int(halfOpen)},
			Bulkhead: Bulkhead{MaxConcurrent: int(maxConc), MaxQueue: int(maxQueue), MaxWait: time.Duration(maxWait), Rate: rateLimit, Burst: int(burst)},
			Fallback: Fallback{Stale: StaleCache{MaxAge: time.Duration(staleAge), MaxEntries: int(staleEntries), MaxBytes: staleBytes, MaxEntryBytes: staleBytes / 2}},
		}
		if constant {
			p.Fallback.Constant = &ConstantResponse{StatusCode: int(maxConc), Body: []byte("fallback")}
		}
		// Retry waits are recorded through OnRetry, on the caller's goroutine.
		var negative []time.Duration
		p.Retry.OnRetry = func(_ *http.Request, ev RetryEvent) {
			if ev.Wait < 0 {
				negative = append(negative, ev.Wait)
			}
		}
		for _, cfg := range []Config{
			{Base: &stubBase{status: 503}, Default: p},
			{Base: &stubBase{status: 503}, Upstreams: map[string]Policy{"api.test": p}},
		} {
			// In a bubble, the waits (retry backoff, bulkhead queue, rate
			// limit, breaker) take fake time, the deadline below bounds them,
			// and a call that could never return fails the bubble as a
			// deadlock instead of hanging.
			synctest.Test(t, func(t *testing.T) {
				tr, err := New(cfg)
				if err != nil {
					var ce *ConfigError
					if tr != nil || !errors.As(err, &ce) || !errors.Is(err, ErrInvalidConfig) {
						t.Fatalf("New = %v, %v; want nil and a *ConfigError", tr, err)
					}
					return
				}
				ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, "GET", "http://api.test/", nil)
				start := time.Now()
				resp, err := tr.RoundTrip(req)
				if (resp == nil) == (err == nil) {
					t.Fatalf("RoundTrip = %v, %v", resp, err)
				}
				if resp != nil {
					resp.Body.Close()
				}
				if took := time.Since(start); took > 50*time.Millisecond {
					t.Errorf("RoundTrip returned after %v, past its 50ms deadline", took)
				}
			})
			if len(negative) > 0 {
				t.Fatalf("negative retry waits %v", negative)
			}
		}
	})
}

// FuzzRateLimitHeaders: whatever the rate-limit fields say, reading them
// does not panic, a pause is never negative nor past a day, and a field
// saying nothing is spent never pauses.
func FuzzRateLimitHeaders(f *testing.F) {
	f.Add(`"default";r=0;t=30`, "0", "20", "0", "5")
	f.Add("limit=100, remaining=0, reset=7", "1", "x", "-1", "1800000000")
	f.Add(`"a";r=0;t=5, "b";r=1;t=9`, "", "", "0, 0", "99999999999999999999")
	f.Fuzz(func(t *testing.T, rl, rem, reset, xrem, xreset string) {
		h := http.Header{}
		for k, v := range map[string]string{hdrRateLimit: rl, hdrRLRemaining: rem, hdrRLReset: reset, hdrXRLRemaining: xrem, hdrXRLReset: xreset} {
			if v != "" {
				h[k] = strings.Split(v, "\n")
			}
		}
		d, res := rateLimitPause(h, time.Unix(1_800_000_000, 0))
		if d < 0 || d > maxRetryAfterHeader || (res != retryAfterValid && d != 0) {
			t.Fatalf("rateLimitPause(%v) = %v, %v", h, d, res)
		}
	})
}

// FuzzRateLimitPolicy: whatever the policy fields say, advertisedRate
// returns a positive finite rate only when it reports one, and the rate
// lies within what a quota of at most 18 digits over a window of 1 s to a
// day can say.
func FuzzRateLimitPolicy(f *testing.F) {
	f.Add(`"default";q=100;w=60`, "100, 100;w=60", "20;w=2")
	f.Add(`"a";q=0;w=1, "b";q=5;w=0`, "x", "-1;w=1")
	f.Add(`10;w=1, 50;w=60`, "", "5000")
	f.Fuzz(func(t *testing.T, policy, limit, xlimit string) {
		h := http.Header{}
		for k, v := range map[string]string{hdrRLPolicy: policy, hdrRLLimit: limit, hdrXRLLimit: xlimit} {
			if v != "" {
				h[k] = strings.Split(v, "\n")
			}
		}
		r, res := advertisedRate(h)
		switch {
		case res == retryAfterValid && !(r >= 1.0/86400 && r < 1e18):
			t.Fatalf("advertisedRate(%v) = %v, valid", h, r)
		case res != retryAfterValid && r != 0:
			t.Fatalf("advertisedRate(%v) = %v, %v", h, r, res)
		}
	})
}
