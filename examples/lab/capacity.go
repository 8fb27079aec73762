package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bulwark-http/bulwark"
)

// A capacity drop, as adaptive concurrency limits are meant for (Netflix's
// concurrency-limits library and Envoy's adaptive concurrency filter): a
// service of C "cores", each request holding one for 20 ms and the rest
// waiting in the service's own FIFO, loses three quarters of its cores (a
// noisy neighbour, a failed-over zone, a deploy at half capacity) and gets
// them back. Callers give up after a deadline, but the service does not
// notice: it serves its queue in order, so once the queue is longer than a
// deadline's worth of work, every answer comes too late and nothing the
// service does is useful (congestive collapse). A client-side limit that
// learns from latency keeps the queue short: the calls beyond the
// capacity fail at once, and the rest are answered in time.
//
// The service time and the deadline are not scaled by -scale: the limit
// learns from latency, and at ×0.25 a 5 ms service would sit inside a
// loaded machine's own noise. The run's length follows -duration.
//
// The figures are issue 28's by default: 40 cores → 10 → 40, 1,200 calls a
// second. The load is -load or 1,200 a second, whichever is more, and the
// cores follow it (the load needs 60 % of them), never fewer than 40: a
// quarter of them must be at least the package default limit's floor
// (capFloor, 10 in flight), or bulwark with zero config would keep more
// requests at the service than its cores serve at once, by design (see
// Bulkhead.MinConcurrent), and the scenario would measure that floor
// instead of the limit.
const (
	capService  = 20 * time.Millisecond
	capDeadline = 250 * time.Millisecond
	capHeadroom = 5.0 / 3 // the full service's capacity ÷ the offered load
	capDropTo   = 4       // the drop leaves a quarter of the cores
	capFloor    = 10      // the package default adaptive limit's floor (Bulkhead.MinConcurrent)
	capMinCores = capDropTo * capFloor
	capCeiling  = 2 // the tuned limit's ceiling ÷ the full service's cores
)

// capacitySpec is the scenario's entry in the registry.
var capacitySpec = spec{
	key:   "capacity",
	title: "6. Capacity drop: the service loses three quarters of its cores",
	blurb: "a service's cores go high → low → high under open-loop load with a deadline per call: plain against bulwark with zero config and bulwark's tuned adaptive concurrency limit",
	run:   (*lab).capacity,
	verdict: func(sc *scenario) string {
		plain, bw, tuned := sc.runs[0].metrics, sc.runs[1].metrics, sc.runs[2].metrics
		return fmt.Sprintf("while the service had a quarter of its cores (%.0f calls/s of capacity), bulwark with zero config kept %.0f calls/s answered in time (p99 of those %s) while the plain client's fell to %.0f calls/s (p99 %s); after the cores came back, bulwark answered %.0f calls/s and the plain client %.0f. bulwark's tuned adaptive limit (from 1) answered %.0f calls/s in time at a quarter of the cores (p99 %s) and %.0f after they came back.",
			bw["low_capacity"], bw["low_good"], msSp(bw["low_ok_p99"]), plain["low_good"], msSp(plain["low_ok_p99"]), bw["after_good"], plain["after_good"],
			tuned["low_good"], msSp(tuned["low_ok_p99"]), tuned["after_good"])
	},
}

// cores is the service's CPU: at most limit requests are served at once,
// the others wait in arrival order, and the limit can change while they
// wait. A channel of tokens would put a lowered limit's own wait behind
// every queued request; this hands a freed core straight to the next
// waiter unless the limit has dropped.
type cores struct {
	mu      sync.Mutex
	limit   int
	busy    int
	waiters []chan struct{}
}

func (c *cores) setLimit(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.limit = n
	for c.busy < c.limit && len(c.waiters) > 0 {
		c.busy++
		close(c.waiters[0])
		c.waiters = c.waiters[1:]
	}
}

// acquire waits for a core; false if stop closed first (the core, if it
// was handed over meanwhile, is not given back: the service is shutting
// down).
func (c *cores) acquire(stop <-chan struct{}) bool {
	c.mu.Lock()
	if c.busy < c.limit {
		c.busy++
		c.mu.Unlock()
		return true
	}
	ch := make(chan struct{})
	c.waiters = append(c.waiters, ch)
	c.mu.Unlock()
	select {
	case <-ch:
		return true
	case <-stop:
		return false
	}
}

func (c *cores) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.busy <= c.limit && len(c.waiters) > 0 {
		close(c.waiters[0])
		c.waiters = c.waiters[1:]
		return
	}
	c.busy--
}

