package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/bulwark-http/bulwark"
	bwserver "github.com/bulwark-http/bulwark/server"
)

// A chain of services: a gateway calls checkout, checkout calls tax, each
// with its own client, and tax answers 503 at once for 2 s. Plain clients
// that each retry twice multiply the load at the bottom (3 × 3 × 3 for
// three tiers); bulwark with package defaults at every tier and the
// server half (server.DeadlineHandler) at every service retries at one
// layer only, the one nearest tax: a failure the tier below already dealt
// with comes up marked Bulwark-No-Retry: below, and no tier above retries
// it or trips on it. The chain's timings are not scaled: the package
// defaults (a breaker's first open time of 1 s, say) are not, and the blip
// is measured against them. A -duration other than the default 9 s
// stretches or shrinks the four phases alike.
const (
	chainWarm  = 3 * time.Second // healthy, before the blip: bulwark learns each hop's latency
	chainBlip  = 2 * time.Second
	chainAfter = 4 * time.Second
	chainLate  = 1500 * time.Millisecond // from when after the blip ≥ 99 % should be answered
)

// chainSpec is the scenario's entry in the registry.
var chainSpec = spec{
	key:   "chain",
	title: "8. A chain of services: gateway → checkout → tax, tax fails for 2 s",
	blurb: "three services in a chain, each calling the next with its own client; tax answers 503 at once for 2 s: plain clients retrying at every tier against bulwark with the server half at every service",
	run:   (*lab).chain,
	verdict: func(sc *scenario) string {
		plain, bw := sc.runs[0].metrics, sc.runs[1].metrics
		return fmt.Sprintf("while tax failed, it received %.2f requests per call offered at the gateway with bulwark at every tier, %.2f with plain clients retrying at every tier; answered during the blip: bulwark %s, plain %s; after it: bulwark %s, plain %s (late after it: bulwark %s, plain %s).",
			bw["load_blip"], plain["load_blip"], pctSp(bw["ok_blip"]), pctSp(plain["ok_blip"]),
			pctSp(bw["ok_after"]), pctSp(plain["ok_after"]), pctSp(bw["ok_late"]), pctSp(plain["ok_late"]))
	},
}

// retrying3 is the plain clients' retry: up to 3 attempts of a request
// that failed with an error or a 5xx, at once, no backoff, no budget, as
// a hand-written retry loop does.
type retrying3 struct{ base http.RoundTripper }

