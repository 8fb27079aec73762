package bulwark

import (
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Transport is bulwark's http.RoundTripper: the router that picks each
// request's upstream policy and per-host state, in front of the stack of
// layers built for that host (the package doc lists them, outer to
// inner). Build it with New; use it as an http.Client's Transport, or use
// NewClient. It is safe for concurrent use.
//
// Each host's stack is composed once, when the host is first seen, and each
// route's on a host when the route is first used there, never per call.
type Transport struct {
	// stackBuilder is what every stack is built over: the base, the
	// jitter source, the fleet (stack.go).
	stackBuilder
	// ownBase is whether base is bulwark's own clone of
	// http.DefaultTransport (Config.Base nil), which serves http and
	// https only (invalidRequest).
	ownBase bool
	logger  *slog.Logger
	obs     *observer // instruments and providers, made once (observe.go)
	// last is the host lookup found last (see lookup); nil after its
	// eviction.
	last atomic.Pointer[hostState]

	// policies are the compiled Config, guarded by mu: New sets them,
	// Update replaces them.
	policies
	// updateMu serialises Updates.
	updateMu sync.Mutex
	// updateBuilt, when set (by tests), is called by Update between
	// building the new stacks and swapping them in.
	updateBuilt func()

	mu    sync.RWMutex
	hosts map[hostKey]*hostState
	// controls holds manual breaker overrides by "host:port", applied to
	// hosts created later too (see ControlBreaker).
	controls map[string]BreakerControl

	config configRecord // the Version in force and the last refused (Snapshot.Config)

	// breakerControls is ControlBreaker (breaker.go), which hands its
	// control to applyControl.
	breakerControls
}

// hostKey is an authority as http.Transport pools connections by it:
// scheme, lower-case host, and port (the scheme's default when absent). Its
// strings are slices of the request URL's, so a lookup allocates nothing.
type hostKey struct{ scheme, host, port string }

// hostState is what the router keeps for one host: its policy, the stack
// built for it, and the layers that have state to show or to be asked
// about. No layer sees it: each got its own narrow env when it was built.
// A new per-host field is declared here and set in newHost.
type hostState struct {
	key      hostKey
	name     string // "host:port", for errors and logs
	upstream string
	policy   *Policy
	rt       layer
	rep      *reporter
	// shared holds the layers the host's routes share with it.
	shared hostShared
	// faults, learned (the host's healthy latency, layer.go) and
	// deadlines (what the host's attempt deadlines, its instances' and
	// routes' too, refused and abandoned) outlive an Update that keeps
	// the host's upstream.
	faults    *faultCounts
	learned   *learned
	deadlines *deadlineCounts
	// table is the route table the host was built under (nil: no
	// routes), and routes[i] its i-th route's stack on this host, built on
	// its first request (nil until then). A host keeps its table, so an
	// Update, which replaces the host, never races a lookup.
	table   *routeTable
	routes  []atomic.Pointer[routeState]
	routeMu sync.Mutex // serialises building routes' stacks
	// parts are the stack's layers with state: those the router asks
	// through a small interface (busier, idleCloser, breakerController,
	// fleetMember) and those that show in Snapshot (shower), outer first.
	parts []any
	// rawScheme and rawHost are the URL's Scheme and Host, as written, of
	// the request that made this state: the last-host fast path (lookup)
	// matches them exactly.
	rawScheme, rawHost string
	gone               atomic.Bool  // evicted (dropLocked)
	lastUsed           atomic.Int64 // unix nanoseconds, updated at most every touchEvery
	// passedUp counts the calls answered with a failure passed up from
	// below (NoRetryFromBelow), which no layer counts against the host.
	passedUp atomic.Uint64
}

// touchEvery is the resolution of a host's last-used time: fine enough for
// least-recently-used eviction to tell a host in steady use from churn,
// coarse enough that a busy host's state is not written on every request.
const touchEvery = 10 * time.Millisecond

// newHost is the one constructor of a host's state, for its first request
// (prev nil) and for Update (prev the state it replaces): k's state under
// policy c and route table, its stack built, keeping what prev's layers
// and routes may keep (see prior in stack.go) when prev has the same
// upstream label. A host whose label changes keeps only its pushback
// pauses: the rest of its state is reported under another label.
func (t *Transport) newHost(k hostKey, rawScheme, rawHost string, c *compiled, table *routeTable, prev *hostState) *hostState {
	hs := &hostState{key: k, name: net.JoinHostPort(k.host, k.port), upstream: c.upstream, policy: &c.policy,
		rawScheme: rawScheme, rawHost: rawHost, table: table, routes: table.slots()}
	if prev != nil {
		hs.lastUsed.Store(prev.lastUsed.Load())
	}
	var before prior
	if prev != nil && prev.upstream != hs.upstream {
		// A host whose label changes keeps nothing of ours, but the pause
		// it asked for (Retry-After) is its own word and still holds.
		if pb := kept[*pushbackLayer](prior{parts: prev.parts}); pb != nil {
			before.parts = []any{pb}
		}
		prev = nil
	}
	if prev == nil {
		hs.rep = t.obs.reporter(hs.upstream, hs.name, k.port)
		hs.faults, hs.learned, hs.deadlines = new(faultCounts), newLearned(hs.rep), new(deadlineCounts)
	} else {
		hs.rep, hs.faults, hs.learned, hs.deadlines = prev.rep, prev.faults, prev.learned, prev.deadlines
	}
	hs.learned.rep.Store(hs.rep)
	hs.shared.faults = hs.faults
	if prev != nil {
		before = prior{parts: prev.parts, policy: prev.policy}
	}
	hs.rt, hs.parts = t.compose(hostLayers, hs.policy, hs.env(hs.rep, hs.learned), &hs.shared, true, before)
	if prev != nil {
		// The routes prev had used keep what their shape allows, under
		// the new table; the others start on their next use.
		t.keepRoutes(hs, prev)
	}
	return hs
}

// env is what the host's layers know of it, with rep and l the reporter
// and learned latency of the stack being built (the host's, or a route's).
func (hs *hostState) env(rep *reporter, l *learned) env {
	return env{host: hs.name, scheme: hs.key.scheme, upstream: hs.upstream, rep: rep, learned: l,
		deadlines: hs.deadlines, passedUp: &hs.passedUp}
}

func defaultPort(scheme string) string {
	switch scheme {
	case "https", "wss":
		return "443"
	case "http", "ws":
		return "80"
	}
	return ""
}

// lookup returns u's per-host state, creating it on first use.
func (t *Transport) lookup(u *url.URL) *hostState { return t.lookupAt(u, time.Now().UnixNano()) }

// lookupAt is lookup at now, in unix nanoseconds.
func (t *Transport) lookupAt(u *url.URL, now int64) *hostState {
	// The last host looked up, when u names it exactly as the URL that made
	// its state did: one atomic load and two string comparisons, where the
	// map costs a lowercased, parsed key, its hash and the read lock, whose
	// counter every core writes.
	if hs := t.last.Load(); hs != nil && hs.spelled(u) && !hs.gone.Load() {
		t.touch(hs, now)
		return hs
	}
	k := hostKey{scheme: strings.ToLower(u.Scheme), host: canonicalHost(u.Hostname()), port: u.Port()}
	if k.port == "" {
		k.port = defaultPort(k.scheme)
	}
	t.mu.RLock()
	hs := t.hosts[k]
	t.mu.RUnlock()
	if hs == nil {
		hs = t.addHost(k, u, now)
	} else {
		t.touch(hs, now)
	}
	if hs.spelled(u) && t.last.Load() != hs {
		t.last.Store(hs)
	}
	return hs
}

// spelled reports whether u names hs exactly as the URL that made hs did.
func (hs *hostState) spelled(u *url.URL) bool {
	return hs.rawHost == u.Host && hs.rawScheme == u.Scheme
}

// touch records that hs was used at now, at most every touchEvery, so hot
// hosts do not bounce the cache line between cores on every request.
func (t *Transport) touch(hs *hostState, now int64) {
	if now-hs.lastUsed.Load() > int64(touchEvery) {
		hs.lastUsed.Store(now)
		t.obs.refresh() // a global provider may have been set since
	}
}

func (t *Transport) addHost(k hostKey, u *url.URL, now int64) *hostState {
	t.mu.Lock()
	defer t.mu.Unlock()
	if hs := t.hosts[k]; hs != nil {
		return hs
	}
	if len(t.hosts) >= t.maxHosts {
		t.evictLocked(now, 1)
	}
	// The key's strings are slices of a caller's URL: copy them so the map
	// does not keep that URL alive.
	k = hostKey{strings.Clone(k.scheme), strings.Clone(k.host), strings.Clone(k.port)}
	hs := t.newHost(k, strings.Clone(u.Scheme), strings.Clone(u.Host), t.forHost(k.host, k.port), t.table, nil)
	hs.lastUsed.Store(now)
	if c, ok := t.controls[hs.name]; ok {
		hs.controlBreaker(c)
	}
	t.hosts[k] = hs
	t.fleet.attach(hs.name, hs)
	t.obs.refresh()
	return hs
}

// evictLocked makes room for room more hosts: it drops hosts idle past
// t.idle, then, if that is not enough, the least recently used down to 7/8
// of the cap less room, so the next inserts do not each pay for a scan. A host with requests in flight is
// evicted last: its next request would otherwise get a fresh bulkhead
// beside the one its running requests still hold, and the host would see
// twice its limit.
func (t *Transport) evictLocked(now int64, room int) {
	for _, hs := range t.hosts {
		if now-hs.lastUsed.Load() > int64(t.idle) && !hs.busy() {
			t.dropLocked(hs)
		}
	}
	if len(t.hosts)+room <= t.maxHosts {
		return
	}
	type entry struct {
		hs   *hostState
		busy bool
		used int64
	}
	all := make([]entry, 0, len(t.hosts))
	for _, hs := range t.hosts {
		all = append(all, entry{hs, hs.busy(), hs.lastUsed.Load()})
	}
	sort.Slice(all, func(i, j int) bool {
		if all[i].busy != all[j].busy {
			return !all[i].busy
		}
		return all[i].used < all[j].used
	})
	keep := t.maxHosts - t.maxHosts/8 - room
	for _, e := range all[:len(all)-keep] {
		t.dropLocked(e.hs)
	}
	t.logger.Debug("bulwark: evicted per-host state", "hosts", len(all)-keep, "cap", t.maxHosts)
}

// dropLocked removes hs's state from the map, and marks it gone so that the
// last-host fast path never returns it, even when a lookup that found it in
// the map just before stores it there after. Under t.mu.
func (t *Transport) dropLocked(hs *hostState) {
	delete(t.hosts, hs.key)
	hs.gone.Store(true)
	t.last.CompareAndSwap(hs, nil)
}

// busy reports whether the host has requests in flight or queued, as the
// layers that count them (bulkhead, balancer) say. Without them nothing
// counts requests, so it is false.
func (hs *hostState) busy() bool {
	for _, p := range hs.parts {
		if b, ok := p.(busier); ok && b.busy() {
			return true
		}
	}
	return false
}

// busier is a layer that knows whether requests are in flight through it.
type busier interface{ busy() bool }

// idleCloser is a layer with connections of its own (the balancer's
// per-instance transports).
type idleCloser interface{ closeIdle() }

// applyFleet hands an update from the fleet to the hosts it names, one
// per scheme (fleetMember).
func (t *Transport) applyFleet(u FleetUpdate, now time.Time) bool {
	changed := false
	t.eachHost(func(hs *hostState) {
		if hs.name == u.Host && hs.applyFleet(u, now) {
			changed = true
		}
	})
	return changed
}

// applyFleet hands an update from the fleet to each of the host's layers
// that share state through it (fleetMember).
func (hs *hostState) applyFleet(u FleetUpdate, now time.Time) bool {
	changed := false
	for _, p := range hs.parts {
		if m, ok := p.(fleetMember); ok && m.applyFleet(u, now) {
			changed = true
		}
	}
	return changed
}

// eachHost calls f for every host with live state, outside the lock (on a
// copy of the list), so f may take its own locks.
func (t *Transport) eachHost(f func(hs *hostState)) {
	t.mu.RLock()
	all := make([]*hostState, 0, len(t.hosts))
	for _, hs := range t.hosts {
		all = append(all, hs)
	}
	t.mu.RUnlock()
	for _, hs := range all {
		f(hs)
	}
}

// hostCount reports how many hosts have live state.
func (t *Transport) hostCount() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.hosts)
}

