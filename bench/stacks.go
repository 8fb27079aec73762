// Package bench builds the stacks that BENCHMARKS.md compares: a bare
// transport, bulwark (its full default stack and each layer alone) and the
// peers a Go user would otherwise pick: failsafe-go through failsafehttp,
// go-retryablehttp's RoundTripper and sony/gobreaker alone. Every stack is
// given the same numbers (Params) wherever it has the feature, so that the
// comparison is of mechanisms, not of tuning; where a peer has no such
// feature (slow-call detection, a retry budget, an idempotency rule) it goes
// without, and BENCHMARKS.md says so.
package bench

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/failsafe-go/failsafe-go/bulkhead"
	"github.com/failsafe-go/failsafe-go/circuitbreaker"
	"github.com/failsafe-go/failsafe-go/failsafehttp"
	"github.com/failsafe-go/failsafe-go/timeout"
	"github.com/hashicorp/go-retryablehttp"
	"github.com/sony/gobreaker/v2"
)

// Params are the figures every stack is configured with, where it has the
// feature.
type Params struct {
	Total, Attempt   time.Duration // whole call, one attempt
	MaxAttempts      int           // first included
	RetryBase        time.Duration // first backoff
	RetryCap         time.Duration // largest backoff
	FailureRate      float64       // breaker trips at this share of failures
	SlowCall         time.Duration // an attempt this long counts as slow (bulwark only)
	MinCalls         int           // calls in the window before a rate counts
	Window           time.Duration // breaker's rolling window (bulwark's only when WindowCalls is zero)
	WindowCalls      int           // bulwark's count window of the last calls; zero: Window
	OpenFor          time.Duration // breaker open before probing
	HalfOpenCalls    int           // probes, all must succeed
	BulkheadCapacity int           // requests in flight per host
}

// Defaults are bulwark's package defaults (resilience4j's breaker
// figures among them), used for the cost benchmarks: a benchmark of
// middleware cost should run the configuration users get. Where bulwark
// learns or adapts a bound (the attempt timeout, the slow-call threshold,
// the bulkhead's limit), every stack here, bulwark's too, gets a fixed
// figure instead: the attempt timeout's ceiling (10 s, Timeout.Attempt),
// half of it, and 100 in flight.
var Defaults = Params{
	Total:       bulwark.DefaultTotalTimeout,
	Attempt:     10 * time.Second,
	MaxAttempts: bulwark.DefaultMaxAttempts,
	RetryBase:   bulwark.DefaultRetryBase,
	RetryCap:    bulwark.DefaultRetryCap,
	FailureRate: bulwark.DefaultFailureRate,
	SlowCall:    5 * time.Second,
	MinCalls:    bulwark.DefaultMinCalls,
	// bulwark's default window is the last 100 calls; the peers, which
	// have no such default, get a minute's time window.
	WindowCalls:      bulwark.DefaultWindowCalls,
	Window:           time.Minute,
	OpenFor:          bulwark.DefaultOpenFor,
	HalfOpenCalls:    bulwark.DefaultHalfOpenCalls,
	BulkheadCapacity: 100,
}

// Stack is one named http.RoundTripper under test.
type Stack struct {
	Name string
	RT   http.RoundTripper
}

// Peers returns bare, the peers and bulwark's full stack over base, in the
// order the tables show them.
func Peers(p Params, base http.RoundTripper) ([]Stack, error) {
	bw, err := Bulwark(p, base)
	if err != nil {
		return nil, err
	}
	return []Stack{
		{"bare", base},
		{"failsafe-go", Failsafe(p, base)},
		{"retryablehttp", RetryableHTTP(p, base)},
		{"gobreaker", GoBreaker(p, base)},
		{"bulwark", bw},
	}, nil
}

// Floor is the least a RoundTripper that propagates a deadline does with
// the standard library alone: an attempt context with a timeout, a clone of
// the request under it carrying the two headers bulwark sends (milliseconds
// left, attempt number), and the context cancelled when the body ends. No
// retry, breaker or bulkhead: a deadline layer cannot cost less than this,
// so it is the yardstick for bulwark's full stack.
func Floor(attempt time.Duration, base http.RoundTripper) http.RoundTripper {
	return floorRT{attempt, base}
}

