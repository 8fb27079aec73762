package bulwark

import (
	"net/http"
	"reflect"
	"time"
)

// buildStack composes a host's layers, outer to inner, once, and records
// in hs.parts the layers the router asks about, and in hs.shows how each
// layer's piece of Snapshot goes into the host's. It is the one place that
// knows every layer. Why this order:
//
//   - fallback, outermost, sees only the call's final outcome;
//   - the total deadline bounds everything below it, retries included;
//   - the retry layer waits outside pushback, breaker and bulkhead, so a
//     waiting retry holds no permit, and every attempt is seen below; it
//     is also the one place hedges are launched (hedge.go), asking the
//     breaker and bulkhead built here whether they would refuse one;
//   - pushback refuses before the breaker counts anything;
//   - the throttle, just above the breaker, counts what the host accepted
//     of what it was sent: an open breaker's refusals are not requests the
//     host turned down, and its own refusals never reach the breaker;
//   - the breaker sees every attempt, outside the bulkhead, so an open
//     breaker refuses before a slot is taken;
//   - the balancer, below the breaker (which sees every attempt whichever
//     instance served it), has a bulkhead per instance;
//   - the bulkhead holds a slot for exactly one attempt;
//   - the attempt deadline makes the attempt's context and headers;
//   - the attempt span covers what goes on the wire;
//   - the fault layer, innermost and only when a Fault policy is on,
//     stands in for the wire, so every layer above sees its faults as real.
//
// A host's routes (Config.Routes) get stacks of their own from the same
// code (compose), sharing the host's bulkhead, pushback and balancer.
//
// prev, when not nil, is the host's state before Transport.Update: the new
// stack keeps the state of prev's layers whose shape p leaves unchanged
// (see reuseFrom), and builds the others afresh. prev's stack is not
// touched: requests sent through it finish there. A route's stack keeps
// its own layers' state by the same rule (keepRoutes, in route.go).
func (t *Transport) buildStack(hs *hostState, prev *hostState) {
	if prev != nil && prev.upstream == hs.upstream {
		hs.faults = prev.faults // counts, like the pushback pauses, outlive an Update
	}
	if hs.faults == nil {
		hs.faults = new(faultCounts)
	}
	if prev != nil && prev.upstream == hs.upstream {
		hs.learned = prev.learned // what the host's latency taught outlives an Update
	}
	if hs.learned == nil {
		hs.learned = newLearned(hs.rep)
	}
	if prev != nil && prev.upstream == hs.upstream {
		hs.deadlines = prev.deadlines // counts, like the faults'
	}
	if hs.deadlines == nil {
		hs.deadlines = new(deadlineCounts)
	}
	hs.learned.rep.Store(hs.rep)
	e := env{host: hs.name, scheme: hs.key.scheme, upstream: hs.upstream, rep: hs.rep, learned: hs.learned, deadlines: hs.deadlines, passedUp: &hs.passedUp}
	hs.shared.faults = hs.faults
	hs.rt, hs.parts, hs.shows = t.compose(hs.policy, e, &hs.shared, reuseFrom(prev, hs))
	faults, deadlines, calls := hs.faults, hs.deadlines, hs.rep.calls
	hs.shows = append(hs.shows,
		func(h *HostSnapshot) { h.Calls = calls.snapshot() },
		func(h *HostSnapshot) { h.Fault = faults.snapshot() },
		func(h *HostSnapshot) {
			h.DeadlineTooShort, h.AbandonedAttempts = deadlines.tooShort.Load(), deadlines.abandoned.Load()
		},
		showLearned(hs.learned, hs.policy))
}

// showLearned puts l's snapshot under p's bounds in a HostSnapshot.
func showLearned(l *learned, p *Policy) func(*HostSnapshot) {
	return func(h *HostSnapshot) {
		var attempt, slow time.Duration
		if !p.Timeout.Disabled {
			attempt = p.Timeout.Attempt
		}
		if !p.Breaker.Disabled {
			slow = p.Breaker.SlowCall
		}
		h.Learned = l.snapshot(attempt, p.Timeout.learn, slow, p.Breaker.learn)
	}
}

