package bulwark

import (
	"context"
	"crypto/tls"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"
)

// resolveTimeout bounds one background lookup.
const resolveTimeout = 10 * time.Second

// instance is one endpoint with the stack built for it.
type instance struct {
	id   uint32 // unique within the balancer, never 0
	addr string
	rt   layer
	own  *http.Transport // the clone rt ends in; nil when the base is shared
	// limit is the layer on top of rt that bounds what the instance gets
	// (its bulkhead), nil when none: see instanceBuilder.
	limit layer

	inflight atomic.Int64
	consec   atomic.Int32
	sent     atomic.Uint64
	// This interval's counts, for the success-rate check.
	reqs, fails atomic.Int64

	// Guarded by the balancer's mu.
	ejected    bool
	until      time.Time
	times      int           // ejections in a row
	lastFor    time.Duration // the last ejection's length
	returnedAt time.Time
}

// bodyEnd ends a request's time in flight: the instance is the bodyEnder,
// so this costs no allocation.
func (in *instance) bodyEnd() { in.inflight.Add(-1) }

// endpointSet is an immutable snapshot: every instance, and the ones that
// take requests. It is replaced, never changed, so picking needs no lock.
type endpointSet struct {
	all    []*instance
	active []*instance
}

// balancerLayer, per logical host, resolves the upstream's
// instances, sends each attempt to one of them (a retry to one the call has
// not tried, when there is one), and ejects the sick ones.
type balancerLayer struct {
	e        env
	base     http.RoundTripper
	build    instanceBuilder
	resolver Resolver
	every    time.Duration
	rr       bool
	od       Outlier
	odOff    bool
	// randN returns a uniform number in [0, n); tests replace it before
	// the first request.
	randN func(n uint64) uint64

	set       atomic.Pointer[endpointSet]
	rrNext    atomic.Uint64
	nextEvent atomic.Int64 // unix ns of the next sweep: an interval's end or a return

	resolveMu   sync.Mutex // serialises the first, blocking resolve
	resolving   atomic.Bool
	nextResolve atomic.Int64 // unix ns

	mu           sync.Mutex // ejection state and set rebuilds
	nextID       uint32
	nextInterval time.Time
}

// instanceBuilder makes the per-attempt layers for one instance, over
// base, for the instance's "host:port" name (stack.go builds them from the
// host's policy: see Transport.instanceStack). It returns them, rt, and
// limit, the layer on top of them that bounds what the instance gets (its
// bulkhead), nil when there is none. The balancer asks limit nothing: it
// counts an instance's requests itself. It keeps it only to hand it back
// in its piece of Snapshot (endpointView), for the side that built it to
// show: one layer never names another's types, so the balancer cannot ask
// a bulkhead for its snapshot itself.
type instanceBuilder func(e env, base http.RoundTripper, name string) (rt, limit layer)

func newBalancer(env env, e Endpoints, base http.RoundTripper, build instanceBuilder) *balancerLayer {
	b := &balancerLayer{
		e: env, base: base, build: build, resolver: e.Resolver, every: e.ResolveEvery,
		rr: e.RoundRobin, od: e.Outlier, odOff: e.Outlier.Disabled,
	}
	now := time.Now()
	b.nextInterval = now.Add(b.od.Interval)
	b.nextEvent.Store(b.nextInterval.UnixNano())
	if b.resolver == nil {
		b.install(e.Addrs, now)
	}
	return b
}

func (b *balancerLayer) rand(n int) int {
	if b.randN != nil {
		return int(b.randN(uint64(n)))
	}
	return int(rand.Uint64N(uint64(n)))
}

func (b *balancerLayer) roundTrip(req *http.Request, c call) (*http.Response, error) {
	now := time.Now()
	set := b.set.Load()
	if set == nil {
		var err error
		if set, err = b.resolveFirst(req, c, now); err != nil {
			closeBody(req)
			return nil, err
		}
	}
	ns := now.UnixNano()
	if b.resolver != nil && ns >= b.nextResolve.Load() {
		b.refreshAsync(ns)
	}
	if ns >= b.nextEvent.Load() && !b.odOff {
		if b.sweep(req.Context(), now) {
			set = b.set.Load()
		}
	}
	// Hedges pick while the attempt they hedge runs: the set is shared.
	c.tried.lock()
	in := b.pick(set, c.tried)
	c.tried.mark(in.id)
	c.tried.unlock()
	in.inflight.Add(1)
	in.sent.Add(1)
	returned := false
	defer func() {
		if !returned {
			// The layer below panicked: the request is no longer in flight.
			in.inflight.Add(-1)
		}
	}()
	resp, err := in.rt.roundTrip(b.outgoing(req, in), c)
	returned = true
	if !b.odOff {
		b.record(req.Context(), in, c.judge(resp, err))
	}
	if err != nil {
		// An attempt abandoned at its deadline is in flight until its
		// base returns, as its bulkhead slot is held.
		afterReturn(err, in)
		return nil, err
	}
	// The caller sees its own request, with the logical URL.
	resp.Request = req
	onBodyEnd(resp, in)
	return resp, nil
}

