package debug

import (
	_ "embed"
	"fmt"
	"html/template"
	"reflect"
	"slices"
	"strconv"
	"time"

	"github.com/bulwark-http/bulwark"
)

// page.html reads the Snapshot's fields directly: showing a new field of a
// layer's snapshot type takes a line there and nothing here. The funcs
// and the view below only derive what a template cannot (the ranking,
// shares and their colours, charts, sums, units).
//
//go:embed page.html
var pageHTML string

var pageTemplate = template.Must(template.New("page").Funcs(template.FuncMap{
	"sum":      sum,
	"ts":       stamp,
	"pct":      func(p float64) float64 { return 100 * p },
	"ms":       millis,
	"priority": func(i int) string { return bulwark.Priority(i).String() },
	"in":       func(t, now time.Time) string { return seconds(t.Sub(now)) },
	"ago":      ago,
}).Parse(pageHTML))

// ago is how long before now t was, for a person: "12.3 s ago", "4 min 2 s
// ago", "just now".
func ago(t, now time.Time) string {
	if d := now.Sub(t); d > 0 {
		return seconds(d) + " ago"
	}
	return "just now"
}

// harm is how badly a host fares, as the page ranks and colours it.
type harm int

const (
	calm harm = iota // folded at the bottom of the page
	warn             // amber: worth a look
	bad              // red: callers are failing or refused now
)

func (h harm) String() string { return [...]string{"calm", "warn", "bad"}[h] }

// The shares of the breaker window at which the page turns amber and red,
// whatever the breaker's own thresholds and MinCalls: a host failing 83 of
// 83 calls is red before its breaker has a rate to trip on.
const (
	failWarn, failBad = 0.05, 0.5
	slowWarn, slowBad = 0.1, 0.5
)

// share is a part of the breaker window (failed or slow calls) as the page
// shows it.
type share struct {
	N, Of int64
	Pct   float64 // 0 to 100; 0 when Of is 0
	Harm  harm    // calm when Of is 0
}

func newShare(n, of int64, warnAt, badAt float64) share {
	s := share{N: n, Of: of}
	if of == 0 {
		return s
	}
	f := float64(n) / float64(of)
	s.Pct = 100 * f
	switch {
	case f >= badAt:
		s.Harm = bad
	case f >= warnAt:
		s.Harm = warn
	}
	return s
}

// view is what page.html draws: the Page, with its hosts ranked by harm.
// The JSON is the Page alone, in the Snapshot's order.
type view struct {
	Page
	Hot      []hostView // warn and bad, worst first
	Calm     []hostView // in the Snapshot's order
	CalmOpen bool       // unfold the calm hosts (?calm=open)
}

// CalmRows is the folded table's rows, one a calm host: its name and its
// Summary, escaped here. They are built in Go rather than in page.html
// for the same reason as the charts (sparkline.svg): on a page of 1,000
// hosts, most of them calm, the template's reflection over three actions
// a row was most of the page's cost. template.HTMLEscapeString escapes
// what could end the element or the double-quoted attribute (< > & ' "
// and NUL), as page.html's escaping would.
func (v view) CalmRows() template.HTML {
	b := make([]byte, 0, 200*len(v.Calm))
	for _, h := range v.Calm {
		host := template.HTMLEscapeString(h.Host)
		b = append(b, `<tr class="host calm" data-host="`...)
		b = append(b, host...)
		b = append(b, `"><td>`...)
		b = append(b, host...)
		b = append(b, `</td><td>`...)
		b = append(b, template.HTMLEscapeString(h.Summary())...)
		b = append(b, "</td></tr>\n"...)
	}
	return template.HTML(b)
}

// The thresholds, for the page's legend.
func (view) FailWarn() float64 { return failWarn }
func (view) FailBad() float64  { return failBad }
func (view) SlowWarn() float64 { return slowWarn }
func (view) SlowBad() float64  { return slowBad }

// hostView is one host as the page draws it.
type hostView struct {
	bulwark.HostSnapshot
	Now        time.Time // the Page's Time, for countdowns
	Harm       harm
	Why        []string // what makes it warn or bad, worst first
	Fail, Slow share    // of the breaker window; zero without a breaker
	// Spark is the chart of the host's history, drawn for hosts in
	// trouble only: a calm host is one row of a folded table.
	Spark template.HTML
	// Rate is the refusals and fallback answers per second over the
	// last rateSpan of its history; drawn for hosts in trouble only.
	Rate rate
}

