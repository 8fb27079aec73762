package bulwark_test

// The seam table: every pair of features that meet in one call, driven
// through the public API only (New, Update, ControlBreaker, Snapshot,
// RoundTrip) over a scripted base, in a synctest bubble so that time is
// virtual. Almost every defect black-box reviews found sat where two
// features meet; a new feature adds its rows here, one for each feature
// it meets.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bulwark-http/bulwark"
)

// seamRows is the table: "feature × feature" and a test that drives both
// through one Transport and asserts where they meet.
var seamRows = []struct {
	name string
	run  func(t *testing.T)
}{
	{"hedge × retry off", seamHedgeRetryOff},
	{"route × Update", seamRouteUpdate},
	{"route × fleet", seamRouteFleet},
	{"shadow × hedge", seamShadowHedge},
	{"shadow × fleet", seamShadowFleet},
	{"throttle × hedge", seamThrottleHedge},
	{"fault × breaker", seamFaultBreaker},
	{"fallback × route", seamFallbackRoute},
	{"classifier × route", seamClassifierRoute},
	{"budget × hedge", seamBudgetHedge},
	{"retry throttle × floor, hedge, fleet", seamThrottleFloor},
	{"pushback × hedge", seamPushbackHedge},
	{"bulkhead × balancer", seamBulkheadBalancer},
	{"deadline × retry", seamDeadlineRetry},
	{"deadline handed down × retry backoff", seamHandedDownBackoff},
	{"local error × breaker, budget", seamLocalErrorBreaker},
	{"force open × route", seamForceOpenRoute},
	{"prepare retry × hedge", seamPrepareRetryHedge},
	{"learned bounds × route", seamLearnedRoute},
	{"learned bounds × hedge", seamLearnedHedge},
	{"learned bounds × Update", seamLearnedUpdate},
	{"learned hold × breaker, slow host", seamLearnedHoldSlowHost},
	{"consecutive failures × hedge", seamConsecutiveHedge},
	{"call counts × retry, fallback, local error", seamCallCountsRetryFallback},
	{"breaker history × Update", seamBreakerHistoryUpdate},
	{"short attempt × retry", seamShortAttemptRetry},
	{"pass-up × fallback", seamPassUpFallback},
	{"fallback × call record", seamFallbackRecord},
	{"pass-up × hedge", seamPassUpHedge},
	{"pass-up × route classifier", seamPassUpRoute},
	{"timer probe × force open", seamTimerProbeForceOpen},
	{"timer probe × fleet", seamTimerProbeFleet},
	{"fleet close × other pod, generation, longer hold", seamFleetCloseOther},
	{"fleet quota × Update, Validate", seamFleetRateUpdate},
	{"breaker judge × learned hold × Update", seamBreakerHoldUpdate},
	{"abandoned attempt × bulkhead", seamAbandonBulkhead},
	{"caller's cancel × open body × bulkhead", seamCancelOpenBody},
	{"abandoned attempt × retry", seamAbandonRetry},
	{"abandoned attempt × hedge", seamAbandonHedge},
	{"fleet × own network (dial refused, DNS)", seamFleetOwnNetwork},
	{"fleet × own successes, host down for all", seamFleetWeighed},
	{"fleet pause × own answers, Shedder's priority", seamFleetPauseWeighed},
	{"fleet counts × own successes", seamFleetCountsOwnSuccess},
	{"SDK attempt header × retry, call record", seamSDKRetry},
	{"SDK attempt header × hedge", seamSDKHedge},
	{"SDK attempt header × budget", seamSDKBudget},
	{"SDK attempt header × breaker", seamSDKBreaker},
	{"retry-after-ms × pushback", seamRetryAfterMsPushback},
	{"RoundTripVia × retry, hedge", seamViaRetryHedge},
	{"RoundTripVia × route, breaker", seamViaRoute},
}

func TestSeams(t *testing.T) {
	for _, row := range seamRows {
		t.Run(row.name, func(t *testing.T) {
			synctest.Test(t, row.run)
		})
	}
}

// seamBase is a scripted upstream: answer decides attempt n's outcome (n
// from 1, in arrival order). It reads and closes each request body first,
// returning the body's error as net/http's Transport does.
type seamBase struct {
	answer func(n int, req *http.Request) (*http.Response, error)

	mu    sync.Mutex
	n     int
	hosts []string
	auth  []string
}

func (b *seamBase) RoundTrip(req *http.Request) (*http.Response, error) {
	b.mu.Lock()
	b.n++
	n := b.n
	b.hosts = append(b.hosts, req.URL.Host)
	b.auth = append(b.auth, req.Header.Get("Authorization"))
	b.mu.Unlock()
	if req.Body != nil {
		_, err := io.Copy(io.Discard, req.Body)
		req.Body.Close()
		if err != nil {
			return nil, err
		}
	}
	return b.answer(n, req)
}

func (b *seamBase) sent() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n
}

// seamAnswer is a response of code to req after d (or req's context's
// error, if it ends first), with header pairs kv.
func seamAnswer(req *http.Request, d time.Duration, code int, kv ...string) (*http.Response, error) {
	if d > 0 {
		tm := time.NewTimer(d)
		defer tm.Stop()
		select {
		case <-tm.C:
		case <-req.Context().Done():
			return nil, context.Cause(req.Context())
		}
	}
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return &http.Response{StatusCode: code, Header: h, Body: io.NopCloser(strings.NewReader(http.StatusText(code))), Request: req}, nil
}

// slowFirstAttempt answers the first attempt of a call after 200 ms and
// any other (a hedge, a retry) after 5 ms, all 200.
func slowFirstAttempt(_ int, req *http.Request) (*http.Response, error) {
	if req.Header.Get(bulwark.AttemptHeader) == "1" {
		return seamAnswer(req, 200*time.Millisecond, 200)
	}
	return seamAnswer(req, 5*time.Millisecond, 200)
}

func seamNew(t *testing.T, cfg bulwark.Config) *bulwark.Transport {
	t.Helper()
	tr, err := bulwark.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Close() })
	return tr
}

// seamSend sends method url (with header pairs kv) and returns the status,
// the body read whole and closed, or the error.
func seamSend(t *testing.T, tr http.RoundTripper, method, url string, kv ...string) (int, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		req.Header.Set(kv[i], kv[i+1])
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// seamHost is host's snapshot ("host:port"), failing the test if it has none.
func seamHost(t *testing.T, tr *bulwark.Transport, host string) bulwark.HostSnapshot {
	t.Helper()
	hs := tr.Snapshot().Host(host)
	if len(hs) != 1 {
		t.Fatalf("Snapshot has %d entries for %s, want 1", len(hs), host)
	}
	return hs[0]
}

// seamRoute is the snapshot of pattern's route on host.
func seamRoute(t *testing.T, tr *bulwark.Transport, host, pattern string) bulwark.RouteSnapshot {
	t.Helper()
	for _, r := range seamHost(t, tr, host).Routes {
		if r.Pattern == pattern {
			return r
		}
	}
	t.Fatalf("no route %q on %s", pattern, host)
	return bulwark.RouteSnapshot{}
}

// seamBreaker trips after 5 failures in a window of 10 calls.
var seamBreaker = bulwark.Breaker{MinCalls: 5, WindowCalls: 10}

// Retry.Disabled means every request is sent once, with hedging on too: a
// fast 503 is not retried, for a GET of a hedge-only host and for a keyed
// charge on a route that disables retries; hedges still go out in the
// first round, and the budget stays on.
func seamHedgeRetryOff(t *testing.T) {
	base := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) {
		if req.URL.Path == "/slow" {
			return slowFirstAttempt(0, req)
		}
		return seamAnswer(req, 0, 503)
	}}
	tr := seamNew(t, bulwark.Config{Base: base,
		Default: bulwark.Policy{Hedge: bulwark.Hedge{Delay: 50 * time.Millisecond}},
		Upstreams: map[string]bulwark.Policy{
			"get.test": {Retry: bulwark.Retry{Disabled: true}},
		},
		Routes: map[string]bulwark.Policy{
			"POST /v1/charges": {Retry: bulwark.Retry{Disabled: true}},
		}})
	if code, err := seamSend(t, tr, "GET", "http://get.test/"); code != 503 || base.sent() != 1 {
		t.Fatalf("hedge-only GET on a fast 503: %d, %v after %d sends; want 503 after 1", code, err, base.sent())
	}
	if hs := seamHost(t, tr, "get.test:80"); hs.Budget == nil {
		t.Error("Retry.Disabled with hedging turned the retry budget off")
	}
	n := base.sent()
	if code, _ := seamSend(t, tr, "POST", "http://pay.test/v1/charges", bulwark.IdempotencyKeyHeader, "k1"); code != 503 || base.sent()-n != 1 {
		t.Fatalf("keyed charge on a fast 503: %d after %d sends; want 503 after 1", code, base.sent()-n)
	}
	n = base.sent()
	if code, _ := seamSend(t, tr, "POST", "http://pay.test/v1/refunds", bulwark.IdempotencyKeyHeader, "k2"); code != 503 || base.sent()-n != 3 {
		t.Fatalf("keyed POST off the route: %d after %d sends; want 503 after 3 (retries on)", code, base.sent()-n)
	}
	n = base.sent()
	if code, _ := seamSend(t, tr, "GET", "http://get.test/slow"); code != 200 || base.sent()-n != 2 {
		t.Fatalf("hedge-only GET, slow first attempt: %d after %d sends; want 200 after 2 (a hedge)", code, base.sent()-n)
	}
}

// Update with the same Config keeps a route's tripped breaker: the next
// call to the route is refused; a change of the breaker's shape starts it
// afresh.
func seamRouteUpdate(t *testing.T) {
	base := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) { return seamAnswer(req, 0, 500) }}
	cfg := bulwark.Config{Base: base, Default: bulwark.Policy{Retry: bulwark.Retry{Disabled: true}},
		Routes: map[string]bulwark.Policy{"GET /pay": {Breaker: seamBreaker}}}
	tr := seamNew(t, cfg)
	for range 5 {
		_, _ = seamSend(t, tr, "GET", "http://api.test/pay")
	}
	if s := seamRoute(t, tr, "api.test:80", "GET /pay").Breaker.State; s != bulwark.CircuitOpen {
		t.Fatalf("route breaker %v after 5 failures, want open", s)
	}
	if err := tr.Update(cfg); err != nil {
		t.Fatal(err)
	}
	n := base.sent()
	_, err := seamSend(t, tr, "GET", "http://api.test/pay")
	var oe *bulwark.BreakerOpenError
	if !errors.As(err, &oe) || base.sent() != n {
		t.Fatalf("after Update(same config): %v, %d sent; want a BreakerOpenError, nothing sent", err, base.sent()-n)
	}
	if b := seamRoute(t, tr, "api.test:80", "GET /pay").Breaker; b.State != bulwark.CircuitOpen || b.Trips != 1 {
		t.Fatalf("route breaker after Update: %+v; want open, 1 trip", b)
	}
	// A new shape: a new breaker, closed.
	cfg.Routes = map[string]bulwark.Policy{"GET /pay": {Breaker: bulwark.Breaker{MinCalls: 5, WindowCalls: 20}}}
	if err := tr.Update(cfg); err != nil {
		t.Fatal(err)
	}
	if code, err := seamSend(t, tr, "GET", "http://api.test/pay"); code != 500 || base.sent() != n+1 {
		t.Fatalf("after Update(new window): %d, %v; want the call sent", code, err)
	}
}

