package bulwark

import (
	"fmt"
	"hash/maphash"
	"net/http"
	"net/url"
	"reflect"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
)

// routeTable is Config.Routes compiled: a ServeMux whose handlers are the
// routes, so that net/http's own pattern matching, with its precedence
// rules, picks a request's route. Nothing is ever served from it.
type routeTable struct {
	mux    *http.ServeMux
	routes []*routeEntry // by index
	memo   routeMemo
}

// routeMemo remembers the route of recent (method, host, path) triples.
// ServeMux.Handler costs several hundred nanoseconds here, and a request
// it finds no pattern for allocates; a request path seen before costs a
// hash and four string comparisons instead, with nothing allocated. The
// mux never changes after New, so an entry never goes stale. It is a
// direct-mapped cache of memoSlots entries: a colliding triple replaces
// the one in its slot.
//
// A triple is remembered only the second time it is seen, as a TinyLFU
// cache's doorkeeper admits only keys seen before (Einziger, Friedman and
// Manes, "TinyLFU: A Highly Efficient Cache Admission Policy", ACM TOS
// 2017): seen holds the hash of the last triple that missed in each slot,
// with nothing allocated. Paths that are all different (an ID in each)
// then pay ServeMux's own cost and no entry, and they do not push the
// repeated paths' entries out. A hash collision in seen only admits an
// entry early; entries are compared in full, so a route is never wrong.
// It is bounded in count (memoSlots) and in bytes (memoMaxKey per entry).
type routeMemo struct {
	seed  maphash.Seed
	slots [memoSlots]atomic.Pointer[memoEntry]
	seen  [memoSlots]atomic.Uint64
}

const memoSlots = 512 // a power of two

// memoMaxKey bounds, in bytes, the method, host and path (raw and
// decoded) of a remembered triple: a longer one is matched by the mux
// every time and never kept, so that the memo holds at most
// memoSlots × memoMaxKey bytes of keys (1 MiB), whatever paths callers
// send. Paths are caller-controlled input; routed paths worth remembering
// are short.
const memoMaxKey = 2048

type memoEntry struct {
	method, host, path, rawPath string
	route                       *routeEntry // nil: no route
}

// routeEntry is one Routes key: its policy compiled for each parent it
// can have (Default and every Upstreams policy), so a host's route stack
// is built without validating anything.
type routeEntry struct {
	idx      int
	pattern  string
	byParent map[*Policy]*Policy // the parent's compiled policy → the route's
}

// noRoute is the entry of the catch-all pattern compileRoutes adds.
var noRoute = &routeEntry{idx: -1, pattern: "/"}

// ServeHTTP is never called: the entry is a marker that ServeMux.Handler
// hands back.
func (*routeEntry) ServeHTTP(http.ResponseWriter, *http.Request) {}

// compileRoutes validates and compiles cfg.Routes against every parent:
// the route's zero fields inherit from the policy of the host it is used
// on (as written, with Default's under it), and only then take the package
// defaults, so that a default derived from another field (the breaker's
// slow-call threshold from the attempt timeout) is derived from the
// route's own.
func compileRoutes(routes map[string]Policy, parents []*route) (*routeTable, error) {
	if len(routes) == 0 {
		return nil, nil
	}
	keys := make([]string, 0, len(routes))
	for k := range routes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if muxGo121() {
		return nil, &ConfigError{Route: keys[0], Reason: "Routes need Go 1.22 ServeMux patterns, " +
			"and GODEBUG=httpmuxgo121=1 makes net/http match by the Go 1.21 rules, " +
			"under which a method or a {wildcard} in a pattern is part of a literal host or path"}
	}
	rt := &routeTable{mux: http.NewServeMux()}
	rt.memo.seed = maphash.MakeSeed()
	for i, k := range keys {
		rp := routes[k]
		if err := rp.switches(); err != nil {
			return nil, inRoute(err, k, "")
		}
		if err := perHostFields(rp); err != nil {
			return nil, inRoute(err, k, "")
		}
		e := &routeEntry{idx: i, pattern: k, byParent: make(map[*Policy]*Policy, len(parents))}
		for _, parent := range parents {
			p := rp.inherit(parent.raw).withDefaults()
			if err := p.validate(); err != nil {
				return nil, inRoute(err, k, parent.upstream)
			}
			e.byParent[&parent.policy] = &p
		}
		if err := register(rt.mux, k, e); err != nil {
			return nil, err
		}
		rt.routes = append(rt.routes, e)
	}
	// A marker for "no route" under every other pattern, so that a request
	// no route matches finds it, where ServeMux would otherwise look for
	// the methods that would have matched (to answer 405), allocating. It
	// is the least specific pattern there is, so it changes no route's
	// precedence; when a route already covers every request ("/",
	// "/{path...}"), registering it fails and it is not needed.
	_ = register(rt.mux, "/", noRoute)
	return rt, nil
}