type floorRT struct {
	attempt time.Duration
	next    http.RoundTripper
}

func (f floorRT) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithTimeout(req.Context(), f.attempt)
	r2 := req.Clone(ctx)
	if r2.Header == nil {
		r2.Header = make(http.Header, 2)
	}
	deadline, _ := ctx.Deadline()
	r2.Header.Set(bulwark.DefaultDeadlineHeader, strconv.FormatInt(time.Until(deadline).Milliseconds(), 10))
	r2.Header.Set(bulwark.AttemptHeader, "1")
	resp, err := f.next.RoundTrip(r2)
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = &cancelAtEnd{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

// cancelAtEnd cancels the attempt context once, at EOF or Close, whichever
// comes first: the caller is still reading until then.
type cancelAtEnd struct {
	io.ReadCloser
	cancel context.CancelFunc
	done   atomic.Bool
}

func (c *cancelAtEnd) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	if err == io.EOF {
		c.end()
	}
	return n, err
}

func (c *cancelAtEnd) Close() error {
	err := c.ReadCloser.Close()
	c.end()
	return err
}

func (c *cancelAtEnd) end() {
	if c.done.CompareAndSwap(false, true) {
		c.cancel()
	}
}

// failureStatus is the status rule every breaker and retry here shares:
// 429 and 5xx other than 501, as bulwark's DefaultClassify, failsafehttp's
// retry rule and go-retryablehttp's DefaultRetryPolicy all have it.
func failureStatus(code int) bool {
	return code == http.StatusTooManyRequests || (code >= 500 && code != http.StatusNotImplemented)
}

// BulwarkPolicy is bulwark's policy for p: every layer on.
func BulwarkPolicy(p Params) bulwark.Policy {
	return bulwark.Policy{
		Timeout: bulwark.Timeout{Total: p.Total, Attempt: p.Attempt},
		Breaker: bulwark.Breaker{
			FailureRate: p.FailureRate, SlowCallRate: p.FailureRate, SlowCall: p.SlowCall,
			Window: bulwarkWindow(p), WindowCalls: p.WindowCalls, MinCalls: p.MinCalls, OpenFor: p.OpenFor, HalfOpenCalls: p.HalfOpenCalls,
		},
		Bulkhead: bulwark.Bulkhead{MaxConcurrent: p.BulkheadCapacity},
		Retry:    bulwark.Retry{MaxAttempts: p.MaxAttempts, Base: p.RetryBase, Cap: p.RetryCap},
	}
}

// Bulwark is bulwark's full stack for p: total and attempt deadlines, retry
// (full jitter, budget, Retry-After), pushback, breaker (failure and
// slow-call rate), bulkhead. No fallback: it needs a decision per feature
// (what to answer instead), which no peer here makes either.
func Bulwark(p Params, base http.RoundTripper) (http.RoundTripper, error) {
	return bulwark.New(bulwark.Config{Base: base, Default: BulwarkPolicy(p)})
}