// applyControl records the manual control c of the host name, "host:port"
// (ControlBreaker), for the host's state over every scheme, now and made
// later, and hands it to their breakers.
func (t *Transport) applyControl(name string, c BreakerControl) {
	t.mu.Lock()
	if c == BreakerAuto {
		delete(t.controls, name)
	} else {
		t.controls[name] = c
	}
	var hosts []*hostState
	for _, hs := range t.hosts {
		if hs.name == name {
			hosts = append(hosts, hs)
		}
	}
	t.mu.Unlock()
	for _, hs := range hosts {
		hs.controlBreaker(c)
	}
}

// controlBreaker hands c to the host's breaker, if it has one, and to its
// routes'.
func (hs *hostState) controlBreaker(c BreakerControl) {
	controlParts(hs.parts, c)
	hs.eachRoute(func(rs *routeState) { controlParts(rs.parts, c) })
}

// controlParts hands c to the breaker among parts, if any.
func controlParts(parts []any, c BreakerControl) {
	for _, p := range parts {
		if b, ok := p.(breakerController); ok {
			b.setControl(c)
		}
	}
}

// routeState is one route's stack on one host.
type routeState struct {
	pattern  string
	rt       layer
	rep      *reporter  // the host's, with bulwark.route
	parts    []any      // as hostState.parts
	classify Classifier // the route's Policy.Classify
	policy   *Policy    // the route's compiled policy on this host
	// learned is the route's own healthy latency: its calls learn its
	// bounds and teach the host's nothing. Kept across an Update, as the
	// host's is. On a balanced upstream, whose attempt deadlines are the
	// instances', it is the host's.
	learned *learned
}

