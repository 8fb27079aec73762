package main

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bulwark-http/bulwark"
)

// The long tail of Dean and Barroso's "The Tail at Scale" (CACM 2013): a
// healthy upstream answers in about 5 ms, but 1 % of attempts, drawn
// independently for each attempt, take a second (a GC pause, a busy
// neighbour, a queue behind a background job). Retrying on a timeout does
// nothing for such a call until the timeout passes; a hedge sent after the
// host's p99 usually answers in the healthy 5 ms, for about 1 % more load.
//
// The tail is injected by bulwark's own Fault policy (fault.go): a
// Transport with Fault alone (every other layer off) adds the second at a
// rate, at the attempt, and is the base of every client of the scenario,
// so the plain client and bulwark see the same upstream and the same
// faults. Its seed is fixed, so each run draws the same sequence of
// faults for its attempts in order.
//
// Latencies here are not scaled by -scale: at ×0.25 the healthy answer
// would be 1.25 ms, inside a loaded machine's own scheduling noise, and
// the tail's shape (5 ms against 1 s) is the point. Only the run's length
// follows -duration.
const (
	tailHealthy  = 5 * time.Millisecond
	tailSlow     = time.Second
	tailSlowRate = 0.01
	tailSeed     = 17 // the Fault policy's seed: the same faults every run
)

// tailHedge is bulwark hedging's policy, as bench/cmd/hedge configures it
// (bench.HedgePolicy): the delay is the host's recent p99 latency, never
// under 8 ms, one hedge per call, taken from the retry budget.
var tailHedge = bulwark.Hedge{Quantile: 0.99, MinDelay: 8 * time.Millisecond}

// tailSpec is the scenario's entry in the registry.
var tailSpec = spec{
	key:   "tail",
	title: "5. The long tail: 1 % of attempts take a second",
	blurb: "a 5 ms upstream where 1 % of attempts take 1 s (bulwark's Fault policy injects it): plain, bulwark retrying only, bulwark hedging",
	run:   (*lab).tail,
	verdict: func(sc *scenario) string {
		plain, retry, hedge := sc.runs[0].metrics, sc.runs[1].metrics, sc.runs[2].metrics
		return fmt.Sprintf("bulwark hedging's p99.9 was %s against the plain client's %s (bulwark retrying only: %s), for %.3f upstream requests per call (plain %.3f).",
			msSp(hedge["p999"]), msSp(plain["p999"]), msSp(retry["p999"]), hedge["load"], plain["load"])
	},
}

// msSp prints milliseconds for a sentence: one decimal under 100 ms.
func msSp(ms float64) string {
	if ms < 100 {
		return fmt.Sprintf("%.1f ms", ms)
	}
	return fmt.Sprintf("%.0f ms", ms)
}

// tailFault is the one Fault policy of the scenario: the second of
// latency at 1 %, drawn for every attempt from a fixed seed.
func tailFault() bulwark.Fault {
	return bulwark.Fault{Delay: tailSlow, DelayRate: tailSlowRate, Seed: tailSeed}
}

// faultyUpstream is the transport every client of the scenario sends
// through: bulwark with the Fault layer alone, over the loopback. It is
// part of the upstream, not of any client under test: no timeout, no
// retry, no breaker, no bulkhead.
func faultyUpstream(base http.RoundTripper) (*bulwark.Transport, error) {
	return bulwark.New(bulwark.Config{Base: base, Default: bulwark.Policy{
		Fault:    tailFault(),
		Timeout:  bulwark.Timeout{Disabled: true},
		Breaker:  bulwark.Breaker{Disabled: true},
		Bulkhead: bulwark.Bulkhead{Disabled: true},
		Retry:    bulwark.Retry{Disabled: true, NoPushback: true},
	}})
}

// counted counts the attempts that reach the upstream (the faulty
// transport and the server behind it), per run.
type counted struct {
	next http.RoundTripper
	n    atomic.Int64
	tl   *timeline
}

func (c *counted) RoundTrip(req *http.Request) (*http.Response, error) {
	c.n.Add(1)
	c.tl.count("sent", time.Now())
	return c.next.RoundTrip(req)
}

type tailRun struct {
	name, short string
	client      func(base http.RoundTripper) (*http.Client, *bulwark.Transport, error)
	tl          *timeline
	up          *counted
	bw          *bulwark.Transport // nil for the plain client
	mu          sync.Mutex
	lat         []float64 // every call's latency, ms
	errs        atomic.Int64
}

