package bulwark

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Snapshot is the state of every host a Transport keeps, as
// Transport.Snapshot reports it. It encodes as JSON under its Go field
// names, breaker states and controls by name ("open", "force-closed"), and
// decodes back from that; package github.com/bulwark-http/bulwark/debug
// serves it so, and as a page for a person.
type Snapshot struct {
	// Hosts has one entry per live host, sorted by Host then Scheme.
	Hosts []HostSnapshot
	// RetryAfterIgnored is how many Retry-After headers on 429 and 503
	// responses, and rate-limit fields (RateLimit, RateLimit-Remaining and
	// -Reset, X-RateLimit-Remaining and -Reset) on any, were ignored because
	// they were malformed, negative or asked for more than a day, and how
	// many rate-limit policies (RateLimit-Policy, RateLimit-Limit,
	// X-RateLimit-Limit) a bulkhead with a Rate could not follow (see
	// Bulkhead.Rate), and how many grpc-retry-pushback-ms values did not
	// parse (each stopped the retry of its response, as gRPC reads it),
	// and how many of the SDKs' signals did not (attempt headers on
	// requests, x-should-retry, retry-after-ms and their kin on responses:
	// see AttemptHeader; each was ignored). A growing count means an
	// upstream, or a client above, sends headers bulwark cannot obey.
	RetryAfterIgnored uint64
	// Fleet is the health of the link to Config.Fleet; nil without one.
	Fleet *FleetSnapshot
	// Config is the Config.Version in force, where it came from, and the
	// last configuration refused and why; nil until a Config with a
	// Version or Source was applied or one was refused.
	Config *ConfigSnapshot
}

// HostSnapshot is one host's state. A layer the host's policy disables has
// a nil field.
type HostSnapshot struct {
	// Host is the "host:port": lower-case, the port always present (the
	// scheme's default when the URL has none), an IPv6 address in
	// brackets; the same string errors carry.
	Host string
	// Scheme is the URL scheme; one host:port reached over two schemes has
	// two entries, each with its own state.
	Scheme string
	// Upstream is the Config.Upstreams key whose policy the host uses, or
	// "default".
	Upstream string

	Breaker  *BreakerSnapshot
	Bulkhead *BulkheadSnapshot // nil too for a balanced upstream: see Endpoints
	Budget   *BudgetSnapshot
	Pushback *PushbackSnapshot
	Hedge    *HedgeSnapshot    // nil unless the upstream hedges
	Throttle *ThrottleSnapshot // nil unless Throttle is enabled
	Quota    *QuotaSnapshot    // nil unless Bulkhead.FleetRate is set and leased
	Fallback *FallbackSnapshot // nil unless the upstream has a Fallback
	// Learned is what bulwark learned of the host's healthy latency, and
	// the attempt timeout and slow-call threshold in force with where each
	// comes from (see Timeout.Attempt and Breaker.SlowCall).
	Learned *LearnedSnapshot
	// Calls are the host's calls by final outcome, since its state was
	// made (an Update keeps them, unless it moves the host to another
	// upstream).
	Calls CallCounts
	// DeadlineTooShort is how many attempts the host's attempt deadlines
	// refused to send, since its state was made, because less than the
	// least time a request is sent with (10 ms) was left before the call's
	// deadline: ErrDeadlineTooShort. Zero when Timeout is disabled.
	DeadlineTooShort uint64
	// AbandonedAttempts is how many attempts the host's attempt deadlines
	// stopped waiting for while the base still ran, since its state was
	// made: with Config.BaseIgnoresContext, an attempt whose base did not
	// return by its deadline (or the caller's cancel). Each kept its
	// bulkhead slot until the base returned, and its late response was
	// closed unread. A count that grows says the base ignores its context.
	AbandonedAttempts uint64
	// Latency is the host's recent latency percentiles, failures
	// included; nil without a retry layer (Retry and Hedge both off) or
	// while its window holds no attempt.
	Latency *LatencySnapshot
	// Fault is what fault injection did on the host, its routes and
	// instances included; nil until a policy that injects faults (see
	// Fault) has a stack on the host.
	Fault *FaultSnapshot
	// Endpoints are a balanced upstream's instances, each with its own
	// bulkhead; nil for other hosts.
	Endpoints []EndpointState
	// Routes are the Config.Routes used on this host so far, with the state
	// of their own layers, sorted by pattern; nil when none was used.
	Routes []RouteSnapshot
	// PassedUp is how many calls the host answered with a failure passed
	// up from a tier below it (NoRetryFromBelow), since its state was
	// made: no retry, breaker, adaptive limit or instance's ejection counts
	// them against the host, so they are counted here, apart.
	PassedUp uint64
}

// Snapshot returns the state of every live host: breakers with their
// windows, bulkheads, retry budgets, pushback pauses and balanced
// instances. It takes each layer's lock briefly, one host at a time, and is
// meant for metrics scrapes and debug pages, not for the request path.
// Reading a breaker may move one whose open time has passed to half-open,
// as the next request would.
func (t *Transport) Snapshot() Snapshot {
	var s Snapshot
	t.eachHost(func(hs *hostState) { s.Hosts = append(s.Hosts, hs.snapshot()) })
	sort.Slice(s.Hosts, func(i, j int) bool {
		a, b := s.Hosts[i], s.Hosts[j]
		if a.Host != b.Host {
			return a.Host < b.Host
		}
		return a.Scheme < b.Scheme
	})
	s.RetryAfterIgnored = t.ignoredRA.Load()
	s.Fleet = t.fleet.snapshot()
	s.Config = t.config.snapshot()
	return s
}