// BulwarkLayers returns bulwark with each layer alone (every other layer
// disabled), and with none (the router only), over base.
func BulwarkLayers(p Params, base http.RoundTripper) ([]Stack, error) {
	full := BulwarkPolicy(p)
	off := bulwark.Policy{
		Timeout:  bulwark.Timeout{Disabled: true},
		Breaker:  bulwark.Breaker{Disabled: true},
		Bulkhead: bulwark.Bulkhead{Disabled: true},
		Retry:    bulwark.Retry{Disabled: true, NoPushback: true},
	}
	variants := []struct {
		name string
		edit func(*bulwark.Policy)
	}{
		{"bulwark-router", func(*bulwark.Policy) {}},
		{"bulwark-timeout", func(q *bulwark.Policy) { q.Timeout = full.Timeout }},
		{"bulwark-retry", func(q *bulwark.Policy) { q.Retry = full.Retry; q.Retry.NoPushback = true }},
		{"bulwark-pushback", func(q *bulwark.Policy) { q.Retry = bulwark.Retry{Disabled: true} }},
		{"bulwark-breaker", func(q *bulwark.Policy) { q.Breaker = full.Breaker }},
		{"bulwark-bulkhead", func(q *bulwark.Policy) { q.Bulkhead = full.Bulkhead }},
		{"bulwark-fallback", func(q *bulwark.Policy) {
			q.Fallback = bulwark.Fallback{Stale: bulwark.StaleCache{MaxAge: time.Minute}}
		}},
	}
	var out []Stack
	for _, v := range variants {
		q := off
		v.edit(&q)
		rt, err := bulwark.New(bulwark.Config{Base: base, Default: q})
		if err != nil {
			return nil, err
		}
		out = append(out, Stack{v.name, rt})
	}
	return out, nil
}

// Failsafe is failsafe-go's equivalent stack through failsafehttp, in the
// composition order its documentation recommends (outer to inner: retry,
// then the load limiters, then the timeout), with a second Timeout
// outermost for the total deadline:
//
//	timeout(Total) → retry → circuit breaker → bulkhead → timeout(Attempt)
//
// The retry is failsafehttp.NewRetryPolicyBuilder (its HTTP rule, 429 and
// 5xx, Retry-After), with MaxAttempts, exponential backoff Base..Cap and a
// jitter factor of 0.5, and it aborts on circuitbreaker.ErrOpen and
// bulkhead.ErrFull, which it would otherwise retry. The breaker counts the
// same failures as bulwark's and trips at FailureRate over MinCalls within
// Window, stays open OpenFor and closes after HalfOpenCalls successes. It
// has no slow-call detection.
func Failsafe(p Params, base http.RoundTripper) http.RoundTripper {
	rt, _ := FailsafeWithBulkhead(p, base)
	return rt
}

// FailsafeWithBulkhead is Failsafe, and its bulkhead so that a benchmark
// can fill it (failsafe-go releases a permit when the round trip returns,
// not when the body is closed, so holding a response does not hold one).
func FailsafeWithBulkhead(p Params, base http.RoundTripper) (http.RoundTripper, bulkhead.Bulkhead[*http.Response]) {
	retry := failsafehttp.NewRetryPolicyBuilder().
		AbortOnErrors(circuitbreaker.ErrOpen, bulkhead.ErrFull).
		WithMaxAttempts(p.MaxAttempts).
		WithBackoff(p.RetryBase, p.RetryCap).
		WithJitterFactor(0.5).
		Build()
	cb := circuitbreaker.NewBuilder[*http.Response]().
		HandleIf(failsafeFailure).
		WithFailureRateThreshold(p.FailureRate, uint(p.MinCalls), p.Window).
		WithDelay(p.OpenFor).
		WithSuccessThreshold(uint(p.HalfOpenCalls)).
		Build()
	bh := bulkhead.New[*http.Response](uint(p.BulkheadCapacity))
	return failsafehttp.NewRoundTripper(base,
		timeout.New[*http.Response](p.Total),
		retry, cb, bh,
		timeout.New[*http.Response](p.Attempt)), bh
}

// failsafeFailure is what failsafe-go's breaker counts as a failure: the
// shared status rule and errors other than its own bulkhead's refusal
// (bulwark's breaker does not count those either: they never reached the
// host).
func failsafeFailure(resp *http.Response, err error) bool {
	if err != nil {
		return !errors.Is(err, bulkhead.ErrFull)
	}
	return resp != nil && failureStatus(resp.StatusCode)
}

