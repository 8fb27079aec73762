package main

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/bulwark-http/bulwark"
	bwserver "github.com/bulwark-http/bulwark/server"
)

// The example of Google's Site Reliability Engineering book (chapter
// "Addressing Cascading Failures"): 5 % of calls never complete. With a
// 100 s deadline they pile up on a bounded server's threads until it
// serves mostly errors; with a deadline near the healthy p99.9 each costs
// a thread for a moment.
const (
	refSREThreads   = 1000
	sreDivisor      = 20 // lab workers = the SRE book's threads / sreDivisor
	refLongDL       = 100 * time.Second
	refSREHealthy   = 40 * time.Millisecond
	refSREMinDL     = 150 * time.Millisecond
	hangEvery       = 20 // one call in 20 (5 %) never completes
	sreQueuePerCent = 50 // queue ≤ 50 % of threads, the SRE book's advice
	sreCalRounds    = 3  // calibrations, of which sreP999 takes the median
)

// deadlinesSpec is the scenario's entry in the registry.
var deadlinesSpec = spec{
	key:   "deadlines",
	title: "3. Deadlines: 5% of calls never complete",
	blurb: "5% of calls never complete: a plain client's 100 s-style deadline against bulwark's near the healthy p99.9",
	run:   (*lab).deadlines,
	verdict: func(sc *scenario) string {
		long, short := sc.runs[0].metrics, sc.runs[1].metrics
		about := ""
		if short["last"] <= 0.07 {
			about = " (about the 5 % that never complete)"
		}
		return fmt.Sprintf("in the last second bulwark's deadline near the p99.9 failed %s of calls%s while the plain client's 100 s-style deadline failed %s.",
			pctSp(short["last"]), about, pctSp(long["last"]))
	},
}

type deadlineRun struct {
	short    bool
	tl       *timeline
	workers  chan struct{}
	queued   atomic.Int64
	maxQueue int64
	hung     atomic.Int64 // workers held by calls that never complete, now
	maxHung  atomic.Int64
	rejected atomic.Int64 // 503s for want of a worker
	n        atomic.Int64
}

func (l *lab) deadlines(ctx context.Context) (*scenario, error) {
	s := l.set
	length := s.runLen(5 * time.Second)
	workers := refSREThreads / sreDivisor
	sc := &scenario{
		length: length,
		headings: map[string]string{
			"ok":  "Calls answered ok",
			"503": "Calls refused for want of a free worker (503/s)",
		},
		intro: []string{
			fmt.Sprintf("server: %d workers (the SRE book's %d threads ÷ %d), queue ≤ %d%% of them, then 503; healthy calls take %v; every %dth call never completes",
				workers, refSREThreads, sreDivisor, sreQueuePerCent, s.ref(refSREHealthy), hangEvery),
			fmt.Sprintf("%.0f req/s offered; the server reads the caller's deadline with bulwark's server.DeadlineHandler and frees a worker when it passes", s.load),
		},
	}
	p999, err := l.sreP999(ctx)
	if err != nil {
		return nil, err
	}
	// Rounded up: a deadline below the measured p99.9 would cut healthy calls.
	shortDL := roundUp(max(s.ref(refSREMinDL), p999), time.Millisecond)
	longDL := s.ref(refLongDL)
	sc.intro = append(sc.intro, fmt.Sprintf("healthy p99.9 measured %v → bulwark's deadline %v (the larger of it and 150 ms scaled, rounded up; bulwark's timeout only, its other layers off); the plain client's deadline %v (http.Client.Timeout, the SRE book's 100 s scaled)",
		roundUp(p999, 100*time.Microsecond), shortDL, longDL))

	start := time.Now().Add(50 * time.Millisecond)
	runs := []*deadlineRun{{short: false}, {short: true}}
	for _, r := range runs {
		r.tl = newTimeline(start, 100*time.Millisecond, length+shortDL+time.Second)
		r.workers = make(chan struct{}, workers)
		r.maxQueue = int64(workers * sreQueuePerCent / 100)
		r.tl.define("offered", kindLoad, false, false)
		r.tl.define("ok", kindRate, true, true)
		r.tl.define("503", kindLoad, true, true)
	}
	if err := l.sideBySide("deadlines: 100 s-style and near-p99.9 side by side", length+shortDL, len(runs), func(i int) error {
		dl := longDL
		if runs[i].short {
			dl = shortDL
		}
		return l.deadlineRun(ctx, runs[i], start, length, dl)
	}); err != nil {
		return nil, err
	}
	endB := runs[0].tl.at(length)
	lastB := runs[0].tl.at(length - time.Second)
	for _, r := range runs {
		out := &run{tl: r.tl}
		if r.short {
			out.name, out.short = "bulwark: deadline near the p99.9 ("+shortDL.String()+")", "bulwark p99.9"
		} else {
			out.name, out.short = "plain client: 100 s-style deadline ("+longDL.String()+")", "plain 100s"
		}
		all, _ := r.tl.get("ok").value(0, endB, r.tl.width)
		last, _ := r.tl.get("ok").value(lastB, endB, r.tl.width)
		out.headline = []stat{
			{"error rate, whole run", pct(1 - all)},
			{"error rate, last second", pct(1 - last)},
			{"503s (no worker free)", strconv.FormatInt(r.rejected.Load(), 10)},
			{"most workers held by hung calls", fmt.Sprintf("%d of %d", r.maxHung.Load(), cap(r.workers))},
		}
		out.metrics = map[string]float64{"errors": 1 - all, "last": 1 - last, "held": float64(r.maxHung.Load()) / float64(cap(r.workers))}
		sc.runs = append(sc.runs, out)
	}
	return sc, nil
}