func tailRuns() []*tailRun {
	bw := func(p bulwark.Policy) func(http.RoundTripper) (*http.Client, *bulwark.Transport, error) {
		return func(base http.RoundTripper) (*http.Client, *bulwark.Transport, error) {
			tr, err := bulwark.New(bulwark.Config{Base: base, Default: p})
			if err != nil {
				return nil, nil, err
			}
			return &http.Client{Transport: tr}, tr, nil
		}
	}
	return []*tailRun{
		{name: "plain http.Client", short: "plain", client: func(base http.RoundTripper) (*http.Client, *bulwark.Transport, error) {
			return &http.Client{Transport: base}, nil, nil
		}},
		{name: "bulwark at its defaults: retries, no hedging", short: "retries", client: bw(bulwark.Policy{})},
		{name: "bulwark hedging: delay the host's p99 (at least 8 ms), one hedge", short: "hedging", client: bw(bulwark.Policy{Hedge: tailHedge})},
	}
}

func (l *lab) tail(ctx context.Context) (*scenario, error) {
	s := l.set
	length := s.runLen(6 * time.Second)
	width := 200 * time.Millisecond
	sc := &scenario{
		length: length,
		headings: map[string]string{
			"p99":  "Slowest 1 % of the calls started in each 200 ms (ms)",
			"sent": "Requests the upstream received (req/s)",
		},
		intro: []string{
			fmt.Sprintf("upstream: answers in %v; bulwark's Fault policy (Delay %v, DelayRate %g, seeded) adds %v to 1 %% of attempts, drawn for each attempt; it sits under every client, so all three see the same upstream and the same faults",
				tailHealthy, tailSlow, tailSlowRate, tailSlow),
			fmt.Sprintf("%.0f calls/s offered to each client, open loop (arrivals do not wait for answers), the three side by side; load = upstream requests ÷ calls", s.load),
			"bulwark retrying only is bulwark at its defaults (its 10 s attempt timeout never fires on a 1 s call); bulwark hedging adds Hedge{Quantile: 0.99, MinDelay: 8 ms}, as bench/cmd/hedge measures it",
			"latencies are not scaled: at ×0.25 a 5 ms answer would be lost in a loaded machine's own noise; only the run's length follows -duration",
		},
	}
	runs := tailRuns()
	start := time.Now().Add(100 * time.Millisecond)
	srv, err := startServer(func(srv *server) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			// A cancelled hedge or call frees the upstream at once.
			if !srv.sleep(req.Context(), tailHealthy) {
				return
			}
			_, _ = w.Write([]byte("ok"))
		})
	})
	if err != nil {
		return nil, err
	}
	defer srv.close()
	for _, r := range runs {
		r.tl = newTimeline(start, width, length+tailSlow+time.Second)
		r.tl.define("calls", kindLoad, false, false)
		r.tl.define("p99", kindP99, true, true)
		r.tl.define("sent", kindLoad, true, true)
	}
	if err := l.sideBySide("tail: plain, retries, hedging side by side", length, len(runs), func(i int) error {
		return l.tailRun(ctx, runs[i], srv.url, start, length)
	}); err != nil {
		return nil, err
	}
	for _, r := range runs {
		out := &run{name: r.name, short: r.short, tl: r.tl}
		r.mu.Lock()
		calls := len(r.lat)
		p50, p99, p999 := percentile(r.lat, 0.5), percentile(r.lat, 0.99), percentile(r.lat, 0.999)
		slow := 0
		for _, v := range r.lat {
			if v >= float64(tailSlow/2)/float64(time.Millisecond) {
				slow++
			}
		}
		r.mu.Unlock()
		load := float64(r.up.n.Load()) / float64(max(calls, 1))
		hedges, won := "-", "-"
		var sent, delay float64
		if r.bw != nil {
			for _, h := range r.bw.Snapshot().Hosts {
				if h.Hedge != nil {
					sent = float64(h.Hedge.Sent)
					delay = float64(h.Hedge.Delay) / float64(time.Millisecond)
					hedges = fmt.Sprintf("%d (delay now %v)", h.Hedge.Sent, h.Hedge.Delay.Round(100*time.Microsecond))
					won = strconv.FormatUint(h.Hedge.Won, 10)
				}
			}
		}
		out.headline = []stat{
			{"calls", strconv.Itoa(calls)},
			{"p50 latency", fmt.Sprintf("%.1fms", p50)},
			{"p99 latency", fmt.Sprintf("%.1fms", p99)},
			{"p99.9 latency", fmt.Sprintf("%.1fms", p999)},
			{"calls of 0.5 s or more", strconv.Itoa(slow)},
			{"upstream requests ÷ calls", fmt.Sprintf("%.3f", load)},
			{"hedges sent", hedges},
			{"hedges that answered first", won},
			{"errors", strconv.FormatInt(r.errs.Load(), 10)},
		}
		out.metrics = map[string]float64{"p50": p50, "p99": p99, "p999": p999, "load": load,
			"slow": float64(slow), "calls": float64(calls), "hedges": sent, "delay": delay, "errors": float64(r.errs.Load())}
		sc.runs = append(sc.runs, out)
	}
	plain, hedge := sc.runs[0].metrics, sc.runs[2].metrics
	hedged := fmt.Sprintf("the hedge nearly always drew a healthy 5 ms answer, so the calls of 0.5 s or more fell to %.0f, for %.0f hedges in %.0f calls.", hedge["slow"], hedge["hedges"], hedge["calls"])
	if hedge["slow"] >= plain["slow"] {
		hedged = fmt.Sprintf("here that did not cut the slow calls (%.0f of 0.5 s or more, for %.0f hedges in %.0f calls): the delay, the host's recent p99, ended the run at %s.", hedge["slow"], hedge["hedges"], hedge["calls"], msSp(hedge["delay"]))
	}
	sc.explain = append(sc.explain, fmt.Sprintf("The plain client waited the full second on every faulted attempt: %.0f of its %.0f calls took 0.5 s or more, so its p99.9 is the fault's second. Retrying only changes nothing here: a 1 s answer is a success, far inside the 10 s attempt timeout, and a timeout short enough to cut it would still cost each such call that timeout and a retry. Hedging sent a second attempt once one had waited the host's recent p99 (at least 8 ms); %s",
		plain["slow"], plain["calls"], hedged))
	if floor := float64(tailHedge.MinDelay) / float64(time.Millisecond); hedge["delay"] > 2*floor {
		sc.explain = append(sc.explain, fmt.Sprintf("Why hedging's p99 and p99.9 (%s, %s) sit well above the healthy 5 ms: a call waits the hedge delay before its hedge goes, and the delay is the host's recent p99, which ended this run at %s, not the %.0f ms floor. The faults alone put 1 %% of attempts at a second; a loaded machine's own stalls, which slow a few attempts of every client, push the p99 it measures up further.",
			msSp(hedge["p99"]), msSp(hedge["p999"]), msSp(hedge["delay"]), floor))
	}
	return sc, nil
}