// queued is how many requests wait for a core.
func (c *cores) queued() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.waiters)
}

// capLoad is the calls a second offered in s: -load, at least what
// capMinCores serve at 60 % (1,200 a second).
func capLoad(s settings) float64 {
	return max(s.load, capMinCores/(capHeadroom*capService.Seconds()))
}

// capCores is the full service's cores at load: capHeadroom times the
// calls in flight it needs, at least capMinCores.
func capCores(load float64) int {
	return max(capMinCores, int(math.Round(capHeadroom*load*capService.Seconds())))
}

// capacityPolicy is bulwark tuned for this scenario: the adaptive
// limit alone, from 1 up to twice the full service's cores (it starts at
// the top and learns down, at most halving per window of a few latencies), no queue (a call past the limit
// fails at once), and the call's deadline as its attempt timeout, so an
// attempt that runs out counts as a queue to the limit. Retries are off
// (a retry into a collapsing queue only lengthens it), and so are the
// breaker and hedging: the limit is what this scenario measures.
func capacityPolicy(full int) bulwark.Policy {
	return bulwark.Policy{
		Timeout:  bulwark.Timeout{Attempt: capDeadline, Total: capDeadline},
		Bulkhead: bulwark.Bulkhead{Adaptive: true, MinConcurrent: 1, MaxConcurrent: capCeiling * full},
		Breaker:  bulwark.Breaker{Disabled: true},
		Retry:    bulwark.Retry{Disabled: true},
	}
}

type capRun struct {
	bulwark  bool
	tuned    bool // bulwark with capacityPolicy; without, package defaults: no policy set at all
	tl       *timeline
	maxQueue atomic.Int64 // the service's longest queue
	refused  atomic.Int64 // calls bulwark's limit refused at once
	late     atomic.Int64 // calls that ran out of deadline
	breaker  atomic.Int64 // calls bulwark's breaker refused at once
}

