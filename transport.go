package bulwark

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Package defaults for the per-host state.
const (
	// DefaultMaxHosts caps how many hosts have state (a breaker, a bulkhead,
	// a budget) at once when Config.MaxHosts is zero.
	DefaultMaxHosts = 1024
	// DefaultHostIdle is how long a host's state is kept without a request
	// once the cap is reached, when Config.HostIdle is zero.
	DefaultHostIdle = 10 * time.Minute
)

// Config configures a Transport. The zero value is a working configuration:
// http.DefaultTransport's settings underneath and the package defaults for
// every layer.
type Config struct {
	// Base sends each attempt. Nil means a clone of http.DefaultTransport
	// (or http.DefaultTransport itself when it has been replaced by
	// something other than an *http.Transport).
	Base http.RoundTripper

	// BaseIgnoresContext says that Base may not return when a request's
	// context ends, and keeps the deadlines whatever it does: each attempt
	// then runs in a goroutine of its own, which the caller leaves behind
	// when the attempt's context ends (Timeout.Attempt, Timeout.Total, the
	// caller's deadline or cancel), as Hystrix's thread isolation leaves a
	// command that ignores its timeout to its thread. The call goes on at
	// once with the attempt's timeout error; the abandoned attempt keeps
	// its bulkhead slot until Base really returns, so a host that holds
	// requests past their deadline still holds no more than its share, and
	// the response it returns late is drained (up to 4 KiB) and closed
	// (HostSnapshot.AbandonedAttempts counts them). Only the wait for the
	// response headers is guarded; a body's reads are the caller's.
	// Needs the deadline layers (Timeout not Disabled).
	//
	// It is off by default: a base that honours its context, as net/http's
	// Transport does, never needs it, and it costs every attempt a
	// goroutine, a hand-over between goroutines and five allocations
	// (bench's BenchmarkAbandonCost).
	BaseIgnoresContext bool

	// Default is the policy for every host that no Upstreams key names, and
	// the parent an upstream's zero fields inherit from.
	Default Policy

	// Upstreams holds per-upstream policies keyed by "host" or "host:port"
	// (no scheme, no path; case does not matter). A request's URL picks the
	// exact host:port key first, then the host key, then Default; the port
	// of a URL without one is the scheme's (80 or 443). Zero fields inherit
	// from Default.
	//
	// A fully qualified name with one trailing dot is the same host as
	// without it, in keys and in requests: a request to
	// "http://api.example.com./" gets the "api.example.com" policy (and
	// shares that host's state), and a key "api.example.com." is the key
	// "api.example.com". An IPv6 address is written in brackets, as in a
	// URL: "[::1]" or "[::1]:8080"; a bare "::1" is refused, since a port
	// cannot be told from the address's last group. A port is 1..65535,
	// without leading zeros. Any other key is a *ConfigError from New.
	Upstreams map[string]Policy

	// Routes holds per-route policies keyed by net/http ServeMux patterns
	// ("[METHOD ][HOST]/[PATH]", as http.ServeMux documents them):
	// "POST api.example.com/v1/charges", "GET /v1/rates/{id}",
	// "/static/", "/{$}". A request's route is the one an http.ServeMux
	// holding these patterns would pick for it, by ServeMux's precedence
	// (the most specific pattern wins; a host in a pattern is matched
	// against the request's Host without its port); a request that matches
	// none, or that ServeMux would redirect (an unclean path, a missing
	// trailing slash), uses its host's policy alone. A malformed pattern,
	// or two that conflict as ServeMux says, is a *ConfigError from New.
	// Nil means no routes, and routing costs nothing. With routes, a
	// (method, host, path) seen recently is matched from a memo, without
	// allocating; a path seen for the first time (an ID in each path) pays
	// what ServeMux's own matching costs, several hundred nanoseconds and,
	// for a wildcard, an allocation. Routes need the Go
	// 1.22 pattern rules: under GODEBUG=httpmuxgo121=1, with which
	// ServeMux reads patterns by the Go 1.21 rules, New refuses Routes
	// with a *ConfigError.
	//
	// A route's zero fields inherit from the policy of the host the request
	// goes to (its Upstreams policy or Default), then from the package
	// defaults. A route has its own breaker, retry layer and retry budget,
	// timeouts, fallback and fault injection, one set per host it is used
	// on: a failing charge endpoint opens its own breaker without stopping
	// the rates endpoint of the same host. What limits the host as a whole
	// stays per host and is shared by all its routes: the bulkhead (and its
	// rate limit), the pushback pauses a Retry-After asks for, and on a
	// balanced upstream the balancer with its instances (their bulkheads,
	// attempt deadlines and fault layers follow the upstream's policy, so a
	// route's Timeout.Attempt and Fault do not apply there). A route learns
	// its own attempt timeout and slow-call threshold (see Timeout.Attempt)
	// from its own calls, from a cold start, and its calls teach the host
	// nothing; on a balanced upstream it follows the host's. A route policy
	// that sets Bulkhead, Endpoints, Retry.NoPushback or
	// Retry.MaxRetryAfter is a *ConfigError. Snapshot shows each route's
	// own state in HostSnapshot.Routes. Metrics and spans of a routed call
	// carry the pattern (never the path) as a bulwark.route attribute,
	// whose values are as few as Routes has keys; the host's shared layers
	// report without it.
	Routes map[string]Policy

	// TracerProvider and MeterProvider are where bulwark's spans and metrics
	// go. Nil means the global providers from go.opentelemetry.io/otel,
	// looked up again as requests arrive, so setting them after New works.
	// Each attempt gets a client span (HTTP semantic conventions, URL
	// redacted) that is a child of the span in the request's context; with
	// none there, bulwark starts one "bulwark.request" span for the call.
	// Retries, rejections and fallbacks are events on that parent span.
	// Metrics are named bulwark.* with a bulwark.upstream attribute (the
	// Upstreams key or "default").
	//
	// With otelhttp, wrap bulwark: otelhttp.NewTransport(bulwarkTransport)
	// gives one logical span with bulwark's attempt spans as its children.
	// If otelhttp must sit inside, as Base, it already makes a span per
	// attempt: set TracerProvider to noop.NewTracerProvider() so there is
	// one span per attempt, not two.
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider

	// Propagator injects each attempt's trace context into its request.
	// Nil means the global propagator, otel.GetTextMapPropagator().
	Propagator propagation.TextMapPropagator

	// Logger receives state changes at Info and retries at Debug. Nil means
	// no logging.
	Logger *slog.Logger

	// MaxHosts caps the number of hosts with live state. Every distinct
	// scheme, host and port gets its own breaker, bulkhead and budget; once
	// the cap is reached, adding a host first evicts hosts idle for longer
	// than HostIdle and then the least recently used, so a stream of
	// distinct hosts cannot grow memory without bound. A request in flight
	// keeps the state it started with. Zero means DefaultMaxHosts.
	MaxHosts int

	// HostIdle is how long without a request makes a host's state the first
	// to be evicted when MaxHosts is reached. Zero means DefaultHostIdle.
	HostIdle time.Duration

	// Fleet, if not nil, shares breaker verdicts and counts, pushback
	// pauses and retry budgets with the other processes calling the same
	// hosts, off the request path (see Fleet), and, when it implements
	// FleetLeaser, Bulkhead.FleetRate quotas; the Transport then runs two
	// goroutines (three with a FleetLeaser) until Close. Nil means
	// each process decides alone. Like Base, it is New's: Update ignores
	// it. Only each host's own breaker and pushback are shared, not the
	// breakers of Routes.
	Fleet Fleet

	// Version and Source name this configuration and where it came from
	// (a file's path, a fleet's store), for Snapshot.Config: New and
	// Update record them as the version in force, and Update records a
	// refused Config that carries either as the last rejected one. They
	// change nothing else; empty is fine.
	Version, Source string
}