// buildRoute composes the stack of one route on a host: the same layers as
// the host's, made for the route's policy, except for the host's shared
// ones (see hostShared), which the route's stack passes through. Its own
// layers report through rep, the route's reporter; the shared ones
// through the host's. old is what the route's previous stack keeps; l is
// the route's own learned latency (routeState.learned).
func (t *Transport) buildRoute(hs *hostState, rep *reporter, p *Policy, old kept, l *learned) (stage, []any, []func(*HostSnapshot)) {
	e := env{host: hs.name, scheme: hs.key.scheme, upstream: hs.upstream, rep: rep, learned: l, deadlines: hs.deadlines, passedUp: &hs.passedUp}
	shared := hs.shared
	rt, parts, shows := t.compose(p, e, &shared, old)
	return rt, parts, append(shows, showLearned(l, p))
}

// hostShared is the per-host state that a host's routes share with it:
// limits on what the host as a whole receives (its bulkhead, the pauses it
// asked for, the balancer and its instances), where a route's own layers
// (breaker, retry and its budget, deadlines, fallback, fault) judge the
// route's calls. Nil fields are layers the host's policy turns off.
type hostShared struct {
	bulkhead *bulkheadStage
	pushback *pushbackStage
	balancer *balancerStage
	// faults counts the faults injected on the host, by every fault layer
	// it has (its own, its instances', its routes'); never nil.
	faults *faultCounts
	built  bool // false while the host's own stack is being composed
}

// compose builds a stack for p, outer to inner, with its parts, outer
// first, and shows: for each layer with state, a func that puts the
// layer's piece of Snapshot (its snapshot method's result) in its field of
// a HostSnapshot. Layers know nothing of HostSnapshot, and Snapshot
// nothing of layers: this is where the two meet. On the host's own stack
// (sh.built false) it makes the shared layers, or keeps old's, and
// records them in sh; on a route's it passes through them, and they are
// neither parts nor shown.
func (t *Transport) compose(p *Policy, e env, sh *hostShared, old kept) (stage, []any, []func(*HostSnapshot)) {
	var s stage
	var parts []any
	var shows []func(*HostSnapshot)
	// What the hedger asks before sending a hedge: is the breaker open,
	// the bulkhead full, the throttle refusing? (A balanced upstream's bulkheads are per
	// instance; the balancer's pick and each instance's bulkhead decide.)
	var open opener
	var full filler
	var shed shedder
	switch {
	case sh.built && sh.balancer != nil:
		s = sh.balancer
	case sh.built:
		s = t.attemptStack(p, e, t.base, sh.faults)
		if sh.bulkhead != nil {
			s, full = sharedStage{via: sh.bulkhead, next: s}, sh.bulkhead
		}
	case old.balancer != nil:
		s, parts, sh.balancer = old.balancer, append(parts, old.balancer), old.balancer
	case p.Endpoints.enabled():
		b := newBalancer(e, p.Endpoints, t.base, t.instanceBuilder(p, sh.faults))
		s, parts, sh.balancer = b, append(parts, b), b
	case old.bulkhead != nil:
		s, parts, sh.bulkhead, full = old.bulkhead, append(parts, old.bulkhead), old.bulkhead, old.bulkhead
	default:
		var bh *bulkheadStage
		s, bh = t.instanceStack(p, e, t.base, e.host, sh.faults)
		if bh != nil {
			parts, sh.bulkhead, full = append(parts, bh), bh, bh
		}
	}
	// The shared layers are the host's: shown in its snapshot, not in its
	// routes' (sh.built).
	if b := sh.balancer; b != nil && !sh.built {
		shows = append(shows, func(h *HostSnapshot) { h.Endpoints, h.Quota = showEndpoints(b.snapshot()) })
	}
	if bh := sh.bulkhead; bh != nil && !sh.built {
		shows = append(shows, func(h *HostSnapshot) { h.Bulkhead, h.Quota = bh.snapshot() })
	}
	if !p.Breaker.Disabled {
		var b *breakerStage
		if old.breaker != nil {
			old.breaker.retune(p.Breaker)
			b = old.breaker.link(s, p.Breaker)
		} else {
			b = newBreaker(s, p.Breaker, e, t.randN)
			if !sh.built {
				b.fleet = t.fleet.publisher() // the host's breaker, not a route's
			}
		}
		s, parts, open = b, append(parts, b), b
		shows = append(shows, func(h *HostSnapshot) { h.Breaker = b.snapshot() })
	}
	if p.Throttle.Enabled {
		th := newThrottle(s, p.Throttle, e, t.randN)
		if old.throttle != nil {
			th.throttleCounts = old.throttle
		}
		s, parts = th, append(parts, th)
		shows = append(shows, func(h *HostSnapshot) { h.Throttle = th.snapshot() })
		if !p.Throttle.Shadow {
			shed = th
		}
	}
	var pause pauser
	switch {
	case sh.built && sh.pushback != nil:
		s, pause = sharedStage{via: sh.pushback, next: s}, sh.pushback
	case !sh.built && !p.Retry.NoPushback:
		pb := newPushback(s, p.Retry.MaxRetryAfter, e, &t.ignoredRA)
		pb.fleet = t.fleet.publisher()
		if old.pauses != nil {
			pb.pauses = old.pauses
		}
		s, pause, parts, sh.pushback = pb, pb, append(parts, pb), pb
		shows = append(shows, func(h *HostSnapshot) { h.Pushback = pb.snapshot() })
	}
	// Hedges and retries are one attempt scheduler: the retry layer. A
	// policy that hedges but does not retry gets it for its first round
	// only (noRetry), with the budget its Retry.Budget says: a hedge
	// spends from it as a retry would.
	if !p.Retry.Disabled || p.Hedge.enabled() {
		r := newRetry(s, p.Retry, e, pause, &t.ignoredRA, t.randN, p.Endpoints.enabled())
		if old.budget != nil && r.budget != nil {
			r.budget = old.budget
		}
		if r.budget != nil && !sh.built && r.budget.fleet == nil {
			// The host's budget is the fleet's; a route's stays local.
			r.budget.fleet, r.budget.host = t.fleet.publisher(), e.host
		}
		if p.Hedge.enabled() {
			r.hedge = newHedger(p.Hedge, open, full, shed)
			r.max = max(r.max, 1+p.Hedge.MaxHedges)
		}
		s, parts = r, append(parts, r)
		shows = append(shows, func(h *HostSnapshot) { h.Budget, h.Hedge = r.snapshot() })
		shows = append(shows, func(h *HostSnapshot) { h.Latency = r.latency(time.Now()) })
	}
	if !p.Timeout.Disabled {
		s = &totalStage{next: s, total: p.Timeout.Total, set: p.Timeout.totalSet}
	}
	if p.Fallback.enabled() {
		f := newFallback(s, p.Fallback, e)
		if old.stale != nil {
			f.stale = old.stale
		}
		s, parts = f, append(parts, f)
		shows = append(shows, func(h *HostSnapshot) { h.Fallback = f.snapshot() })
	}
	sh.built = true
	// Outer first, as the stack reads.
	for i, j := 0, len(parts)-1; i < j; i, j = i+1, j-1 {
		parts[i], parts[j] = parts[j], parts[i]
	}
	return s, parts, shows
}

