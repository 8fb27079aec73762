package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bulwark-http/bulwark"
	"google.golang.org/grpc"
)

// The Tuesday of Michael Nygard's Release It! (2nd ed.), scaled: a
// checkout service with a fixed pool of workers (200 threads, here 200/5) serves POST /checkout,
// which calls a tax service, and GET /orders/{id}, which touches nothing
// but itself. The tax service goes from 40 ms to 10 s for a while, then
// heals.
const (
	refPoolThreads = 200
	poolDivisor    = 5 // lab workers = the 200 threads / poolDivisor
	refTaxBulkhead = 40
	refTaxHealthy  = 40 * time.Millisecond
	refTaxSick     = 10 * time.Second
	refOrderTime   = 3 * time.Millisecond
	refTaxTimeout  = 150 * time.Millisecond // near the healthy p99.9 of 40 ms calls
	refPatience    = 5 * time.Second        // how long a user waits
)

// The breaker's open time, in unscaled time: resilience4j's
// 60 s would outlast the whole scaled run; 4 s probes the sick service a
// few times and lets traffic back within a second of lab time of the heal.
const refBreakerOpenFor = 4 * time.Second

// Breaker window sizing. resilience4j counts its window in calls (100 by
// default), bulwark in time; the lab's window is the time the offered load
// takes to make breakerWindowCalls tax calls, so it holds enough calls for
// MinCalls whatever -load and -scale say (a window that cannot hold
// MinCalls calls never trips), and short enough that the breaker trips
// early in the sickness.
const (
	breakerWindowCalls = 50
	breakerMinCalls    = 20
)

// breakerWindow is the breaker's window at s's load (half the offered
// requests are checkouts, each one tax call).
func breakerWindow(s settings) time.Duration {
	return max(time.Duration(breakerWindowCalls/(s.load/2)*float64(time.Second)), 100*time.Millisecond).Round(time.Millisecond)
}

// tunedTaxClient is the transport the checkout service calls tax with in
// the "bulwark tuned" run: the policy an expert sets by hand, beside the
// package defaults of the "bulwark" run (protectedTaxClient). lastGood
// returns the last tax rate a call returned ("" for none yet), which the
// fallback answers with.
//
// Layers for the tax call, Release It!'s remedies for a slow dependency:
//   - Timeout: the attempt timeout near the healthy p99.9 (a capacity
//     decision), the call bounded at twice that.
//   - Breaker with slow-call detection: slow is worse than down (Release
//     It!), so a call that takes half the attempt timeout already counts as
//     slow, and half the window being slow (or failed) trips it. MinCalls
//     keeps a quiet moment from tripping it; the window is sized in calls
//     and the open time scaled (above).
//     HalfOpenCalls is 5 rather than resilience4j's 10: at the lab's load ten
//     probes would be most of a second's tax traffic.
//   - Bulkhead: 40 of the 200 threads, scaled with the pool: 8 of the
//     lab's 40 workers (40 of 40 would isolate nothing). No queue: a full
//     bulkhead refuses at once and the fallback answers.
//   - Fallback: the tax call is a POST, which the stale cache never stores
//     or serves, so a Fallback.Func answers from the last good rate held in
//     memory: no network call, for a fallback that calls out can fail, or
//     hang, the same way as the call it stands in for.
//   - Retry: off. The call is a POST without an idempotency key, which is
//     not safe to retry: the service may have acted on the first one
//     (bulwark would not replay it anyway). And a retry of a call that
//     timed out because the service is slow only adds load to the sick
//     service and holds a worker longer; the breaker and the fallback are
//     the answer to slowness, not another try.
func tunedTaxClient(base http.RoundTripper, taxHost string, attempt time.Duration, bulkhead int, s settings, lastGood func() string) (*bulwark.Transport, error) {
	return bulwark.New(bulwark.Config{
		Base: base,
		Upstreams: map[string]bulwark.Policy{
			taxHost: {
				Timeout: bulwark.Timeout{Attempt: attempt, Total: 2 * attempt},
				Breaker: bulwark.Breaker{
					SlowCall:      attempt / 2,
					SlowCallRate:  0.5,
					FailureRate:   0.5,
					MinCalls:      breakerMinCalls,
					Window:        breakerWindow(s),
					OpenFor:       s.ref(refBreakerOpenFor),
					HalfOpenCalls: 5,
				},
				Bulkhead: bulwark.Bulkhead{MaxConcurrent: bulkhead},
				Fallback: bulwark.Fallback{Func: lastRateFallback(lastGood)},
				Retry:    bulwark.Retry{Disabled: true},
			},
		},
	})
}

