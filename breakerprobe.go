package bulwark

import (
	"sync/atomic"
	"time"
)

// breakerProbes rations the requests a tripped breaker lets through, and
// spaces some of them through its open time: the probe on a timer, so that
// a recovered dependency is found within one spacing (open time ÷
// HalfOpenCalls) rather than at the end of an open time that doubles on
// each trip in a row. From a trip until the breaker closes or trips again,
// at most HalfOpenCalls requests pass: up to HalfOpenCalls − 1 spaced, one
// each, and at least one kept for the half-open round. A probe that
// succeeds refills the ration, and a spaced one ends the open time. With
// HalfOpenCalls 1 there is no timer probe.
//
// A hold adopted from another pod is probed by a second breakerProbes of
// the breaker's (only spaced is asked), so a fleet's verdict is never
// harder to end than a local trip. It is all atomics: a closed breaker
// costs one load of gate.
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
// last (else a caller whose requests come about a spacing apart would have
// nearly every one sent as a probe), while the ration keeps one for the
// half-open round.
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