// Transport is bulwark's http.RoundTripper: the router that picks each
// request's upstream policy and per-host state, in front of the stack of
// layers built for that host. Build it with New; use it as an
// http.Client's Transport, or use NewClient. It is safe for concurrent use.
//
// The stack, outer to inner, for one request:
//
//	router → fallback → total deadline → retry → pushback → breaker → [balancer →] bulkhead → attempt deadline → attempt span → [fault →] base
//
// Each host's stack is composed once, when the host is first seen, and each
// route's on a host when the route is first used there, never per call.
type Transport struct {
	base http.RoundTripper
	// abandon is Config.BaseIgnoresContext.
	abandon bool
	// ownBase is whether base is bulwark's own clone of
	// http.DefaultTransport (Config.Base nil), which serves http and
	// https only (invalidRequest).
	ownBase bool
	logger  *slog.Logger
	obs     *observer // instruments and providers, made once (observe.go)
	// last is the host lookup found last (see lookup); nil after its
	// eviction.
	last atomic.Pointer[hostState]
	// randN returns a uniform number in [0, n) for n > 0, for retry
	// jitter and the breaker's open time; nil means math/rand/v2. Tests
	// replace it before the first request.
	randN func(n int64) int64
	// ignoredRA counts Retry-After values ignored as malformed (Snapshot).
	ignoredRA atomic.Uint64

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

	fleet *fleetLink // nil without Config.Fleet (fleet.go)

	config configRecord // the Version in force and the last refused (Snapshot.Config)
}