// protectedTaxClient is the transport the checkout service calls tax with
// in the "bulwark" run: bulwark's package defaults, nothing that tunes
// resilience set. Its attempt timeout and slow-call threshold are learned
// from the tax host's own healthy latency, its bulkhead is the soft
// adaptive default, and a POST without an idempotency key is never
// retried. Only the fallback is set: no default can know what to answer a
// failed tax call with (here the last good rate, as in tunedTaxClient),
// and the scenario's verdict counts the checkouts it answered.
func protectedTaxClient(base http.RoundTripper, lastGood func() string) (*bulwark.Transport, error) {
	return bulwark.New(bulwark.Config{
		Base:    base,
		Default: bulwark.Policy{Fallback: bulwark.Fallback{Func: lastRateFallback(lastGood)}},
	})
}

// lastRateFallback answers a failed tax call with the last good rate, from
// memory. Before any call has succeeded it declines, and the caller gets
// the original error.
func lastRateFallback(lastGood func() string) func(*http.Request, error) (*http.Response, error) {
	return func(req *http.Request, _ error) (*http.Response, error) {
		rate := lastGood()
		if rate == "" || req.URL.Path != "/rate" {
			return nil, nil
		}
		return &http.Response{
			Status: "200 OK", StatusCode: http.StatusOK,
			Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
			Header:        http.Header{"Content-Type": {"text/plain"}},
			Body:          io.NopCloser(strings.NewReader(rate)),
			ContentLength: int64(len(rate)),
			Request:       req,
		}, nil
	}
}

// tuesdaySpec is the scenario's entry in the registry.
var tuesdaySpec = spec{
	key:   "tuesday",
	title: "1. A slow dependency: tax gets slow, checkout's shared worker pool drains",
	blurb: "the tax service turns slow (40 ms -> 10 s) and drains checkout's 40-worker pool; GET /orders fails with it unless the tax call is bounded (bulwark with zero config, and tuned by hand)",
	run:   (*lab).tuesday,
	verdict: func(sc *scenario) string {
		p, b, t := sc.runs[0].metrics, sc.runs[1].metrics, sc.runs[2].metrics
		return fmt.Sprintf("while tax was slow, bulwark with zero config (only a fallback set) kept GET /orders at %s ok (plain client: %s; bulwark tuned by hand: %s) and POST /checkout at %s ok (plain: %s), and let %.0f calls reach the sick tax service (plain: %.0f; tuned: %.0f), but %s of those checkouts were answered by its fallback: %.0f checkouts in the run were charged the last good tax rate, a stale one.",
			pctSp(b["orders_sick"]), pctSp(p["orders_sick"]), pctSp(t["orders_sick"]), pctSp(b["checkout_sick"]), pctSp(p["checkout_sick"]),
			b["tax_sick"], p["tax_sick"], t["tax_sick"], pctSp(b["fallback_sick"]), b["fallback"])
	},
}

// pctSp formats a share as "7.7 %", for sentences.
func pctSp(f float64) string { return fmt.Sprintf("%.1f %%", 100*f) }

type tuesdayRun struct {
	protected bool
	tuned     bool // protected with the hand-tuned policy, not the package defaults
	tl        *timeline
	sickAt    time.Time
	healAt    time.Time
	workers   chan struct{}
	queued    atomic.Int64
	maxQueue  int64
	taxSick   atomic.Int64 // tax requests received while sick
	stale     atomic.Int64 // checkouts bulwark's fallback answered
	taxHeld   atomic.Int64 // checkout workers inside a tax call, now
	maxHeld   atomic.Int64 // the most at once
	lastRate  atomic.Value // string: the last good tax rate
	taxClient *http.Client
	bulwark   *bulwark.Transport // the tax client's transport; nil for plain
	taxHost   string             // host:port of this run's tax service
	// overGRPC: checkout calls tax over gRPC (tuesday_grpc.go), through
	// taxConn, with bulwark's client interceptor when protected.
	overGRPC bool
	taxConn  *grpc.ClientConn
	// learned is what bulwark had learned of tax when it turned sick (the
	// first breaker sample in the sick period); nil for plain.
	learned *bulwark.LearnedSnapshot
}