// muxGo121 reports whether net/http's ServeMux matches by the Go 1.21
// rules, as it does under GODEBUG=httpmuxgo121=1. net/http reads the
// setting once, when it starts, from the environment or from a //go:debug
// directive or go.mod godebug line of the main module, so an os.Getenv
// would miss the last two: this asks a ServeMux how it behaves instead.
// Under the Go 1.22 rules "/{x}" is a wildcard that matches "/a"; under
// the 1.21 rules it is the literal path "/{x}", which does not.
var muxGo121 = sync.OnceValue(func() bool {
	mux := http.NewServeMux()
	mux.Handle("/{x}", noRoute)
	_, pattern := mux.Handler(&http.Request{Method: "GET", Host: "probe", URL: &url.URL{Path: "/a"}})
	return pattern != "/{x}"
})

// register adds a pattern to the mux. ServeMux panics on a pattern it
// refuses (malformed, or conflicting with one registered before); that
// refusal is the Config error, so this is the one place bulwark recovers a
// panic.
func register(mux *http.ServeMux, pattern string, h http.Handler) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &ConfigError{Route: pattern, Reason: fmt.Sprint(r)}
		}
	}()
	mux.Handle(pattern, h)
	return nil
}

// perHostFields refuses a route policy that sets what is per host: the
// bulkhead, the balancer's instances and the pushback settings belong to
// the upstream's policy, since they limit what the host as a whole gets.
func perHostFields(p Policy) error {
	for _, f := range []struct {
		name string
		v    any
	}{
		{"Bulkhead", p.Bulkhead},
		{"Endpoints", p.Endpoints},
		{"Retry.NoPushback", p.Retry.NoPushback},
		{"Retry.MaxRetryAfter", p.Retry.MaxRetryAfter},
	} {
		if !reflect.ValueOf(f.v).IsZero() {
			return fieldError(f.name, "set", "is per host: set it in the upstream's policy")
		}
	}
	return nil
}

// inRoute labels a validation error with the route (and the upstream whose
// policy it inherited from) it came from.
func inRoute(err error, pattern, upstream string) error {
	err = inUpstream(err, upstream)
	if ce, ok := err.(*ConfigError); ok {
		ce.Route = pattern
	}
	return err
}

// routeState is one route's stack on one host.
type routeState struct {
	pattern  string
	rt       stage
	rep      *reporter  // the host's, with bulwark.route
	parts    []any      // as hostState.parts
	classify Classifier // the route's Policy.Classify
	policy   *Policy    // the route's compiled policy on this host
	// learned is the route's own healthy latency: a route is an endpoint
	// the user named apart, often for a latency of its own (a report
	// behind a fast API), so its calls learn its bounds and teach the
	// host's nothing; a rare slow route sharing a fast host's p99.9 would
	// time out every call. Kept across an Update, as the host's is. On a
	// balanced upstream, whose attempt deadlines are the instances', it is
	// the host's.
	learned *learned

	shows []func(*HostSnapshot) // as hostState.shows
}

// keepRoutes builds, on hs, the new stack of every route prev had built
// that hs's table still has (by pattern), keeping the state of the
// route's own layers whose shape is unchanged, by the rule a host's stack
// follows (reuseFrom): a route's breaker keeps its window, state and
// manual control across an Update, as the host's does. A host whose
// upstream label changes keeps nothing, as for its own stack. Routes prev
// never used are built on their first request, as before.
func (t *Transport) keepRoutes(hs, prev *hostState) {
	if hs.table == nil || prev.upstream != hs.upstream {
		return
	}
	var olds []*routeState
	prev.eachRoute(func(rs *routeState) { olds = append(olds, rs) })
	hs.routeMu.Lock()
	defer hs.routeMu.Unlock()
	for _, rs := range olds {
		for _, e := range hs.table.routes {
			if e.pattern == rs.pattern && hs.routes[e.idx].Load() == nil {
				t.storeRoute(hs, e, keptParts(rs.parts, rs.policy, e.byParent[hs.policy]), rs.learned)
			}
		}
	}
}