func (l *lab) capacity(ctx context.Context) (*scenario, error) {
	s := l.set
	length := s.runLen(10 * time.Second)
	dropAt, backAt := length*25/100, length*70/100
	load := capLoad(s)
	full := capCores(load)
	low := full / capDropTo
	sc := &scenario{
		length: length,
		headings: map[string]string{
			"good":  "Calls answered ok within the deadline (per second)",
			"p99":   "99th percentile latency of every call, failures included (ms)",
			"cores": "The service's cores, and bulwark's concurrency limit",
		},
		marks: []mark{{dropAt, backAt, fmt.Sprintf("%d of %d cores", low, full)}},
		intro: []string{
			fmt.Sprintf("service: %d cores, each request holds one for %v (%.0f calls/s of capacity), the rest wait in its own FIFO and are served even after their caller gave up; from %.1fs to %.1fs it has %d cores (%.0f calls/s)",
				full, capService, float64(full)/capService.Seconds(), dropAt.Seconds(), backAt.Seconds(), low, float64(low)/capService.Seconds()),
			fmt.Sprintf("%.0f calls/s offered to each client (-load, at least %.0f: a quarter of the cores must be at least bulwark's default floor of %d in flight), open loop, with a %v deadline per call; the three runs side by side, each with its own service", load, capLoad(settings{}), capFloor, capDeadline),
			"bulwark: zero config (bulwark.Config{} with nothing set): learned attempt timeout and slow-call threshold, breaker, retries of GETs, and the soft adaptive limit (floor 10), which comes down to what the service serves when its latency shows a queue",
			fmt.Sprintf("bulwark tuned: the adaptive concurrency limit alone (a latency gradient, after Netflix's concurrency-limits and Envoy's adaptive concurrency), from 1 to %d, no queue; retries, breaker and hedging off", capCeiling*full),
			"the service time and the deadline are not scaled: the limit learns from latency, which a loaded machine blurs below a few milliseconds; only the run's length follows -duration",
		},
	}
	start := time.Now().Add(100 * time.Millisecond)
	width := 100 * time.Millisecond
	runs := []*capRun{{bulwark: false}, {bulwark: true}, {bulwark: true, tuned: true}}
	for _, r := range runs {
		r.tl = newTimeline(start, width, length+capDeadline+time.Second)
		r.tl.define("calls", kindLoad, false, false)
		r.tl.define("good", kindLoad, true, true)
		r.tl.define("p99", kindP99, true, true)
		r.tl.define("ok p99", kindP99, false, false) // of the calls answered ok in time
		r.tl.define("cores", kindGauge, true, true)
		if r.bulwark {
			r.tl.define("limit", kindGauge, true, true)
		}
	}
	if err := l.sideBySide("capacity: plain, zero config and tuned adaptive limit side by side", length, len(runs), func(i int) error {
		return l.capacityRun(ctx, runs[i], start, length, load, dropAt, backAt, full, low)
	}); err != nil {
		return nil, err
	}
	lowFrom, lowTo := runs[0].tl.at(dropAt), runs[0].tl.at(backAt)
	// The drop's first half second is the limit learning; the figures are
	// of the rest, once each client has settled.
	settle := min(lowFrom+runs[0].tl.at(500*time.Millisecond), (lowFrom+lowTo)/2)
	endB := runs[0].tl.at(length)
	for _, r := range runs {
		out := &run{tl: r.tl}
		if r.tuned {
			out.name, out.short = "bulwark tuned: adaptive concurrency limit from 1, breaker and retries off", "bulwark tuned"
		} else if r.bulwark {
			out.name, out.short = "bulwark with zero config: package defaults (learned timeout and slow-call threshold, breaker, soft adaptive bulkhead with a floor of 10, retries of GETs)", "bulwark"
		} else {
			out.name, out.short = "plain http.Client with the deadline", "plain"
		}
		good := r.tl.get("good")
		before, _ := good.value(0, lowFrom, width)
		lowGood, _ := good.value(settle, lowTo, width)
		after, _ := good.value(lowTo, endB, width)
		p99 := r.tl.get("p99")
		lowP99, _ := p99.value(settle, lowTo, width)
		lowOkP99, _ := r.tl.get("ok p99").value(settle, lowTo, width)
		limit := "-"
		var lowLimit, minLimit float64
		if r.bulwark {
			ls := r.tl.get("limit")
			lowLimit, _ = ls.value(settle, lowTo, width)
			minLimit = math.Inf(1)
			for b := lowFrom; b < lowTo; b++ {
				if v, ok := ls.value(b, b+1, width); ok {
					minLimit = min(minLimit, v)
				}
			}
			limit = fmt.Sprintf("%.1f (lowest %.0f)", lowLimit, minLimit)
		}
		out.headline = []stat{
			{"answered in time, full cores (calls/s)", fmt.Sprintf("%.0f", before)},
			{"answered in time, quarter cores (calls/s)", fmt.Sprintf("%.0f", lowGood)},
			{"p99 latency, quarter cores", fmt.Sprintf("%.0fms", lowP99)},
			{"p99 of the calls answered in time, quarter cores", fmt.Sprintf("%.0fms", lowOkP99)},
			{"answered in time, cores back (calls/s)", fmt.Sprintf("%.0f", after)},
			{"bulwark's mean limit, quarter cores", limit},
			{"calls refused at once by the limit", strconv.FormatInt(r.refused.Load(), 10)},
			{"calls refused at once by the breaker", strconv.FormatInt(r.breaker.Load(), 10)},
			{"calls out of deadline", strconv.FormatInt(r.late.Load(), 10)},
			{"longest queue at the service", strconv.FormatInt(r.maxQueue.Load(), 10)},
		}
		out.metrics = map[string]float64{"before_good": before, "low_good": lowGood, "low_p99": lowP99, "low_ok_p99": lowOkP99, "after_good": after,
			"load": load, "full_capacity": float64(full) / capService.Seconds(),
			"low_limit": lowLimit, "min_limit": minLimit, "ceiling": float64(capCeiling * full), "low_capacity": float64(low) / capService.Seconds(), "full": float64(full), "low": float64(low),
			"max_queue": float64(r.maxQueue.Load()), "refused": float64(r.refused.Load()), "breaker": float64(r.breaker.Load())}
		sc.runs = append(sc.runs, out)
	}
	plain, bw, tuned := sc.runs[0].metrics, sc.runs[1].metrics, sc.runs[2].metrics
	sc.explain = append(sc.explain,
		fmt.Sprintf("Why the plain client's calls stop being answered: %.0f calls/s arrive at a service that now serves %.0f, so its queue grows (to %.0f requests here), and once it holds more than a deadline's worth of work (%.0f requests) every request waits past its caller's deadline. The service still serves each one, for nobody, so after the cores come back it first works through the backlog of calls already given up.",
			load, plain["low_capacity"], plain["max_queue"], plain["low_capacity"]*capDeadline.Seconds()),
		fmt.Sprintf("bulwark with zero config sets no bounds, and its soft limit stays out of the way while the service answers at its baseline (%.0f calls/s answered before the drop, %.0f refused in the whole run). When the cores go, the latency shows a queue and the limit comes down whole to what the service completes a second × its baseline latency (to %.1f on average, lowest %.0f, against %.0f cores; never below its floor of %d), so the calls beyond it fail at once instead of queueing (p99 of the calls answered %s). When the cores come back, no window shows a queue for a second, the limit turns soft again and rises with what is in flight.",
			bw["before_good"], bw["refused"], bw["low_limit"], bw["min_limit"], bw["low"], capFloor, msSp(bw["low_ok_p99"])),
		fmt.Sprintf("bulwark tuned has the adaptive limit alone, from 1 to %.0f, hard: it falls while each short window's mean latency is above the baseline (to %.1f on average here) and grows again when the cores come back.",
			tuned["ceiling"], tuned["low_limit"]),
	)
	why := ""
	if bw["breaker"] > 0 {
		why = fmt.Sprintf("In this run the zero-config breaker opened and refused %.0f calls at once, calls the service had room for among them.", bw["breaker"])
	}
	if why != "" {
		sc.explain = append(sc.explain, why)
	}
	return sc, nil
}