// seamHub is an in-memory store pods share through seamFleet: what one
// publishes reaches the others' sinks.
type seamHub struct {
	mu    sync.Mutex
	sinks map[*seamFleet]*bulwark.FleetSink
	// opens counts the trips published (FleetBreakerOpen).
	opens atomic.Int64
}

type seamFleet struct{ hub *seamHub }

func (f *seamFleet) Publish(_ context.Context, u bulwark.FleetUpdate) error {
	u.From = fmt.Sprintf("%p", f)
	if u.Kind == bulwark.FleetBreakerOpen {
		f.hub.opens.Add(1)
	}
	f.hub.mu.Lock()
	defer f.hub.mu.Unlock()
	for g, s := range f.hub.sinks {
		if g != f {
			s.Apply(u)
		}
	}
	return nil
}

func (f *seamFleet) Receive(ctx context.Context, s *bulwark.FleetSink) error {
	f.hub.mu.Lock()
	f.hub.sinks[f] = s
	f.hub.mu.Unlock()
	s.Connected()
	<-ctx.Done()
	f.hub.mu.Lock()
	delete(f.hub.sinks, f)
	f.hub.mu.Unlock()
	return ctx.Err()
}

// A route's breaker is the route's, on its pod: its trip is not the
// fleet's, so another pod still calls the route; the host's trip is, and
// reaches the other pod's calls to the host.
func seamRouteFleet(t *testing.T) {
	hub := &seamHub{sinks: map[*seamFleet]*bulwark.FleetSink{}}
	fail := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) { return seamAnswer(req, 0, 500) }}
	ok := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) { return seamAnswer(req, 0, 200) }}
	cfg := bulwark.Config{Default: bulwark.Policy{Retry: bulwark.Retry{Disabled: true}, Breaker: seamBreaker},
		Routes: map[string]bulwark.Policy{"GET /pay": {Breaker: seamBreaker}}}
	cfg.Base, cfg.Fleet = fail, &seamFleet{hub: hub}
	a := seamNew(t, cfg)
	cfg.Base, cfg.Fleet = ok, &seamFleet{hub: hub}
	b := seamNew(t, cfg)
	synctest.Wait() // both pods receiving
	for range 5 {
		_, _ = seamSend(t, a, "GET", "http://api.test/pay")
	}
	if s := seamRoute(t, a, "api.test:80", "GET /pay").Breaker.State; s != bulwark.CircuitOpen {
		t.Fatalf("pod A's route breaker %v, want open", s)
	}
	synctest.Wait()
	if code, err := seamSend(t, b, "GET", "http://api.test/pay"); code != 200 || ok.sent() != 1 {
		t.Fatalf("pod B's call to the route after A's route trip: %d, %v; want it sent (a route's trip stays on its pod)", code, err)
	}
	if s := seamHost(t, a, "api.test:80").Breaker.State; s != bulwark.CircuitClosed {
		t.Fatalf("pod A's host breaker %v after route failures, want closed (the route's are the route's)", s)
	}
	for range 5 {
		_, _ = seamSend(t, a, "GET", "http://api.test/other")
	}
	synctest.Wait()
	_, err := seamSend(t, b, "GET", "http://api.test/other")
	var oe *bulwark.BreakerOpenError
	if !errors.As(err, &oe) || ok.sent() != 1 {
		t.Fatalf("pod B after A's host trip: %v, %d sent; want a BreakerOpenError, nothing sent", err, ok.sent()-1)
	}
}

// A breaker in shadow mode changes nothing that is sent: open, it does
// not stop a hedge. One fast success after the five failures gives the
// retry throttle back the token the fifth took (five failed calls in a
// row hold every hedge, as gRFC A6 says), and leaves the shadow breaker's
// window well over its rate.
func seamShadowHedge(t *testing.T) {
	base := &seamBase{answer: func(n int, req *http.Request) (*http.Response, error) {
		switch req.URL.Path {
		case "/fail":
			return seamAnswer(req, 0, 500)
		case "/ok":
			return seamAnswer(req, 0, 200)
		}
		return slowFirstAttempt(n, req)
	}}
	br := seamBreaker
	br.Shadow = true
	tr := seamNew(t, bulwark.Config{Base: base, Default: bulwark.Policy{Retry: bulwark.Retry{Disabled: true},
		Breaker: br, Hedge: bulwark.Hedge{Delay: 50 * time.Millisecond}}})
	for range 5 {
		_, _ = seamSend(t, tr, "GET", "http://api.test/fail")
	}
	if code, err := seamSend(t, tr, "GET", "http://api.test/ok"); code != 200 {
		t.Fatalf("fast call under a shadow breaker: %d, %v", code, err)
	}
	if code, err := seamSend(t, tr, "GET", "http://api.test/slow"); code != 200 {
		t.Fatalf("slow call under a shadow breaker: %d, %v", code, err)
	}
	hs := seamHost(t, tr, "api.test:80")
	if hs.Hedge.Sent != 1 || hs.Hedge.Skipped.Breaker != 0 || hs.Breaker.WouldReject == 0 {
		t.Fatalf("hedge %+v, breaker would-reject %d; want 1 hedge sent and the shadow refusal counted", hs.Hedge, hs.Breaker.WouldReject)
	}
}

// A breaker in shadow mode trips on its pod only: its trip is not
// published, so a pod that enforces keeps calling (a canary watching a
// threshold in shadow must not enforce it fleet-wide); once Update turns
// shadow off, its next trip is the fleet's.
func seamShadowFleet(t *testing.T) {
	hub := &seamHub{sinks: map[*seamFleet]*bulwark.FleetSink{}}
	fail := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) { return seamAnswer(req, 0, 500) }}
	ok := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) { return seamAnswer(req, 0, 200) }}
	br := seamBreaker
	br.Shadow = true
	shadowCfg := bulwark.Config{Base: fail, Fleet: &seamFleet{hub: hub}, Default: bulwark.Policy{Retry: bulwark.Retry{Disabled: true}, Breaker: br}}
	a := seamNew(t, shadowCfg)
	b := seamNew(t, bulwark.Config{Base: ok, Fleet: &seamFleet{hub: hub},
		Default: bulwark.Policy{Retry: bulwark.Retry{Disabled: true}, Breaker: seamBreaker}})
	synctest.Wait() // both pods receiving
	for range 6 {
		_, _ = seamSend(t, a, "GET", "http://api.test/x")
	}
	if hs := seamHost(t, a, "api.test:80"); hs.Breaker.State != bulwark.CircuitOpen || hs.Breaker.WouldReject == 0 {
		t.Fatalf("pod A's shadow breaker %+v, want open with a refusal it would have made", hs.Breaker)
	}
	synctest.Wait()
	if code, err := seamSend(t, b, "GET", "http://api.test/x"); code != 200 || ok.sent() != 1 {
		t.Fatalf("pod B after A's shadow trip: %d, %v; want it sent (a shadow trip is its pod's)", code, err)
	}
	// Enforced: Update keeps the breaker (Shadow moves in place); its next
	// trip reaches pod B.
	br.Shadow = false
	shadowCfg.Default.Breaker = br
	if err := a.Update(shadowCfg); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Minute) // virtual: past the open time, to the probe
	for range 6 {
		_, _ = seamSend(t, a, "GET", "http://api.test/x")
	}
	synctest.Wait()
	if _, err := seamSend(t, b, "GET", "http://api.test/x"); !errors.Is(err, bulwark.ErrBreakerOpen) || ok.sent() != 1 {
		t.Fatalf("pod B after A's enforced trip: %v, %d sent; want a refusal, nothing more sent", err, ok.sent())
	}
}

// An enforcing throttle that is refusing requests stops hedges, which
// would add load where it takes load off.
func seamThrottleHedge(t *testing.T) {
	base := &seamBase{answer: func(n int, req *http.Request) (*http.Response, error) {
		if req.URL.Path == "/fail" {
			return seamAnswer(req, 0, 500)
		}
		return slowFirstAttempt(n, req)
	}}
	tr := seamNew(t, bulwark.Config{Base: base, Default: bulwark.Policy{Retry: bulwark.Retry{Disabled: true},
		Breaker: bulwark.Breaker{Disabled: true}, Throttle: bulwark.Throttle{Enabled: true, K: 1, MaxProbability: 0.5},
		Hedge: bulwark.Hedge{Delay: 50 * time.Millisecond}}})
	for range 20 {
		_, _ = seamSend(t, tr, "GET", "http://api.test/fail")
	}
	// The throttle refuses about half: send until one goes through.
	var passed bool
	for range 200 {
		if _, err := seamSend(t, tr, "GET", "http://api.test/slow"); err == nil {
			passed = true
			break
		} else if !errors.Is(err, bulwark.ErrThrottled) {
			t.Fatalf("slow call: %v", err)
		}
	}
	if !passed {
		t.Fatal("the throttle refused 200 calls in a row at a probability of 0.5")
	}
	if h := seamHost(t, tr, "api.test:80").Hedge; h.Sent != 0 || h.Skipped.Throttle == 0 {
		t.Fatalf("hedge %+v; want none sent, skipped for the throttle", h)
	}
}

// An injected fault is a real one to the breaker: injected 503s open it,
// and nothing reaches the base.
func seamFaultBreaker(t *testing.T) {
	base := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) { return seamAnswer(req, 0, 200) }}
	tr := seamNew(t, bulwark.Config{Base: base, Default: bulwark.Policy{Retry: bulwark.Retry{Disabled: true},
		Breaker: seamBreaker, Fault: bulwark.Fault{AbortStatus: 503, AbortRate: 1}}})
	for range 5 {
		if code, err := seamSend(t, tr, "GET", "http://api.test/"); code != 503 {
			t.Fatalf("injected abort: %d, %v; want 503", code, err)
		}
	}
	_, err := seamSend(t, tr, "GET", "http://api.test/")
	if !errors.Is(err, bulwark.ErrBreakerOpen) || base.sent() != 0 {
		t.Fatalf("after 5 injected 503s: %v, %d sent; want the breaker open, nothing sent", err, base.sent())
	}
}

// A route's fallback answers for the route's calls only.
func seamFallbackRoute(t *testing.T) {
	base := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) { return seamAnswer(req, 0, 500) }}
	tr := seamNew(t, bulwark.Config{Base: base, Default: bulwark.Policy{Retry: bulwark.Retry{Disabled: true}},
		Routes: map[string]bulwark.Policy{"GET /menu": {Fallback: bulwark.Fallback{
			Constant: &bulwark.ConstantResponse{StatusCode: 200, Body: []byte("[]")}}}}})
	if code, err := seamSend(t, tr, "GET", "http://api.test/menu"); code != 200 {
		t.Fatalf("route with a fallback, host failing: %d, %v; want the fallback's 200", code, err)
	}
	if code, err := seamSend(t, tr, "GET", "http://api.test/other"); code != 500 {
		t.Fatalf("off the route: %d, %v; want the host's 500", code, err)
	}
}