// outReq holds a request copy and its URL copy in one allocation.
type outReq struct {
	r http.Request
	u url.URL
}

// outgoing copies req with the instance as URL host. Host stays the
// logical name: it goes in the Host header, and the instance's transport
// verifies TLS against it.
func (b *balancerLayer) outgoing(req *http.Request, in *instance) *http.Request {
	o := &outReq{r: *req, u: *req.URL}
	o.u.Host = in.addr
	o.r.URL = &o.u
	if o.r.Host == "" {
		o.r.Host = req.URL.Host
	}
	return &o.r
}

// pick chooses the instance for one attempt: among active instances, not
// one the call tried when another is available; then by the power of two
// choices (or in turn, with RoundRobin). set.active is never empty.
func (b *balancerLayer) pick(set *endpointSet, tried *triedSet) *instance {
	act := set.active
	n := len(act)
	if n == 1 {
		return act[0]
	}
	if b.rr {
		return b.inTurn(act, tried)
	}
	i := b.rand(n)
	j := b.rand(n - 1)
	if j >= i {
		j++
	}
	x, y := act[i], act[j]
	if tried != nil && tried.n > 0 {
		if in := untried(act, i, j, tried); in != nil {
			return in
		}
	}
	if y.inflight.Load() < x.inflight.Load() {
		return y
	}
	return x
}

// inTurn is RoundRobin's pick: the next instance in turn that the call has
// not tried, or the next in turn if it tried them all.
func (b *balancerLayer) inTurn(act []*instance, tried *triedSet) *instance {
	n := len(act)
	start := int(b.rrNext.Add(1) % uint64(n))
	for k := 0; k < n; k++ {
		if in := act[(start+k)%n]; !tried.has(in.id) {
			return in
		}
	}
	return act[start]
}

// untried settles the two choices act[i] and act[j] for a call that tried
// some instances already: the one it did not try, or, when it tried both,
// the first after act[i] that it did not; nil when neither was tried, or
// when every instance was (the two choices then stand).
func untried(act []*instance, i, j int, tried *triedSet) *instance {
	x, y := act[i], act[j]
	tx, ty := tried.has(x.id), tried.has(y.id)
	switch {
	case tx && !ty:
		return y
	case ty && !tx:
		return x
	case tx && ty:
		for k := 1; k < len(act); k++ {
			if in := act[(i+k)%len(act)]; !tried.has(in.id) {
				return in
			}
		}
	}
	return nil
}

// record counts an attempt's outcome, judged j by the call's classifier,
// toward its instance's ejection.
func (b *balancerLayer) record(ctx context.Context, in *instance, j judged) {
	h := j.v.Outcome
	if h == OutcomeIgnored {
		// The caller's own end, a local refusal, or what the classifier
		// ignores (by default a wrong request): nothing about the instance.
		return
	}
	failed := h == OutcomeFailure
	in.reqs.Add(1)
	if !failed {
		if in.consec.Load() != 0 {
			in.consec.Store(0)
		}
		return
	}
	in.fails.Add(1)
	if c := b.od.Consecutive; c > 0 && in.consec.Add(1) >= int32(c) {
		b.ejectConsecutive(ctx, in)
	}
}

// ejectConsecutive ejects in for its run of failures; ctx is the request
// whose failure completed the run, where the event goes.
func (b *balancerLayer) ejectConsecutive(ctx context.Context, in *instance) {
	var evs [1]endpointEvent
	n := 0
	b.mu.Lock()
	now := time.Now()
	if !in.ejected && b.ejectLocked(in, now) {
		evs[0] = b.ejectEvent(in, "consecutive failures")
		n = 1
	}
	b.mu.Unlock()
	b.log(ctx, evs[:n])
}