func (l *lab) capacityRun(ctx context.Context, r *capRun, start time.Time, length time.Duration, load float64, dropAt, backAt time.Duration, full, low int) error {
	cpu := &cores{limit: full}
	srv, err := startServer(func(srv *server) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if !cpu.acquire(srv.stop) {
				return
			}
			// The service does not look at its caller: it serves what it
			// queued, whether anyone still waits for it or not.
			srv.sleep(context.Background(), capService)
			cpu.release()
			_, _ = w.Write([]byte("ok"))
		})
	})
	if err != nil {
		return err
	}
	defer srv.close()
	base := loopbackTransport()
	defer base.CloseIdleConnections()
	var (
		c  *http.Client
		bw *bulwark.Transport
	)
	if r.bulwark {
		cfg := bulwark.Config{Base: base}
		if r.tuned {
			cfg.Default = capacityPolicy(full)
		}
		bw, err = bulwark.New(cfg)
		if err != nil {
			return err
		}
		defer bw.CloseIdleConnections()
		c = &http.Client{Transport: bw}
	} else {
		c = &http.Client{Transport: base}
	}
	// The poller changes the cores on schedule and samples them, the
	// service's queue and bulwark's limit every 20 ms.
	pollDone := make(chan struct{})
	var pwg sync.WaitGroup
	pwg.Go(func() {
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-pollDone:
				return
			case now := <-t.C:
				el := now.Sub(start)
				n := full
				if el >= dropAt && el < backAt {
					n = low
				}
				cpu.setLimit(n)
				if el < 0 || el > length {
					continue
				}
				r.tl.level("cores", now, int64(n))
				if q := int64(cpu.queued()); q > r.maxQueue.Load() {
					r.maxQueue.Store(q)
				}
				if bw != nil {
					for _, h := range bw.Snapshot().Hosts {
						if h.Bulkhead != nil {
							r.tl.level("limit", now, int64(h.Bulkhead.Limit))
						}
					}
				}
			}
		}
	})
	defer func() { close(pollDone); pwg.Wait() }()
	runCtx, cancel := context.WithDeadline(ctx, start.Add(length+capDeadline+500*time.Millisecond))
	defer cancel()
	time.Sleep(time.Until(start))
	openLoop(runCtx, load, length, 4000, func(ctx context.Context, i int, at time.Time, dropped bool) {
		r.tl.count("calls", at)
		if dropped {
			r.tl.latency("p99", at, capDeadline)
			return
		}
		cctx, cancel := context.WithTimeout(ctx, capDeadline)
		code, body, err := send(cctx, c, http.MethodGet, srv.url+"/work/"+strconv.Itoa(i))
		cancel()
		took := time.Since(at)
		r.tl.latency("p99", at, took)
		switch {
		case err == nil && code == http.StatusOK && string(body) == "ok":
			r.tl.count("good", at)
			r.tl.latency("ok p99", at, took)
		case errors.Is(err, bulwark.ErrBulkheadFull):
			r.refused.Add(1)
		case errors.Is(err, bulwark.ErrBreakerOpen):
			r.breaker.Add(1)
		default:
			r.late.Add(1)
		}
	})
	return nil
}