// FailsafeBreaker is failsafe-go's circuit breaker alone (as in Failsafe),
// and the breaker itself so a benchmark can open it.
func FailsafeBreaker(p Params, base http.RoundTripper) (http.RoundTripper, circuitbreaker.CircuitBreaker[*http.Response]) {
	cb := circuitbreaker.NewBuilder[*http.Response]().
		HandleIf(func(resp *http.Response, err error) bool {
			return err != nil || (resp != nil && failureStatus(resp.StatusCode))
		}).
		WithFailureRateThreshold(p.FailureRate, uint(p.MinCalls), p.Window).
		WithDelay(p.OpenFor).
		WithSuccessThreshold(uint(p.HalfOpenCalls)).
		Build()
	return failsafehttp.NewRoundTripper(base, cb), cb
}

// RetryableHTTP is go-retryablehttp's RoundTripper over a Client from
// retryablehttp.NewClient, as its README shows, with RetryMax =
// MaxAttempts−1, RetryWaitMin/Max = Base/Cap (its default Backoff:
// exponential, honours Retry-After, no jitter), its DefaultRetryPolicy,
// the per-attempt timeout as HTTPClient.Timeout, and the logger off (its
// default logs every request to stderr). It has no breaker, bulkhead,
// budget or total deadline, and it retries POSTs.
func RetryableHTTP(p Params, base http.RoundTripper) http.RoundTripper {
	c := retryablehttp.NewClient()
	c.HTTPClient = &http.Client{Transport: base, Timeout: p.Attempt}
	c.RetryMax = p.MaxAttempts - 1
	c.RetryWaitMin = p.RetryBase
	c.RetryWaitMax = p.RetryCap
	c.Logger = nil
	return &retryablehttp.RoundTripper{Client: c}
}

// GoBreaker wraps base in a gobreaker.TwoStepCircuitBreaker alone: Allow
// before the request, done with a verdict from the status after. It trips
// when failures ≥ FailureRate × requests once MinCalls requests are in the
// rolling window (Interval = Window, BucketPeriod = Window/10), stays open
// OpenFor (Timeout) and lets HalfOpenCalls probes through (MaxRequests). It
// has no timeout, no slow-call detection, no retry.
func GoBreaker(p Params, base http.RoundTripper) http.RoundTripper {
	return &GoBreakerRT{Next: base, CB: NewGoBreaker(p)}
}

// NewGoBreaker is the breaker GoBreaker uses.
func NewGoBreaker(p Params) *gobreaker.TwoStepCircuitBreaker[*http.Response] {
	minCalls, rate := uint32(p.MinCalls), p.FailureRate
	return gobreaker.NewTwoStepCircuitBreaker[*http.Response](gobreaker.Settings{
		Name:         "upstream",
		MaxRequests:  uint32(p.HalfOpenCalls),
		Interval:     p.Window,
		BucketPeriod: p.Window / 10,
		Timeout:      p.OpenFor,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			return c.Requests >= minCalls && float64(c.TotalFailures) >= rate*float64(c.Requests)
		},
	})
}

// GoBreakerRT is the thin RoundTripper a gobreaker user writes.
type GoBreakerRT struct {
	Next http.RoundTripper
	CB   *gobreaker.TwoStepCircuitBreaker[*http.Response]
}

var errFailureStatus = errors.New("bench: failure status")

// RoundTrip asks the breaker, sends, and reports the verdict.
func (g *GoBreakerRT) RoundTrip(req *http.Request) (*http.Response, error) {
	done, err := g.CB.Allow()
	if err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
	resp, err := g.Next.RoundTrip(req)
	switch {
	case err != nil:
		done(err)
	case failureStatus(resp.StatusCode):
		done(errFailureStatus)
	default:
		done(nil)
	}
	return resp, err
}

// bulwarkWindow is the time window bulwark gets: none when it counts calls.
func bulwarkWindow(p Params) time.Duration {
	if p.WindowCalls > 0 {
		return 0
	}
	return p.Window
}

// HedgePolicy is the one hedging configuration bench/cmd/hedge measures on
// both the long-tail and the sick upstream: the delay is the host's recent
// p99 latency, never under 8 ms.
var HedgePolicy = bulwark.Hedge{Quantile: 0.99, MinDelay: 8 * time.Millisecond}