func (l *lab) tailRun(ctx context.Context, r *tailRun, url string, start time.Time, length time.Duration) error {
	base := loopbackTransport()
	defer base.CloseIdleConnections()
	up, err := faultyUpstream(base)
	if err != nil {
		return err
	}
	defer up.CloseIdleConnections()
	r.up = &counted{next: up, tl: r.tl}
	c, bw, err := r.client(r.up)
	if err != nil {
		return err
	}
	r.bw = bw
	if bw != nil {
		defer bw.CloseIdleConnections()
	}
	// Calls still waiting when the run ends plus a fault's second are cut
	// off then and count as errors.
	runCtx, cancel := context.WithDeadline(ctx, start.Add(length+tailSlow+500*time.Millisecond))
	defer cancel()
	time.Sleep(time.Until(start))
	openLoop(runCtx, l.set.load, length, 4000, func(ctx context.Context, i int, at time.Time, dropped bool) {
		r.tl.count("calls", at)
		if dropped {
			r.errs.Add(1)
			return
		}
		code, body, err := send(ctx, c, http.MethodGet, url+"/item/"+strconv.Itoa(i))
		d := time.Since(at)
		if err != nil || code != http.StatusOK || string(body) != "ok" {
			r.errs.Add(1)
		}
		r.tl.latency("p99", at, d)
		r.mu.Lock()
		r.lat = append(r.lat, float64(d)/float64(time.Millisecond))
		r.mu.Unlock()
	})
	return nil
}