// learnedNote says what the zero-config client had learned of tax when it
// turned sick.
func (r *tuesdayRun) learnedNote() string {
	l := r.learned
	if l == nil {
		return "(nothing learned of tax was in its snapshot when it turned sick)"
	}
	note := fmt.Sprintf("when tax turned sick: healthy p50 %v, p99.9 %v (%d samples) → attempt timeout %v (%s), slow call ≥ %v (%s).",
		l.HealthyP50.Round(100*time.Microsecond), l.HealthyP999.Round(100*time.Microsecond), l.Samples,
		l.AttemptTimeout.Round(100*time.Microsecond), l.AttemptFrom, l.SlowCall.Round(100*time.Microsecond), l.SlowCallFrom)
	if l.AttemptFrom == bulwark.FromColdStart {
		// bulwark learns from 200 healthy attempts; the run's healthy
		// first 15 % made fewer tax calls than that.
		note += " Too few healthy tax calls before it turned sick to learn from: the static bounds, which a sick call never reaches. A longer -duration or a higher -load gives bulwark the calls to learn from."
	}
	return note
}

// sick reports whether the tax service is slow at instant t.
func (r *tuesdayRun) sick(t time.Time) bool { return !t.Before(r.sickAt) && t.Before(r.healAt) }

func (l *lab) tuesday(ctx context.Context) (*scenario, error) { return l.tuesdayOver(ctx, false) }

