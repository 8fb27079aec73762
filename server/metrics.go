package server

import (
	"context"
	"errors"

	"github.com/bulwark-http/bulwark/internal/version"
	"github.com/bulwark-http/bulwark/internal/wire"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// instrumentationName names the Shedder's meter: this package's path, as
// OpenTelemetry names an instrumentation scope after the code that reports
// (the client reports under the root's). Its version is the module's.
const instrumentationName = "github.com/bulwark-http/bulwark/server"

// Attribute keys of the Shedder's metrics.
const (
	keyShedPriority = attribute.Key("bulwark.shed.priority")
	keyShedReason   = attribute.Key("bulwark.shed.reason")
	keyShedName     = attribute.Key("bulwark.shed.name")
	keyShedShadow   = attribute.Key("bulwark.shed.shadow")
)

// registerMetrics registers the observable instruments described on
// Shedder, with attribute sets built once here so that a collection
// allocates nothing per point.
func (s *Shedder) registerMetrics(mp metric.MeterProvider, name string) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	switch mp.(type) {
	case metricnoop.MeterProvider, *metricnoop.MeterProvider:
		return
	}
	m := mp.Meter(instrumentationName, metric.WithSchemaURL(semconv.SchemaURL), metric.WithInstrumentationVersion(version.Module()))
	served, err1 := m.Int64ObservableCounter("bulwark.shed.served",
		metric.WithDescription("Requests a Shedder handed to its handler, by priority."), metric.WithUnit("{request}"))
	refused, err2 := m.Int64ObservableCounter("bulwark.shed.refused",
		metric.WithDescription("Requests a Shedder refused with a 503, by reason and priority."), metric.WithUnit("{request}"))
	inflight, err3 := m.Int64ObservableGauge("bulwark.shed.in_flight",
		metric.WithDescription("Requests in a Shedder's handler now."), metric.WithUnit("{request}"))
	queued, err4 := m.Int64ObservableGauge("bulwark.shed.queued",
		metric.WithDescription("Requests waiting in a Shedder's queue now."), metric.WithUnit("{request}"))
	workers, err5 := m.Int64ObservableGauge("bulwark.shed.workers",
		metric.WithDescription("A Shedder's worker count in force: Workers, or the adaptive count."), metric.WithUnit("{worker}"))
	if err := errors.Join(err1, err2, err3, err4, err5); err != nil {
		otel.Handle(err)
		return
	}
	// set is the attribute set of one point: kv, and the Shedder's name.
	set := func(kv ...attribute.KeyValue) metric.ObserveOption {
		if name != "" {
			kv = append(kv, keyShedName.String(name))
		}
		if s.shadow {
			kv = append(kv, keyShedShadow.Bool(true))
		}
		return metric.WithAttributeSet(attribute.NewSet(kv...))
	}
	var byPrio [numPriorities]metric.ObserveOption
	var byReason [numShedReasons][numPriorities]metric.ObserveOption
	for p := range byPrio {
		pa := keyShedPriority.String(wire.PriorityNames[p])
		byPrio[p] = set(pa)
		for r := range byReason {
			byReason[r][p] = set(keyShedReason.String(shedReasonNames[r]), pa)
		}
	}
	whole := set()
	_, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		st := s.Stats()
		for p, n := range st.Served {
			o.ObserveInt64(served, int64(n), byPrio[p])
		}
		for r := range st.Shed {
			for p, n := range st.Shed[r] {
				o.ObserveInt64(refused, int64(n), byReason[r][p])
			}
		}
		o.ObserveInt64(inflight, int64(st.InFlight), whole)
		o.ObserveInt64(queued, int64(st.Queued), whole)
		o.ObserveInt64(workers, int64(st.Workers), whole)
		return nil
	}, served, refused, inflight, queued, workers)
	if err != nil {
		otel.Handle(err)
	}
}
