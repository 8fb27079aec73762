package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bulwark-http/bulwark"
)

// The retry storm of the AWS Builders' Library ("Timeouts, retries, and
// backoff with jitter") and Marc Brooker's "Exponential Backoff And
// Jitter" (AWS Architecture Blog): a 2 s blip on a service with fixed
// capacity, and many clients. The service stalls (a GC pause, a leader
// election) and, like most servers, works through its queue afterwards
// without noticing that the callers of the queued requests gave up.
const (
	refStormBlip      = 2 * time.Second
	refServiceTime    = 40 * time.Millisecond
	refAttemptTimeout = 150 * time.Millisecond
	refBackoffBase    = 200 * time.Millisecond
	refBackoffCap     = 2 * time.Second
	stormClients      = 200
	capacityFactor    = 1.75 // service capacity ÷ offered load
)

// stormSpec is the scenario's entry in the registry.
var stormSpec = spec{
	key:   "storm",
	title: "2. Retry storm: a blip on a service with fixed capacity",
	blurb: "a 2 s blip on a fixed-capacity service, with no retries, 3 immediate retries, exponential backoff, full jitter, and bulwark's retries (full jitter with a retry budget)",
	run:   (*lab).storm,
	verdict: func(sc *scenario) string {
		runs := map[string]map[string]float64{}
		for _, r := range sc.runs {
			runs[r.short] = r.metrics
		}
		return stormVerdict(runs["none"], runs["imm×3"], runs["bulwark"])
	},
}

// stormVerdict compares bulwark with the two clients a reader weighs it
// against, no retries and immediate retries, on the two things they trade:
// the load on the service around the blip and the calls that ended ok. It
// says who wins on what from the figures, whichever way they fall.
func stormVerdict(none, imm, bw map[string]float64) string {
	v := fmt.Sprintf("around the blip the service got at most %.0f req/s from bulwark, %.0f from 3 immediate retries and %.0f from a client that does not retry; calls ok: bulwark %s, immediate retries %s, no retries %s.",
		bw["peak"], imm["peak"], none["peak"], pctSp(bw["ok"]), pctSp(imm["ok"]), pctSp(none["ok"]))
	lowerPeak, moreOK := bw["peak"] < imm["peak"], bw["ok"] > imm["ok"]
	switch {
	case lowerPeak && moreOK:
		v += " Against immediate retries bulwark wins on both."
	case lowerPeak:
		v += " Against immediate retries bulwark wins on load, not on calls ok."
	case moreOK:
		v += " Against immediate retries bulwark wins on calls ok, not on load."
	default:
		v += " Against immediate retries bulwark wins on neither."
	}
	if bw["ok"] < none["ok"] {
		load := "at a lower load"
		if none["peak"] >= bw["peak"] {
			load = "though at a load as high or higher"
		}
		return v + fmt.Sprintf(" Not retrying at all beats bulwark on calls ok (by %.1f points), %s: in this blip retries buy nothing, and bulwark's budget only bounds what they cost.", 100*(none["ok"]-bw["ok"]), load)
	}
	load := fmt.Sprintf("at %.0f req/s more at the peak", bw["peak"]-none["peak"])
	if bw["peak"] <= none["peak"] {
		load = "and on load"
	}
	return v + fmt.Sprintf(" Against no retries bulwark wins on calls ok (by %.1f points), %s.", 100*(bw["ok"]-none["ok"]), load)
}

// caller makes one logical call, retrying as it sees fit, and reports
// whether it ended in a 200 and whether a retry budget refused it a retry.
type caller interface {
	call(ctx context.Context, url string) (ok, refused bool)
}

// retryLoop is a lab-local client retry loop: the COMPARISON BASELINES,
// that is, what the peers of bulwark do (none, immediate, backoff without
// jitter, full jitter). It is not bulwark.
type retryLoop struct {
	c        *http.Client
	attempts int           // total, first included
	timeout  time.Duration // per attempt
	sleep    func(retry int) time.Duration
}

func (r *retryLoop) call(ctx context.Context, url string) (bool, bool) {
	return r.try(ctx, url), false
}