// ejectLocked takes in out of the active set if the cap allows it.
func (b *balancerLayer) ejectLocked(in *instance, now time.Time) bool {
	set := b.set.Load()
	ejected := len(set.all) - len(set.active)
	if ejected >= ejectCap(len(set.all), b.od.MaxEjectedPercent) {
		return false
	}
	in.times++
	in.lastFor = b.od.ejectionTime(in.times)
	in.until = now.Add(in.lastFor)
	in.ejected = true
	in.consec.Store(0)
	b.rebuildLocked(set.all)
	if u := in.until.UnixNano(); u < b.nextEvent.Load() {
		b.nextEvent.Store(u)
	}
	return true
}

func (b *balancerLayer) ejectEvent(in *instance, reason string) endpointEvent {
	return endpointEvent{addr: in.addr, ejected: true, reason: reason, duration: in.lastFor, times: in.times}
}

// rebuildLocked publishes a new snapshot of all. Should every instance be
// ejected (the set shrank under them), all take requests again: sending to
// a sick instance beats sending nowhere, and the breaker is there for it.
func (b *balancerLayer) rebuildLocked(all []*instance) {
	active := make([]*instance, 0, len(all))
	for _, in := range all {
		if !in.ejected {
			active = append(active, in)
		}
	}
	if len(active) == 0 {
		active = all
	}
	b.set.Store(&endpointSet{all: all, active: active})
}

// sweep returns instances whose ejection is over and, at an interval's
// end, runs the success-rate check. It reports whether the set changed.
// One request sweeps at a time; others carry on with the current set. The
// events go on ctx's span: the sweeping request's.
func (b *balancerLayer) sweep(ctx context.Context, now time.Time) bool {
	if !b.mu.TryLock() {
		return false
	}
	var evs []endpointEvent
	set := b.set.Load()
	changed := false
	for _, in := range set.all {
		if in.ejected && !now.Before(in.until) {
			in.ejected, in.until, in.returnedAt = false, time.Time{}, now
			in.consec.Store(0)
			changed = true
			evs = append(evs, endpointEvent{addr: in.addr})
		}
	}
	if changed {
		b.rebuildLocked(set.all)
		set = b.set.Load()
	}
	if !now.Before(b.nextInterval) {
		evs = b.intervalLocked(set, now, evs)
		b.nextInterval = now.Add(b.od.Interval)
		changed = changed || len(evs) > 0
	}
	next := b.nextInterval
	for _, in := range b.set.Load().all {
		if in.ejected && in.until.Before(next) {
			next = in.until
		}
	}
	b.nextEvent.Store(next.UnixNano())
	b.mu.Unlock()
	b.log(ctx, evs)
	return changed
}

// intervalLocked closes an interval: the success-rate check, and a lower
// count for instances that have stayed in as long as they were last out.
func (b *balancerLayer) intervalLocked(set *endpointSet, now time.Time, evs []endpointEvent) []endpointEvent {
	var samples []rateSample
	for _, in := range set.all {
		reqs, fails := in.reqs.Swap(0), in.fails.Swap(0)
		if in.ejected {
			continue
		}
		if in.times > 0 && now.Sub(in.returnedAt) >= in.lastFor {
			in.times--
			in.returnedAt = now
		}
		if reqs > 0 && reqs >= int64(b.od.SuccessRateVolume) {
			samples = append(samples, rateSample{in: in, rate: float64(reqs-fails) / float64(reqs)})
		}
	}
	for _, s := range successRateOutliers(samples, b.od.SuccessRateMinHosts, b.od.StdevFactor) {
		if b.ejectLocked(s.in, now) {
			evs = append(evs, b.ejectEvent(s.in, "success rate"))
		}
	}
	return evs
}

// log logs and reports evs, outside the balancer's lock.
func (b *balancerLayer) log(ctx context.Context, evs []endpointEvent) {
	for _, ev := range evs {
		b.e.rep.endpointChanged(ctx, ev)
	}
}

// resolveFirst resolves the instances before the first request, bounded by
// the request's context; concurrent first requests share one lookup.
func (b *balancerLayer) resolveFirst(req *http.Request, c call, now time.Time) (*endpointSet, error) {
	b.resolveMu.Lock()
	defer b.resolveMu.Unlock()
	if set := b.set.Load(); set != nil {
		return set, nil
	}
	ctx := req.Context()
	if dl, ok := c.deadline(req); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, dl)
		defer cancel()
	}
	addrs, err := b.resolver.Resolve(ctx, b.e.host)
	if err != nil || len(addrs) == 0 {
		return nil, &NoEndpointsError{Host: b.e.host, Err: err}
	}
	b.nextResolve.Store(now.Add(b.every).UnixNano())
	b.install(addrs, now)
	return b.set.Load(), nil
}