// routeStack returns req's route on hs, nil when no route matches. ServeMux.Handler does the matching, on req.Host as a server
// would see it (URL.Host when Host is empty); a request ServeMux would
// redirect (an unclean path, a missing trailing slash) matches no route.
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

// lookup returns req's route, nil for none: from the memo, or from the
// mux (and then remembered).
func (rt *routeTable) lookup(req *http.Request) *routeEntry {
	host, u := req.Host, req.URL
	if host == "" {
		host = u.Host
	}
	h := maphash.String(rt.memo.seed, u.Path)
	h ^= maphash.String(rt.memo.seed, host) * 0x9e3779b97f4a7c15
	h += uint64(len(req.Method))<<7 + uint64(len(u.RawPath))
	i := h & (memoSlots - 1)
	slot := &rt.memo.slots[i]
	if m := slot.Load(); m != nil && m.path == u.Path && m.host == host && m.method == req.Method && m.rawPath == u.RawPath {
		return m.route
	}
	e := rt.match(req, host)
	if len(req.Method)+len(host)+len(u.Path)+len(u.RawPath) > memoMaxKey {
		return e // too long to keep (memoMaxKey)
	}
	if rt.memo.seen[i].Swap(h) != h {
		return e // first sight: not remembered yet
	}
	// Copies: the memo must not keep a caller's request alive.
	slot.Store(&memoEntry{method: strings.Clone(req.Method), host: strings.Clone(host),
		path: strings.Clone(u.Path), rawPath: strings.Clone(u.RawPath), route: e})
	return e
}

// match asks the mux. It matches on req.Host as a server would see it,
// URL.Host when Host is empty.
func (rt *routeTable) match(req *http.Request, host string) *routeEntry {
	if req.Host != host {
		// A shallow copy with the Host set, for the matcher only, never
		// sent; pooled, since Handler does not keep it.
		r := shells.Get().(*http.Request)
		*r = *req
		r.Host = host
		defer func() { *r = http.Request{}; shells.Put(r) }()
		req = r
	}
	h, pattern := rt.mux.Handler(req)
	e, ok := h.(*routeEntry)
	if !ok || e == noRoute || pattern != e.pattern {
		// A redirect, or the catch-all.
		return nil
	}
	return e
}

var shells = sync.Pool{New: func() any { return new(http.Request) }}

// addRoute builds a route's stack on hs on its first request.
func (t *Transport) addRoute(hs *hostState, e *routeEntry) *routeState {
	hs.routeMu.Lock()
	defer hs.routeMu.Unlock()
	if rs := hs.routes[e.idx].Load(); rs != nil {
		return rs
	}
	return t.storeRoute(hs, e, kept{}, nil)
}

// storeRoute builds e's stack on hs, keeping old's state and the learned
// latency l (nil: a new one, cold), and stores it. Under hs.routeMu.
func (t *Transport) storeRoute(hs *hostState, e *routeEntry, old kept, l *learned) *routeState {
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
	rs.rt, rs.parts, rs.shows = t.buildRoute(hs, rs.rep, p, old, rs.learned)
	t.mu.RLock()
	c, ok := t.controls[hs.name]
	t.mu.RUnlock()
	if ok {
		for _, p := range rs.parts {
			if b, ok := p.(breakerController); ok {
				b.setControl(c)
			}
		}
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

// RouteSnapshot is the state of one route's own layers on a host (see
// Config.Routes); the shared ones are in the HostSnapshot. A layer the
// route's policy disables has a nil field.
type RouteSnapshot struct {
	Pattern string // the Config.Routes key
	Breaker *BreakerSnapshot
	Budget  *BudgetSnapshot
	// Learned is what the route's own calls taught of its healthy
	// latency, and the bounds in force on it: a route learns apart from
	// its host, from a cold start.
	Learned *LearnedSnapshot
}

func (rs *routeState) snapshot() RouteSnapshot {
	var h HostSnapshot
	for _, show := range rs.shows {
		show(&h)
	}
	return RouteSnapshot{Pattern: rs.pattern, Breaker: h.Breaker, Budget: h.Budget, Learned: h.Learned}
}

// routeSlots makes a host's empty route slots; nil without routes.
func (rt *routeTable) slots() []atomic.Pointer[routeState] {
	if rt == nil {
		return nil
	}
	return make([]atomic.Pointer[routeState], len(rt.routes))
}
