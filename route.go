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
func compileRoutes(routes map[string]Policy, parents []*compiled) (*routeTable, error) {
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