// refreshAsync starts one background lookup when the last is old enough.
func (b *balancerLayer) refreshAsync(now int64) {
	if !b.resolving.CompareAndSwap(false, true) {
		return
	}
	if now < b.nextResolve.Load() {
		b.resolving.Store(false)
		return
	}
	b.nextResolve.Store(now + int64(b.every))
	go func() {
		defer b.resolving.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), resolveTimeout)
		defer cancel()
		b.refresh(ctx)
	}()
}

// refresh asks the resolver again; a failed or empty answer keeps the
// last good set.
func (b *balancerLayer) refresh(ctx context.Context) {
	addrs, err := b.resolver.Resolve(ctx, b.e.host)
	if err != nil || len(addrs) == 0 {
		kept := 0
		if set := b.set.Load(); set != nil {
			kept = len(set.all)
		}
		b.e.rep.logger.Info("bulwark: resolve failed, keeping the last good endpoints",
			"host", b.e.host, "upstream", b.e.upstream, "endpoints", kept, "error", err)
		return
	}
	b.install(addrs, time.Now())
}

// install makes addrs the set, keeping the state of instances already in
// it. Instances that left have their idle connections closed.
func (b *balancerLayer) install(addrs []string, now time.Time) {
	b.mu.Lock()
	old := map[string]*instance{}
	if set := b.set.Load(); set != nil {
		for _, in := range set.all {
			old[in.addr] = in
		}
	}
	all := make([]*instance, 0, len(addrs))
	seen := make(map[string]bool, len(addrs))
	for _, a := range addrs {
		if seen[a] {
			continue
		}
		seen[a] = true
		if in := old[a]; in != nil {
			all = append(all, in)
			delete(old, a)
			continue
		}
		all = append(all, b.newInstance(a))
	}
	b.rebuildLocked(all)
	b.mu.Unlock()
	for _, in := range old {
		if in.own != nil {
			in.own.CloseIdleConnections()
		}
	}
}

func (b *balancerLayer) newInstance(addr string) *instance {
	b.nextID++
	in := &instance{id: b.nextID, addr: addr}
	base := b.base
	if tr, ok := base.(*http.Transport); ok {
		// A transport per instance: see Endpoints for why.
		c := tr.Clone()
		if b.e.scheme == "https" {
			if c.TLSClientConfig == nil {
				c.TLSClientConfig = &tls.Config{}
			}
			if c.TLSClientConfig.ServerName == "" {
				c.TLSClientConfig.ServerName = hostOnly(b.e.host)
			}
		}
		in.own, base = c, c
	}
	in.rt, in.limit = b.build(b.e, base, addr)
	return in
}

// busy reports whether any instance has requests in flight.
func (b *balancerLayer) busy() bool {
	set := b.set.Load()
	if set == nil {
		return b.resolving.Load()
	}
	for _, in := range set.all {
		if in.inflight.Load() > 0 {
			return true
		}
	}
	return false
}

func (b *balancerLayer) closeIdle() {
	if set := b.set.Load(); set != nil {
		for _, in := range set.all {
			if in.own != nil {
				in.own.CloseIdleConnections()
			}
		}
	}
}

// endpointView is one instance as the balancer shows it: its part of
// Snapshot's EndpointState (snapshot.go), each field the one of that name,
// and the instance's limit, whose piece snapshot.go adds.
type endpointView struct {
	addr                string
	ejected             bool
	ejectedUntil        time.Time
	ejections           int
	inFlight            int
	consecutiveFailures int
	requests            uint64
	limit               layer
}

// snapshot is the balancer's piece of Snapshot: the instances, in the
// order the resolver or Addrs gave them; nil before the first resolve.
func (b *balancerLayer) snapshot() []endpointView {
	b.mu.Lock()
	defer b.mu.Unlock()
	set := b.set.Load()
	if set == nil {
		return nil
	}
	out := make([]endpointView, 0, len(set.all))
	for _, in := range set.all {
		out = append(out, endpointView{
			addr: in.addr, ejected: in.ejected, ejectedUntil: in.until, ejections: in.times,
			inFlight: int(in.inflight.Load()), consecutiveFailures: int(in.consec.Load()),
			requests: in.sent.Load(), limit: in.limit,
		})
	}
	return out
}

// hostOnly is the host of a "host:port", without brackets.
func hostOnly(hostport string) string {
	h, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return hostport
	}
	return h
}

// show hands Snapshot the instances, each with its limit (shower).
func (b *balancerLayer) show(put func(any)) { put(b.snapshot()) }