// rate is what a host's counts grew by per second, over Span.
type rate struct {
	Span            time.Duration // zero: fewer than two samples
	Refused, Served float64       // per second
	Calls           float64       // per second
	OK              share         // of the calls over Span that succeeded
	// RefusedBy is Refused by the layer that refused, indexed by layer.
	RefusedBy [numLayers]float64
	PassedUp  float64 // failures passed up from below, per second
}

// rateSpan is how far back the page's per-second rates look: long enough
// to smooth the second-by-second samples, short enough to show now.
const rateSpan = 10 * time.Second

// newRate is the growth per second of a history's counts over the last
// rateSpan (or all of it, if shorter).
func newRate(hist History) rate {
	n := len(hist.Samples)
	if n < 2 {
		return rate{}
	}
	last := hist.Samples[n-1]
	first := hist.Samples[n-2]
	for i := n - 2; i >= 0 && last.Time.Sub(hist.Samples[i].Time) <= rateSpan; i-- {
		first = hist.Samples[i]
	}
	span := last.Time.Sub(first.Time)
	if span <= 0 {
		return rate{}
	}
	per := func(a, b uint64) float64 {
		if b < a {
			return 0 // the host's state was made again (an eviction): no rate
		}
		return float64(b-a) / span.Seconds()
	}
	r := rate{Span: span, Refused: per(first.Refused, last.Refused), Served: per(first.Served, last.Served), Calls: per(first.Requests, last.Requests),
		PassedUp: per(first.PassedUp, last.PassedUp)}
	for l := range numLayers {
		r.RefusedBy[l] = per(*first.RefusedBy.of(l), *last.RefusedBy.of(l))
	}
	if last.Requests > first.Requests && last.Succeeded >= first.Succeeded {
		calls, ok := int64(last.Requests-first.Requests), int64(last.Succeeded-first.Succeeded)
		// The share that did not succeed, coloured as the breaker
		// window's failures are; shown as the share that did.
		r.OK = newShare(calls-ok, calls, failWarn, failBad)
		r.OK.N, r.OK.Pct = ok, 100-r.OK.Pct
	}
	return r
}

// The rows below are plain strings built here, each escaped by page.html
// as one action: a row of a dozen actions costs the template a dozen
// reflective calls, and on a page of many hosts in trouble those were
// most of its cost (BenchmarkPage1000Hosts).

// ChangeLines are the breaker's last state changes, newest first: "closed
// → open failure rate 60 % ≥ 50 % · 12.0 s ago".
func (h hostView) ChangeLines() []string {
	if h.Breaker == nil {
		return nil
	}
	cs := h.Breaker.Changes
	out := make([]string, len(cs))
	for i, c := range cs {
		out[len(cs)-1-i] = c.From.String() + " → " + c.To.String() + " " + c.Reason + " · " + ago(c.At, h.Now)
	}
	return out
}

// LastTripLine is the breaker's window at its last trip, why it tripped
// and when: "100 calls: 60 failed, 3 slow · failure rate 60 % ≥ 50 % ·
// 12.0 s ago (11:59:48.000 UTC)"; empty before any.
func (h hostView) LastTripLine() string {
	if h.Breaker == nil || h.Breaker.LastTrip == nil {
		return ""
	}
	t := h.Breaker.LastTrip
	return fmt.Sprintf("%d calls: %d failed, %d slow · %s · %s (%s UTC)", t.Calls, t.Failures, t.Slow, t.Reason, ago(t.At, h.Now), stamp(t.At))
}

// CallsLine is the host's calls since start by outcome: "1000: 900
// succeeded · 60 failed · 10 timed out · 25 refused"; empty before any.
func (h hostView) CallsLine() string {
	c := h.Calls
	if c.Calls == 0 {
		return ""
	}
	line := fmt.Sprintf("%d: %d succeeded · %d failed · %d timed out · %d refused", c.Calls, c.Succeeded, c.Failed, c.TimedOut, c.Refused)
	if c.PassedUp > 0 {
		line += fmt.Sprintf(" · %d passed up from below", c.PassedUp)
	}
	return line
}

