package bulwark

import (
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strconv"
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
	// ("[METHOD ][HOST]/[PATH]"): "POST api.example.com/v1/charges",
	// "GET /v1/rates/{id}", "/static/", "/{$}". A request's route is the one
	// an http.ServeMux holding these patterns would pick for it (a host in a
	// pattern is matched against the request's Host without its port); a
	// request that matches none, or that ServeMux would redirect, uses its
	// host's policy alone. A malformed pattern, two that conflict, or Routes
	// under GODEBUG=httpmuxgo121=1 (the Go 1.21 pattern rules) is a
	// *ConfigError from New. Nil means no routes, and routing costs nothing;
	// a path seen for the first time costs what ServeMux's matching costs, a
	// recent one is matched from a memo without allocating.
	//
	// A route's zero fields inherit from its host's policy, then from the
	// package defaults. A route has its own breaker, retry layer and budget,
	// timeouts, fallback and fault injection, one set per host it is used
	// on, and learns its own attempt timeout and slow-call threshold from a
	// cold start (on a balanced upstream it follows the host's). What limits
	// the host as a whole is shared by its routes: the bulkhead and its rate,
	// the pushback pauses, the balancer and its instances (whose attempt
	// deadlines and fault layers follow the upstream's policy). A route
	// policy that sets Bulkhead, Endpoints, Retry.NoPushback or
	// Retry.MaxRetryAfter is a *ConfigError. Snapshot shows each route in
	// HostSnapshot.Routes; metrics and spans of a routed call carry the
	// pattern (never the path) as a bulwark.route attribute.
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

// policies is what New and Update compile from a Config: a route per
// Upstreams key, Default's, the table of Config.Routes, and the limits on
// the per-host state.
type policies struct {
	def      *compiled
	exact    map[hostPort]*compiled
	byHost   map[string]*compiled
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
	all := []*compiled{rs.def}
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

// hostPort is an Upstreams key with a port, as policies.exact keys it.
type hostPort struct{ host, port string }

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

// compile validates cfg's policies and host limits, and compiles them: the
// one validation New and Update share. Every invalid value is a
// *ConfigError.
func compile(cfg Config) (*policies, error) {
	rs, err := hostLimits(cfg)
	if err != nil {
		return nil, err
	}
	if rs.def, err = compileDefault(cfg.Default); err != nil {
		return nil, err
	}
	parents := []*compiled{rs.def}

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
		r, err := compileUpstream(k, cfg.Upstreams[k], cfg.Default)
		if err != nil {
			return nil, err
		}
		parents = append(parents, r)
		if port != "" {
			rs.exact[hostPort{host, port}] = r
		} else {
			rs.byHost[host] = r
		}
	}
	if rs.table, err = compileRoutes(cfg.Routes, parents); err != nil {
		return nil, err
	}
	return rs, nil
}

// hostLimits is cfg's MaxHosts and HostIdle, defaulted, in policies with
// no policy yet.
func hostLimits(cfg Config) (*policies, error) {
	rs := &policies{
		exact:    make(map[hostPort]*compiled),
		byHost:   make(map[string]*compiled),
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
	return rs, nil
}

// compileDefault validates and compiles Config.Default.
func compileDefault(d Policy) (*compiled, error) {
	if err := d.switches(); err != nil {
		return nil, err
	}
	def := d.withDefaults()
	if err := def.validate(); err != nil {
		return nil, err
	}
	if def.Endpoints.set() {
		// Every host no Upstreams key names would go to these instances.
		return nil, &ConfigError{Field: "Endpoints", Value: "set", Reason: "belongs in an Upstreams policy, not Default"}
	}
	return &compiled{upstream: "default", policy: def, raw: d}, nil
}

// compileUpstream validates and compiles the Upstreams policy p of key k,
// over Default's d.
func compileUpstream(k string, p, d Policy) (*compiled, error) {
	if err := p.switches(); err != nil {
		return nil, inUpstream(err, k)
	}
	raw := p.inherit(d)
	c := raw.withDefaults()
	if err := c.validate(); err != nil {
		return nil, inUpstream(err, k)
	}
	return &compiled{upstream: k, policy: c, raw: raw}, nil
}

// forHost picks the compiled policy for a host (canonical, as
// canonicalHost makes it) and port: exact host:port, then host, then
// Default.
func (rs *policies) forHost(host, port string) *compiled {
	if r := rs.exact[hostPort{host, port}]; r != nil {
		return r
	}
	if r := rs.byHost[host]; r != nil {
		return r
	}
	return rs.def
}
