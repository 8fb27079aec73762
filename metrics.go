package bulwark

import (
	"context"
	"errors"
	"net"
	"slices"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// gaugeAgg says how a gauge combines the values of the hosts that share an
// upstream label.
type gaugeAgg int

const (
	gaugeSum gaugeAgg = iota // in-flight, queued: the upstream's total
	gaugeMax                 // throttle probability: the highest host
	gaugeMin                 // budget left: the scarcest
)

// perUpstream is one gauge's values by upstream label, each the values of
// the upstream's hosts combined by agg. An upstream no host reported for
// has no point.
type perUpstream[N int64 | float64] struct {
	agg  gaugeAgg
	vals map[string]N
}

func newPerUpstream[N int64 | float64](agg gaugeAgg) *perUpstream[N] {
	return &perUpstream[N]{agg: agg, vals: make(map[string]N)}
}

// add combines one host's value v into upstream's.
func (p *perUpstream[N]) add(upstream string, v N) {
	old, seen := p.vals[upstream]
	switch {
	case !seen:
		p.vals[upstream] = v
	case p.agg == gaugeSum:
		p.vals[upstream] = old + v
	case p.agg == gaugeMax && v > old, p.agg == gaugeMin && v < old:
		p.vals[upstream] = v
	}
}

// breakerStates are the states the bulwark.breaker.state series are
// reported for, every one at every collection.
var breakerStates = [...]CircuitState{CircuitClosed, CircuitHalfOpen, CircuitOpen}

// gauges are the instruments registerGauges makes; one callback observes
// them all from one Snapshot.
type gauges struct {
	inFlight, queued, limit, budget, ejected metric.Int64ObservableGauge
	throttle                                 metric.Float64ObservableGauge
	breakerState                             metric.Int64ObservableUpDownCounter
	failureRate, slowRate                    metric.Float64ObservableGauge
}

// registerGauges registers the gauges of the breaker, the bulkhead, the
// throttle, the retry budget and the balancer, once, in New: per upstream
// label, but the breaker's per host (and per route on it). They read
// Snapshot at each collection, on the MeterProvider's collection
// goroutine, for as long as the MeterProvider lives. Without a
// MeterProvider that could ever record, it registers nothing. A failure is
// logged, not returned: New does not fail over metrics.
func (t *Transport) registerGauges() {
	if !t.obs.meterOn {
		return
	}
	m := t.obs.meter
	var errs []error
	i64 := func(name, unit, desc string) metric.Int64ObservableGauge {
		g, err := m.Int64ObservableGauge(name, metric.WithDescription(desc), metric.WithUnit(unit))
		errs = append(errs, err)
		return g
	}
	f64 := func(name, unit, desc string) metric.Float64ObservableGauge {
		g, err := m.Float64ObservableGauge(name, metric.WithDescription(desc), metric.WithUnit(unit))
		errs = append(errs, err)
		return g
	}
	var g gauges
	g.inFlight = i64("bulwark.bulkhead.in_flight", "{request}", "Bulkhead slots held, summed over the upstream's hosts.")
	g.queued = i64("bulwark.bulkhead.queued", "{request}", "Requests queued for a bulkhead slot, summed over the upstream's hosts.")
	g.limit = i64("bulwark.bulkhead.limit", "{request}", "Bulkhead concurrency limit in force, adaptive or fixed, summed over the upstream's hosts.")
	g.throttle = f64("bulwark.throttle.probability", "1", "Client-side throttle's local rejection probability, 0 to 1; the highest of the upstream's hosts.")
	g.budget = i64("bulwark.retry.budget.remaining", "{retry}", "Retries the retry budget allows now; the scarcest of the upstream's hosts.")
	g.ejected = i64("bulwark.outlier.ejected", "{instance}", "Instances ejected by outlier detection now, summed over the upstream's hosts.")
	var err error
	g.breakerState, err = m.Int64ObservableUpDownCounter("bulwark.breaker.state", metric.WithUnit("{breaker}"),
		metric.WithDescription("Circuit breakers in each state: per host (and route), 1 for the breaker's state and 0 for the others."))
	errs = append(errs, err)
	g.failureRate = f64("bulwark.breaker.failure.rate", "1",
		"Failed share of the calls in a host's breaker window, 0 to 1; none while the window holds fewer than Breaker.MinCalls.")
	g.slowRate = f64("bulwark.breaker.slow_call.rate", "1",
		"Slow share of the calls in a host's breaker window, 0 to 1; none while the window holds fewer than Breaker.MinCalls.")
	if err := errors.Join(errs...); err != nil {
		t.logger.Warn("bulwark: registering gauges", "err", err)
		return
	}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		g.observe(o, t.Snapshot())
		return nil
	}, g.inFlight, g.queued, g.limit, g.throttle, g.budget, g.ejected, g.breakerState, g.failureRate, g.slowRate)
	if err != nil {
		t.logger.Warn("bulwark: registering gauges", "err", err)
	}
}