// PassedUpLine is the host's answers that passed up a failure from a
// tier below it, their rate, and what that means for whoever is on call;
// empty before any. Such a host is amber, not red (newView): its callers
// fail, but the fault, and the retrying, are further down.
func (h hostView) PassedUpLine() string {
	if h.PassedUp == 0 {
		return ""
	}
	b := fmt.Appendf(nil, "%d failures passed up from below since start", h.PassedUp)
	if h.Rate.Span > 0 {
		b = fmt.Appendf(b, " · now %.1f/s (last %s)", h.Rate.PassedUp, h.Rate.SpanLine())
	}
	return string(append(b, " · not this host's fault: a service below it failed and was retried there if it could be; not retried here, not counted by this host's breaker or concurrency limit"...))
}

// FallbackLine is the fallback's answers since the policy was set, their
// rate, and the stale cache; empty without a fallback.
func (h hostView) FallbackLine() string {
	f := h.Fallback
	if f == nil {
		return ""
	}
	b := fmt.Appendf(nil, "%d final failures answered from the fallback since the policy was set", f.Served)
	if h.Rate.Span > 0 {
		b = fmt.Appendf(b, " · now %.1f/s", h.Rate.Served)
	}
	if f.StaleEntries > 0 {
		b = fmt.Appendf(b, " · stale cache %d answers, %d bytes, the oldest received %s", f.StaleEntries, f.StaleBytes, ago(f.StaleOldest, h.Now))
	}
	return string(b)
}

// LatencyLine is the host's recent latency percentiles: "p50 4.0 ms · p99
// 41.5 ms · p99.9 250.0 ms"; empty without them.
func (h hostView) LatencyLine() string {
	l := h.Latency
	if l == nil {
		return ""
	}
	return fmt.Sprintf("p50 %.1f ms · p99 %.1f ms · p99.9 %.1f ms", millis(l.P50), millis(l.P99), millis(l.P999))
}

// QuotaLine is the host's share of its fleet quota; empty without one.
func (h hostView) QuotaLine() string {
	q := h.Quota
	if q == nil {
		return ""
	}
	b := fmt.Appendf(nil, "%d tokens held", q.Tokens)
	if q.LeaseUntil.After(h.Now) {
		b = fmt.Appendf(b, " for %s", seconds(q.LeaseUntil.Sub(h.Now)))
	}
	return string(fmt.Appendf(b, " of %.0f/s for the fleet, shared by %d pods · demand here %.1f/s · %d refused · %d leases, %d failed",
		q.FleetRate, q.Pods, q.Demand, q.Refused, q.Leases, q.LeaseErrors))
}

// CallsLine is the calls a second, "20.0/s".
func (r rate) CallsLine() string { return strconv.FormatFloat(r.Calls, 'f', 1, 64) + "/s" }

// RefusedLine is the refusals a second, "4.0/s".
func (r rate) RefusedLine() string { return strconv.FormatFloat(r.Refused, 'f', 1, 64) + "/s" }

// SpanLine is the span the rates are over, "10 s".
func (r rate) SpanLine() string { return strconv.FormatFloat(r.Span.Seconds(), 'f', 0, 64) + " s" }

// millis is d in milliseconds.
func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// stamp is t as the page shows a clock time, "15:04:05.000" (UTC).
func stamp(t time.Time) string { return t.UTC().Format("15:04:05.000") }

// Summary is a calm host's one line: scheme, upstream, breaker window,
// the attempt timeout in force and where it comes from, requests in
// flight. It is a plain string, escaped by page.html, so a row
// of the folded table costs the template two actions, not a dozen.
func (h hostView) Summary() string {
	b := make([]byte, 0, 96)
	b = append(b, h.Scheme...)
	b = append(b, " · upstream "...)
	b = append(b, h.Upstream...)
	if br := h.Breaker; br != nil {
		b = fmt.Appendf(b, " · breaker %s, %d calls, %.0f %% failed, %.0f %% slow", br.State, br.Calls, h.Fail.Pct, h.Slow.Pct)
	}
	if l := h.Learned; l != nil && l.AttemptFrom != "" {
		b = fmt.Appendf(b, " · attempt timeout %.1f ms, %s", float64(l.AttemptTimeout)/float64(time.Millisecond), l.AttemptFrom)
	}
	b = fmt.Appendf(b, " · %d in flight", h.InFlight())
	if h.PassedUp > 0 {
		b = fmt.Appendf(b, " · %d failures passed up from below", h.PassedUp)
	}
	return string(b)
}