// A route's classifier judges the route's calls in its breaker, and not
// the host's other calls.
func seamClassifierRoute(t *testing.T) {
	base := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) { return seamAnswer(req, 0, 404) }}
	tr := seamNew(t, bulwark.Config{Base: base, Default: bulwark.Policy{Retry: bulwark.Retry{Disabled: true}, Breaker: seamBreaker},
		Routes: map[string]bulwark.Policy{"GET /index/": {Classify: func(resp *http.Response, err error) bulwark.Verdict {
			if resp != nil && resp.StatusCode == 404 {
				return bulwark.Verdict{Outcome: bulwark.OutcomeFailure}
			}
			return bulwark.DefaultClassify(resp, err)
		}}}})
	for range 10 {
		_, _ = seamSend(t, tr, "GET", "http://api.test/other")
	}
	for range 5 {
		_, _ = seamSend(t, tr, "GET", "http://api.test/index/a")
	}
	if _, err := seamSend(t, tr, "GET", "http://api.test/index/a"); !errors.Is(err, bulwark.ErrBreakerOpen) {
		t.Fatalf("route after 5 404s it calls failures: %v; want its breaker open", err)
	}
	if b := seamHost(t, tr, "api.test:80").Breaker; b.State != bulwark.CircuitClosed || b.Failures != 0 {
		t.Fatalf("host breaker %+v; want closed with no failures (its 404s are ignored)", b)
	}
}

// A hedge spends from the retry budget: with no calls yet and no floor,
// it is skipped; once calls give the ratio room, it is sent.
func seamBudgetHedge(t *testing.T) {
	base := &seamBase{answer: func(n int, req *http.Request) (*http.Response, error) {
		if req.URL.Path == "/fast" {
			return seamAnswer(req, 0, 200)
		}
		return slowFirstAttempt(n, req)
	}}
	tr := seamNew(t, bulwark.Config{Base: base, Default: bulwark.Policy{
		Retry: bulwark.Retry{Budget: bulwark.Budget{Ratio: 0.1, MinPerSecond: -1}},
		Hedge: bulwark.Hedge{Delay: 50 * time.Millisecond}}})
	_, _ = seamSend(t, tr, "GET", "http://api.test/slow")
	if h := seamHost(t, tr, "api.test:80").Hedge; h.Sent != 0 || h.Skipped.Budget != 1 {
		t.Fatalf("first call: hedge %+v; want skipped for the budget", h)
	}
	for range 20 {
		_, _ = seamSend(t, tr, "GET", "http://api.test/fast")
	}
	_, _ = seamSend(t, tr, "GET", "http://api.test/slow")
	if h := seamHost(t, tr, "api.test:80").Hedge; h.Sent != 1 {
		t.Fatalf("after 20 calls: hedge %+v; want one sent", h)
	}
}

// Five failed calls in a row hold every retry and hedge of the pod that
// made them, the floor's too (gRFC A6's throttle), while the floor has
// tokens to spare; another pod of the same fleet, whose own calls did not
// fail, still retries; successes (a fifth of a token each) give the first
// pod its retries back.
func seamThrottleFloor(t *testing.T) {
	answer := func(n int, req *http.Request) (*http.Response, error) {
		switch req.URL.Path {
		case "/fail":
			return seamAnswer(req, 0, 500)
		case "/ok":
			return seamAnswer(req, 0, 200)
		case "/flaky":
			if req.Header.Get(bulwark.AttemptHeader) == "1" {
				return seamAnswer(req, 0, 503)
			}
			return seamAnswer(req, 0, 200)
		}
		return slowFirstAttempt(n, req)
	}
	hub := &seamHub{sinks: map[*seamFleet]*bulwark.FleetSink{}}
	baseA, baseB := &seamBase{answer: answer}, &seamBase{answer: answer}
	p := bulwark.Policy{Hedge: bulwark.Hedge{Delay: 50 * time.Millisecond}}
	a := seamNew(t, bulwark.Config{Base: baseA, Default: p, Fleet: &seamFleet{hub: hub}})
	b := seamNew(t, bulwark.Config{Base: baseB, Default: p, Fleet: &seamFleet{hub: hub}})
	synctest.Wait()
	for range 5 {
		_, _ = seamSend(t, a, "GET", "http://api.test/fail")
	}
	if n := baseA.sent(); n != 5+4*2 {
		t.Fatalf("five failing calls sent %d attempts, want 13 (calls 1-4 retried twice, call 5 once: the throttle holds)", n)
	}
	time.Sleep(time.Second) // the floor's bucket refills
	before := baseA.sent()
	if code, _ := seamSend(t, a, "GET", "http://api.test/flaky"); code != 503 || baseA.sent()-before != 1 {
		t.Fatalf("throttled pod: a call that a retry would save answered %d after %d attempts; want its 503, sent once", code, baseA.sent()-before)
	}
	_, _ = seamSend(t, a, "GET", "http://api.test/slow")
	hs := seamHost(t, a, "api.test:80")
	if hs.Hedge.Sent != 0 || hs.Hedge.Skipped.Budget != 1 || hs.Budget.Remaining != 0 || !hs.Budget.Throttled {
		t.Fatalf("throttled pod: hedge %+v, budget %+v; want the hedge skipped for the budget, no retry remaining, the throttle shown holding", hs.Hedge, hs.Budget)
	}
	if code, _ := seamSend(t, b, "GET", "http://api.test/flaky"); code != 200 {
		t.Fatalf("the other pod of the fleet: %d, want 200 (its throttle is its own)", code)
	}
	// The throttle is at 4.2 tokens (5, less the flaky call, plus the slow
	// call's success); the next flaky call's failed first attempt takes
	// one before its retry is judged, so ten successes are needed (6.2).
	for range 10 {
		if code, _ := seamSend(t, a, "GET", "http://api.test/ok"); code != 200 {
			t.Fatalf("/ok: %d", code)
		}
	}
	if code, _ := seamSend(t, a, "GET", "http://api.test/flaky"); code != 200 {
		t.Fatalf("after successes the first pod answered %d, want its retry's 200", code)
	}
	if bs := seamHost(t, a, "api.test:80").Budget; bs.Throttled || bs.ThrottleTokens <= 5 {
		t.Fatalf("budget %+v after the throttle let a retry through, want it shown not holding", bs)
	}
}

// A host's Retry-After pause, which arrives while a call is under way,
// stops that call's hedge.
func seamPushbackHedge(t *testing.T) {
	base := &seamBase{answer: func(n int, req *http.Request) (*http.Response, error) {
		if req.URL.Path == "/busy" {
			return seamAnswer(req, 0, 503, "Retry-After", "1")
		}
		return slowFirstAttempt(n, req)
	}}
	tr := seamNew(t, bulwark.Config{Base: base, Default: bulwark.Policy{Retry: bulwark.Retry{Disabled: true},
		Hedge: bulwark.Hedge{Delay: 50 * time.Millisecond}}})
	done := make(chan int)
	go func() {
		code, _ := seamSend(t, tr, "GET", "http://api.test/slow")
		done <- code
	}()
	synctest.Wait() // the slow call's first attempt is at the host
	if code, _ := seamSend(t, tr, "GET", "http://api.test/busy"); code != 503 {
		t.Fatalf("busy: %d, want 503", code)
	}
	if code := <-done; code != 200 {
		t.Fatalf("slow call: %d, want 200", code)
	}
	if h := seamHost(t, tr, "api.test:80").Hedge; h.Sent != 0 || h.Skipped.Pushback != 1 {
		t.Fatalf("hedge %+v; want none sent, skipped for the pause", h)
	}
}

// A balanced host's bulkhead is per instance: with two instances of one
// slot each, two calls go out at once, one to each, and a third is
// refused without being sent.
func seamBulkheadBalancer(t *testing.T) {
	release := make(chan struct{})
	base := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) {
		select {
		case <-release:
		case <-req.Context().Done():
			return nil, req.Context().Err()
		}
		return seamAnswer(req, 0, 200)
	}}
	tr := seamNew(t, bulwark.Config{Base: base, Default: bulwark.Policy{Retry: bulwark.Retry{Disabled: true}},
		Upstreams: map[string]bulwark.Policy{"svc.test": {
			Bulkhead:  bulwark.Bulkhead{MaxConcurrent: 1},
			Endpoints: bulwark.Endpoints{Addrs: []string{"10.0.0.1:80", "10.0.0.2:80"}},
		}}})
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			if code, err := seamSend(t, tr, "GET", "http://svc.test/"); code != 200 {
				t.Errorf("held call: %d, %v", code, err)
			}
		})
	}
	synctest.Wait()
	base.mu.Lock()
	hosts := append([]string(nil), base.hosts...)
	base.mu.Unlock()
	if len(hosts) != 2 || hosts[0] == hosts[1] {
		t.Fatalf("two calls went to %v; want one to each instance", hosts)
	}
	_, err := seamSend(t, tr, "GET", "http://svc.test/")
	if !errors.Is(err, bulwark.ErrBulkheadFull) || base.sent() != 2 {
		t.Errorf("third call with both slots held: %v, %d sent; want ErrBulkheadFull, not sent", err, base.sent())
	}
	close(release)
	wg.Wait()
}

// A retry that cannot fit before Timeout.Total is not made: the caller
// gets the last attempt's response, not a timeout.
func seamDeadlineRetry(t *testing.T) {
	base := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) {
		return seamAnswer(req, 400*time.Millisecond, 503)
	}}
	tr := seamNew(t, bulwark.Config{Base: base, Default: bulwark.Policy{
		Timeout: bulwark.Timeout{Total: time.Second, Attempt: 500 * time.Millisecond},
		Retry:   bulwark.Retry{Base: 100 * time.Millisecond, Jitter: bulwark.JitterNone},
		Breaker: bulwark.Breaker{Disabled: true}}})
	start := time.Now()
	code, err := seamSend(t, tr, "GET", "http://api.test/")
	if code != 503 || err != nil || base.sent() != 2 {
		t.Fatalf("got %d, %v after %d sends; want the second attempt's 503", code, err, base.sent())
	}
	if d := time.Since(start); d != 900*time.Millisecond {
		t.Errorf("returned after %v, want 900ms (two attempts and one wait)", d)
	}
}

// A deadline handed down from a caller that learned its own host (45 ms,
// as server.DeadlineHandler makes it of Bulwark-Timeout-Ms: 45) leaves a
// fast host's caller less than the 100 ms Base: the retry's wait is drawn
// within the room, so each of 50 calls whose first attempt fails is
// retried and answered (a draw over the whole range skipped about two in
// three as late), and every retry leaves the host its median to answer.
func seamHandedDownBackoff(t *testing.T) {
	var failNext atomic.Bool
	base := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) {
		if failNext.CompareAndSwap(true, false) {
			return seamAnswer(req, 5*time.Millisecond, 503)
		}
		return seamAnswer(req, 5*time.Millisecond, 200)
	}}
	tr := seamNew(t, bulwark.Config{Base: base})
	call := func(d time.Duration) (int, error) {
		ctx, cancel := context.WithTimeout(t.Context(), d)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://tax.test/rate", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			return 0, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	for range 250 { // learned: the host's median is 5 ms
		call(time.Second)
	}
	for i := range 50 {
		for range 5 { // the retry throttle's token back
			call(time.Second)
		}
		failNext.Store(true)
		before := base.sent()
		start := time.Now()
		code, err := call(45 * time.Millisecond)
		if code != 200 || base.sent()-before != 2 {
			t.Fatalf("call %d: %d, %v after %d attempts; want the retry's 200", i, code, err, base.sent()-before)
		}
		if d := time.Since(start); d > 45*time.Millisecond-5*time.Millisecond {
			t.Fatalf("call %d answered after %v: the retry left the host less than its median", i, d)
		}
	}
}