// policies is what New and Update compile from a Config: a route per
// Upstreams key, Default's, the table of Config.Routes, and the limits on
// the per-host state.
type policies struct {
	def      *route
	exact    map[hostPort]*route
	byHost   map[string]*route
	table    *routeTable // nil: no Config.Routes
	maxHosts int
	idle     time.Duration
}

// checkLeases refuses a Bulkhead.FleetRate that nothing would enforce:
// the Fleet is not a FleetLeaser (or there is none).
func (rs *policies) checkLeases(leases bool) error {
	if leases {
		return nil
	}
	all := []*route{rs.def}
	for _, r := range rs.exact {
		all = append(all, r)
	}
	for _, r := range rs.byHost {
		all = append(all, r)
	}
	for _, r := range all {
		if r.policy.Bulkhead.FleetRate > 0 && !r.policy.Bulkhead.Disabled {
			err := fieldError("Bulkhead.FleetRate", r.policy.Bulkhead.FleetRate, "needs a Config.Fleet that implements FleetLeaser")
			if r.upstream != "default" {
				err = inUpstream(err, r.upstream)
			}
			return err
		}
	}
	return nil
}

// route is a compiled policy and the upstream label it goes by.
type route struct {
	upstream string // the Upstreams key, or "default"
	policy   Policy
	raw      Policy // as written, over Default's: what routes inherit from
}

type hostPort struct{ host, port string }

// hostKey is an authority as http.Transport pools connections by it:
// scheme, lower-case host, and port (the scheme's default when absent). Its
// strings are slices of the request URL's, so a lookup allocates nothing.
type hostKey struct{ scheme, host, port string }

