package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bulwark-http/bulwark"
)

// Client-side adaptive throttling, from Google's Site Reliability
// Engineering book (chapter 21, "Handling Overload"): a backend that can
// accept X requests a second answers the rest with a 503 at once, and its
// callers offer several times X. Rejecting costs the backend too (here a
// cheap 503, in real services often as much as serving), and a plain
// client sends every request whatever the answers. With the SRE book's
// throttle each client refuses locally, with probability
// max(0, (requests − K·accepts) ÷ (requests + 1)) over a recent window,
// so the backend receives about K times what it accepts.
const (
	throttleOffered = 5 // the callers offer this many times what the backend accepts
	throttleK       = 2 // the SRE book's K
)

// throttleSpec is the scenario's entry in the registry.
var throttleSpec = spec{
	key:   "throttle",
	title: "7. Throttling: callers offer five times what the backend accepts",
	blurb: "a backend accepts X req/s and answers the rest 503 at once; callers offer 5 X: plain against bulwark's SRE-style adaptive throttle (K = 2)",
	run:   (*lab).throttle,
	verdict: func(sc *scenario) string {
		plain, bw := sc.runs[0].metrics, sc.runs[1].metrics
		return fmt.Sprintf("against a backend that accepts %.0f req/s, bulwark's throttle (K = 2) sent %.2f requests per request accepted (%.0f req/s) while the plain client sent %.2f (%.0f req/s); both had %.0f req/s accepted.",
			bw["capacity"], bw["ratio"], bw["received"], plain["ratio"], plain["received"], (bw["accepted"]+plain["accepted"])/2)
	},
}

// throttleWindow is the throttle's counting window at s: the SRE book's
// two minutes would outlast the run, so 8 s, scaled, at least 200 ms.
func throttleWindow(s settings) time.Duration {
	return max(s.ref(8*time.Second), 200*time.Millisecond).Round(10 * time.Millisecond)
}

// throttlePolicy is what bulwark does in this scenario: the throttle alone.
// Retries are off, since a retry of a 503 from an overloaded backend is
// more load on it; the breaker is off too, since a backend that accepts a
// fifth of what it is offered would trip it and the scenario would
// measure the breaker.
func throttlePolicy(s settings) bulwark.Policy {
	return bulwark.Policy{
		Throttle: bulwark.Throttle{Enabled: true, K: throttleK, Window: throttleWindow(s)},
		Breaker:  bulwark.Breaker{Disabled: true},
		Retry:    bulwark.Retry{Disabled: true, NoPushback: true},
		Bulkhead: bulwark.Bulkhead{Disabled: true},
	}
}

type throttleRun struct {
	bulwark  bool
	tl       *timeline
	received atomic.Int64 // after the warm-up
	accepted atomic.Int64 // after the warm-up
	local    atomic.Int64 // refused by the throttle, after the warm-up
}