// keepRoutes builds, on hs, the new stack of every route prev had built
// that hs's table still has (by pattern), keeping the state of the
// route's own layers by the rule a host's stack follows. Routes prev
// never used are built on their first request, as before.
func (t *Transport) keepRoutes(hs, prev *hostState) {
	if hs.table == nil {
		return
	}
	var olds []*routeState
	prev.eachRoute(func(rs *routeState) { olds = append(olds, rs) })
	hs.routeMu.Lock()
	defer hs.routeMu.Unlock()
	for _, rs := range olds {
		for _, e := range hs.table.routes {
			if e.pattern == rs.pattern && hs.routes[e.idx].Load() == nil {
				t.storeRoute(hs, e, prior{parts: rs.parts, policy: rs.policy}, rs.learned)
			}
		}
	}
}

// routeStack returns req's route on hs, nil when no route matches.
// ServeMux.Handler does the matching, on req.Host as a server would see it
// (URL.Host when Host is empty); a request ServeMux would redirect (an
// unclean path, a missing trailing slash) matches no route.
func (t *Transport) routeStack(hs *hostState, req *http.Request) *routeState {
	e := hs.table.lookup(req)
	if e == nil {
		return nil
	}
	if rs := hs.routes[e.idx].Load(); rs != nil {
		return rs
	}
	return t.addRoute(hs, e)
}