// A request net/http would refuse to write, and one whose body fails to
// read, are the caller's faults: never retried, never counted for the
// host, so they cannot open its breaker for everyone.
func seamLocalErrorBreaker(t *testing.T) {
	base := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) { return seamAnswer(req, 0, 200) }}
	tr := seamNew(t, bulwark.Config{Base: base, Default: bulwark.Policy{Breaker: seamBreaker}})
	for range 10 {
		_, err := seamSend(t, tr, "GET", "http://api.test/", "X-Bad\x01Name", "v")
		if !errors.Is(err, bulwark.ErrInvalidRequest) {
			t.Fatalf("bad header name: %v; want ErrInvalidRequest", err)
		}
	}
	errRead := errors.New("disk gone")
	for range 10 {
		req, _ := http.NewRequestWithContext(t.Context(), "PUT", "http://api.test/", nil)
		req.Body = io.NopCloser(io.MultiReader(strings.NewReader("part"), errReader{errRead}))
		req.GetBody = func() (io.ReadCloser, error) {
			return io.NopCloser(io.MultiReader(strings.NewReader("part"), errReader{errRead})), nil
		}
		resp, err := tr.RoundTrip(req)
		if resp != nil || !errors.Is(err, bulwark.ErrRequestBody) || !errors.Is(err, errRead) {
			t.Fatalf("failing body: %v, %v; want ErrRequestBody wrapping the body's error", resp, err)
		}
	}
	if base.sent() != 10 {
		t.Fatalf("sent %d; want each failing body sent once, the bad headers never", base.sent())
	}
	hs := seamHost(t, tr, "api.test:80")
	if b := hs.Breaker; b.State != bulwark.CircuitClosed || b.Calls != 0 {
		t.Fatalf("breaker %+v; want closed with nothing counted", b)
	}
	if hs.Budget.Calls != 0 || hs.Budget.Retries != 0 {
		t.Fatalf("budget %+v; want nothing counted", hs.Budget)
	}
	if code, err := seamSend(t, tr, "GET", "http://api.test/"); code != 200 {
		t.Fatalf("a good request after: %d, %v", code, err)
	}
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// ControlBreaker's hold reaches a route's breaker too, and its refusal
// names the host.
func seamForceOpenRoute(t *testing.T) {
	base := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) { return seamAnswer(req, 0, 200) }}
	tr := seamNew(t, bulwark.Config{Base: base, Routes: map[string]bulwark.Policy{"GET /pay": {Breaker: seamBreaker}}})
	if err := tr.ControlBreaker("api.test:80", bulwark.BreakerForceOpen); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/", "/pay"} {
		_, err := seamSend(t, tr, "GET", "http://api.test"+path)
		var oe *bulwark.BreakerOpenError
		if !errors.As(err, &oe) || oe.Host != "api.test:80" {
			t.Fatalf("GET %s, forced open: %v; want a *BreakerOpenError for api.test:80", path, err)
		}
	}
	if base.sent() != 0 {
		t.Fatalf("sent %d while forced open", base.sent())
	}
}

// PrepareRetry changes each retry's own copy, not the first attempt nor a
// hedge of the first round, and never the caller's request.
func seamPrepareRetryHedge(t *testing.T) {
	base := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) {
		if req.Header.Get(bulwark.AttemptHeader) == "1" {
			return seamAnswer(req, 100*time.Millisecond, 503)
		}
		return seamAnswer(req, 0, 503)
	}}
	var prepared int
	tr := seamNew(t, bulwark.Config{Base: base, Default: bulwark.Policy{
		Retry: bulwark.Retry{MaxAttempts: 4, PrepareRetry: func(req *http.Request) error {
			prepared++
			req.Header.Set("Authorization", fmt.Sprintf("sig-%d", prepared))
			return nil
		}},
		Hedge: bulwark.Hedge{Delay: 50 * time.Millisecond}}})
	req, _ := http.NewRequestWithContext(t.Context(), "GET", "http://api.test/", nil)
	req.Header.Set("Authorization", "sig-0")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	base.mu.Lock()
	auth := strings.Join(base.auth, ",")
	base.mu.Unlock()
	if auth != "sig-0,sig-0,sig-1,sig-2" || prepared != 2 {
		t.Fatalf("attempts sent with %s, PrepareRetry called %d; want sig-0,sig-0 (first and its hedge),sig-1,sig-2", auth, prepared)
	}
	if got := req.Header.Get("Authorization"); got != "sig-0" {
		t.Fatalf("the caller's request now says %q", got)
	}
}

// seamLearn sends n GETs to url one after another, each read and closed.
func seamLearn(t *testing.T, tr http.RoundTripper, url string, n int) (failed int) {
	t.Helper()
	for range n {
		if code, err := seamSend(t, tr, "GET", url); err != nil || code != 200 {
			failed++
		}
	}
	return failed
}

// A route learns its own bounds, from a cold start, and its calls teach
// the host nothing: a report route at 300 ms, called once in 4,000 calls
// of a host whose other calls take 10 ms (far under the host's p99.9), is
// not timed out at the host's learned 50 ms, and the host's timeout stays
// the fast calls'. Once the route has its own 200 healthy calls it has its
// own learned timeout, three times its p99.9.
func seamLearnedRoute(t *testing.T) {
	base := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) {
		if req.URL.Path == "/report" {
			return seamAnswer(req, 300*time.Millisecond, 200)
		}
		return seamAnswer(req, 10*time.Millisecond, 200)
	}}
	tr := seamNew(t, bulwark.Config{Base: base, Routes: map[string]bulwark.Policy{"GET /report": {}}})
	reportFailed := 0
	for range 3 {
		seamLearn(t, tr, "http://api.test/rates", 4000)
		reportFailed += seamLearn(t, tr, "http://api.test/report", 1)
	}
	host, route := seamHost(t, tr, "api.test:80").Learned, seamRoute(t, tr, "api.test:80", "GET /report").Learned
	if reportFailed != 0 || host == nil || route == nil {
		t.Fatalf("%d of 3 report calls failed; host learned %+v, route %+v; want none failed and both shown", reportFailed, host, route)
	}
	if host.AttemptFrom != bulwark.FromLearned || host.AttemptTimeout > 100*time.Millisecond || route.AttemptFrom != bulwark.FromColdStart || route.AttemptTimeout != bulwark.DefaultAttemptTimeout {
		t.Fatalf("host learned %+v, route %+v; want the host's learned from its 10 ms calls, the route's cold", *host, *route)
	}
	if f := seamLearn(t, tr, "http://api.test/report", 300); f != 0 {
		t.Fatalf("%d of 300 report calls failed", f)
	}
	route = seamRoute(t, tr, "api.test:80", "GET /report").Learned
	if route.AttemptFrom != bulwark.FromLearned || route.AttemptTimeout < 900*time.Millisecond || route.AttemptTimeout > 1100*time.Millisecond {
		t.Fatalf("route learned %+v after 300 calls at 300 ms; want its own, 3 × its p99.9", *route)
	}
}

// A hedge's loser teaches nothing: the first attempt of every call takes
// 200 ms and loses to a hedge sent after 20 ms that answers in 5 ms (the
// budget off, so that every call is hedged); the host's healthy p99.9 is
// the winners' 5 ms, not the losers' 200 ms.
func seamLearnedHedge(t *testing.T) {
	base := &seamBase{answer: slowFirstAttempt}
	tr := seamNew(t, bulwark.Config{Base: base, Default: bulwark.Policy{Hedge: bulwark.Hedge{Delay: 20 * time.Millisecond},
		Retry: bulwark.Retry{Budget: bulwark.Budget{Disabled: true}}}})
	if f := seamLearn(t, tr, "http://api.test/x", 500); f != 0 {
		t.Fatalf("%d of 500 hedged calls failed", f)
	}
	hs := seamHost(t, tr, "api.test:80")
	l := hs.Learned
	if hs.Hedge.Sent < 500 || l.HealthyP999 <= 0 || l.HealthyP999 > 10*time.Millisecond || l.AttemptFrom != bulwark.FromLearned {
		t.Fatalf("%d hedges sent; learned %+v; want every call hedged and a p99.9 of the winners' 5 ms", hs.Hedge.Sent, *l)
	}
}

// Update keeps what a host and its routes learned: it is a measurement of
// the host, not configuration. A bound the new config sets is obeyed as
// set while the measurement is kept, and a later Update that unsets it is
// back on the learned value at once, with no cold start. A host that moves
// to another upstream label starts cold, as its other state does.
func seamLearnedUpdate(t *testing.T) {
	base := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) {
		return seamAnswer(req, 10*time.Millisecond, 200)
	}}
	cfg := bulwark.Config{Base: base, Routes: map[string]bulwark.Policy{"GET /report": {}}}
	tr := seamNew(t, cfg)
	seamLearn(t, tr, "http://api.test/x", 300)
	seamLearn(t, tr, "http://api.test/report", 300)
	learned := func() (host, route bulwark.LearnedSnapshot) {
		return *seamHost(t, tr, "api.test:80").Learned, *seamRoute(t, tr, "api.test:80", "GET /report").Learned
	}
	h0, r0 := learned()
	if h0.AttemptFrom != bulwark.FromLearned || r0.AttemptFrom != bulwark.FromLearned {
		t.Fatalf("before Update: host %+v, route %+v; want both learned", h0, r0)
	}
	if err := tr.Update(cfg); err != nil {
		t.Fatal(err)
	}
	if h, r := learned(); h != h0 || r != r0 {
		t.Fatalf("after Update(same config): host %+v, route %+v; want %+v and %+v kept", h, r, h0, r0)
	}
	set := cfg
	set.Default.Timeout.Attempt = 2 * time.Second
	if err := tr.Update(set); err != nil {
		t.Fatal(err)
	}
	if h, r := learned(); h.AttemptFrom != bulwark.FromSet || h.AttemptTimeout != 2*time.Second || h.Baseline != h0.Baseline ||
		r.AttemptFrom != bulwark.FromSet || r.Baseline != r0.Baseline {
		t.Fatalf("after Update(Attempt 2s): host %+v, route %+v; want 2s set, baselines %v and %v kept", h, r, h0.Baseline, r0.Baseline)
	}
	if err := tr.Update(cfg); err != nil {
		t.Fatal(err)
	}
	if h, r := learned(); h != h0 || r != r0 {
		t.Fatalf("after Update(Attempt unset again): host %+v, route %+v; want the learned %+v and %+v at once", h, r, h0, r0)
	}
	moved := cfg
	moved.Upstreams = map[string]bulwark.Policy{"api.test": {}}
	if err := tr.Update(moved); err != nil {
		t.Fatal(err)
	}
	seamLearn(t, tr, "http://api.test/x", 1)
	if h := *seamHost(t, tr, "api.test:80").Learned; h.AttemptFrom != bulwark.FromColdStart || h.Baseline != 0 {
		t.Fatalf("after moving to upstream api.test: host %+v, want a cold start", h)
	}
}

