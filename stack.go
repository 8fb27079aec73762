package bulwark

import (
	"net/http"
	"reflect"
	"slices"
	"sync/atomic"
)

// stackBuilder is what every stack is built over, the Transport's for all
// its hosts: the base, the jitter source, the fleet.
type stackBuilder struct {
	base http.RoundTripper
	// abandon is Config.BaseIgnoresContext.
	abandon bool
	// randN returns a uniform number in [0, n) for n > 0, for retry
	// jitter and the breaker's open time; nil means math/rand/v2. Tests
	// replace it before the first request.
	randN func(n int64) int64
	// ignoredRA counts Retry-After values ignored as malformed (Snapshot).
	ignoredRA atomic.Uint64
	fleet     *fleetLink // nil without Config.Fleet (fleet.go)
}

// The stacks, as lists of layer steps, inner to outer: each step adds one
// layer (or none, when the policy turns it off) over what the steps before
// it built. The order is the package doc's table, read from the bottom; it
// is written here and nowhere else in the code. A host's routes
// (Config.Routes) get stacks of their own, which pass through the host's
// shared layers (hostShared) instead of making them.
var (
	hostLayers = []func(*build){
		(*build).hostBottom, // balancer, or bulkhead over the attempt layers
		(*build).breaker,
		(*build).throttle,
		(*build).pushback,
		(*build).retry, // retries and hedges: one attempt scheduler
		(*build).total,
		(*build).fallback,
	}
	routeLayers = []func(*build){
		(*build).routeBottom, // the host's balancer, or its bulkhead over the route's attempt layers
		(*build).breaker,
		(*build).throttle,
		(*build).sharedPushback,
		(*build).retry,
		(*build).total,
		(*build).fallback,
	}
)

// prior is a stack's previous version, which an Update's new stack keeps
// state from: its parts and the policy it was built for. The zero prior
// keeps nothing. What is kept is Update's rule (its doc lists it): each
// layer applies it in its own file (keepFrom, or the breaker's keptFor),
// and the bottom of a host's stack, kept whole, by bottomKept.
type prior struct {
	parts  []any
	policy *Policy
}

// build is one stack being composed: what the steps read, and what they
// have built so far.
type build struct {
	*stackBuilder
	p    *Policy
	e    env
	sh   *hostShared
	own  bool // the host's own stack, which makes sh's layers; false: a route's
	prev prior

	s     layer // the stack so far, its outermost layer
	parts []any // its layers with state, inner first
	// What the hedger asks before sending a hedge: is the breaker open,
	// the bulkhead full, the throttle refusing? And what the retry layer
	// asks: is the host paused?
	open  opener
	full  filler
	shed  shedder
	pause pauser
}

// compose builds the stack that steps make for p, over sh's shared
// layers, keeping what prev's layers may keep. It returns the outermost
// layer and the parts, outer first.
func (b *stackBuilder) compose(steps []func(*build), p *Policy, e env, sh *hostShared, own bool, prev prior) (layer, []any) {
	bd := &build{stackBuilder: b, p: p, e: e, sh: sh, own: own, prev: prev}
	for _, step := range steps {
		step(bd)
	}
	slices.Reverse(bd.parts)
	return bd.s, bd.parts
}

// add puts l over the stack, with state to keep or show.
func (bd *build) add(l layer) {
	bd.s = l
	bd.parts = append(bd.parts, l)
}

// kept returns prev's part of type T, or T's zero value.
func kept[T any](prev prior) T {
	for _, p := range prev.parts {
		if l, ok := p.(T); ok {
			return l
		}
	}
	var zero T
	return zero
}

// bottomKept reports whether the bottom of a host's stack built for q (the
// bulkhead with the attempt layers below it, or the balancer with its
// instances and their bulkheads) is kept whole under p (Update's rule).
func bottomKept(q, p *Policy) bool {
	return q != nil && reflect.DeepEqual(q.Bulkhead, p.Bulkhead) && reflect.DeepEqual(q.Timeout, p.Timeout) &&
		reflect.DeepEqual(q.Fault, p.Fault) &&
		(!p.Endpoints.enabled() || reflect.DeepEqual(q.Endpoints, p.Endpoints))
}