// layer is a layer that refuses requests, as the page counts refusals.
type layer int

const (
	layerBreaker layer = iota
	layerBulkhead
	layerBudget
	layerPushback
	layerThrottle
	layerTooShort
	numLayers
)

// layerNames are the layers as the page names their refusals.
var layerNames = [numLayers]string{"breaker open", "bulkhead full", "retry budget spent", "pushback", "throttle", "deadline too short"}

// of is the count of layer l.
func (r *Refusals) of(l layer) *uint64 {
	switch l {
	case layerBreaker:
		return &r.Breaker
	case layerBulkhead:
		return &r.Bulkhead
	case layerBudget:
		return &r.Budget
	case layerPushback:
		return &r.Pushback
	case layerThrottle:
		return &r.Throttle
	}
	return &r.DeadlineTooShort
}

// refusal is one layer's count of requests it refused.
type refusal struct {
	Layer string
	N     uint64
	id    layer
}

// Refusals are the host's refusals since its state was made, by the layer
// that refused (see refusals).
func (h hostView) Refusals() []refusal { return refusals(h.HostSnapshot) }

// RefusalsLine is the refused row: each layer's refusals since start, red
// when any, with its rate over the last rateSpan when the host has had
// any, then all layers' rate: "<span class="full">40 breaker open
// (4.0/s)</span> · <span>0 pushback</span> · <span class="rate">now
// 4.0/s in all</span> …". It is built here, unescaped, as the chart is:
// everything in it is a number this file formats or a fixed layer name,
// nothing from a request or a Snapshot's strings.
func (h hostView) RefusalsLine() template.HTML {
	rs := h.Refusals()
	if len(rs) == 0 {
		return ""
	}
	b := make([]byte, 0, 64*len(rs)+96)
	for i, r := range rs {
		if i > 0 {
			b = append(b, " · "...)
		}
		b = append(b, "<span"...)
		if r.N > 0 {
			b = append(b, ` class="full"`...)
		}
		b = append(b, '>')
		b = strconv.AppendUint(b, r.N, 10)
		b = append(b, ' ')
		b = append(b, layerNames[r.id]...)
		if r.N > 0 && h.Rate.Span > 0 {
			b = append(b, " ("...)
			b = strconv.AppendFloat(b, h.Rate.RefusedBy[r.id], 'f', 1, 64)
			b = append(b, "/s)"...)
		}
		b = append(b, "</span>"...)
	}
	if h.Rate.Span > 0 {
		b = append(b, ` · <span class="rate">now `...)
		b = append(b, h.Rate.RefusedLine()...)
		b = append(b, ` in all</span> <span class="muted">(last `...)
		b = append(b, h.Rate.SpanLine()...)
		b = append(b, ")</span>"...)
	}
	return template.HTML(b)
}

// refusals are h's refusals since its state was made, by the layer that
// refused, for each layer the host has: its routes' breakers added to its
// own breaker's, its instances' bulkheads to its bulkhead's.
func refusals(h bulwark.HostSnapshot) []refusal {
	var out []refusal
	if b := h.Breaker; b != nil || len(h.Routes) > 0 {
		var n uint64
		if b != nil {
			n = b.Refused
		}
		for _, r := range h.Routes {
			if r.Breaker != nil {
				n += r.Breaker.Refused
			}
		}
		out = append(out, refusal{layerNames[layerBreaker], n, layerBreaker})
	}
	if bhs := bulkheads(h); len(bhs) > 0 {
		var n uint64
		for _, bh := range bhs {
			n += bh.Refused
		}
		out = append(out, refusal{layerNames[layerBulkhead], n, layerBulkhead})
	}
	if b := h.Budget; b != nil {
		out = append(out, refusal{layerNames[layerBudget], b.Refused, layerBudget})
	}
	if p := h.Pushback; p != nil {
		out = append(out, refusal{layerNames[layerPushback], p.Refused, layerPushback})
	}
	if t := h.Throttle; t != nil {
		out = append(out, refusal{layerNames[layerThrottle], t.Refused, layerThrottle})
	}
	// The attempt deadline is on when a timeout is in force, or has
	// refused before an Update turned it off.
	if l := h.Learned; l != nil && l.AttemptFrom != "" || h.DeadlineTooShort > 0 {
		out = append(out, refusal{layerNames[layerTooShort], h.DeadlineTooShort, layerTooShort})
	}
	return out
}