// The breaker's learned hold (a rate rule must hold for the third
// attempt's learned timeout before it trips) is at most 10 s, as that
// timeout is: a host whose healthy answers take 3.5 s (a learned hold of
// 45 s, uncapped) that turns to fast 503s, called 20 times a second, is
// refused within 20 s of the change.
func seamLearnedHoldSlowHost(t *testing.T) {
	var failing atomic.Bool
	base := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) {
		if failing.Load() {
			return seamAnswer(req, 0, 503)
		}
		return seamAnswer(req, 3500*time.Millisecond, 200)
	}}
	tr := seamNew(t, bulwark.Config{Base: base})
	// 220 healthy calls, 20 at a time: 200 must fall within the
	// learning window (five to ten minutes).
	var wg sync.WaitGroup
	var failed atomic.Int64
	for range 20 {
		wg.Go(func() { failed.Add(int64(seamLearn(t, tr, "http://slow.test/x", 11))) })
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of 220 healthy calls failed", n)
	}
	if l := seamHost(t, tr, "slow.test:80").Learned; l.AttemptFrom != bulwark.FromLearned || l.AttemptTimeout != 10*time.Second {
		t.Fatalf("learned %+v, want the attempt timeout learned at its 10 s ceiling", l)
	}
	failing.Store(true)
	start := time.Now()
	for time.Since(start) < time.Minute {
		if _, err := seamSend(t, tr, "GET", "http://slow.test/x"); errors.Is(err, bulwark.ErrBreakerOpen) {
			took := time.Since(start)
			t.Logf("first refusal %v after the host turned to 503s", took)
			if took > 20*time.Second {
				t.Fatalf("first refusal %v after the host turned to 503s, want within 20 s", took)
			}
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no refusal in a minute of 503s: %+v", seamHost(t, tr, "slow.test:80").Breaker)
}

// ConsecutiveFailures counts attempts the host never answered; a hedge's
// loser, cancelled by bulwark when the hedge won, is not one of them: a
// host whose first attempts hang and whose hedges answer keeps its breaker
// closed and answers every call. When the hedges hang too, every attempt
// is unanswered and the breaker opens within a few calls.
func seamConsecutiveHedge(t *testing.T) {
	var hangAll atomic.Bool
	base := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) {
		if req.Header.Get(bulwark.AttemptHeader) == "1" || hangAll.Load() {
			<-req.Context().Done()
			return nil, context.Cause(req.Context())
		}
		return seamAnswer(req, 5*time.Millisecond, 200)
	}}
	tr := seamNew(t, bulwark.Config{Base: base, Default: bulwark.Policy{Hedge: bulwark.Hedge{Delay: 20 * time.Millisecond},
		Retry: bulwark.Retry{Budget: bulwark.Budget{Disabled: true}}}})
	if f := seamLearn(t, tr, "http://api.test/x", 300); f != 0 {
		t.Fatalf("%d of 300 calls failed while every hedge answered", f)
	}
	if b := seamHost(t, tr, "api.test:80").Breaker; b.State != bulwark.CircuitClosed || b.Trips != 0 {
		t.Fatalf("breaker %+v after 300 calls whose hedges answered; want closed, never tripped", b)
	}
	hangAll.Store(true)
	for i := range 20 {
		start := time.Now()
		_, err := seamSend(t, tr, "GET", "http://api.test/x")
		if errors.Is(err, bulwark.ErrBreakerOpen) {
			t.Logf("all attempts hung: the breaker refused call %d; the one before took %v", i, time.Since(start))
			return
		}
	}
	t.Fatalf("breaker %+v after 20 calls whose every attempt hung; want it open", seamHost(t, tr, "api.test:80").Breaker)
}

// A failure passed up from below (bulwark.NoRetryFromBelow) is no failure
// of the host's, but the call still failed: a fallback answers for it,
// and it is neither retried nor counted by the breaker.
func seamPassUpFallback(t *testing.T) {
	base := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) {
		return seamAnswer(req, 0, 503, bulwark.NoRetryHeader, bulwark.NoRetryFromBelow)
	}}
	tr := seamNew(t, bulwark.Config{Base: base, Default: bulwark.Policy{Breaker: seamBreaker,
		Fallback: bulwark.Fallback{Constant: &bulwark.ConstantResponse{StatusCode: 200, Body: []byte("[]")}}}})
	for range 10 {
		if code, err := seamSend(t, tr, "GET", "http://api.test/menu"); code != 200 {
			t.Fatalf("a failure passed up: %d, %v; want the fallback's 200", code, err)
		}
	}
	h := seamHost(t, tr, "api.test:80")
	if base.sent() != 10 || h.Breaker.State != bulwark.CircuitClosed || h.Breaker.Failures != 0 || h.PassedUp != 10 {
		t.Fatalf("sent %d, breaker %+v, passed up %d; want 10 sent once each, the breaker closed and empty, 10 passed up", base.sent(), h.Breaker, h.PassedUp)
	}
}

// A failure a fallback answered is not the service's failure from below:
// a call made with a CallRecord's context (as a service's handler makes
// it under the server half), retried and still failed, then answered by
// the fallback (a constant, or the stale copy of an earlier success),
// notes nothing in the record, so the service's own failure after it is
// not passed up; with no fallback, one that has nothing (an empty stale
// cache), or one that answers a failure, the call notes it. Every call
// is sent 3 times: the fallback sees only the final outcome.
func seamFallbackRecord(t *testing.T) {
	const get = "http://tax.test/rate"
	for _, tc := range []struct {
		name   string
		fb     bulwark.Fallback
		warmed bool // an earlier success, which a stale cache keeps
		want   bool
	}{
		{"constant 200", bulwark.Fallback{Constant: &bulwark.ConstantResponse{StatusCode: 200}}, false, false},
		{"stale copy", bulwark.Fallback{Stale: bulwark.StaleCache{MaxAge: time.Minute}}, true, false},
		{"empty stale cache", bulwark.Fallback{Stale: bulwark.StaleCache{MaxAge: time.Minute}}, false, true},
		{"constant 503", bulwark.Fallback{Constant: &bulwark.ConstantResponse{StatusCode: 503}}, false, true},
		{"none", bulwark.Fallback{}, false, true},
	} {
		var warmed atomic.Bool
		base := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) {
			if !warmed.Load() {
				return seamAnswer(req, 0, 200)
			}
			return seamAnswer(req, 0, 503)
		}}
		tr := seamNew(t, bulwark.Config{Base: base, Default: bulwark.Policy{Fallback: tc.fb}})
		if tc.warmed {
			if code, err := seamSend(t, tr, "GET", get); code != 200 {
				t.Fatalf("%s: the warming call got %d, %v", tc.name, code, err)
			}
		}
		warmed.Store(true)
		before := base.sent()
		var rec bulwark.CallRecord
		req, err := http.NewRequestWithContext(rec.Attach(t.Context()), "GET", get, nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp, err := tr.RoundTrip(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		if got, sent := rec.FailedBelow(), base.sent()-before; got != tc.want || sent != bulwark.DefaultMaxAttempts {
			t.Errorf("%s: noted %v after %d attempts; want %v after %d", tc.name, got, sent, tc.want, bulwark.DefaultMaxAttempts)
		}
	}
}

// A hedged call whose first attempt answers a failure passed up from
// below ends with it: it is not retryable, so no hedge or retry follows.
func seamPassUpHedge(t *testing.T) {
	base := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) {
		return seamAnswer(req, 5*time.Millisecond, 503, bulwark.NoRetryHeader, bulwark.NoRetryFromBelow)
	}}
	tr := seamNew(t, bulwark.Config{Base: base, Default: bulwark.Policy{Hedge: bulwark.Hedge{Delay: 50 * time.Millisecond}}})
	if code, err := seamSend(t, tr, "GET", "http://api.test/x"); code != 503 || err != nil {
		t.Fatalf("got %d, %v; want the 503 passed up", code, err)
	}
	time.Sleep(time.Second)
	if n := base.sent(); n != 1 {
		t.Fatalf("%d attempts, want 1: a pass-up is final", n)
	}
}

// A route's classifier that calls every 503 a failure still cannot make
// its breaker count a failure passed up from below.
func seamPassUpRoute(t *testing.T) {
	base := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) {
		return seamAnswer(req, 0, 503, bulwark.NoRetryHeader, "Below")
	}}
	strict := func(resp *http.Response, err error) bulwark.Verdict {
		return bulwark.Verdict{Outcome: bulwark.OutcomeFailure, Retryable: true}
	}
	tr := seamNew(t, bulwark.Config{Base: base, Default: bulwark.Policy{Breaker: seamBreaker},
		Routes: map[string]bulwark.Policy{"GET /pay/": {Classify: strict}}})
	for range 20 {
		_, _ = seamSend(t, tr, "GET", "http://api.test/pay/1")
	}
	h := seamHost(t, tr, "api.test:80")
	if len(h.Routes) != 1 || h.Routes[0].Breaker.State != bulwark.CircuitClosed || h.Routes[0].Breaker.Failures != 0 {
		t.Fatalf("route %+v; want its breaker closed with no failures", h.Routes)
	}
	if base.sent() != 20 || h.PassedUp != 20 {
		t.Fatalf("sent %d, passed up %d; want 20 each (no retries)", base.sent(), h.PassedUp)
	}
}

// A breaker forced open sends nothing, not even the timer probes of an
// open period that a trip before it started.
func seamTimerProbeForceOpen(t *testing.T) {
	base := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) { return seamAnswer(req, 0, 503) }}
	tr := seamNew(t, bulwark.Config{Base: base, Default: bulwark.Policy{Retry: bulwark.Retry{Disabled: true},
		Breaker: bulwark.Breaker{MinCalls: 5, WindowCalls: 10, OpenFor: time.Second}}})
	for range 5 {
		_, _ = seamSend(t, tr, "GET", "http://api.test/x")
	}
	if b := seamHost(t, tr, "api.test:80").Breaker; b.State != bulwark.CircuitOpen {
		t.Fatalf("breaker %v after 5 failures, want open", b.State)
	}
	if err := tr.ControlBreaker("api.test:80", bulwark.BreakerForceOpen); err != nil {
		t.Fatal(err)
	}
	sent := base.sent()
	for range 400 {
		time.Sleep(10 * time.Millisecond)
		_, _ = seamSend(t, tr, "GET", "http://api.test/x")
	}
	if n := base.sent() - sent; n != 0 {
		t.Fatalf("%d requests sent while forced open, want none", n)
	}
}