// hostBottom is the host's balancer, or its bulkhead over the attempt
// layers (none when disabled): kept whole by bottomKept, or new.
func (bd *build) hostBottom() {
	p, keep := bd.p, bottomKept(bd.prev.policy, bd.p)
	if p.Endpoints.enabled() {
		b := kept[*balancerLayer](bd.prev)
		if b == nil || !keep {
			b = newBalancer(bd.e, p.Endpoints, bd.base, bd.instanceBuilder(p, bd.sh.faults))
		}
		bd.sh.balancer = b
		bd.add(b)
		return
	}
	bh := kept[*bulkheadLayer](bd.prev)
	if bh != nil && keep && !p.Bulkhead.Disabled {
		bd.s = bh
	} else {
		bd.s, bh = bd.instanceStack(p, bd.e, bd.base, bd.e.host, bd.sh.faults)
	}
	if bh != nil {
		bd.sh.bulkhead, bd.full = bh, bh
		bd.add(bh)
	}
}

// routeBottom passes through the host's balancer, or puts the route's
// attempt layers under the host's bulkhead.
func (bd *build) routeBottom() {
	if b := bd.sh.balancer; b != nil {
		bd.s = b
		return
	}
	bd.s = bd.attemptStack(bd.p, bd.e, bd.base, bd.sh.faults)
	if bh := bd.sh.bulkhead; bh != nil {
		bd.s, bd.full = sharedLayer{via: bh, next: bd.s}, bh
	}
}

func (bd *build) breaker() {
	if bd.p.Breaker.Disabled {
		return
	}
	b := kept[*breakerLayer](bd.prev).keptFor(bd.s, bd.p.Breaker)
	if b == nil {
		b = newBreaker(bd.s, bd.p.Breaker, bd.e, bd.randN)
		if bd.own {
			b.fleet = bd.fleet.publisher() // the host's breaker, not a route's
		}
	}
	bd.open = b
	bd.add(b)
}

func (bd *build) throttle() {
	if !bd.p.Throttle.Enabled {
		return
	}
	th := newThrottle(bd.s, bd.p.Throttle, bd.e, bd.randN)
	th.keepFrom(kept[*throttleLayer](bd.prev))
	if !bd.p.Throttle.Shadow {
		bd.shed = th
	}
	bd.add(th)
}

// pushback is the host's pushback layer: its pauses are the host's word,
// not the policy's, so they are always kept.
func (bd *build) pushback() {
	if bd.p.Retry.NoPushback {
		return
	}
	pb := newPushback(bd.s, bd.p.Retry.MaxRetryAfter, bd.e, &bd.ignoredRA)
	pb.fleet = bd.fleet.publisher()
	pb.keepFrom(kept[*pushbackLayer](bd.prev))
	bd.pause, bd.sh.pushback = pb, pb
	bd.add(pb)
}

// sharedPushback passes a route's calls through the host's pushback.
func (bd *build) sharedPushback() {
	if pb := bd.sh.pushback; pb != nil {
		bd.s, bd.pause = sharedLayer{via: pb, next: bd.s}, pb
	}
}

// retry is the one attempt scheduler. A policy that hedges but does not
// retry gets it for its first round only (noRetry), with the budget its
// Retry.Budget says: a hedge spends from it as a retry would.
func (bd *build) retry() {
	p := bd.p
	if p.Retry.Disabled && !p.Hedge.enabled() {
		return
	}
	r := newRetry(bd.s, p.Retry, bd.e, bd.pause, &bd.ignoredRA, bd.randN, p.Endpoints.enabled())
	r.keepFrom(kept[*retryLayer](bd.prev))
	if r.budget != nil && bd.own && r.budget.fleet == nil {
		// The host's budget is the fleet's; a route's stays local.
		r.budget.fleet, r.budget.host = bd.fleet.publisher(), bd.e.host
	}
	if p.Hedge.enabled() {
		r.hedge = newHedger(p.Hedge, bd.open, bd.full, bd.shed)
		r.max = max(r.max, 1+p.Hedge.MaxHedges)
	}
	bd.add(r)
}