// tuesdayOver runs the scenario with checkout calling tax over HTTP, or
// over gRPC (without the hand-tuned run: its fallback and policy are the
// HTTP run's).
func (l *lab) tuesdayOver(ctx context.Context, overGRPC bool) (*scenario, error) {
	s := l.set
	length := s.runLen(9 * time.Second)
	sickFrom, sickTo := length*15/100, length*50/100
	workers := refPoolThreads / poolDivisor
	patience := s.ref(refPatience)
	sc := &scenario{
		length: length,
		headings: map[string]string{
			"tax recv":    "Requests the tax service received (req/s)",
			"checkout ok": "POST /checkout answered ok (and, apart, bulwark's answers from the fallback: a stale tax rate)",
			"orders ok":   "GET /orders answered ok (and bulwark's breaker: share of time open)",
			"orders p99":  "GET /orders, 99th percentile latency (ms)",
		},
		marks: []mark{{sickFrom, sickTo, fmt.Sprintf("tax %v → %v", s.ref(refTaxHealthy), s.ref(refTaxSick))}},
		intro: []string{
			"the outage of a slow dependency told in Michael Nygard's Release It! (2nd ed.): slow is worse than down, because a slow service holds its callers' threads",
			fmt.Sprintf("checkout: %d workers (%d threads ÷ %d), %.0f req/s offered, half POST /checkout (calls tax), half GET /orders/{id} (local, %v)",
				workers, refPoolThreads, poolDivisor, s.load, max(s.ref(refOrderTime), 500*time.Microsecond)),
			fmt.Sprintf("tax answers in %v, then %v from %.1fs to %.1fs; users give up after %v; the runs side by side, each with its own servers",
				s.ref(refTaxHealthy), s.ref(refTaxSick), sickFrom.Seconds(), sickTo.Seconds(), patience),
		},
	}

	runs := []*tuesdayRun{{protected: false}, {protected: true}, {protected: true, tuned: true}}
	var attempt time.Duration
	if overGRPC {
		runs = []*tuesdayRun{{overGRPC: true}, {overGRPC: true, protected: true}}
		sc.intro = append(sc.intro, grpcIntro)
	} else {
		// Calibrate on a healthy tax service: the tuned attempt timeout comes from its
		// measured p99.9, never below 150 ms (scaled).
		p999, err := l.taxP999(ctx)
		if err != nil {
			return nil, err
		}
		// Rounded up: a timeout below the measured p99.9 would cut healthy calls.
		attempt = roundUp(max(s.ref(refTaxTimeout), p999), time.Millisecond)
		sc.intro = append(sc.intro, fmt.Sprintf("healthy tax p99.9 measured %v → tuned bulwark's attempt timeout %v (the larger of it and 150 ms scaled, rounded up); the zero-config bulwark learns its own", roundUp(p999, 100*time.Microsecond), attempt))
	}

	start := time.Now().Add(50 * time.Millisecond)
	for _, r := range runs {
		r.tl = newTimeline(start, 100*time.Millisecond, length+patience+time.Second)
		r.sickAt, r.healAt = start.Add(sickFrom), start.Add(sickTo)
		r.workers = make(chan struct{}, workers)
		r.maxQueue = int64(25 * workers) // a server's accept queue holds thousands
		r.lastRate.Store("")
		r.tl.define("offered", kindLoad, false, false)
		r.tl.define("tax recv", kindLoad, true, true)
		r.tl.define("checkout ok", kindRate, true, true)
		// The share of checkouts answered ok from bulwark's fallback (the
		// last good tax rate): counted in "checkout ok" too, and drawn
		// apart from it so an ok at a stale rate does not pass for a real
		// one. The plain client has no fallback; its row stays empty.
		r.tl.define("checkout fallback", kindRate, false, true)
		r.tl.define("orders ok", kindRate, true, true)
		r.tl.define("orders p99", kindP99, true, false)
		// The share of the time bulwark's breaker for tax was open, sampled
		// every few ms. Defined for every run so the sparkline rows line up;
		// the plain client has no breaker, so its row stays empty.
		r.tl.define("breaker open", kindRate, r.protected, true)
	}

	what := "tuesday: plain, bulwark and bulwark tuned side by side"
	if overGRPC {
		what = "tuesday over gRPC: plain channel and bulwark side by side"
	}
	if err := l.sideBySide(what, length+patience, len(runs), func(i int) error {
		return l.tuesdayRun(ctx, runs[i], start, length, patience, attempt, workers)
	}); err != nil {
		return nil, err
	}

	sickB, healB, endB := runs[0].tl.at(sickFrom), runs[0].tl.at(sickTo), runs[0].tl.at(length)
	for _, r := range runs {
		out := &run{tl: r.tl}
		switch {
		case r.overGRPC:
			out.name, out.short, out.notes = grpcRunNames(r)
		case r.protected && !r.tuned:
			out.name, out.short = "bulwark client, zero config: package defaults, only a fallback set on the tax call", "bulwark"
			out.notes = []string{
				"nothing tuned: the attempt timeout and the breaker's slow-call threshold are learned from tax's own healthy latency, the bulkhead is the soft adaptive default;",
				"only a fallback function is set (no default can know what to answer a failed tax call with): it answers with the last good rate, from memory.",
				r.learnedNote(),
			}
		case r.tuned:
			out.name, out.short = "bulwark client tuned by hand (timeout, breaker, bulkhead, fallback on the tax call)", "bulwark tuned"
			out.notes = []string{
				fmt.Sprintf("bulwark layers for tax: Timeout (attempt %v, total %v); Breaker (slow call ≥ %v, trips at 50%% slow or failed of ≥ %d calls in %v, open %v, 5 probes);",
					attempt, 2*attempt, attempt/2, breakerMinCalls, breakerWindow(s), s.ref(refBreakerOpenFor)),
				fmt.Sprintf("Bulkhead %d in flight (%d of %d threads, scaled with the pool), no queue; a fallback function that answers with the last good rate, from memory", refTaxBulkhead/poolDivisor, refTaxBulkhead, refPoolThreads),
				"(the tax call is a POST: no stale cache, no retries). \"of which fallback\" counts checkouts whose response carried " + bulwark.FallbackHeader + ".",
			}
		default:
			out.name, out.short = "plain http.Client (no timeout)", "plain"
		}
		ordersSick, _ := r.tl.get("orders ok").value(sickB, healB, r.tl.width)
		openSick, hasBreaker := r.tl.get("breaker open").value(sickB, healB, r.tl.width)
		openCol := "no breaker"
		if hasBreaker {
			openCol = pct(openSick)
		}
		ordersAll, _ := r.tl.get("orders ok").value(0, endB, r.tl.width)
		checkSick, _ := r.tl.get("checkout ok").value(sickB, healB, r.tl.width)
		fallbackSick, _ := r.tl.get("checkout fallback").value(sickB, healB, r.tl.width)
		p99, _ := r.tl.get("orders p99").value(sickB, healB, r.tl.width)
		rec := "none in run"
		combined := combineRates(r.tl, "tuesday ok", "checkout ok", "orders ok")
		if b := r.tl.recoveredAt(combined, healB, endB, 0.9); b >= 0 {
			rec = fmt.Sprintf("%.1fs", (time.Duration(b-healB) * r.tl.width).Seconds())
		}
		out.headline = []stat{
			{"orders ok while tax sick", pct(ordersSick)},
			{"orders ok whole run", pct(ordersAll)},
			{"orders p99 while sick (failed too)", fmt.Sprintf("%.0f ms", p99)},
			{"checkout ok while sick", pct(checkSick)},
			{"  of which fallback (last good rate)", strconv.FormatInt(r.stale.Load(), 10)},
			{"tax requests while sick", strconv.FormatInt(r.taxSick.Load(), 10)},
			{"breaker open, share of sick time", openCol},
			{"most workers waiting on tax at once", fmt.Sprintf("%d of %d", r.maxHeld.Load(), workers)},
			{"recovered (≥90% ok) after heal", rec},
		}
		out.metrics = map[string]float64{"orders_sick": ordersSick, "checkout_sick": checkSick,
			"tax_sick": float64(r.taxSick.Load()), "breaker_open_sick": openSick,
			"held":     float64(r.maxHeld.Load()) / float64(workers),
			"fallback": float64(r.stale.Load()), "fallback_sick": fallbackSick}
		sc.runs = append(sc.runs, out)
	}
	// Why the plain client's tax traffic spikes at the heal: its workers
	// were stuck on slow calls while checkouts queued behind them; when tax
	// answers fast again the whole backlog calls it at once.
	spike := 0.0
	recv := runs[0].tl.get("tax recv")
	for b := healB; b < endB; b++ {
		v, _ := recv.value(b, b+1, runs[0].tl.width)
		spike = max(spike, v)
	}
	sc.explain = append(sc.explain, fmt.Sprintf("The plain client's tax traffic spikes to %.0f req/s (in a 100 ms bucket) when tax heals: while its workers were stuck on slow tax calls, checkouts piled up in the accept queue (their users long gone); once tax answers fast again the whole backlog calls it at once. bulwark's breaker and bulkhead never let that queue form, and after the heal its half-open probes let traffic back gradually.", spike))
	sc.runs[0].metrics["tax_spike"] = spike
	return sc, nil
}