// A trip adopted from the fleet is probed as a local trip is: spaced
// through the hold, at most HalfOpenCalls − 1 a hold, so that a pod that
// can reach the host finds it on its own, and a fleet verdict is never
// harder to end than a local one. Once the host recovers, the adopting
// pod answers within a spacing of its own, or as soon as the tripping
// pod's half-open round closes its breaker (its FleetBreakerClosed ends
// the hold adopted from its trip), whichever comes first.
func seamTimerProbeFleet(t *testing.T) {
	hub := &seamHub{sinks: map[*seamFleet]*bulwark.FleetSink{}}
	var healthy atomic.Bool
	var sentA, sentB atomic.Int64
	base := func(sent *atomic.Int64) *seamBase {
		return &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) {
			sent.Add(1)
			if healthy.Load() {
				return seamAnswer(req, 0, 200)
			}
			return seamAnswer(req, 0, 503)
		}}
	}
	br := bulwark.Breaker{MinCalls: 5, WindowCalls: 10, OpenFor: 10 * time.Second, HalfOpenCalls: 10}
	policy := bulwark.Policy{Retry: bulwark.Retry{Disabled: true}, Breaker: br}
	a := seamNew(t, bulwark.Config{Base: base(&sentA), Fleet: &seamFleet{hub: hub}, Default: policy})
	b := seamNew(t, bulwark.Config{Base: base(&sentB), Fleet: &seamFleet{hub: hub}, Default: policy})
	synctest.Wait() // both pods receiving
	for range 5 {
		_, _ = seamSend(t, a, "GET", "http://api.test/x")
	}
	synctest.Wait()
	if _, err := seamSend(t, b, "GET", "http://api.test/x"); !errors.Is(err, bulwark.ErrBreakerOpen) || sentB.Load() != 0 {
		t.Fatalf("pod B after A's trip: %v, %d sent; want the fleet's trip adopted", err, sentB.Load())
	}
	// Sick for 5 s, both pods called every 50 ms: each probes its hold.
	before := sentA.Load()
	for range 100 {
		time.Sleep(50 * time.Millisecond)
		_, _ = seamSend(t, a, "GET", "http://api.test/x")
		_, _ = seamSend(t, b, "GET", "http://api.test/x")
	}
	probes := sentA.Load() - before
	if n := probes; n < 2 || n > 10 {
		t.Errorf("pod A sent %d spaced probes in 5 s of a 10 s open time, want 2 to 10", n)
	}
	if n := sentB.Load(); n < 2 || n > 10 {
		t.Errorf("pod B, holding an adopted trip, sent %d spaced probes in 5 s of it, want 2 to 10 (as a local trip)", n)
	}
	healthy.Store(true)
	recovered := time.Now()
	for code, _ := seamSend(t, a, "GET", "http://api.test/x"); code != 200; code, _ = seamSend(t, a, "GET", "http://api.test/x") {
		if time.Since(recovered) > 2*time.Second {
			t.Fatal("pod A not answered within 2 s of the host's recovery (a spacing is at most 1 s)")
		}
		time.Sleep(50 * time.Millisecond)
	}
	tookA := time.Since(recovered)
	// Both pods called every 50 ms: B's own spaced probe, or A's close
	// after its half-open round, ends the hold B adopted.
	for {
		time.Sleep(50 * time.Millisecond)
		_, _ = seamSend(t, a, "GET", "http://api.test/x")
		synctest.Wait() // A's close, if any, delivered
		if code, _ := seamSend(t, b, "GET", "http://api.test/x"); code == 200 {
			break
		}
		if time.Since(recovered) > 2*time.Second {
			t.Fatalf("pod B not answered 2 s after the host's recovery (its own spacing is at most 1 s); pod A %v",
				seamHost(t, a, "api.test:80").Breaker.State)
		}
	}
	tookB := time.Since(recovered)
	h := seamHost(t, b, "api.test:80").Breaker
	if n := len(h.Changes); n == 0 || h.Changes[n-1].Reason != "the pod that tripped closed again" && h.Changes[n-1].Reason != "a spaced probe succeeded" {
		t.Errorf("pod B's breaker changes %+v, want the last to be the end of the adopted hold", h.Changes)
	}
	t.Logf("pod A sent %d spaced probes while the host was sick; after it recovered pod A answered in %v, pod B in %v", probes, tookA, tookB)
}

// A pod's close ends only the hold adopted from that pod's trip of that
// generation: a close from another pod, or of the same pod's earlier
// trip, ends nothing, and neither does the tripping pod's own close once a
// later, longer hold from another pod replaced the one adopted from it.
// The source of the hold in force still ends it.
func seamFleetCloseOther(t *testing.T) {
	hub := &seamHub{sinks: map[*seamFleet]*bulwark.FleetSink{}}
	var healthy atomic.Bool
	sick := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) {
		if healthy.Load() {
			return seamAnswer(req, 0, 200)
		}
		return seamAnswer(req, 0, 503)
	}}
	ok := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) { return seamAnswer(req, 0, 200) }}
	// HalfOpenCalls 1: no spaced probes, one probe closes or trips again.
	br := bulwark.Breaker{MinCalls: 5, WindowCalls: 10, OpenFor: 10 * time.Second, MaxOpenFor: time.Minute, HalfOpenCalls: 1}
	policy := bulwark.Policy{Retry: bulwark.Retry{Disabled: true}, Breaker: br}
	fa, fb := &seamFleet{hub: hub}, &seamFleet{hub: hub}
	a := seamNew(t, bulwark.Config{Base: sick, Fleet: fa, Default: policy})
	b := seamNew(t, bulwark.Config{Base: ok, Fleet: fb, Default: policy})
	synctest.Wait() // both pods receiving
	hub.mu.Lock()
	sinkB := hub.sinks[fb]
	hub.mu.Unlock()
	idA := fmt.Sprintf("%p", fa) // what seamFleet names pod A
	refused := func(when string) {
		t.Helper()
		if _, err := seamSend(t, b, "GET", "http://api.test/x"); !errors.Is(err, bulwark.ErrBreakerOpen) || ok.sent() != 0 {
			t.Fatalf("pod B %s: %v, %d sent; want the adopted hold to stand", when, err, ok.sent())
		}
	}
	for range 5 {
		_, _ = seamSend(t, a, "GET", "http://api.test/x")
	}
	synctest.Wait()
	refused("after A's first trip")
	// A's hold ends (at most 10 s), its half-open probe fails: its second
	// trip, which B adopts before its grace runs out.
	time.Sleep(10*time.Second + time.Millisecond)
	_, _ = seamSend(t, a, "GET", "http://api.test/x")
	synctest.Wait()
	if h := seamHost(t, a, "api.test:80").Breaker; h.State != bulwark.CircuitOpen || h.Trips != 2 {
		t.Fatalf("pod A %v after %d trips, want open after 2", h.State, h.Trips)
	}
	time.Sleep(2 * time.Second) // past the grace of B's first hold
	refused("after A's second trip")
	now := time.Now()
	sinkB.Apply(bulwark.FleetUpdate{Kind: bulwark.FleetBreakerClosed, Host: "api.test:80", From: idA, Generation: 1, Until: now.Add(5 * time.Second)})
	sinkB.Apply(bulwark.FleetUpdate{Kind: bulwark.FleetBreakerClosed, Host: "api.test:80", From: "pod-c", Generation: 2, Until: now.Add(5 * time.Second)})
	refused("after a close of A's older trip and one from pod C")
	// Pod C's trip holds longer than A's second one (at most 20 s).
	sinkB.Apply(bulwark.FleetUpdate{Kind: bulwark.FleetBreakerOpen, Host: "api.test:80", From: "pod-c", Generation: 1, Until: now.Add(40 * time.Second)})
	healthy.Store(true)
	time.Sleep(20 * time.Second) // A's second hold is over
	if code, err := seamSend(t, a, "GET", "http://api.test/x"); code != 200 {
		t.Fatalf("pod A's probe: %d, %v", code, err)
	}
	synctest.Wait() // A's close delivered
	if s := seamHost(t, a, "api.test:80").Breaker.State; s != bulwark.CircuitClosed {
		t.Fatalf("pod A %v after its probe succeeded, want closed", s)
	}
	refused("after A closed, holding pod C's longer trip")
	sinkB.Apply(bulwark.FleetUpdate{Kind: bulwark.FleetBreakerClosed, Host: "api.test:80", From: "pod-c", Generation: 1, Until: time.Now().Add(5 * time.Second)})
	if code, err := seamSend(t, b, "GET", "http://api.test/x"); code != 200 || ok.sent() != 1 {
		t.Fatalf("pod B after pod C's close: %d, %v, %d sent; want its hold ended and the call sent", code, err, ok.sent())
	}
}

// seamLeaser is a seamFleet that leases quota, granting what is asked.
type seamLeaser struct{ seamFleet }

func (*seamLeaser) Lease(_ context.Context, r bulwark.LeaseRequest) (bulwark.LeaseGrant, error) {
	return bulwark.LeaseGrant{Tokens: r.Want, Pods: 1}, nil
}

// Bulkhead.FleetRate needs a Fleet that leases quota, and which one is
// the running Transport's: Update accepts it on a Transport whose Fleet
// leases, though the Config passed names no Fleet (New's, which Update
// ignores), and refuses it, changing nothing, on one without. Validate
// checks a Config as New would, against the Config's own Fleet.
func seamFleetRateUpdate(t *testing.T) {
	base := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) { return seamAnswer(req, 0, 200) }}
	rated := bulwark.Config{Base: base, Upstreams: map[string]bulwark.Policy{"api.test": {Bulkhead: bulwark.Bulkhead{FleetRate: 100}}}}
	if err := rated.Validate(); !errors.Is(err, bulwark.ErrInvalidConfig) || !strings.Contains(err.Error(), "FleetLeaser") {
		t.Fatalf("Validate of a FleetRate with no Fleet = %v, want New's refusal", err)
	}
	hub := &seamHub{sinks: map[*seamFleet]*bulwark.FleetSink{}}
	withFleet := rated
	withFleet.Fleet = &seamLeaser{seamFleet{hub: hub}}
	if err := withFleet.Validate(); err != nil {
		t.Fatalf("Validate of a FleetRate with a leasing Fleet = %v", err)
	}

	leasing := seamNew(t, bulwark.Config{Base: base, Fleet: &seamLeaser{seamFleet{hub: hub}}})
	plain := seamNew(t, bulwark.Config{Base: base, Version: "v1"})
	synctest.Wait()
	rated.Version = "rated"
	if err := leasing.Update(rated); err != nil {
		t.Fatalf("Update(FleetRate) on a Transport whose Fleet leases = %v", err)
	}
	if code, err := seamSend(t, leasing, "GET", "http://api.test/"); code != 200 {
		t.Fatalf("a call under the leased quota: %d, %v", code, err)
	}
	err := plain.Update(rated)
	if !errors.Is(err, bulwark.ErrInvalidConfig) || !strings.Contains(err.Error(), "FleetLeaser") {
		t.Fatalf("Update(FleetRate) on a Transport with no Fleet = %v, want a ConfigError", err)
	}
	if c := plain.Snapshot().Config; c.Version != "v1" || c.Rejected == nil || c.Rejected.Version != "rated" {
		t.Fatalf("Snapshot().Config after the refused Update = %+v, want v1 in force and rated refused", c)
	}
	if code, err := seamSend(t, plain, "GET", "http://api.test/"); code != 200 {
		t.Fatalf("a call after the refused Update: %d, %v", code, err)
	}
}