// hostState is what the router keeps for one host: its policy, the stack
// built for it, and the layers that have state to show or to be asked
// about. No layer sees it: each got its own narrow env when it was built.
type hostState struct {
	key      hostKey
	name     string // "host:port", for errors and logs
	upstream string
	policy   *Policy
	rt       stage
	rep      *reporter
	// shared holds the layers the host's routes share with it.
	shared hostShared
	// faults counts what every fault layer of the host injected.
	faults *faultCounts
	// learned is the host's healthy latency (layer.go), kept across an
	// Update like faults.
	learned *learned
	// deadlines counts what the host's attempt deadlines (its instances'
	// and routes' too) refused and abandoned, kept across an Update like
	// faults.
	deadlines *deadlineCounts
	// table is the route table the host was built under (nil: no
	// routes), and routes[i] its i-th route's stack on this host, built on
	// its first request (nil until then). A host keeps its table, so an
	// Update, which replaces the host, never races a lookup.
	table   *routeTable
	routes  []atomic.Pointer[routeState]
	routeMu sync.Mutex // serialises building routes' stacks
	// parts are the stack's layers that implement one of the small
	// interfaces the router asks (busier, idleCloser, breakerController,
	// fleetMember), in stack order, outer first.
	parts []any
	// shows put each layer's piece of Snapshot in a HostSnapshot (see
	// compose).
	shows []func(*HostSnapshot)
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

// New validates cfg and builds a Transport. Every invalid value is a
// *ConfigError (matching ErrInvalidConfig) naming the upstream and field.
func New(cfg Config) (*Transport, error) {
	_, leases := cfg.Fleet.(FleetLeaser)
	rs, err := compileFor(cfg, leases)
	if err != nil {
		return nil, err
	}
	t := &Transport{
		base:     cfg.Base,
		abandon:  cfg.BaseIgnoresContext,
		logger:   cfg.Logger,
		policies: *rs,
		hosts:    make(map[hostKey]*hostState),
		controls: make(map[string]BreakerControl),
	}
	if t.base == nil {
		if dt, ok := http.DefaultTransport.(*http.Transport); ok {
			t.base, t.ownBase = dt.Clone(), true
		} else {
			t.base = http.DefaultTransport
		}
	}
	if t.logger == nil {
		t.logger = slog.New(slog.DiscardHandler)
	}
	t.obs = newObserver(cfg.TracerProvider, cfg.Propagator, cfg.MeterProvider, t.logger)
	t.registerGauges()
	t.config.applied(cfg.Version, cfg.Source, time.Now())
	// Last, so that a refused configuration starts no goroutine.
	t.fleet = newFleetLink(cfg.Fleet, t.logger, t)
	return t, nil
}

// Validate reports whether New would accept c: nil, or the *ConfigError
// New would return, naming the upstream and field. It builds nothing and
// starts nothing, so a loader can check a Config it read before anything
// uses it. A Bulkhead.FleetRate is checked against c.Fleet, as New checks
// it; Update checks it against the Transport's own Fleet instead.
func (c Config) Validate() error {
	_, leases := c.Fleet.(FleetLeaser)
	_, err := compileFor(c, leases)
	return err
}

// compileFor is compile, and a Bulkhead.FleetRate refused unless leases
// (the Fleet that would run the policies is a FleetLeaser): the whole of
// New's, Update's and Validate's validation.
func compileFor(cfg Config, leases bool) (*policies, error) {
	rs, err := compile(cfg)
	if err != nil {
		return nil, err
	}
	if err := rs.checkLeases(leases); err != nil {
		return nil, err
	}
	return rs, nil
}

// Close stops the Transport's background work: the goroutines that publish
// to and receive from Config.Fleet. It does not close the Fleet, nor idle
// connections. After Close the Transport still sends requests, with local
// state only. It returns nil; calling it again does nothing.
func (t *Transport) Close() error {
	t.fleet.close()
	return nil
}

// compile validates cfg's policies and host limits, and compiles them: the
// one validation New and Update share. Every invalid value is a
// *ConfigError.
func compile(cfg Config) (*policies, error) {
	rs := &policies{
		exact:    make(map[hostPort]*route),
		byHost:   make(map[string]*route),
		maxHosts: cfg.MaxHosts,
		idle:     cfg.HostIdle,
	}
	switch {
	case cfg.MaxHosts < 0:
		return nil, &ConfigError{Field: "MaxHosts", Value: cfg.MaxHosts, Reason: "must be ≥ 0"}
	case cfg.MaxHosts == 0:
		rs.maxHosts = DefaultMaxHosts
	}
	switch {
	case cfg.HostIdle < 0:
		return nil, &ConfigError{Field: "HostIdle", Value: cfg.HostIdle, Reason: "must be ≥ 0"}
	case cfg.HostIdle == 0:
		rs.idle = DefaultHostIdle
	}

	if err := cfg.Default.switches(); err != nil {
		return nil, err
	}
	def := cfg.Default.withDefaults()
	if err := def.validate(); err != nil {
		return nil, err
	}
	if def.Endpoints.set() {
		// Every host no Upstreams key names would go to these instances.
		return nil, &ConfigError{Field: "Endpoints", Value: "set", Reason: "belongs in an Upstreams policy, not Default"}
	}
	rs.def = &route{upstream: "default", policy: def, raw: cfg.Default}
	parents := []*route{rs.def}

	// Sorted so that the first error reported does not depend on map order.
	keys := make([]string, 0, len(cfg.Upstreams))
	for k := range cfg.Upstreams {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	seen := make(map[string]string, len(keys))
	for _, k := range keys {
		host, port, err := parseUpstreamKey(k)
		if err != nil {
			return nil, &ConfigError{Upstream: k, Reason: err.Error()}
		}
		canon := host
		if port != "" {
			canon = net.JoinHostPort(host, port)
		}
		if other, dup := seen[canon]; dup {
			return nil, &ConfigError{Upstream: k, Reason: "names the same upstream as " + strconv.Quote(other)}
		}
		seen[canon] = k
		if err := cfg.Upstreams[k].switches(); err != nil {
			return nil, inUpstream(err, k)
		}
		raw := cfg.Upstreams[k].inherit(cfg.Default)
		p := raw.withDefaults()
		if err := p.validate(); err != nil {
			return nil, inUpstream(err, k)
		}
		r := &route{upstream: k, policy: p, raw: raw}
		parents = append(parents, r)
		if port != "" {
			rs.exact[hostPort{host, port}] = r
		} else {
			rs.byHost[host] = r
		}
	}
	table, err := compileRoutes(cfg.Routes, parents)
	if err != nil {
		return nil, err
	}
	rs.table = table
	return rs, nil
}

// NewClient returns an *http.Client whose Transport is New(cfg): a drop-in
// for http.DefaultClient. The client's own Timeout is left at zero, since
// Timeout.Total bounds each call (each redirect hop is a call of its own);
// redirects and cookies behave as with a zero http.Client.
func NewClient(cfg Config) (*http.Client, error) {
	t, err := New(cfg)
	if err != nil {
		return nil, err
	}
	return &http.Client{Transport: t}, nil
}

// RoundTrip sends req through the stack for its host. It implements
// http.RoundTripper: it never modifies req, always closes req.Body, and
// returns either a response or an error.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	return t.roundTrip(req, nil)
}

// roundTrip is RoundTrip with each attempt sent to via (call.via); nil is
// the base.
func (t *Transport) roundTrip(req *http.Request, via http.RoundTripper) (*http.Response, error) {
	// A request that cannot be written is refused before any layer sees
	// it: its fault is its own, and no layer may count it against the
	// host nor retry it.
	if err := invalidRequest(req, t.ownBase); err != nil {
		closeBody(req)
		return nil, err
	}
	if err := req.Context().Err(); err != nil {
		closeBody(req)
		return nil, doneError(req.Context())
	}
	now := time.Now()
	hs := t.lookupAt(req.URL, now.UnixNano())
	rt, rep, c := hs.rt, hs.rep, call{start: now, classify: hs.policy.Classify, above: retriedAbove(req.Header, &t.ignoredRA), via: via}
	if hs.table != nil {
		if r := t.routeStack(hs, req); r != nil {
			rt, rep, c.classify = r.rt, r.rep, r.classify
		}
	}
	resp, err := t.send(rep, rt, req, c)
	if err != nil || resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests {
		noteFailure(req.Context(), resp, err)
	}
	if err == nil {
		watchBody(req.Context(), resp)
	}
	return resp, err
}

// noteFailure notes a call that failed in the record of the incoming
// request its context carries, if any (CallRecord): a local refusal, or an
// answer that said don't retry (a pass-up from further down included). A
// call that was retried and still failed is noted by the retry layer,
// which knows.
func noteFailure(ctx context.Context, resp *http.Response, err error) {
	// A call with no record (no server half above it) reads nothing more.
	r, ok := ctx.Value(recordKey{}).(*CallRecord)
	if !ok {
		return
	}
	switch {
	case err != nil:
		// Refused here on purpose (breaker, bulkhead, pushback, throttle,
		// budget): the layer above retrying would meet the same refusal.
		// errors.Is, not classify, whose errors.As would allocate on a
		// refusal, which allocates nothing.
		if errors.Is(err, ErrBreakerOpen) || errors.Is(err, ErrBulkheadFull) || errors.Is(err, ErrPushback) ||
			errors.Is(err, ErrThrottled) || errors.Is(err, ErrRetryBudget) {
			r.notes.Or(noteRefused)
		}
	default:
		if stop, _, _ := noRetry(resp.Header); stop {
			r.notes.Or(noteNoRetry)
		}
	}
}

// CloseIdleConnections closes the base's idle connections, when the base
// can, as http.Client.CloseIdleConnections expects of a transport.
func (t *Transport) CloseIdleConnections() {
	type closeIdler interface{ CloseIdleConnections() }
	if ci, ok := t.base.(closeIdler); ok {
		ci.CloseIdleConnections()
	}
	// Balanced upstreams have a transport of their own per instance.
	t.eachHost(func(hs *hostState) {
		for _, p := range hs.parts {
			if c, ok := p.(idleCloser); ok {
				c.closeIdle()
			}
		}
	})
}

// idleCloser is a layer with connections of its own (the balancer's
// per-instance transports).
type idleCloser interface{ closeIdle() }

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
		t.evictLocked(now)
	}
	// The key's strings are slices of a caller's URL: copy them so the map
	// does not keep that URL alive.
	k = hostKey{strings.Clone(k.scheme), strings.Clone(k.host), strings.Clone(k.port)}
	r := t.route(k)
	hs := &hostState{key: k, name: net.JoinHostPort(k.host, k.port), upstream: r.upstream, policy: &r.policy,
		rawScheme: strings.Clone(u.Scheme), rawHost: strings.Clone(u.Host)}
	hs.lastUsed.Store(now)
	hs.rep = t.obs.reporter(hs.upstream, hs.name, k.port)
	hs.table, hs.routes = t.table, t.table.slots()
	t.buildStack(hs, nil)
	if c, ok := t.controls[hs.name]; ok {
		hs.controlBreaker(c)
	}
	t.hosts[k] = hs
	t.fleet.attach(hs.name, hs)
	t.obs.refresh()
	return hs
}