// observe reports every gauge's points for s.
func (g *gauges) observe(o metric.Observer, s Snapshot) {
	inFlight, queued, limit := newPerUpstream[int64](gaugeSum), newPerUpstream[int64](gaugeSum), newPerUpstream[int64](gaugeSum)
	budget, ejected := newPerUpstream[int64](gaugeMin), newPerUpstream[int64](gaugeSum)
	throttle := newPerUpstream[float64](gaugeMax)
	for _, h := range s.Hosts {
		for _, b := range h.bulkheads() {
			inFlight.add(h.Upstream, int64(b.InFlight))
			queued.add(h.Upstream, int64(b.Queued))
			limit.add(h.Upstream, int64(b.Limit))
		}
		if h.Throttle != nil {
			throttle.add(h.Upstream, h.Throttle.Probability)
		}
		if h.Budget != nil {
			budget.add(h.Upstream, h.Budget.Remaining)
		}
		if h.Endpoints != nil {
			ejected.add(h.Upstream, int64(h.ejected()))
		}
		host := hostAttrs(h)
		if h.Breaker != nil {
			g.observeBreaker(o, host, h.Breaker)
		}
		for _, r := range h.Routes {
			if r.Breaker != nil {
				g.observeBreaker(o, append(host, keyRoute.String(r.Pattern)), r.Breaker)
			}
		}
	}
	for _, c := range []struct {
		g metric.Int64ObservableGauge
		p *perUpstream[int64]
	}{{g.inFlight, inFlight}, {g.queued, queued}, {g.limit, limit}, {g.budget, budget}, {g.ejected, ejected}} {
		for up, v := range c.p.vals {
			o.ObserveInt64(c.g, v, metric.WithAttributes(keyUpstream.String(up)))
		}
	}
	for up, v := range throttle.vals {
		o.ObserveFloat64(g.throttle, v, metric.WithAttributes(keyUpstream.String(up)))
	}
}

// observeBreaker reports one breaker's state series and rates, under the
// attributes kv. The rates are its own window's (a fleet's counts are in
// BreakerSnapshot apart), and are not observed while the window holds
// fewer calls than MinCalls: the breaker does not judge such a window, and
// a rate of 1 after one failed call in one would read as an alarm.
func (g *gauges) observeBreaker(o metric.Observer, kv []attribute.KeyValue, b *BreakerSnapshot) {
	kv = slices.Clip(kv) // each append below gets its own array
	for _, st := range breakerStates {
		v := int64(0)
		if b.State == st {
			v = 1
		}
		o.ObserveInt64(g.breakerState, v, metric.WithAttributes(append(kv, keyBreakerState.String(stateLabel(st.String())))...))
	}
	if b.Calls == 0 || b.Calls < int64(b.MinCalls) {
		return
	}
	n := float64(b.Calls)
	at := metric.WithAttributes(kv...)
	o.ObserveFloat64(g.failureRate, float64(b.Failures)/n, at)
	o.ObserveFloat64(g.slowRate, float64(b.Slow)/n, at)
}

// hostAttrs are the attributes of a host's own series: its upstream label
// and, as the semantic conventions name a peer, server.address,
// server.port and url.scheme (one host:port reached over two schemes has
// two breakers).
func hostAttrs(h HostSnapshot) []attribute.KeyValue {
	kv := []attribute.KeyValue{keyUpstream.String(h.Upstream), semconv.URLScheme(h.Scheme)}
	host, port, err := net.SplitHostPort(h.Host)
	if err != nil {
		return append(kv, semconv.ServerAddress(h.Host))
	}
	kv = append(kv, semconv.ServerAddress(host))
	if p, err := strconv.Atoi(port); err == nil {
		kv = append(kv, semconv.ServerPort(p))
	}
	return kv
}