// sreHandler is the bounded server. Every hangEvery-th call never
// completes: it holds its worker until the caller's deadline, carried in
// by bwserver.DeadlineHandler, ends it (or the lab shuts down).
func (r *deadlineRun) sreHandler(srv *server, s settings) http.Handler {
	return bwserver.DeadlineHandler(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if r.queued.Add(1) > r.maxQueue+int64(cap(r.workers)) {
			r.queued.Add(-1)
			r.rejected.Add(1)
			r.tl.count("503", time.Now())
			http.Error(w, "overloaded", http.StatusServiceUnavailable)
			return
		}
		defer r.queued.Add(-1)
		select {
		case r.workers <- struct{}{}:
		case <-req.Context().Done():
			return
		}
		defer func() { <-r.workers }()
		if r.n.Add(1)%hangEvery == 0 {
			h := r.hung.Add(1)
			for m := r.maxHung.Load(); h > m && !r.maxHung.CompareAndSwap(m, h); m = r.maxHung.Load() {
			}
			select {
			case <-req.Context().Done():
			case <-srv.stop:
			}
			r.hung.Add(-1)
			// The deadline passed (DeadlineHandler ends the context a little
			// before the caller gives up): say so rather than an empty 200.
			http.Error(w, "deadline exceeded", http.StatusGatewayTimeout)
			return
		}
		if !srv.sleep(req.Context(), jitter(s.ref(refSREHealthy))) {
			http.Error(w, "deadline exceeded", http.StatusGatewayTimeout)
			return
		}
		_, _ = w.Write([]byte("ok"))
	}), bwserver.DeadlineOptions{Max: s.ref(refLongDL) + time.Second})
}

// sreP999 measures the healthy server's p99.9: the median of
// sreCalRounds rounds of 400 calls. The p99.9 of 400 calls is the slowest
// of them, so a single stall of a loaded machine (a burst of other
// processes, a GC pause under -race) during a round sets that round's
// value; the median of three ignores one stalled round. One stall must not
// make the "short" deadline seconds long: at that length the hung calls
// hold the server's workers as the long deadline's do, and the run shows
// nothing.
func (l *lab) sreP999(ctx context.Context) (time.Duration, error) {
	healthy := l.set.ref(refSREHealthy)
	srv, err := startServer(func(s *server) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			s.sleep(r.Context(), jitter(healthy))
			_, _ = w.Write([]byte("ok"))
		})
	})
	if err != nil {
		return 0, err
	}
	defer srv.close()
	tr := loopbackTransport()
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	var rounds [sreCalRounds]float64
	for i := range rounds {
		d, err := calibrate(ctx, c, srv.url+"/", 400, 8)
		if err != nil {
			return 0, err
		}
		rounds[i] = float64(d)
	}
	return time.Duration(percentile(rounds[:], 0.5)), nil
}

func (l *lab) deadlineRun(ctx context.Context, r *deadlineRun, start time.Time, length, dl time.Duration) error {
	srv, err := startServer(func(srv *server) http.Handler { return r.sreHandler(srv, l.set) })
	if err != nil {
		return err
	}
	defer srv.close()
	tr := loopbackTransport()
	defer tr.CloseIdleConnections()
	var c *http.Client
	if r.short {
		// Only the deadline differs between the two runs, so bulwark's other
		// layers are off. Its default breaker would otherwise decide the run
		// on a loaded machine: its slow-call threshold is half of Attempt
		// (15 ms for a 30 ms deadline) and its window the last 100 calls,
		// so one stall of the machine, in which every call in flight runs
		// past its deadline, trips it; and while it is open (1 s, doubling
		// on each trip in a row) every call but a probe fails at once, so
		// the run would measure the breaker, not the deadline. A retry seldom
		// fits in Total = Attempt, and the plain client has no retries and
		// no bulkhead either.
		c, err = bulwark.NewClient(bulwark.Config{Base: tr, Upstreams: map[string]bulwark.Policy{
			srv.host: {
				Timeout:  bulwark.Timeout{Attempt: dl, Total: dl},
				Breaker:  bulwark.Breaker{Disabled: true},
				Retry:    bulwark.Retry{Disabled: true},
				Bulkhead: bulwark.Bulkhead{Disabled: true},
			},
		}})
		if err != nil {
			return err
		}
	} else {
		// The long deadline is a plain client's; bulwark would have sent it
		// in the deadline header too, but the point is its length.
		c = &http.Client{Transport: tr, Timeout: dl}
	}
	// Calls still waiting when the run ends are cut off then, and count as
	// errors: their users saw nothing.
	runCtx, cancel := context.WithDeadline(ctx, start.Add(length+dl/100+500*time.Millisecond))
	defer cancel()
	time.Sleep(time.Until(start))
	openLoop(runCtx, l.set.load, length, 4000, func(ctx context.Context, i int, at time.Time, dropped bool) {
		r.tl.count("offered", at)
		ok := false
		if !dropped {
			code, body, err := send(ctx, c, http.MethodGet, srv.url+"/q/"+strconv.Itoa(i))
			ok = err == nil && code == http.StatusOK && string(body) == "ok"
		}
		r.tl.outcome("ok", at, ok)
	})
	return nil
}