// evictLocked makes room: it drops hosts idle past t.idle, then, if that is
// not enough, the least recently used down to 7/8 of the cap, so the next
// inserts do not each pay for a scan. A host with requests in flight is
// evicted last: its next request would otherwise get a fresh bulkhead
// beside the one its running requests still hold, and the host would see
// twice its limit.
func (t *Transport) evictLocked(now int64) {
	for _, hs := range t.hosts {
		if now-hs.lastUsed.Load() > int64(t.idle) && !hs.busy() {
			t.dropLocked(hs)
		}
	}
	if len(t.hosts) < t.maxHosts {
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
	keep := t.maxHosts - t.maxHosts/8 - 1
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

// route picks the compiled policy for a host: exact host:port, then host,
// then Default.
func (t *Transport) route(k hostKey) *route {
	if r := t.exact[hostPort{k.host, k.port}]; r != nil {
		return r
	}
	if r := t.byHost[k.host]; r != nil {
		return r
	}
	return t.def
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

// send is the router's hand-off to a host's stack (or its route's, rt,
// with the route's reporter rep), with the call's state c: it counts the
// call's final outcome (in rep.calls, and in the metrics if on) and, when the caller's context has no span, wraps
// the call in a logical span so that its attempts share one trace.
func (t *Transport) send(rep *reporter, rt stage, req *http.Request, c call) (*http.Response, error) {
	o := rep.begin(req)
	if o == nil {
		resp, err := rt.roundTrip(req, c)
		rep.calls.count(c.judge(resp, err))
		return resp, err
	}
	if o.ctx != nil {
		req = req.WithContext(o.ctx)
	}
	returned := false
	defer func() {
		if !returned {
			// A layer below panicked: the logical span ends with it.
			o.abort()
		}
	}()
	resp, err := rt.roundTrip(req, c)
	returned = true
	j := c.judge(resp, err)
	rep.calls.count(j)
	o.end(req, resp, err, j)
	return resp, err
}