func (r *retryLoop) try(ctx context.Context, url string) bool {
	for a := range r.attempts {
		if a > 0 {
			if d := r.sleep(a); d > 0 {
				t := time.NewTimer(d)
				select {
				case <-t.C:
				case <-ctx.Done():
					t.Stop()
					return false
				}
			}
		}
		actx, cancel := context.WithTimeout(ctx, r.timeout)
		code, _, err := send(actx, r.c, http.MethodGet, url)
		cancel()
		if err == nil && code == http.StatusOK {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
	}
	return false
}

// backoff is min(cap, base·2^(retry-1)).
func backoff(base, cap time.Duration, retry int) time.Duration {
	return time.Duration(math.Min(float64(cap), float64(base)*math.Pow(2, float64(retry-1))))
}

// bulwarkRetryClient is the client the "bulwark" row of the storm uses:
// bulwark's own Retry layer (retry.go), not a lab loop. The caller
// sends each call once; bulwark retries underneath.
//
// It is set up like the baselines so that the comparison is about how
// retries are made: the same attempt timeout, at most 3 retries (4
// attempts), backoff base and cap scaled alike, Full jitter, plus the
// per-host retry budget with bulwark's default ratio (20 %) and floor
// (10 retries a second), its 10 s window scaled like every other duration.
// Layers on: Timeout (Attempt as the baselines' per-attempt context; Total
// as long as four attempts and three capped waits, which no baseline call
// exceeds either) and Retry with its budget. Pushback stays on, but the
// service sends no Retry-After, so it never acts. Off: Breaker (an open
// breaker would shed the load itself and hide what the retries do),
// Bulkhead (it would cap the 200 clients' concurrency, which no baseline
// has) and Fallback (none configured).
func bulwarkRetryClient(c *http.Client, s settings) caller {
	attempt, base, cp := s.ref(refAttemptTimeout), s.ref(refBackoffBase), s.ref(refBackoffCap)
	bc, err := bulwark.NewClient(bulwark.Config{
		Base: c.Transport,
		Default: bulwark.Policy{
			Timeout: bulwark.Timeout{Attempt: attempt, Total: 4*attempt + 3*cp},
			Retry: bulwark.Retry{
				MaxAttempts: 4, Base: base, Cap: cp, Jitter: bulwark.JitterFull,
				Budget: bulwark.Budget{
					Ratio:        bulwark.DefaultBudgetRatio,
					Window:       s.ref(bulwark.DefaultBudgetWindow),
					MinPerSecond: bulwark.DefaultBudgetMinPerSecond,
				},
			},
			Breaker:  bulwark.Breaker{Disabled: true},
			Bulkhead: bulwark.Bulkhead{Disabled: true},
		},
	})
	if err != nil {
		// The configuration is fixed above; only a programming error
		// gets here.
		panic(err)
	}
	return &oneCall{c: bc}
}

// oneCall sends each call once through its client; retries, if any, are
// the client's business. It counts the calls whose retry bulwark's budget
// refused (the error says so: ErrRetryBudget).
type oneCall struct {
	c       *http.Client
	refused atomic.Int64
}

func (o *oneCall) call(ctx context.Context, url string) (bool, bool) {
	code, _, err := send(ctx, o.c, http.MethodGet, url)
	refused := errors.Is(err, bulwark.ErrRetryBudget)
	if refused {
		o.refused.Add(1)
	}
	return err == nil && code == http.StatusOK, refused
}

type stormStrategy struct {
	name, short string
	make        func(c *http.Client, s settings) caller
}

func stormStrategies() []stormStrategy {
	loop := func(attempts int, sleep func(s settings, k int) time.Duration) func(*http.Client, settings) caller {
		return func(c *http.Client, s settings) caller {
			return &retryLoop{c: c, attempts: attempts, timeout: s.ref(refAttemptTimeout),
				sleep: func(k int) time.Duration { return sleep(s, k) }}
		}
	}
	none := func(settings, int) time.Duration { return 0 }
	return []stormStrategy{
		{"no retries", "none", loop(1, none)},
		{"3 immediate retries", "imm×3", loop(4, none)},
		{"exponential backoff, no jitter", "expo", loop(4, func(s settings, k int) time.Duration {
			return backoff(s.ref(refBackoffBase), s.ref(refBackoffCap), k)
		})},
		{"full jitter", "jitter", loop(4, func(s settings, k int) time.Duration {
			return rand.N(backoff(s.ref(refBackoffBase), s.ref(refBackoffCap), k) + 1)
		})},
		{"bulwark: full jitter + retry budget", "bulwark", bulwarkRetryClient},
	}
}

func (l *lab) storm(ctx context.Context) (*scenario, error) {
	s := l.set
	blip := s.ref(refStormBlip)
	// By default a fifth of the run before the blip and six blips after it.
	length := s.runLen(time.Duration(float64(7*blip) / 0.8))
	blipFrom := length * 20 / 100
	blipTo := blipFrom + blip
	if blipTo+time.Second > length {
		return nil, fmt.Errorf("storm: -duration %v leaves under a second after a %v blip at -scale %g", length, blip, s.scale)
	}
	svc := s.ref(refServiceTime)
	workers := stormWorkers(s)
	capacity := float64(workers) / svc.Seconds()
	sc := &scenario{
		length: length,
		headings: map[string]string{
			"recv": "Requests the service received (req/s), every client",
			"ok":   "Calls that ended ok, every client",
		},
		marks: []mark{{blipFrom, blipTo, fmt.Sprintf("%v stall", blip)}},
		intro: []string{
			fmt.Sprintf("service: %d workers × %v each = %.0f req/s capacity, FIFO queue of %d; stalls %.1fs–%.1fs (a 2 s blip)",
				workers, svc, capacity, 10*workers, blipFrom.Seconds(), blipTo.Seconds()),
			fmt.Sprintf("%d clients, %.0f req/s offered in all, attempt timeout %v, up to 3 retries, backoff base %v cap %v",
				stormClients, s.load, s.ref(refAttemptTimeout), s.ref(refBackoffBase), s.ref(refBackoffCap)),
			fmt.Sprintf("the first four rows are lab-local baselines (what peers do); the last is bulwark's Retry layer: Full jitter, budget %.0f%% of calls over %v (floor %.0f/s), breaker and bulkhead off",
				100*bulwark.DefaultBudgetRatio, s.ref(bulwark.DefaultBudgetWindow), float64(bulwark.DefaultBudgetMinPerSecond)),
		},
	}
	drain := 4*s.ref(refAttemptTimeout) + 3*s.ref(refBackoffCap) + time.Second
	for _, st := range stormStrategies() {
		r, err := l.stormRun(ctx, st, length, drain, blipFrom, blipTo, workers)
		if err != nil {
			return nil, err
		}
		sc.runs = append(sc.runs, r)
	}
	none, bw := sc.runs[0], sc.runs[len(sc.runs)-1]
	refused := fmt.Sprintf("bulwark's retry budget (%.0f %% of calls, floor %.0f/s) refused the retry of %.0f calls in this run, %.0f of them started during the blip or the second after it; those calls failed, as they would have with no retries.",
		100*bulwark.DefaultBudgetRatio, float64(bulwark.DefaultBudgetMinPerSecond), bw.metrics["refused"], bw.metrics["refused_blip"])
	if bw.metrics["ok"] < none.metrics["ok"] {
		sc.explain = append(sc.explain, fmt.Sprintf("Why bulwark's calls ok (%s) is below no retries (%s): %s The retries it did allow added to the backlog that the service works through after the stall (it received %.0f requests against %.0f with no retries), and waiting behind that backlog costs some first attempts their attempt timeout. The budget trades a little success in a blip for a bounded load: compare the peaks.",
			pctSp(bw.metrics["ok"]), pctSp(none.metrics["ok"]), refused, bw.metrics["received"], none.metrics["received"]))
	} else {
		sc.explain = append(sc.explain, fmt.Sprintf("bulwark's calls ok (%s) against no retries (%s): %s", pctSp(bw.metrics["ok"]), pctSp(none.metrics["ok"]), refused))
	}
	sc.explain = append(sc.explain, "The spikes after the stall are the retries the clients held: immediate retries fire as fast as attempts time out, and backoff without jitter releases every client's retry at the same instants; jitter spreads them, and the budget caps how many there are.")
	return sc, nil
}

// stormWorkers sizes the service so its capacity is capacityFactor times
// the offered load.
func stormWorkers(s settings) int {
	return max(1, int(math.Ceil(capacityFactor*s.load*s.ref(refServiceTime).Seconds())))
}

func (l *lab) stormRun(ctx context.Context, st stormStrategy, length, drain, blipFrom, blipTo time.Duration, workers int) (*run, error) {
	s := l.set
	start := time.Now().Add(50 * time.Millisecond)
	tl := newTimeline(start, 100*time.Millisecond, length+drain)
	tl.define("calls", kindLoad, false, false) // first attempts: the offered load
	tl.define("recv", kindLoad, true, true)
	tl.define("ok", kindRate, true, true)
	tl.define("refused", kindLoad, false, false) // calls whose retry the budget refused
	stallFrom, stallTo := start.Add(blipFrom), start.Add(blipTo)
	svc := s.ref(refServiceTime)

	type job struct{ done chan struct{} }
	queue := make(chan *job, 10*workers)
	var received atomic.Int64
	srv, err := startServer(func(srv *server) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			tl.count("recv", time.Now())
			received.Add(1)
			j := &job{done: make(chan struct{})}
			select {
			case queue <- j:
			default:
				http.Error(w, "queue full", http.StatusServiceUnavailable)
				return
			}
			select {
			case <-j.done:
				_, _ = w.Write([]byte("ok"))
			case <-srv.stop:
			}
		})
	})
	if err != nil {
		return nil, err
	}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				var j *job
				select {
				case j = <-queue:
				case <-srv.stop:
					return
				}
				if now := time.Now(); !now.Before(stallFrom) && now.Before(stallTo) {
					srv.sleep(context.Background(), stallTo.Sub(now))
				}
				srv.sleep(context.Background(), svc)
				close(j.done)
			}
		})
	}
	defer func() { srv.close(); wg.Wait() }()

	tr := loopbackTransport()
	defer tr.CloseIdleConnections()
	c := st.make(&http.Client{Transport: tr}, s)
	think := time.Duration(float64(stormClients) / s.load * float64(time.Second))
	end := start.Add(length)
	stop := l.showProgress("storm: "+st.name, length+drain/2)
	time.Sleep(time.Until(start))
	var clients sync.WaitGroup
	for range stormClients {
		clients.Go(func() {
			// Each client thinks (exponentially, mean think), calls, repeats,
			// until the run's arrivals end; a bounded number of times.
			for range int(length/time.Millisecond) + 1 {
				d := time.Duration(rand.ExpFloat64() * float64(think))
				if time.Now().Add(d).After(end) {
					return
				}
				t := time.NewTimer(d)
				select {
				case <-t.C:
				case <-ctx.Done():
					t.Stop()
					return
				}
				at := time.Now()
				tl.count("calls", at)
				ok, refused := c.call(ctx, srv.url+"/work")
				tl.outcome("ok", at, ok)
				if refused {
					tl.count("refused", at)
				}
			}
		})
	}
	clients.Wait()
	stop()

	r := &run{name: st.name, short: st.short, tl: tl}
	recv := tl.get("recv")
	fromB, toB, endB := tl.at(blipFrom), tl.at(blipTo), tl.at(length)
	peak := 0.0
	for b := fromB; b < endB; b++ {
		v, _ := recv.value(b, b+1, tl.width)
		peak = max(peak, v)
	}
	after, _ := recv.value(toB, toB+tl.at(time.Second), tl.width)
	rec, recS := fmt.Sprintf("none in %.1fs", (length-blipTo).Seconds()), -1.0
	if b := tl.recoveredAt("ok", toB, endB, 0.9); b >= 0 {
		recS = (time.Duration(b-toB) * tl.width).Seconds()
		rec = fmt.Sprintf("%.1fs", recS)
	}
	okAll, _ := tl.get("ok").value(0, endB, tl.width)
	r.headline = []stat{
		{"peak load (per 100 ms, as req/s)", fmt.Sprintf("%.0f", peak)},
		{"load in the second after the blip", fmt.Sprintf("%.0f req/s", after)},
		{"requests the service received", strconv.FormatInt(received.Load(), 10)},
		{"calls ok, whole run", pct(okAll)},
		{"recovered (≥90% ok) after the blip", rec},
	}
	refusedS := "no budget"
	var refused, refusedBlip int64
	if oc, ok := c.(*oneCall); ok {
		refused = oc.refused.Load()
		rs := tl.get("refused")
		for b := fromB; b < min(toB+tl.at(time.Second), len(rs.num)); b++ {
			refusedBlip += rs.num[b]
		}
		refusedS = strconv.FormatInt(refused, 10)
	}
	r.headline = append(r.headline, stat{"calls whose retry the budget refused", refusedS})
	r.metrics = map[string]float64{"peak": peak, "ok": okAll, "received": float64(received.Load()),
		"refused": float64(refused), "refused_blip": float64(refusedBlip), "recovered": recS}
	return r, nil
}