// addRoute builds a route's stack on hs on its first request.
func (t *Transport) addRoute(hs *hostState, e *routeEntry) *routeState {
	hs.routeMu.Lock()
	defer hs.routeMu.Unlock()
	if rs := hs.routes[e.idx].Load(); rs != nil {
		return rs
	}
	return t.storeRoute(hs, e, prior{}, nil)
}

// storeRoute builds e's stack on hs, keeping before's state and the learned
// latency l (nil: a new one, cold), and stores it. The route's own layers
// report through its reporter; the host's shared ones (hostShared), which
// its stack passes through, through the host's. Under hs.routeMu.
func (t *Transport) storeRoute(hs *hostState, e *routeEntry, before prior, l *learned) *routeState {
	p := e.byParent[hs.policy]
	rs := &routeState{pattern: e.pattern, rep: hs.rep.forRoute(e.pattern), classify: p.Classify, policy: p, learned: l}
	switch {
	case hs.shared.balancer != nil:
		// The instances' attempt deadlines, the host's, time every call:
		// the route's breaker follows what they learn.
		rs.learned = hs.learned
	case l == nil:
		rs.learned = newLearned(rs.rep)
	default:
		rs.learned.rep.Store(rs.rep)
	}
	shared := hs.shared
	rs.rt, rs.parts = t.compose(routeLayers, p, hs.env(rs.rep, rs.learned), &shared, false, before)
	t.mu.RLock()
	c, ok := t.controls[hs.name]
	t.mu.RUnlock()
	if ok {
		controlParts(rs.parts, c)
	}
	hs.routes[e.idx].Store(rs)
	return rs
}

// eachRoute calls f for every route with a stack on hs, under hs.routeMu.
func (hs *hostState) eachRoute(f func(rs *routeState)) {
	if hs.routes == nil {
		return
	}
	hs.routeMu.Lock()
	defer hs.routeMu.Unlock()
	for i := range hs.routes {
		if rs := hs.routes[i].Load(); rs != nil {
			f(rs)
		}
	}
}

// slots makes a host's empty route slots; nil without routes.
func (rt *routeTable) slots() []atomic.Pointer[routeState] {
	if rt == nil {
		return nil
	}
	return make([]atomic.Pointer[routeState], len(rt.routes))
}