// passer is a shared layer that a route's stack passes through with its
// own layers below (bulkheadStage.pass, pushbackStage.pass).
type passer interface {
	pass(next stage, req *http.Request, c call) (*http.Response, error)
}

// sharedStage puts a host's shared layer into a route's stack, over the
// route's own layers below it.
type sharedStage struct {
	via  passer
	next stage
}

func (s sharedStage) roundTrip(req *http.Request, c call) (*http.Response, error) {
	return s.via.pass(s.next, req, c)
}

// instanceStack composes the per-attempt layers over base for one host,
// or for one instance of a balanced upstream (name is its "host:port"):
// bulkhead, attempt deadline, attempt span, fault. The bulkhead is nil when
// disabled.
func (t *Transport) instanceStack(p *Policy, e env, base http.RoundTripper, name string, faults *faultCounts) (stage, *bulkheadStage) {
	s := t.attemptStack(p, e, base, faults)
	if p.Bulkhead.Disabled {
		return s, nil
	}
	bh := newBulkhead(s, p.Bulkhead, name, e.rep, &t.ignoredRA)
	bh.quota = newFleetQuota(t.fleet.leasing(), e.host, p.Bulkhead) // per host, shared by its instances
	return bh, bh
}

// instanceBuilder is instanceStack for p, as the balancer builds its
// instances: with the bulkhead, when there is one, as their limit.
func (t *Transport) instanceBuilder(p *Policy, faults *faultCounts) instanceBuilder {
	return func(e env, base http.RoundTripper, name string) (stage, stage) {
		s, bh := t.instanceStack(p, e, base, name, faults)
		if bh == nil {
			return s, nil // a nil limit, not a nil *bulkheadStage in one
		}
		return s, bh
	}
}

