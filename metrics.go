package bulwark

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/metric"
)

// gaugeAgg says how a gauge combines the values of the hosts that share an
// upstream label.
type gaugeAgg int

const (
	gaugeSum gaugeAgg = iota // in-flight, queued: the upstream's total
	gaugeMax                 // breaker state: the worst host
	gaugeMin                 // budget left: the scarcest
)

// registerGauge registers an Int64ObservableGauge name (under the bulwark.
// prefix) read at every collection: f calls observe once per host (or per
// upstream) and registerGauge reports one point per upstream, the hosts'
// values combined by agg. f runs on the MeterProvider's collection
// goroutine; it must not block. The registration lives as long as the
// MeterProvider.
func (t *Transport) registerGauge(name, desc, unit string, agg gaugeAgg, f func(observe func(upstream string, v int64))) error {
	g, err := t.obs.meter.Int64ObservableGauge(name, metric.WithDescription(desc), metric.WithUnit(unit))
	if err != nil {
		return err
	}
	_, err = t.obs.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		vals := make(map[string]int64)
		f(func(upstream string, v int64) {
			old, seen := vals[upstream]
			switch {
			case !seen:
				vals[upstream] = v
			case agg == gaugeSum:
				vals[upstream] = old + v
			case agg == gaugeMax && v > old, agg == gaugeMin && v < old:
				vals[upstream] = v
			}
		})
		for up, v := range vals {
			o.ObserveInt64(g, v, metric.WithAttributes(keyUpstream.String(up)))
		}
		return nil
	}, g)
	return err
}

// registerGauges registers the per-upstream gauges of the breaker, the
// bulkhead, the retry budget and the balancer, once, in New; they read
// Snapshot at each collection. Without a MeterProvider that could ever
// record, it registers nothing. A failure is logged, not returned: New
// does not fail over metrics.
func (t *Transport) registerGauges() {
	if !t.obs.meterOn {
		return
	}
	gauge := func(name, desc, unit string, agg gaugeAgg, f func(h HostSnapshot, observe func(string, int64))) error {
		return t.registerGauge(name, desc, unit, agg, func(observe func(string, int64)) {
			for _, h := range t.Snapshot().Hosts {
				f(h, observe)
			}
		})
	}
	errs := []error{
		gauge("bulwark.breaker.state", "Circuit breaker state: 0 closed, 1 half-open, 2 open; the worst of the upstream's hosts.", "1", gaugeMax,
			func(h HostSnapshot, observe func(string, int64)) {
				if h.Breaker != nil {
					observe(h.Upstream, int64(h.Breaker.State))
				}
			}),
		gauge("bulwark.bulkhead.in_flight", "Bulkhead slots held.", "{request}", gaugeSum,
			func(h HostSnapshot, observe func(string, int64)) {
				for _, b := range h.bulkheads() {
					observe(h.Upstream, int64(b.InFlight))
				}
			}),
		gauge("bulwark.bulkhead.queued", "Requests queued for a bulkhead slot.", "{request}", gaugeSum,
			func(h HostSnapshot, observe func(string, int64)) {
				for _, b := range h.bulkheads() {
					observe(h.Upstream, int64(b.Queued))
				}
			}),
		gauge("bulwark.bulkhead.limit", "Bulkhead concurrency limit in force, adaptive or fixed.", "{request}", gaugeSum,
			func(h HostSnapshot, observe func(string, int64)) {
				for _, b := range h.bulkheads() {
					observe(h.Upstream, int64(b.Limit))
				}
			}),
		gauge("bulwark.throttle.probability", "Client-side throttle's local rejection probability, in parts per million; the highest of the upstream's hosts.", "ppm", gaugeMax,
			func(h HostSnapshot, observe func(string, int64)) {
				if h.Throttle != nil {
					observe(h.Upstream, int64(h.Throttle.Probability*1e6))
				}
			}),
		gauge("bulwark.retry.budget.remaining", "Retries the retry budget allows now; the scarcest of the upstream's hosts.", "{retry}", gaugeMin,
			func(h HostSnapshot, observe func(string, int64)) {
				if h.Budget != nil {
					observe(h.Upstream, h.Budget.Remaining)
				}
			}),
		gauge("bulwark.outlier.ejected", "Instances ejected by outlier detection now.", "{instance}", gaugeSum,
			func(h HostSnapshot, observe func(string, int64)) {
				if h.Endpoints != nil {
					observe(h.Upstream, int64(h.ejected()))
				}
			}),
	}
	if err := errors.Join(errs...); err != nil {
		t.logger.Warn("bulwark: registering gauges", "err", err)
	}
}