func (r retrying3) RoundTrip(req *http.Request) (*http.Response, error) {
	var (
		resp *http.Response
		err  error
	)
	for attempt := 1; attempt <= 3; attempt++ {
		resp, err = r.base.RoundTrip(req)
		if err == nil && resp.StatusCode < 500 || attempt == 3 || req.Context().Err() != nil {
			break
		}
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	return resp, err
}

type chainRun struct {
	bulwark bool
	tl      *timeline
	// Counted by when the gateway's call started: during the blip, in
	// the 4 s after it, and from 1.5 s after it.
	offeredBlip, okBlip   atomic.Int64
	after, okAfter        atomic.Int64
	late, okLate          atomic.Int64
	taxBlip               atomic.Int64 // requests tax received during the blip
	passedUp, tierRetries atomic.Int64 // bulwark: answers passed up to the gateway's caller; retries above tax
}

func (l *lab) chain(ctx context.Context) (*scenario, error) {
	s := l.set
	def := chainWarm + chainBlip + chainAfter
	length := s.runLen(def)
	part := func(d time.Duration) time.Duration { return time.Duration(float64(d) * float64(length) / float64(def)) }
	blipFrom, blipTo, after, late := part(chainWarm), part(chainWarm+chainBlip), part(chainAfter), part(chainLate)
	sc := &scenario{
		length: length,
		headings: map[string]string{
			"tax recv": "Requests tax received (req/s)",
			"ok":       "Gateway calls answered ok",
		},
		marks: []mark{{blipFrom, blipTo, "tax 503s"}},
		intro: []string{
			fmt.Sprintf("three services on 127.0.0.1, gateway → checkout → tax, each calling the next with its own client; %.0f req/s offered to the gateway's caller, open loop; tax answers 503 at once from %.1fs to %.1fs; the two runs side by side, each with its own services; \"after the blip\" is the %.1fs after it, \"late\" from %.1fs after it", s.load, blipFrom.Seconds(), blipTo.Seconds(), after.Seconds(), late.Seconds()),
			"plain: every tier's client retries a failure twice at once, as a hand-written loop does; bulwark: package defaults at every tier, and server.DeadlineHandler (the server half) at every service. Times are not scaled: the package defaults are not",
		},
	}
	start := time.Now().Add(100 * time.Millisecond)
	width := 100 * time.Millisecond
	runs := []*chainRun{{bulwark: false}, {bulwark: true}}
	for _, r := range runs {
		r.tl = newTimeline(start, width, length+time.Second)
		r.tl.define("tax recv", kindLoad, true, true)
		r.tl.define("ok", kindRate, true, true)
	}
	if err := l.sideBySide("chain: plain and bulwark side by side", length, len(runs), func(i int) error {
		return l.chainRun(ctx, runs[i], start, length, blipFrom, blipTo, after, late)
	}); err != nil {
		return nil, err
	}
	share := func(ok, n *atomic.Int64) float64 { return float64(ok.Load()) / max(float64(n.Load()), 1) }
	for _, r := range runs {
		out := &run{tl: r.tl}
		if r.bulwark {
			out.name, out.short = "bulwark at every tier, package defaults, the server half at every service", "bulwark"
		} else {
			out.name, out.short = "plain clients, 3 attempts at every tier, no backoff", "plain"
		}
		m := map[string]float64{
			"load_blip": float64(r.taxBlip.Load()) / max(float64(r.offeredBlip.Load()), 1),
			"ok_blip":   share(&r.okBlip, &r.offeredBlip),
			"ok_after":  share(&r.okAfter, &r.after),
			"ok_late":   share(&r.okLate, &r.late),
			"passed_up": float64(r.passedUp.Load()),
			"retries":   float64(r.tierRetries.Load()),
		}
		out.metrics = m
		out.headline = []stat{
			{"tax requests per call offered, during the blip", fmt.Sprintf("%.2f", m["load_blip"])},
			{"answered during the blip", pctSp(m["ok_blip"])},
			{"answered after it", pctSp(m["ok_after"])},
			{"answered late after it", pctSp(m["ok_late"])},
		}
		if r.bulwark {
			out.headline = append(out.headline, stat{"gateway calls answered with a failure passed up from below", fmt.Sprintf("%.0f", m["passed_up"])})
		}
		sc.runs = append(sc.runs, out)
	}
	plain, bw := sc.runs[0].metrics, sc.runs[1].metrics
	sc.explain = append(sc.explain,
		fmt.Sprintf("Plain clients retry at every tier, so each call offered became up to 27 at tax: %.1f on average during the blip. bulwark's checkout client is the one that retries (within its budget) and the one whose breaker trips; its service then answers 503 marked Bulwark-No-Retry: below, which the gateway's client neither retries nor counts against checkout (%.0f such answers reached the gateway's caller), so tax received %.2f per call offered.",
			plain["load_blip"], bw["passed_up"], bw["load_blip"]),
		"When tax recovers, the one tripped breaker finds it within a tenth of its open time (a probe on a timer), and no breaker above it has tripped, so the chain answers again at once.")
	return sc, nil
}

func (l *lab) chainRun(ctx context.Context, r *chainRun, start time.Time, length, blipFrom, blipTo, after, late time.Duration) error {
	inBlip := func(t time.Time) bool { return !t.Before(start.Add(blipFrom)) && t.Before(start.Add(blipTo)) }
	wrap := func(h http.Handler) http.Handler {
		if r.bulwark {
			return bwserver.DeadlineHandler(h, bwserver.DeadlineOptions{})
		}
		return h
	}
	var clients []*bulwark.Transport
	var bases []*http.Transport
	defer func() {
		for _, b := range bases {
			b.CloseIdleConnections()
		}
	}()
	newClient := func() (*http.Client, error) {
		base := loopbackTransport()
		bases = append(bases, base)
		if !r.bulwark {
			return &http.Client{Transport: retrying3{base}}, nil
		}
		bw, err := bulwark.New(bulwark.Config{Base: base})
		if err != nil {
			return nil, err
		}
		clients = append(clients, bw)
		return &http.Client{Transport: bw}, nil
	}
	tax, err := startServer(func(srv *server) http.Handler {
		return wrap(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			now := time.Now()
			r.tl.count("tax recv", now)
			if inBlip(now) {
				r.taxBlip.Add(1)
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			_, _ = io.WriteString(w, "ok")
		}))
	})
	if err != nil {
		return err
	}
	defer tax.close()
	below := tax.url + "/tax"
	// checkout, then the gateway: each calls the one below it.
	for _, name := range []string{"checkout", "gateway"} {
		c, err := newClient()
		if err != nil {
			return err
		}
		srv, err := startServer(func(*server) http.Handler { return wrap(relay(c, below)) })
		if err != nil {
			return err
		}
		defer srv.close()
		below = srv.url + "/" + name
	}
	top, err := newClient()
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithDeadline(ctx, start.Add(length+5*time.Second))
	defer cancel()
	time.Sleep(time.Until(start))
	afterFrom, lateFrom, afterTo := start.Add(blipTo), start.Add(blipTo+late), start.Add(blipTo+after)
	openLoop(runCtx, l.set.load, length, 4000, func(ctx context.Context, i int, at time.Time, dropped bool) {
		ok := false
		if !dropped {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second) // the caller's patience
			code, _, err := send(cctx, top, http.MethodGet, below+"?n="+strconv.Itoa(i))
			cancel()
			ok = err == nil && code == http.StatusOK
		}
		r.tl.outcome("ok", at, ok)
		count := func(n, okN *atomic.Int64) {
			n.Add(1)
			if ok {
				okN.Add(1)
			}
		}
		switch {
		case inBlip(at):
			count(&r.offeredBlip, &r.okBlip)
		case !at.Before(afterFrom) && at.Before(afterTo):
			count(&r.after, &r.okAfter)
			if !at.Before(lateFrom) {
				count(&r.late, &r.okLate)
			}
		}
	})
	for _, c := range clients {
		for _, h := range c.Snapshot().Hosts {
			if h.Budget != nil && h.Host != tax.host {
				r.tierRetries.Add(h.Budget.Retries)
			}
		}
	}
	if len(clients) > 0 {
		for _, h := range clients[len(clients)-1].Snapshot().Hosts {
			r.passedUp.Add(int64(h.PassedUp))
		}
	}
	return nil
}

// relay is a middle service: it calls below with the request's context
// and answers 200 when that answered 200, 503 otherwise.
func relay(c *http.Client, below string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		code, _, err := send(req.Context(), c, http.MethodGet, below)
		if err != nil || code != http.StatusOK {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
}