// attemptStack composes the layers of one attempt over base: attempt
// deadline, attempt span, and, when p injects faults, the fault layer,
// below the span and the deadline so that an injected fault is marked in
// the span and an injected delay counts against the deadline. Off, the
// fault layer is not there at all; when there, it counts in faults.
func (t *Transport) attemptStack(p *Policy, e env, base http.RoundTripper, faults *faultCounts) stage {
	var s stage = baseStage{base}
	if p.Fault.enabled() {
		s = newFault(s, p.Fault, e, faults)
	}
	s = newObserveStage(s, e)
	if !p.Timeout.Disabled {
		a := newAttemptStage(s, p.Timeout, e.rep, e.learned)
		a.counts, a.abandon = e.deadlines, t.abandon
		s = a
	}
	return s
}

// kept is the state of a host's previous stack that its new one keeps.
type kept struct {
	balancer *balancerStage
	bulkhead *bulkheadStage
	breaker  *breakerCore
	pauses   *pauses
	budget   *retryBudget
	stale    *staleCache
	throttle *throttleCounts
}

// reuseFrom picks the layers of prev (nil: none) whose state survives a
// change to policy p. A layer keeps its state when its own sub-policy's
// shape is unchanged; anything else is built afresh, empty:
//
//   - the breaker keeps its window, state, trips and manual control unless
//     Window, WindowCalls, HalfOpenCalls or OpenFor change (breakerShape);
//     its rates, MinCalls, MaxOpenFor, SlowCall, OnStateChange and Shadow
//     move in place;
//   - the bulkhead (slots held, queue), or a balanced upstream's balancer
//     (instances, ejections, their bulkheads), is kept whole when the
//     Bulkhead, Timeout and, balanced, Endpoints policies are all equal;
//     otherwise the new one starts empty, and requests still in the old one
//     hold their slots there, so for as long as they run the host may see
//     up to both limits at once;
//   - the pushback pauses are always kept (they are the host's word, not
//     the policy's);
//   - the retry budget is kept when Retry.Budget is unchanged;
//   - the stale cache is kept when Fallback.Stale is unchanged;
//   - the throttle's counts are kept when Throttle is unchanged;
//   - Policy.Classify is no layer's: it travels with each call (see
//     call.classify), so a new one applies to the new stack's calls and
//     rebuilds nothing.
//
// Equal means reflect.DeepEqual, under which a non-nil func or an
// interface holding one is never equal: a policy with a Resolver whose
// type holds a func, say, gets a fresh balancer on every Update.
//
// A host whose upstream label changes (an Upstreams key added or removed)
// keeps nothing: its state is reported under another label.
func reuseFrom(prev, hs *hostState) kept {
	if prev == nil || prev.upstream != hs.upstream {
		return kept{}
	}
	return keptParts(prev.parts, prev.policy, hs.policy)
}

// keptParts is reuseFrom's rule for the layers parts of a stack built for
// policy q, under the new policy p. A route's stack has no shared layers
// among its parts, so on a route's it keeps only the route's own layers.
func keptParts(parts []any, q, p *Policy) kept {
	var k kept
	for _, part := range parts {
		switch l := part.(type) {
		case *balancerStage:
			if p.Endpoints.enabled() && reflect.DeepEqual(q.Endpoints, p.Endpoints) &&
				reflect.DeepEqual(q.Bulkhead, p.Bulkhead) && reflect.DeepEqual(q.Timeout, p.Timeout) {
				k.balancer = l
			}
		case *bulkheadStage:
			if !p.Endpoints.enabled() && !p.Bulkhead.Disabled &&
				reflect.DeepEqual(q.Bulkhead, p.Bulkhead) && reflect.DeepEqual(q.Timeout, p.Timeout) {
				k.bulkhead = l
			}
		case *breakerStage:
			if shapeOf(q.Breaker) == shapeOf(p.Breaker) {
				k.breaker = l.breakerCore
			}
		case *pushbackStage:
			k.pauses = l.pauses
		case *retryStage:
			if l.budget != nil && reflect.DeepEqual(q.Retry.Budget, p.Retry.Budget) {
				k.budget = l.budget
			}
		case *throttleStage:
			if reflect.DeepEqual(q.Throttle, p.Throttle) {
				k.throttle = l.throttleCounts
			}
		case *fallbackStage:
			if l.stale != nil && reflect.DeepEqual(q.Fallback.Stale, p.Fallback.Stale) {
				k.stale = l.stale
			}
		}
	}
	return k
}