// InFlight is the slots held in the host's bulkheads (its instances' for a
// balanced upstream).
func (h hostView) InFlight() int {
	n := 0
	for _, b := range bulkheads(h.HostSnapshot) {
		n += b.InFlight
	}
	return n
}

// newView ranks p's hosts: bad before warn before calm, and within a
// rank an open breaker first (it refuses every call), then by failure
// share, then by calls in the window; ties keep the Snapshot's order (by
// host).
func newView(p Page, span time.Duration) view {
	v := view{Page: p}
	hosts := make([]hostView, len(p.Snapshot.Hosts))
	for i, h := range p.Snapshot.Hosts {
		hv := assess(h, p.Time)
		if i < len(p.History) {
			if h.PassedUp > 0 || hv.Harm > calm {
				hv.Rate = newRate(p.History[i])
			}
			// A host that passes failures up from below fails its callers
			// but is not at fault: amber, so that it is seen, and never
			// red, so that the host at fault, further down, ranks first.
			if hv.Rate.PassedUp > 0 {
				hv.Harm = max(hv.Harm, warn)
				hv.Why = append(hv.Why, "failures passed up from below")
			}
			if hv.Harm > calm {
				hv.Spark = spark(h, p.History[i], p.Time, p.SampleEvery, span).svg()
			}
		}
		hosts[i] = hv
	}
	slices.SortStableFunc(hosts, func(a, b hostView) int {
		switch {
		case a.Harm != b.Harm:
			return int(b.Harm - a.Harm)
		case a.open() != b.open():
			if a.open() {
				return -1
			}
			return 1
		case a.Fail.Pct != b.Fail.Pct:
			if a.Fail.Pct > b.Fail.Pct {
				return -1
			}
			return 1
		}
		return int(b.Fail.Of - a.Fail.Of)
	})
	for _, h := range hosts {
		if h.Harm == calm {
			v.Calm = append(v.Calm, h)
		} else {
			v.Hot = append(v.Hot, h)
		}
	}
	return v
}

// open reports whether the host's own breaker is open.
func (h hostView) open() bool { return h.Breaker != nil && h.Breaker.State == bulwark.CircuitOpen }

// assess is h's harm at now, from its Snapshot alone.
func assess(h bulwark.HostSnapshot, now time.Time) hostView {
	hv := hostView{HostSnapshot: h, Now: now}
	note := func(level harm, why string) {
		hv.Harm = max(hv.Harm, level)
		if level == bad {
			hv.Why = append([]string{why}, hv.Why...)
		} else {
			hv.Why = append(hv.Why, why)
		}
	}
	if b := h.Breaker; b != nil {
		hv.Fail = newShare(b.Failures, b.Calls, failWarn, failBad)
		hv.Slow = newShare(b.Slow, b.Calls, slowWarn, slowBad)
		switch b.State {
		case bulwark.CircuitOpen:
			note(bad, "breaker open")
		case bulwark.CircuitHalfOpen:
			note(warn, "breaker half-open")
		}
		if hv.Fail.Harm > calm {
			note(hv.Fail.Harm, fmt.Sprintf("%d of %d calls failed", b.Failures, b.Calls))
		}
		if hv.Slow.Harm > calm {
			note(hv.Slow.Harm, fmt.Sprintf("%d of %d calls slow", b.Slow, b.Calls))
		}
	}
	for _, r := range h.Routes {
		if r.Breaker != nil && r.Breaker.State == bulwark.CircuitOpen {
			note(bad, "breaker of route "+r.Pattern+" open")
		}
	}
	for _, bh := range bulkheads(h) {
		if bh.Limit > 0 && bh.InFlight >= bh.Limit {
			note(bad, "bulkhead full")
			break
		}
		if bh.Queued > 0 {
			note(warn, "requests queued")
			break
		}
	}
	if p := h.Pushback; p != nil {
		if p.Until.After(now) {
			note(bad, "paused by the upstream")
		} else if slices.ContainsFunc(p.Tiers[:], func(t time.Time) bool { return t.After(now) }) {
			note(warn, "some priorities paused")
		}
	}
	if t := h.Throttle; t != nil {
		// The throttle's window is the one count of failures a host
		// without a breaker has: requests its upstream did not accept.
		if h.Breaker == nil {
			if sh := newShare(t.Requests-t.Accepts, t.Requests, failWarn, failBad); sh.Harm > calm {
				note(sh.Harm, fmt.Sprintf("%d of %d requests not accepted", t.Requests-t.Accepts, t.Requests))
			}
		}
		if !t.Shadow && t.Probability > 0 {
			note(warn, "throttled")
		}
	}
	for _, e := range h.Endpoints {
		if e.Ejected {
			note(warn, "instance ejected")
			break
		}
	}
	return hv
}

