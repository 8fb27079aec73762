package bulwark

import (
	"sync/atomic"
	"time"
)

// breakerProbes rations the requests a tripped breaker lets through, and
// spaces some of them through its open time: the probe on a timer.
//
// Why a timer: a breaker that probes only when its open time ends stays
// open, after its dependency recovers, for up to the whole open time in
// force, which doubles on each trip in a row; in a chain of services a
// 2 s blip at the bottom then kept the top down for seconds after it. A
// probe every open time ÷ HalfOpenCalls (once a request was refused since
// the last) finds the recovery within that spacing (200 ms in the second
// open time of the package defaults) or the next request after, while
// the open time still grows on repeated trips, so a dependency that stays
// sick sees probes ever more rarely.
//
// Why a ration: a dependency that is still sick sees at most HalfOpenCalls
// probes per open period, as with probes at its end alone. From a trip
// until the breaker closes or trips again, at most HalfOpenCalls requests
// pass: up to HalfOpenCalls − 1 spaced through the open time, one request
// each, and the rest at its end as the half-open round (at least one is
// kept for it). A probe that succeeds shows the dependency answering:
// the ration is refilled (the half-open round needs HalfOpenCalls
// successes to close), and a spaced one ends the open time at once. With
// HalfOpenCalls 1 there is no timer probe.
//
// A hold adopted from another pod of a fleet is probed the same way, by a
// second breakerProbes of the breaker's (trip at the adoption, closed when
// the hold ends; only spaced is asked), so that a fleet's verdict is never
// harder to end than a local trip (see Fleet).
//
// All of it is atomics: a refusal still costs a few loads, and nothing
// runs while the breaker is closed but one load of gate.
type breakerProbes struct {
	calls   int32        // HalfOpenCalls, at least 1: the ration
	gate    atomic.Bool  // set at a trip, cleared when the breaker closes
	left    atomic.Int32 // requests the ration still allows
	next    atomic.Int64 // unix ns from which the next spaced probe may go
	spacing atomic.Int64 // ns between spaced probes
	// refused is set once a request was refused since the trip or the
	// last spaced probe: the next probe waits for it (see spaced).
	refused atomic.Bool
}

// trip starts an open period of d at now.
func (p *breakerProbes) trip(d time.Duration, now time.Time) {
	sp := int64(d) / int64(p.calls)
	p.spacing.Store(sp)
	p.next.Store(now.UnixNano() + sp)
	p.left.Store(p.calls)
	p.refused.Store(false)
	p.gate.Store(true)
}

// extend carries an open period on into a hold of d from now that was
// adopted while one runs (a chain of trips from another pod): the ration
// is refilled and the spacing set for the new hold, but the next probe's
// time stands, so that holds arriving faster than the spacing cannot put
// the probe off (the spacing runs from the first adoption of the run).
// Without an open period it is trip.
func (p *breakerProbes) extend(d time.Duration, now time.Time) {
	if !p.gate.Load() {
		p.trip(d, now)
		return
	}
	sp := int64(d) / int64(p.calls)
	p.spacing.Store(sp)
	if next := p.next.Load(); next > now.UnixNano()+sp {
		p.next.CompareAndSwap(next, now.UnixNano()+sp)
	}
	p.left.Store(p.calls)
}

// closed ends the ration: the breaker closed.
func (p *breakerProbes) closed() { p.gate.Store(false) }

// spaced reports whether a request the open time would refuse at now goes
// as a spaced probe: one per spacing, once a request was refused since the
// last, while the ration keeps one for the half-open round.
//
// Why a refusal between: a caller whose requests come about as far apart
// as the spacing (10 a second against the 80–100 ms of a first 1 s open
// time) would otherwise have nearly every request sent as a probe: none
// refused at once, and the sick host got as many requests as before the
// trip. So at most every other request is a probe; a busier caller, with
// many refusals per spacing, probes as often as before.
func (p *breakerProbes) spaced(now int64) bool {
	if !p.gate.Load() {
		return false // held by a control, or by what these probes do not space
	}
	if !p.refused.Load() {
		p.refused.Store(true) // this request is refused: the next may probe
		return false
	}
	next := p.next.Load()
	if now < next || p.left.Load() <= 1 {
		return false
	}
	if !p.next.CompareAndSwap(next, now+p.spacing.Load()) {
		return false // another request took this slot
	}
	p.refused.Store(false)
	if p.left.Add(-1) < 1 {
		p.left.Add(1)
		return false
	}
	return true
}

// take reports whether a request past the open time may go to the
// half-open round: always once the breaker closed.
func (p *breakerProbes) take() bool {
	if !p.gate.Load() {
		return true
	}
	if p.left.Add(-1) >= 0 {
		return true
	}
	p.left.Add(1)
	return false
}

// giveBack returns what take took for a request gobreaker refused, or a
// probe that ended without a verdict (the caller's cancel), whose slot
// gobreaker frees too.
func (p *breakerProbes) giveBack() {
	for p.gate.Load() {
		n := p.left.Load()
		if n >= p.calls || p.left.CompareAndSwap(n, n+1) {
			return
		}
	}
}

// answered refills the ration after a probe that succeeded.
func (p *breakerProbes) answered() {
	if p.gate.Load() {
		p.left.Store(p.calls)
	}
}