// A breaker whose slow-call threshold is learned trips on a rate only once
// it has held for the hold, the learned third-attempt timeout capped at
// the attempt timeout's ceiling, when it needs bulwark's own timeouts (or
// slow calls) to be met; the rate is judged after every call, the
// successes too. A host answering in 1 s has a learned hold of 12 s,
// capped at 10 s: hanging on every other call (each times out at the
// learned attempt timeout, 3 s; its successes still take 1 s), it is
// refused within a call (3 s) of 10 s after its window first held half
// failures. An Update that sets Timeout.Attempt to 4 s while the
// rate holds caps the hold at 4 s and keeps the time it has held: refused
// within a call of 4 s after the breach began, not 4 s after the Update.
func seamBreakerHoldUpdate(t *testing.T) {
	for _, update := range []bool{false, true} {
		var sick atomic.Bool
		base := &seamBase{answer: func(n int, req *http.Request) (*http.Response, error) {
			if sick.Load() && n%2 == 0 {
				return seamAnswer(req, time.Minute, 200) // times out: a hung call
			}
			return seamAnswer(req, time.Second, 200)
		}}
		cfg := bulwark.Config{Base: base, Default: bulwark.Policy{Retry: bulwark.Retry{Disabled: true}}}
		tr := seamNew(t, cfg)
		seamLearn(t, tr, "http://api.test/x", 300)
		if l := seamHost(t, tr, "api.test:80").Learned; l.SlowCallFrom != bulwark.FromLearned {
			t.Fatalf("after 300 healthy calls: %+v, want the slow-call threshold learned", l)
		}
		sick.Store(true)
		var dueAt, updatedAt time.Time
		want := 10 * time.Second
		for i := range 1000 {
			_, err := seamSend(t, tr, "GET", "http://api.test/x")
			if errors.Is(err, bulwark.ErrBreakerOpen) {
				if dueAt.IsZero() {
					t.Fatalf("update %v: refused at call %d before the window held half failures", update, i+1)
				}
				held := time.Since(dueAt)
				t.Logf("update %v: refused %v after the rate was first met", update, held)
				if held < want || held > want+3100*time.Millisecond {
					t.Errorf("update %v: refused %v after the rate was first met, want %v to %v", update, held, want, want+3100*time.Millisecond)
				}
				break
			}
			b := seamHost(t, tr, "api.test:80").Breaker
			if dueAt.IsZero() && b.Calls >= 100 && 2*b.Failures >= b.Calls {
				dueAt = time.Now()
			}
			if update && updatedAt.IsZero() && !dueAt.IsZero() && time.Since(dueAt) >= 2*time.Second {
				set := cfg
				set.Default.Timeout.Attempt = 4 * time.Second
				if err := tr.Update(set); err != nil {
					t.Fatal(err)
				}
				updatedAt, want = time.Now(), 4*time.Second
			}
			time.Sleep(50 * time.Millisecond)
			if i == 999 {
				t.Fatalf("update %v: never refused in 1,000 calls", update)
			}
		}
	}
}

// stubbornAnswer is a 200 after d, whatever req's context does: a base
// that ignores its context.
func stubbornAnswer(req *http.Request, d time.Duration) (*http.Response, error) {
	time.Sleep(d)
	return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("late")), Request: req}, nil
}

// stubbornFirst is a base whose first attempt ignores its context for 2 s
// before its 200; every other attempt is answered 200 at once.
func stubbornFirst() *seamBase {
	return &seamBase{answer: func(n int, req *http.Request) (*http.Response, error) {
		if n == 1 {
			return stubbornAnswer(req, 2*time.Second)
		}
		return seamAnswer(req, 0, 200)
	}}
}

// seamInFlight is the slots host's bulkhead holds.
func seamInFlight(t *testing.T, tr *bulwark.Transport, host string) int {
	t.Helper()
	return seamHost(t, tr, host).Bulkhead.InFlight
}

// An attempt abandoned at its deadline (Config.BaseIgnoresContext) keeps
// its bulkhead slot until its base returns: a host that ignores its
// deadlines holds no more than MaxConcurrent requests however many calls
// come back at their deadline, and the slot is free once it answers.
func seamAbandonBulkhead(t *testing.T) {
	base := stubbornFirst()
	tr := seamNew(t, bulwark.Config{Base: base, BaseIgnoresContext: true, Default: bulwark.Policy{
		Timeout:  bulwark.Timeout{Attempt: 100 * time.Millisecond},
		Bulkhead: bulwark.Bulkhead{MaxConcurrent: 1},
		Retry:    bulwark.Retry{Disabled: true}}})
	start := time.Now()
	if _, err := seamSend(t, tr, "GET", "http://api.test/"); !errors.Is(err, bulwark.ErrAttemptTimeout) || time.Since(start) != 100*time.Millisecond {
		t.Fatalf("stubborn attempt: %v after %v; want ErrAttemptTimeout after 100ms", err, time.Since(start))
	}
	if _, err := seamSend(t, tr, "GET", "http://api.test/"); !errors.Is(err, bulwark.ErrBulkheadFull) || base.sent() != 1 {
		t.Fatalf("a call while the abandoned attempt runs: %v after %d sends; want ErrBulkheadFull after 1", err, base.sent())
	}
	time.Sleep(2 * time.Second)
	synctest.Wait()
	if code, err := seamSend(t, tr, "GET", "http://api.test/"); code != 200 || base.sent() != 2 {
		t.Fatalf("once the base returned: %d, %v after %d sends; want 200 after 2", code, err, base.sent())
	}
	if hs := seamHost(t, tr, "api.test:80"); hs.AbandonedAttempts != 1 || hs.Bulkhead.InFlight != 0 {
		t.Fatalf("%d abandoned, %d slots held; want 1, 0", hs.AbandonedAttempts, hs.Bulkhead.InFlight)
	}
}

// The retry after an abandoned attempt leaves at once after its backoff,
// with a body of its own (GetBody), while the abandoned one still runs:
// the call succeeds at 100 ms of attempt and 100 ms of wait, and each
// body is read once and closed once.
func seamAbandonRetry(t *testing.T) {
	base := stubbornFirst()
	tr := seamNew(t, bulwark.Config{Base: base, BaseIgnoresContext: true, Default: bulwark.Policy{
		Timeout: bulwark.Timeout{Total: time.Second, Attempt: 100 * time.Millisecond},
		Retry:   bulwark.Retry{Base: 100 * time.Millisecond, Jitter: bulwark.JitterNone}}})
	var closes [2]atomic.Int32
	var made atomic.Int32
	body := func() io.ReadCloser {
		i := made.Add(1) - 1
		return &seamCountedBody{Reader: strings.NewReader("order"), n: &closes[min(i, 1)]}
	}
	req, _ := http.NewRequestWithContext(t.Context(), "PUT", "http://api.test/", nil)
	req.Body = body()
	req.GetBody = func() (io.ReadCloser, error) { return body(), nil }
	start := time.Now()
	resp, err := tr.RoundTrip(req)
	if err != nil || resp.StatusCode != 200 || base.sent() != 2 || time.Since(start) != 200*time.Millisecond {
		t.Fatalf("%v, %v after %d sends and %v; want the retry's 200 after 2 sends and 200ms", resp, err, base.sent(), time.Since(start))
	}
	resp.Body.Close()
	if hs := seamHost(t, tr, "api.test:80"); hs.AbandonedAttempts != 1 || hs.Bulkhead.InFlight != 1 {
		t.Fatalf("%d abandoned, %d slots held; want 1, 1 (the abandoned attempt's)", hs.AbandonedAttempts, hs.Bulkhead.InFlight)
	}
	time.Sleep(2 * time.Second)
	synctest.Wait()
	if made.Load() != 2 || closes[0].Load() != 1 || closes[1].Load() != 1 || seamInFlight(t, tr, "api.test:80") != 0 {
		t.Fatalf("%d bodies, closed %d and %d times, %d slots held; want 2 bodies closed once each, 0 slots",
			made.Load(), closes[0].Load(), closes[1].Load(), seamInFlight(t, tr, "api.test:80"))
	}
}

type seamCountedBody struct {
	io.Reader
	n *atomic.Int32
}

func (b *seamCountedBody) Close() error { b.n.Add(1); return nil }

// A hedge that wins over a stubborn first attempt answers the call at
// once; the loser, cancelled, is abandoned (its base ignores the cancel)
// and holds its slot until its base returns.
func seamAbandonHedge(t *testing.T) {
	base := &seamBase{answer: func(n int, req *http.Request) (*http.Response, error) {
		if req.Header.Get(bulwark.AttemptHeader) == "1" {
			return stubbornAnswer(req, 2*time.Second)
		}
		return seamAnswer(req, 5*time.Millisecond, 200)
	}}
	tr := seamNew(t, bulwark.Config{Base: base, BaseIgnoresContext: true, Default: bulwark.Policy{
		Hedge: bulwark.Hedge{Delay: 50 * time.Millisecond}}})
	start := time.Now()
	if code, err := seamSend(t, tr, "GET", "http://api.test/"); code != 200 || base.sent() != 2 || time.Since(start) != 55*time.Millisecond {
		t.Fatalf("%d, %v after %d sends and %v; want the hedge's 200 after 2 sends and 55ms", code, err, base.sent(), time.Since(start))
	}
	synctest.Wait()
	if hs := seamHost(t, tr, "api.test:80"); hs.AbandonedAttempts != 1 || hs.Bulkhead.InFlight != 1 {
		t.Fatalf("%d abandoned, %d slots held; want the loser abandoned, its slot held", hs.AbandonedAttempts, hs.Bulkhead.InFlight)
	}
	time.Sleep(2 * time.Second)
	synctest.Wait()
	if n := seamInFlight(t, tr, "api.test:80"); n != 0 {
		t.Fatalf("%d slots held once the loser's base returned, want 0", n)
	}
}