// combineRates adds a rate series that is the sum of two others and
// returns its name.
func combineRates(tl *timeline, name, a, b string) string {
	sa, sb := tl.get(a), tl.get(b)
	tl.define(name, kindRate, false, false)
	s := tl.get(name)
	for i := range s.num {
		s.num[i] = sa.num[i] + sb.num[i]
		s.den[i] = sa.den[i] + sb.den[i]
	}
	return name
}

func pct(f float64) string { return fmt.Sprintf("%.1f%%", 100*f) }

// taxP999 measures a healthy tax service's latency.
func (l *lab) taxP999(ctx context.Context) (time.Duration, error) {
	healthy := l.set.ref(refTaxHealthy)
	srv, err := startServer(func(s *server) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			s.sleep(r.Context(), jitter(healthy))
			_, _ = w.Write([]byte("0.0825"))
		})
	})
	if err != nil {
		return 0, err
	}
	defer srv.close()
	tr := loopbackTransport()
	defer tr.CloseIdleConnections()
	return calibrate(ctx, &http.Client{Transport: tr, Timeout: 10 * time.Second}, srv.url+"/rate", 400, 8)
}

// jitter spreads d by ±25 %, as real latencies are.
func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.75 + 0.5*rand.Float64()))
}

func (l *lab) tuesdayRun(ctx context.Context, r *tuesdayRun, start time.Time, length, patience, attempt time.Duration, workers int) error {
	s := l.set
	startTax := r.startHTTPTax
	if r.overGRPC {
		startTax = r.startGRPCTax
	}
	stopTax, err := startTax(s, attempt)
	if err != nil {
		return err
	}
	defer stopTax()

	checkout, err := startServer(func(srv *server) http.Handler { return r.checkoutMux(srv, s) })
	if err != nil {
		return err
	}
	defer checkout.close()

	users := loopbackTransport()
	defer users.CloseIdleConnections()
	userClient := &http.Client{Transport: users, Timeout: patience}
	time.Sleep(time.Until(start))
	stopSampling := r.sampleBreaker()
	defer stopSampling()
	openLoop(ctx, s.load, length, 4000, func(ctx context.Context, i int, at time.Time, dropped bool) {
		r.tl.count("offered", at)
		series, method, path := "orders ok", http.MethodGet, "/orders/"+strconv.Itoa(i)
		if i%2 == 0 {
			series, method, path = "checkout ok", http.MethodPost, "/checkout"
		}
		ok, stale := false, false
		if !dropped {
			code, body, err := send(ctx, userClient, method, checkout.url+path)
			ok = err == nil && code == http.StatusOK
			stale = ok && bytes.HasPrefix(body, []byte(staleAnswer))
		}
		r.tl.outcome(series, at, ok)
		if r.protected && !r.overGRPC && series == "checkout ok" {
			r.tl.outcome("checkout fallback", at, stale)
		}
		if series == "orders ok" {
			r.tl.latency("orders p99", at, time.Since(at))
		}
	})
	return nil
}