// seconds formats a wait for a person: "3.2 s", "2 min 5 s"; "now" once
// it is over.
func seconds(d time.Duration) string {
	switch {
	case d <= 0:
		return "now"
	case d < time.Minute:
		return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + " s"
	}
	d = d.Round(time.Second)
	return fmt.Sprintf("%d min %d s", int(d.Minutes()), int(d.Seconds())%60)
}

// The sparkline's geometry, in SVG user units: the plot, and margins for
// the axis labels.
const (
	sparkW, sparkH     = 300, 40
	sparkLeft, sparkUp = 34, 4
	sparkSVGW          = sparkLeft + sparkW + 34
	sparkSVGH          = sparkUp + sparkH + 14
)

// sparkline is a host's chart as page.html draws it over a fixed span
// that ends now: requests in flight, the breaker window's failure share,
// and bands where the breaker was open. Points are SVG polyline point
// lists.
type sparkline struct {
	N     int      // samples drawn
	Span  string   // the x axis's length, "5 min"
	Every string   // between two samples, "1 s"
	Peak  int      // in flight at the top of the chart
	In    string   // "" with no samples
	Fail  []string // one polyline per run of samples with calls in the window
	Open  []band   // where the breaker was open
}

// band is a span of the x axis.
type band struct{ X, W int }

// spark draws hist over the span that ends at now: requests in flight
// (scaled to their peak, or the bulkhead's limit if larger), the breaker
// window's failure share (scaled to 100 %; a sample whose window is empty,
// as it is when the breaker has just opened, breaks the line rather than
// drawing a fall to 0), and the samples at which the breaker was open, as
// bands. x is a sample's time, so the chart fills from the right as the
// history grows.
func spark(h bulwark.HostSnapshot, hist History, now time.Time, every, span time.Duration) sparkline {
	sl := sparkline{N: len(hist.Samples), Span: spanLabel(span), Every: spanLabel(every), Peak: 1}
	if sl.N == 0 {
		return sl
	}
	for _, bh := range bulkheads(h) {
		sl.Peak = max(sl.Peak, bh.Limit)
	}
	peak := 0
	for _, s := range hist.Samples {
		peak = max(peak, s.InFlight)
	}
	sl.Peak = max(sl.Peak, peak)
	x := func(t time.Time) int {
		return sparkLeft + sparkW - int(min(max(now.Sub(t), 0), span)*sparkW/max(span, 1))
	}
	y := func(share float64) int { return sparkUp + sparkH - int(share*sparkH+0.5) }
	var in, fail []byte
	var bands []band
	step := max(int(sparkW*every/max(span, 1)), 1) // a sample's width; a lone one still shows
	for i, s := range hist.Samples {
		xi := x(s.Time)
		if i > 0 {
			in = append(in, ' ')
		}
		in = point(in, xi, y(float64(s.InFlight)/float64(sl.Peak)))
		if sl.N == 1 {
			in = append(in, ' ')
			in = point(in, xi-step, y(float64(s.InFlight)/float64(sl.Peak)))
		}
		if s.State != nil && *s.State == bulwark.CircuitOpen {
			if n := len(bands); n > 0 && bands[n-1].X+bands[n-1].W >= xi-step {
				bands[n-1].W = xi - bands[n-1].X
			} else {
				bands = append(bands, band{X: xi - step, W: step})
			}
		}
		if h.Breaker == nil {
			continue
		}
		if s.Calls == 0 {
			if len(fail) > 0 {
				sl.Fail = append(sl.Fail, string(fail))
				fail = fail[:0]
			}
			continue
		}
		if len(fail) > 0 {
			fail = append(fail, ' ')
		}
		fail = point(fail, xi, y(float64(s.Failures)/float64(s.Calls)))
	}
	if len(fail) > 0 {
		sl.Fail = append(sl.Fail, string(fail))
	}
	sl.In, sl.Open = string(in), bands
	return sl
}