// A pod whose own network is broken (every dial refused while the other
// pods' counts show the host answering them, or every name unresolved)
// protects itself, its own breaker tripping as ever, but tells the fleet
// nothing: no trip is published, its failures are not in the counts it
// shares, and a pod that never called the host still calls it.
func seamFleetOwnNetwork(t *testing.T) {
	for _, broken := range []error{
		&net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)},
		&net.DNSError{Err: "no such host", Name: "api.test", IsNotFound: true},
	} {
		hub := &seamHub{sinks: map[*seamFleet]*bulwark.FleetSink{}}
		sick := &seamBase{answer: func(int, *http.Request) (*http.Response, error) { return nil, broken }}
		ok := func() *seamBase {
			return &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) { return seamAnswer(req, 0, 200) }}
		}
		policy := bulwark.Policy{Retry: bulwark.Retry{Disabled: true}, Breaker: seamBreaker}
		a := seamNew(t, bulwark.Config{Base: sick, Fleet: &seamFleet{hub: hub}, Default: policy})
		okB, okC := ok(), ok()
		b := seamNew(t, bulwark.Config{Base: okB, Fleet: &seamFleet{hub: hub}, Default: policy})
		c := seamNew(t, bulwark.Config{Base: okC, Fleet: &seamFleet{hub: hub}, Default: policy})
		synctest.Wait() // every pod receiving
		if code, err := seamSend(t, b, "GET", "http://api.test/x"); code != 200 {
			t.Fatalf("pod B: %d, %v", code, err)
		}
		// A fails: its first failure's counts reach B, which answers with
		// its own (the host answers B); then A's next failures are A's own.
		for i := 0; i < 20; i++ {
			_, err := seamSend(t, a, "GET", "http://api.test/x")
			synctest.Wait()
			if errors.Is(err, bulwark.ErrBreakerOpen) {
				break
			}
		}
		if s := seamHost(t, a, "api.test:80").Breaker.State; s != bulwark.CircuitOpen {
			t.Fatalf("%T: pod A %v, want its own breaker open", broken, s)
		}
		// Its probes fail too: it trips again, as its own again.
		for range 3 {
			time.Sleep(2 * time.Second)
			_, _ = seamSend(t, b, "GET", "http://api.test/x")
			_, _ = seamSend(t, a, "GET", "http://api.test/x")
			synctest.Wait()
		}
		if h := seamHost(t, a, "api.test:80").Breaker; h.TotalTrips < 2 {
			t.Fatalf("%T: pod A tripped %d times, want its probes to have tripped it again", broken, h.TotalTrips)
		}
		if n := hub.opens.Load(); n != 0 {
			t.Errorf("%T: %d trips published, want none: the failures were pod A's own", broken, n)
		}
		// C never called the host: nothing holds it back.
		if code, err := seamSend(t, c, "GET", "http://api.test/x"); code != 200 || okC.sent() != 1 {
			t.Errorf("%T: pod C's first call: %d, %v; want it sent and answered", broken, code, err)
		}
		hb := seamHost(t, b, "api.test:80").Breaker
		if code, err := seamSend(t, b, "GET", "http://api.test/x"); code != 200 || hb.FleetFailures > 1 {
			t.Errorf("%T: pod B: %d, %v, with %d of A's failures counted; want answered, at most A's first failure counted",
				broken, code, err, hb.FleetFailures)
		}
	}
}

// A pod weighs what the fleet says against its own latest call: one that
// succeeded declines another pod's trip, and outweighs the fleet's counts,
// so the pod goes on calling; once a call of its own fails (the host is
// down for it too), it adopts the trip (or trips on the counts) at once,
// so a host down for everyone costs each pod at most one call more than
// an obeyed verdict did.
func seamFleetWeighed(t *testing.T) {
	hub := &seamHub{sinks: map[*seamFleet]*bulwark.FleetSink{}}
	var down atomic.Bool
	sick := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) { return seamAnswer(req, 0, 503) }}
	okB := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) {
		if down.Load() {
			return seamAnswer(req, 0, 503)
		}
		return seamAnswer(req, 0, 200)
	}}
	policy := bulwark.Policy{Retry: bulwark.Retry{Disabled: true}, Breaker: seamBreaker}
	a := seamNew(t, bulwark.Config{Base: sick, Fleet: &seamFleet{hub: hub}, Default: policy})
	b := seamNew(t, bulwark.Config{Base: okB, Fleet: &seamFleet{hub: hub}, Default: policy})
	synctest.Wait()
	// Six answered calls: with A's five failures added, its window stays
	// under the failure rate, so only A's trip could stop it.
	for range 6 {
		if code, _ := seamSend(t, b, "GET", "http://api.test/x"); code != 200 {
			t.Fatalf("pod B's first calls: %d", code)
		}
	}
	// A's failures trip it (B's answered counts, which B shares in answer,
	// count in A's sums too).
	for range 20 {
		_, err := seamSend(t, a, "GET", "http://api.test/x")
		synctest.Wait()
		if errors.Is(err, bulwark.ErrBreakerOpen) {
			break
		}
	}
	if hub.opens.Load() != 1 {
		t.Fatalf("%d trips published, want pod A's", hub.opens.Load())
	}
	for i := range 3 {
		time.Sleep(100 * time.Millisecond)
		if code, err := seamSend(t, b, "GET", "http://api.test/x"); code != 200 {
			t.Fatalf("pod B's call %d after A's trip: %d, %v; want its own success to outweigh A's trip", i, code, err)
		}
	}
	if fs := b.Snapshot().Fleet; fs.Declined != 1 {
		t.Errorf("pod B's fleet %+v, want A's trip declined once", fs)
	}
	down.Store(true)
	sent := okB.sent()
	if code, _ := seamSend(t, b, "GET", "http://api.test/x"); code != 503 {
		t.Fatalf("pod B's call with the host down: %d, want 503", code)
	}
	if _, err := seamSend(t, b, "GET", "http://api.test/x"); !errors.Is(err, bulwark.ErrBreakerOpen) || okB.sent() != sent+1 {
		t.Fatalf("pod B after its own failure: %v, %d sent; want A's trip adopted after one call", err, okB.sent()-sent)
	}
}

// A caller that cancels its context after the headers and never closes
// the body gives its bulkhead slot back on the cancel: with two slots and
// no queue, three such calls in a row leave both free, and the next call
// is sent; its body's Close later gives back nothing twice.
func seamCancelOpenBody(t *testing.T) {
	base := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) {
		return seamAnswer(req, time.Millisecond, 200)
	}}
	tr := seamNew(t, bulwark.Config{Base: base, Default: bulwark.Policy{Bulkhead: bulwark.Bulkhead{MaxConcurrent: 2}}})
	var open []*http.Response
	for i := range 3 {
		ctx, cancel := context.WithCancel(t.Context())
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://api.test/", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("call %d after cancelled calls with open bodies: %v", i, err)
		}
		cancel()
		synctest.Wait()
		open = append(open, resp)
	}
	if b := seamHost(t, tr, "api.test:80").Bulkhead; b == nil || b.InFlight != 0 {
		t.Fatalf("after three cancelled calls with open bodies: bulkhead %+v, want none in flight", b)
	}
	for _, resp := range open {
		resp.Body.Close()
	}
	if b := seamHost(t, tr, "api.test:80").Bulkhead; b.InFlight != 0 {
		t.Fatalf("after their bodies closed: %d in flight, want 0", b.InFlight)
	}
}

// seamFleetPauseWeighed: another pod's pause is weighed as its trip is,
// priority by priority. Pod A's proxy answers 503 with a Retry-After (and
// a Shedder's refusal of low-priority requests); pod B, whose own calls
// of the default priority are answered, declines the host's pause, but
// adopts the Shedder's pause of the low priority (its answers say nothing
// of room for those), which its default-priority answers do not end.
func seamFleetPauseWeighed(t *testing.T) {
	hub := &seamHub{sinks: map[*seamFleet]*bulwark.FleetSink{}}
	var shed atomic.Bool
	sick := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) {
		if shed.Load() {
			return seamAnswer(req, 0, 503, "Retry-After", "30", bulwark.ShedPriorityHeader, "low")
		}
		return seamAnswer(req, 0, 503, "Retry-After", "30")
	}}
	okB := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) { return seamAnswer(req, 0, 200) }}
	policy := bulwark.Policy{Retry: bulwark.Retry{Disabled: true}, Breaker: seamBreaker}
	a := seamNew(t, bulwark.Config{Base: sick, Fleet: &seamFleet{hub: hub}, Default: policy})
	b := seamNew(t, bulwark.Config{Base: okB, Fleet: &seamFleet{hub: hub}, Default: policy})
	synctest.Wait()
	if code, _ := seamSend(t, b, "GET", "http://api.test/x"); code != 200 {
		t.Fatalf("pod B's first call: %d", code)
	}
	if code, _ := seamSend(t, a, "GET", "http://api.test/x"); code != 503 {
		t.Fatalf("pod A's call: %d, want its proxy's 503", code)
	}
	synctest.Wait()
	for i := range 3 {
		if code, err := seamSend(t, b, "GET", "http://api.test/x"); code != 200 {
			t.Fatalf("pod B's call %d after A's pause: %d, %v; want its own answers to outweigh it", i, code, err)
		}
	}
	if p := b.Snapshot().Host("api.test:80")[0].Pushback; p.Until.After(time.Now()) {
		t.Fatalf("pod B paused until %v, want A's pause declined", p.Until)
	}
	shed.Store(true)
	if code, _ := seamSend(t, a, "GET", "http://shed.test/x"); code != 503 {
		t.Fatalf("pod A's call: %d, want the Shedder's 503", code)
	}
	_, _ = seamSend(t, b, "GET", "http://shed.test/x") // default priority, answered
	synctest.Wait()
	shed.Store(false)
	if code, _ := seamSend(t, a, "GET", "http://shed.test/x"); code != 503 {
		t.Fatal("pod A's second call not answered 503")
	}
	synctest.Wait()
	req, _ := http.NewRequestWithContext(bulwark.WithPriority(t.Context(), bulwark.PriorityLow), "GET", "http://shed.test/x", nil)
	if _, err := b.RoundTrip(req); !errors.Is(err, bulwark.ErrPushback) {
		t.Fatalf("pod B's low-priority call: %v, want the Shedder's pause adopted", err)
	}
	if code, _ := seamSend(t, b, "GET", "http://shed.test/x"); code != 200 {
		t.Fatalf("pod B's default-priority call: %d, want it sent", code)
	}
	if _, err := b.RoundTrip(req.Clone(req.Context())); !errors.Is(err, bulwark.ErrPushback) {
		t.Fatalf("pod B's low-priority call after a default-priority answer: %v, want the pause to stand", err)
	}
}

// Another pod's failure counts add to a pod's window only after an
// outcome of its own that failed: a pod whose own calls succeed is not
// tripped by the fleet's counts, as it declines a trip. With peers
// reporting 100 failed calls, pod B's own 200s are all sent; its first
// own failure then meets the rate with the peers' counts, and it trips.
func seamFleetCountsOwnSuccess(t *testing.T) {
	hub := &seamHub{sinks: map[*seamFleet]*bulwark.FleetSink{}}
	var down atomic.Bool
	base := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) {
		if down.Load() {
			return seamAnswer(req, 0, 503)
		}
		return seamAnswer(req, 0, 200)
	}}
	fb := &seamFleet{hub: hub}
	b := seamNew(t, bulwark.Config{Base: base, Fleet: fb, Default: bulwark.Policy{Retry: bulwark.Retry{Disabled: true}, Breaker: seamBreaker}})
	synctest.Wait()
	if code, err := seamSend(t, b, "GET", "http://api.test/x"); code != 200 {
		t.Fatalf("pod B's first call: %d, %v", code, err)
	}
	sink := hub.sinks[fb]
	for i := range 20 {
		sink.Apply(bulwark.FleetUpdate{Kind: bulwark.FleetBreakerCounts, Host: "api.test:80", From: "pod-x",
			Until: time.Now().Add(10 * time.Second), Calls: 100, Failures: 100})
		if code, err := seamSend(t, b, "GET", "http://api.test/x"); code != 200 {
			t.Fatalf("pod B's own call %d beside the peers' failures: %d, %v; want it sent and answered", i, code, err)
		}
	}
	down.Store(true)
	if code, _ := seamSend(t, b, "GET", "http://api.test/x"); code != 503 {
		t.Fatalf("pod B's call with the host down: %d, want 503", code)
	}
	if _, err := seamSend(t, b, "GET", "http://api.test/x"); !errors.Is(err, bulwark.ErrBreakerOpen) {
		t.Fatalf("pod B after its own failure beside the peers' failures: %v, want ErrBreakerOpen", err)
	}
}