// taxDelay counts a request reaching tax at now and returns how long tax
// takes to answer it: healthy, or sick (slow, and then correct).
func (r *tuesdayRun) taxDelay(s settings, now time.Time) time.Duration {
	r.tl.count("tax recv", now)
	if r.sick(now) {
		r.taxSick.Add(1)
		return s.ref(refTaxSick)
	}
	return jitter(s.ref(refTaxHealthy))
}

// startHTTPTax starts the tax service over HTTP and the client checkout
// calls it with: plain, bulwark with zero config, or tuned with the
// attempt timeout given.
func (r *tuesdayRun) startHTTPTax(s settings, attempt time.Duration) (stop func(), err error) {
	tax, err := startServer(func(srv *server) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if !srv.sleep(req.Context(), r.taxDelay(s, time.Now())) {
				http.Error(w, "gave up", http.StatusServiceUnavailable)
				return
			}
			_, _ = w.Write([]byte("0.0825"))
		})
	})
	if err != nil {
		return nil, err
	}
	r.taxHost = tax.host
	taxBase := loopbackTransport()
	stop = func() {
		taxBase.CloseIdleConnections()
		tax.close()
	}
	lastGood := func() string { return r.lastRate.Load().(string) }
	switch {
	case r.tuned:
		r.bulwark, err = tunedTaxClient(taxBase, tax.host, attempt, refTaxBulkhead/poolDivisor, s, lastGood)
		r.taxClient = &http.Client{Transport: r.bulwark}
	case r.protected:
		r.bulwark, err = protectedTaxClient(taxBase, lastGood)
		r.taxClient = &http.Client{Transport: r.bulwark}
	default:
		r.taxClient = &http.Client{Transport: taxBase} // no timeout: the default
	}
	if err != nil {
		stop()
		return nil, err
	}
	return stop, nil
}