func (bd *build) total() {
	if t := bd.p.Timeout; !t.Disabled {
		bd.s = &totalLayer{next: bd.s, total: t.Total, set: t.totalSet}
	}
}

func (bd *build) fallback() {
	if !bd.p.Fallback.enabled() {
		return
	}
	f := newFallback(bd.s, bd.p.Fallback, bd.e)
	f.keepFrom(kept[*fallbackLayer](bd.prev))
	bd.add(f)
}

// hostShared is the per-host state that a host's routes share with it:
// limits on what the host as a whole receives (its bulkhead, the pauses it
// asked for, the balancer and its instances), where a route's own layers
// (breaker, retry and its budget, deadlines, fallback, fault) judge the
// route's calls. Nil fields are layers the host's policy turns off.
type hostShared struct {
	bulkhead *bulkheadLayer
	pushback *pushbackLayer
	balancer *balancerLayer
	// faults counts the faults injected on the host, by every fault layer
	// it has (its own, its instances', its routes'); never nil.
	faults *faultCounts
}

// passer is a shared layer that a route's stack passes through with its
// own layers below (bulkheadLayer.pass, pushbackLayer.pass).
type passer interface {
	pass(next layer, req *http.Request, c call) (*http.Response, error)
}

// sharedLayer puts a host's shared layer into a route's stack, over the
// route's own layers below it.
type sharedLayer struct {
	via  passer
	next layer
}

func (s sharedLayer) roundTrip(req *http.Request, c call) (*http.Response, error) {
	return s.via.pass(s.next, req, c)
}

// instanceStack composes the per-attempt layers over base for one host,
// or for one instance of a balanced upstream (name is its "host:port"):
// bulkhead over attemptStack. The bulkhead is nil when disabled.
func (b *stackBuilder) instanceStack(p *Policy, e env, base http.RoundTripper, name string, faults *faultCounts) (layer, *bulkheadLayer) {
	s := b.attemptStack(p, e, base, faults)
	if p.Bulkhead.Disabled {
		return s, nil
	}
	bh := newBulkhead(s, p.Bulkhead, name, e.rep, &b.ignoredRA)
	bh.quota = newFleetQuota(b.fleet.leasing(), e.host, p.Bulkhead) // per host, shared by its instances
	return bh, bh
}

// instanceBuilder is instanceStack for p, as the balancer builds its
// instances: with the bulkhead, when there is one, as their limit.
func (b *stackBuilder) instanceBuilder(p *Policy, faults *faultCounts) instanceBuilder {
	return func(e env, base http.RoundTripper, name string) (layer, layer) {
		s, bh := b.instanceStack(p, e, base, name, faults)
		if bh == nil {
			return s, nil // a nil limit, not a nil *bulkheadLayer in one
		}
		return s, bh
	}
}

// attemptStack composes the layers of one attempt over base, inner to
// outer: the fault layer (only when p injects faults; it counts in
// faults), the attempt span, the attempt deadline. The fault layer sits
// below the span and the deadline so that an injected fault is marked in
// the span and an injected delay counts against the deadline.
func (b *stackBuilder) attemptStack(p *Policy, e env, base http.RoundTripper, faults *faultCounts) layer {
	var s layer = baseLayer{base}
	if p.Fault.enabled() {
		s = newFault(s, p.Fault, e, faults)
	}
	s = newSpanLayer(s, e)
	if !p.Timeout.Disabled {
		a := newAttemptLayer(s, p.Timeout, e.rep, e.learned)
		a.counts, a.abandon = e.deadlines, b.abandon
		s = a
	}
	return s
}