// svg is the chart as markup. It is built here rather than in page.html
// because html/template's escaping of some 2,400 bytes of points per host
// was most of the cost of a page of many hosts; it is safe unescaped
// because everything in it is a number this file formats or a fixed
// string, nothing from a request or a Snapshot.
func (sl sparkline) svg() template.HTML {
	if sl.N == 0 {
		return ""
	}
	b := make([]byte, 0, 1024+len(sl.In)+len(sl.In)*len(sl.Fail))
	b = fmt.Appendf(b, `<svg class="spark" data-points="%d" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="the last %s: requests in flight, failure share, breaker open">`,
		sl.N, sparkSVGW, sparkSVGH, sparkSVGW, sparkSVGH, sl.Span)
	b = fmt.Appendf(b, `<rect class="plot" x="%d" y="%d" width="%d" height="%d"/>`, sparkLeft, sparkUp, sparkW, sparkH)
	for _, o := range sl.Open {
		b = fmt.Appendf(b, `<rect class="openband" x="%d" y="%d" width="%d" height="%d"/>`, o.X, sparkUp, o.W, sparkH)
	}
	b = append(b, "\n"+`<polyline class="in" points="`...)
	b = append(b, sl.In...)
	b = append(b, `"/>`...)
	for _, f := range sl.Fail {
		b = append(b, `<polyline class="fail" points="`...)
		b = append(b, f...)
		b = append(b, `"/>`...)
	}
	l, r, top, bottom := sparkLeft-3, sparkLeft+sparkW+3, sparkUp+7, sparkUp+sparkH
	b = fmt.Appendf(b, "\n"+`<text class="failax" x="%d" y="%d" text-anchor="end">100 %%</text><text class="failax" x="%d" y="%d" text-anchor="end">0 %%</text>`, l, top, l, bottom)
	b = fmt.Appendf(b, `<text class="inax" x="%d" y="%d">%d</text><text class="inax" x="%d" y="%d">0</text>`, r, top, sl.Peak, r, bottom)
	b = fmt.Appendf(b, `<text x="%d" y="%d">−%s</text><text x="%d" y="%d" text-anchor="end">now</text></svg>`, sparkLeft, sparkSVGH-2, sl.Span, sparkLeft+sparkW, sparkSVGH-2)
	b = fmt.Appendf(b, `<span class="muted"><span style="color:#1565c0">in flight (right axis, requests)</span> · <span style="color:#c62828">failure share of the breaker window (left axis, %%)</span> · shaded: breaker open · a sample every %s, %d so far</span>`, sl.Every, sl.N)
	return template.HTML(b)
}

// point appends "x,y".
func point(b []byte, x, y int) []byte {
	b = strconv.AppendInt(b, int64(x), 10)
	b = append(b, ',')
	return strconv.AppendInt(b, int64(y), 10)
}

// spanLabel is a span for the axis: "5 min", "90 s".
func spanLabel(d time.Duration) string {
	if d >= time.Minute && d%time.Minute == 0 {
		return strconv.Itoa(int(d/time.Minute)) + " min"
	}
	return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + " s"
}

// sum adds up the unsigned counters of a struct of counts by kind
// (bulwark.HedgeSkips, bulwark.FaultCounts), for a total on the page. It
// reads every field rather than naming them, so a kind added to one of
// those types is counted with no change here.
func sum(counts any) uint64 {
	v := reflect.ValueOf(counts)
	var n uint64
	for i := range v.NumField() {
		if f := v.Field(i); f.CanUint() {
			n += f.Uint()
		}
	}
	return n
}
