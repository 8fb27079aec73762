package main

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// The reference note's retry storm: a 2 s blip on a service with fixed
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
	budgetRatio       = 0.1  // retries per request the budget allows
	budgetBurst       = 10   // retries the budget can save up
)

// caller makes one logical call, retrying as it sees fit, and reports
// whether it ended in a 200.
type caller interface {
	call(ctx context.Context, url string) bool
}

// retryLoop is a lab-local client retry loop: the COMPARISON BASELINES,
// that is, what the peers of bulwark do (none, immediate, backoff without
// jitter, full jitter, a budget). It is not bulwark.
type retryLoop struct {
	c        *http.Client
	attempts int           // total, first included
	timeout  time.Duration // per attempt
	sleep    func(retry int) time.Duration
	budget   *retryBudget // nil: no budget
}

func (r *retryLoop) call(ctx context.Context, url string) bool {
	r.budget.deposit()
	for a := range r.attempts {
		if a > 0 {
			if !r.budget.withdraw() {
				return false
			}
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

// retryBudget lets retries be at most budgetRatio of requests (a token
// bucket fed by every first attempt), shared by all the calling service's
// goroutines, as the SRE book's per-process budget is.
type retryBudget struct {
	mu     sync.Mutex
	tokens float64
}

func (b *retryBudget) deposit() {
	if b == nil {
		return
	}
	b.mu.Lock()
	b.tokens = min(budgetBurst, b.tokens+budgetRatio)
	b.mu.Unlock()
}

func (b *retryBudget) withdraw() bool {
	if b == nil {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// backoff is min(cap, base·2^(retry-1)).
func backoff(base, cap time.Duration, retry int) time.Duration {
	return time.Duration(math.Min(float64(cap), float64(base)*math.Pow(2, float64(retry-1))))
}

// bulwarkRetryClient is the client the "bulwark" row of the storm uses.
//
// TODO(lead): swap in bulwark's Retry policy once retry_rt.go is merged:
// bulwark.NewClient(bulwark.Config{Base: base, Default: bulwark.Policy{
// Timeout: {Attempt: timeout}, Retry: {MaxAttempts: 4, Base: base, Cap: cap,
// Jitter: bulwark.Full, Budget: …}}}) behind a one-attempt caller. Until
// then it is the lab's own full-jitter-with-budget loop, the same as the
// baseline row above it, and the screen says so.
func bulwarkRetryClient(c *http.Client, s settings) caller {
	base, cp := s.ref(refBackoffBase), s.ref(refBackoffCap)
	return &retryLoop{c: c, attempts: 4, timeout: s.ref(refAttemptTimeout), budget: &retryBudget{},
		sleep: func(k int) time.Duration { return rand.N(backoff(base, cp, k) + 1) }}
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
		{"full jitter + budget (bulwarkRetryClient)", "jit+bud", bulwarkRetryClient},
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
		key:    "storm",
		title:  "2. Retry storm: a blip on a service with fixed capacity",
		length: length,
		marks:  []mark{{blipFrom, blipTo, fmt.Sprintf("%v stall", blip)}},
		intro: []string{
			fmt.Sprintf("service: %d workers × %v each = %.0f req/s capacity, FIFO queue of %d; stalls %.1fs–%.1fs (the note's 2 s blip)",
				workers, svc, capacity, 10*workers, blipFrom.Seconds(), blipTo.Seconds()),
			fmt.Sprintf("%d clients, %.0f req/s offered in all, attempt timeout %v, up to 3 retries, backoff base %v cap %v, budget %.0f%% of requests",
				stormClients, s.load, s.ref(refAttemptTimeout), s.ref(refBackoffBase), s.ref(refBackoffCap), 100*budgetRatio),
			"the first four rows are lab-local baselines (what peers do); the last is bulwarkRetryClient, today the same lab loop (bulwark's Retry layer is not merged yet)",
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
				tl.outcome("ok", at, c.call(ctx, srv.url+"/work"))
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
	rec := fmt.Sprintf("none in %.1fs", (length - blipTo).Seconds())
	if b := tl.recoveredAt("ok", toB, endB, 0.9); b >= 0 {
		rec = fmt.Sprintf("%.1fs", (time.Duration(b-toB) * tl.width).Seconds())
	}
	okAll, _ := tl.get("ok").value(0, endB, tl.width)
	r.headline = []stat{
		{"peak load (per 100 ms, as req/s)", fmt.Sprintf("%.0f", peak)},
		{"load in the second after the blip", fmt.Sprintf("%.0f req/s", after)},
		{"requests the service received", strconv.FormatInt(received.Load(), 10)},
		{"calls ok, whole run", pct(okAll)},
		{"recovered (≥90% ok) after the blip", rec},
	}
	r.metrics = map[string]float64{"peak": peak, "ok": okAll}
	return r, nil
}