// snapshot is the host's state: each layer's piece (shower), the host's
// own counts, and its routes'.
func (hs *hostState) snapshot() HostSnapshot {
	h := HostSnapshot{Host: hs.name, Scheme: hs.key.scheme, Upstream: hs.upstream, PassedUp: hs.passedUp.Load()}
	h.showParts(hs.parts)
	h.Calls = hs.rep.calls.snapshot()
	h.Fault = hs.faults.snapshot()
	h.DeadlineTooShort, h.AbandonedAttempts = hs.deadlines.tooShort.Load(), hs.deadlines.abandoned.Load()
	h.Learned = showLearned(hs.learned, hs.policy)
	hs.eachRoute(func(rs *routeState) { h.Routes = append(h.Routes, rs.snapshot()) })
	sort.Slice(h.Routes, func(i, j int) bool { return h.Routes[i].Pattern < h.Routes[j].Pattern })
	return h
}

// showParts puts the piece of each of parts that shows (shower) in its
// field of h.
func (h *HostSnapshot) showParts(parts []any) {
	for _, p := range parts {
		if s, ok := p.(shower); ok {
			s.show(h.put)
		}
	}
}

// put files one layer's piece of Snapshot in its field: the one place
// that knows which piece goes where.
func (h *HostSnapshot) put(piece any) {
	switch v := piece.(type) {
	case *BreakerSnapshot:
		h.Breaker = v
	case *BulkheadSnapshot:
		h.Bulkhead = v
	case *QuotaSnapshot:
		h.Quota = v
	case []endpointView:
		h.Endpoints, h.Quota = showEndpoints(v)
	case *BudgetSnapshot:
		h.Budget = v
	case *HedgeSnapshot:
		h.Hedge = v
	case *LatencySnapshot:
		h.Latency = v
	case *PushbackSnapshot:
		h.Pushback = v
	case *ThrottleSnapshot:
		h.Throttle = v
	case *FallbackSnapshot:
		h.Fallback = v
	default:
		panic(fmt.Sprintf("bulwark: HostSnapshot has no field for a %T", piece))
	}
}

// showLearned is l's snapshot under p's bounds.
func showLearned(l *learned, p *Policy) *LearnedSnapshot {
	var attempt, slow time.Duration
	if !p.Timeout.Disabled {
		attempt = p.Timeout.Attempt
	}
	if !p.Breaker.Disabled {
		slow = p.Breaker.SlowCall
	}
	return l.snapshot(attempt, p.Timeout.learn, slow, p.Breaker.learn)
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

// snapshot is the state of the route's own layers.
func (rs *routeState) snapshot() RouteSnapshot {
	var h HostSnapshot
	h.showParts(rs.parts)
	h.Learned = showLearned(rs.learned, rs.policy)
	return RouteSnapshot{Pattern: rs.pattern, Breaker: h.Breaker, Budget: h.Budget, Learned: h.Learned}
}

// EndpointState is one instance of a balanced upstream, as Snapshot
// reports it.
type EndpointState struct {
	// Addr is the instance's "host:port".
	Addr string
	// Ejected reports whether outlier detection has taken the instance out;
	// EjectedUntil is when it returns (zero when not ejected).
	Ejected      bool
	EjectedUntil time.Time
	// Ejections is how many times in a row it has been ejected: the
	// multiplier of its next ejection time.
	Ejections int
	// InFlight is the requests sent to it whose response body is not done.
	InFlight int
	// ConsecutiveFailures is its current run of failures.
	ConsecutiveFailures int
	// Requests is how many attempts the balancer has sent it.
	Requests uint64
	// Bulkhead is the instance's own bulkhead; nil when disabled.
	Bulkhead *BulkheadSnapshot
}

// showEndpoints is the balancer's piece of Snapshot with each instance's
// bulkhead added: EndpointState holds the pieces of two layers, the
// balancer's and the bulkhead's, so it is made here, where both are known.
// An instance's limit is the bulkhead that stack.go's instanceBuilder put
// there, or nil. The instances' bulkheads share the host's fleet quota,
// if any: quota is its piece.
func showEndpoints(vs []endpointView) (_ []EndpointState, quota *QuotaSnapshot) {
	if vs == nil {
		return nil, nil
	}
	out := make([]EndpointState, len(vs))
	for i, v := range vs {
		out[i] = EndpointState{Addr: v.addr, Ejected: v.ejected, EjectedUntil: v.ejectedUntil, Ejections: v.ejections,
			InFlight: v.inFlight, ConsecutiveFailures: v.consecutiveFailures, Requests: v.requests}
		if bh, ok := v.limit.(*bulkheadLayer); ok {
			var q *QuotaSnapshot
			out[i].Bulkhead, q = bh.snapshot()
			if quota == nil {
				quota = q
			}
		}
	}
	return out, quota
}

// Host returns the entries for host ("host:port"; case does not matter),
// one per scheme it was reached over.
func (s Snapshot) Host(host string) []HostSnapshot {
	var out []HostSnapshot
	for _, h := range s.Hosts {
		if strings.EqualFold(h.Host, host) {
			out = append(out, h)
		}
	}
	return out
}

// bulkheads is every bulkhead of h: its own, or its instances'.
func (h HostSnapshot) bulkheads() []BulkheadSnapshot {
	if h.Bulkhead != nil {
		return []BulkheadSnapshot{*h.Bulkhead}
	}
	var out []BulkheadSnapshot
	for _, e := range h.Endpoints {
		if e.Bulkhead != nil {
			out = append(out, *e.Bulkhead)
		}
	}
	return out
}

// ejected is how many of h's instances are ejected now.
func (h HostSnapshot) ejected() int {
	n := 0
	for _, e := range h.Endpoints {
		if e.Ejected {
			n++
		}
	}
	// Every instance ejected means all take requests again (see
	// rebuildLocked): none is out.
	if n == len(h.Endpoints) {
		return 0
	}
	return n
}
