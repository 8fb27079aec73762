package bulwark

import "net/http"

// buildStack composes a host's layers, outer to inner, once, and records
// in hs.parts the layers the router and Snapshot ask about. It is the one
// place that knows every layer: adding one is a line here and a file of its
// own. Why this order:
//
//   - fallback, outermost, sees only the call's final outcome;
//   - the total deadline bounds everything below it, retries included;
//   - the retry layer waits outside pushback, breaker and bulkhead, so a
//     waiting retry holds no permit, and every attempt is seen below; it
//     is also the one place hedges are launched (hedge.go), asking the
//     breaker and bulkhead built here whether they would refuse one;
//   - pushback refuses before the breaker counts anything;
//   - the breaker sees every attempt, outside the bulkhead, so an open
//     breaker refuses before a slot is taken;
//   - the balancer, below the breaker (which sees every attempt whichever
//     instance served it), has a bulkhead per instance;
//   - the bulkhead holds a slot for exactly one attempt;
//   - the attempt deadline makes the attempt's context and headers;
//   - the attempt span, innermost, covers what goes on the wire.
func (t *Transport) buildStack(hs *hostState) {
	p := hs.policy
	e := env{host: hs.name, scheme: hs.key.scheme, upstream: hs.upstream, rep: hs.rep}
	var s stage
	var parts []any
	// What the hedger asks before sending a hedge: is the breaker open,
	// the bulkhead full? (A balanced upstream's bulkheads are per
	// instance; the balancer's pick and each instance's bulkhead decide.)
	var open opener
	var full filler
	if p.Endpoints.enabled() {
		b := newBalancer(e, p, t.base, t.instanceStack)
		s, parts = b, append(parts, b)
	} else {
		var bh *bulkheadStage
		s, bh = t.instanceStack(p, e, t.base, hs.name)
		if bh != nil {
			parts, full = append(parts, bh), bh
		}
	}
	if !p.Breaker.Disabled {
		b := newBreaker(s, p.Breaker, e, t.randN)
		s, parts, open = b, append(parts, b), b
	}
	var pause pauser
	if !p.Retry.NoPushback {
		pb := newPushback(s, p.Retry.MaxRetryAfter, e, &t.ignoredRA)
		s, pause, parts = pb, pb, append(parts, pb)
	}
	// Hedges and retries are one attempt scheduler: the retry layer. A
	// policy that hedges but does not retry gets it with one attempt per
	// round.
	if !p.Retry.Disabled || p.Hedge.enabled() {
		rp := p.Retry
		if rp.Disabled {
			rp.MaxAttempts = 1 + p.Hedge.MaxHedges
			rp.Budget.Disabled = true
		}
		r := newRetry(s, rp, e, pause, &t.ignoredRA, t.randN, p.Endpoints.enabled())
		if p.Hedge.enabled() {
			r.hedge = newHedger(p.Hedge, open, full)
			r.max = max(r.max, 1+p.Hedge.MaxHedges)
		}
		s, parts = r, append(parts, r)
	}
	if !p.Timeout.Disabled {
		s = &totalStage{next: s, total: p.Timeout.Total}
	}
	if p.Fallback.enabled() {
		s = newFallback(s, p.Fallback, e)
	}
	hs.rt = s
	// Outer first, as the stack reads.
	for i, j := 0, len(parts)-1; i < j; i, j = i+1, j-1 {
		parts[i], parts[j] = parts[j], parts[i]
	}
	hs.parts = parts
}

// instanceStack composes the per-attempt layers over base for one host,
// or for one instance of a balanced upstream (name is its "host:port"):
// bulkhead, attempt deadline, attempt span. The bulkhead is nil when
// disabled.
func (t *Transport) instanceStack(p *Policy, e env, base http.RoundTripper, name string) (stage, *bulkheadStage) {
	var s stage = baseStage{base}
	s = newObserveStage(s, e)
	if !p.Timeout.Disabled {
		s = newAttemptStage(s, p.Timeout, e.rep)
	}
	if p.Bulkhead.Disabled {
		return s, nil
	}
	bh := newBulkhead(s, p.Bulkhead, name, e.rep)
	return bh, bh
}