func (l *lab) throttle(ctx context.Context) (*scenario, error) {
	s := l.set
	length := s.runLen(4 * time.Second)
	warm := length / 4
	capacity := s.load / throttleOffered
	sc := &scenario{
		length: length,
		headings: map[string]string{
			"recv":     "Requests the backend received (req/s)",
			"accepted": "Requests the backend accepted (req/s), and bulwark's local refusals",
		},
		intro: []string{
			fmt.Sprintf("backend: accepts %.0f req/s (a token bucket) and answers every other request 503 at once; %.0f req/s offered to each client, open loop, the two runs side by side, each with its own backend", capacity, s.load),
			fmt.Sprintf("bulwark: the adaptive throttle of Google's SRE book (chapter 21), K = %d, counting over %v; retries, breaker and bulkhead off. The figures leave out the first %.1fs, while the throttle's window fills", throttleK, throttleWindow(s), warm.Seconds()),
		},
	}
	start := time.Now().Add(100 * time.Millisecond)
	width := 100 * time.Millisecond
	runs := []*throttleRun{{bulwark: false}, {bulwark: true}}
	for _, r := range runs {
		r.tl = newTimeline(start, width, length+time.Second)
		r.tl.define("recv", kindLoad, true, true)
		r.tl.define("accepted", kindLoad, true, true)
		if r.bulwark {
			r.tl.define("refused locally", kindLoad, true, true)
		}
	}
	if err := l.sideBySide("throttle: plain and bulwark side by side", length, len(runs), func(i int) error {
		return l.throttleRun(ctx, runs[i], start, length, warm, capacity)
	}); err != nil {
		return nil, err
	}
	secs := (length - warm).Seconds()
	for _, r := range runs {
		out := &run{tl: r.tl}
		if r.bulwark {
			out.name, out.short = "bulwark: adaptive throttle, K = 2", "bulwark"
		} else {
			out.name, out.short = "plain http.Client", "plain"
		}
		rcv, acc, loc := float64(r.received.Load()), float64(r.accepted.Load()), float64(r.local.Load())
		ratio := rcv / max(acc, 1)
		out.headline = []stat{
			{"backend received (req/s)", fmt.Sprintf("%.0f", rcv/secs)},
			{"backend accepted (req/s)", fmt.Sprintf("%.0f", acc/secs)},
			{"received ÷ accepted", fmt.Sprintf("%.2f", ratio)},
			{"refused locally, never sent (req/s)", fmt.Sprintf("%.0f", loc/secs)},
		}
		out.metrics = map[string]float64{"received": rcv / secs, "accepted": acc / secs, "ratio": ratio, "local": loc / secs, "capacity": capacity}
		sc.runs = append(sc.runs, out)
	}
	plain, bw := sc.runs[0].metrics, sc.runs[1].metrics
	sc.explain = append(sc.explain, fmt.Sprintf("The backend accepts the same %.0f req/s from both: the throttle does not get more calls answered, it stops sending the ones that would have been refused. The plain client kept sending all %.0f req/s, %.2f for each request accepted; bulwark's throttle refused %.0f req/s locally, without a network call, and the backend received %.2f for each one accepted, about K = %d. A backend whose refusals cost it work (a parsed request, a TLS handshake, a queue slot) gets that work back.",
		capacity, plain["received"], plain["ratio"], bw["local"], bw["ratio"], throttleK))
	return sc, nil
}

func (l *lab) throttleRun(ctx context.Context, r *throttleRun, start time.Time, length, warm time.Duration, capacity float64) error {
	counting := func(t time.Time) bool { return !t.Before(start.Add(warm)) }
	var (
		mu     sync.Mutex
		burst  = max(1, capacity/10)
		tokens = burst
		last   = start
	)
	srv, err := startServer(func(srv *server) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			now := time.Now()
			r.tl.count("recv", now)
			mu.Lock()
			if now.After(last) {
				tokens = min(burst, tokens+now.Sub(last).Seconds()*capacity)
				last = now
			}
			ok := tokens >= 1
			if ok {
				tokens--
			}
			mu.Unlock()
			if counting(now) {
				r.received.Add(1)
			}
			if !ok {
				http.Error(w, "over capacity", http.StatusServiceUnavailable)
				return
			}
			r.tl.count("accepted", now)
			if counting(now) {
				r.accepted.Add(1)
			}
			_, _ = w.Write([]byte("ok"))
		})
	})
	if err != nil {
		return err
	}
	defer srv.close()
	base := loopbackTransport()
	defer base.CloseIdleConnections()
	c := &http.Client{Transport: base}
	if r.bulwark {
		bw, err := bulwark.New(bulwark.Config{Base: base, Default: throttlePolicy(l.set)})
		if err != nil {
			return err
		}
		defer bw.CloseIdleConnections()
		c = &http.Client{Transport: bw}
	}
	runCtx, cancel := context.WithDeadline(ctx, start.Add(length+2*time.Second))
	defer cancel()
	time.Sleep(time.Until(start))
	openLoop(runCtx, l.set.load, length, 4000, func(ctx context.Context, i int, at time.Time, dropped bool) {
		if dropped {
			return
		}
		_, _, err := send(ctx, c, http.MethodGet, srv.url+"/q/"+strconv.Itoa(i))
		if errors.Is(err, bulwark.ErrThrottled) {
			r.tl.count("refused locally", at)
			if counting(at) {
				r.local.Add(1)
			}
		}
	})
	return nil
}