// checkoutMux is the checkout service. Both runs use this same code; only
// the client it calls tax with differs.
func (r *tuesdayRun) checkoutMux(srv *server, s settings) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /checkout", func(w http.ResponseWriter, req *http.Request) {
		if !r.acquire(w, srv.stop) {
			return
		}
		defer func() { <-r.workers }()
		// The tax call runs under the server's lifetime, not the user's
		// request: like a thread-per-request server's, a worker does
		// not notice that its user gave up. (Passing req.Context() would be
		// a mitigation of its own and hide the problem being shown.)
		h := r.taxHeld.Add(1)
		for m := r.maxHeld.Load(); h > m && !r.maxHeld.CompareAndSwap(m, h); m = r.maxHeld.Load() {
		}
		code, rate, fallback, err := r.callTax(srv.ctx)
		r.taxHeld.Add(-1)
		switch {
		case err == nil && code == http.StatusOK && len(rate) > 0 && fallback != "":
			// bulwark's Fallback answered (the call failed, was refused by
			// the breaker or the bulkhead): a degraded but honest answer.
			r.stale.Add(1)
			w.Header().Set("X-Tax-Rate", "last-known")
			fmt.Fprintf(w, "%s %s\n", staleAnswer, rate)
		case err == nil && code == http.StatusOK && len(rate) > 0:
			r.lastRate.Store(string(rate))
			fmt.Fprintf(w, "charged with tax rate %s\n", rate)
		default:
			http.Error(w, "tax unavailable", http.StatusBadGateway)
		}
	})
	mux.HandleFunc("GET /orders/{id}", func(w http.ResponseWriter, req *http.Request) {
		if !r.acquire(w, srv.stop) {
			return
		}
		defer func() { <-r.workers }()
		if !srv.sleep(req.Context(), max(s.ref(refOrderTime), 500*time.Microsecond)) {
			http.Error(w, "gave up", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintf(w, "order %s: shipped\n", req.PathValue("id"))
	})
	return mux
}

// staleAnswer starts checkout's answer when bulwark's fallback gave the
// tax rate: how the users' side tells a stale rate from a real one.
const staleAnswer = "charged with last known tax rate"

// callTax asks the tax service for its rate and returns the status, the
// body, and the response's bulwark.FallbackHeader ("" when the tax service
// itself answered).
func (r *tuesdayRun) callTax(ctx context.Context) (code int, rate []byte, fallback string, err error) {
	if r.overGRPC {
		return r.callGRPCTax(ctx)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+r.taxHost+"/rate", nil)
	if err != nil {
		return 0, nil, "", err
	}
	resp, err := r.taxClient.Do(req)
	if err != nil {
		return 0, nil, "", err
	}
	defer resp.Body.Close()
	rate, err = io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	return resp.StatusCode, rate, resp.Header.Get(bulwark.FallbackHeader), err
}

// sampleBreaker records, every few milliseconds until the returned func is
// called, whether the tax host's breaker is open. The plain run has no
// breaker and records nothing.
func (r *tuesdayRun) sampleBreaker() (stop func()) {
	if r.bulwark == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		// Bounded by the timeline's length too, whatever the caller does.
		end := r.tl.start.Add(time.Duration(r.tl.n) * r.tl.width)
		for now := time.Now(); now.Before(end); now = time.Now() {
			// No state yet (before the first call) is a closed breaker.
			open := false
			for _, h := range r.bulwark.Snapshot().Host(r.taxHost) {
				open = open || h.Breaker != nil && h.Breaker.State == bulwark.CircuitOpen
				if r.learned == nil && h.Learned != nil && r.sick(now) {
					r.learned = h.Learned
				}
			}
			r.tl.outcome("breaker open", now, open)
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

// acquire takes a worker, waiting in the accept queue for one; a full
// queue is an immediate 503. Like a server's accept queue it does not
// notice that the user behind a queued request gave up: the request still
// gets a worker when its turn comes (a dead order then costs nothing, a
// dead checkout still makes its tax call).
func (r *tuesdayRun) acquire(w http.ResponseWriter, stop <-chan struct{}) bool {
	if r.queued.Add(1) > r.maxQueue {
		r.queued.Add(-1)
		http.Error(w, "accept queue full", http.StatusServiceUnavailable)
		return false
	}
	defer r.queued.Add(-1)
	select {
	case r.workers <- struct{}{}:
		return true
	case <-stop:
		return false
	}
}
