package config

import (
	"context"

	"github.com/bulwark-http/bulwark"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// validate runs bulwark.New's validation on cfg's policies: bulwark has no
// Validate of its own, and New is the one place that holds every rule, so
// a Transport is built from the policies alone, with no-op providers (no
// instrument is registered anywhere) and no Base, Logger or Fleet of the
// program's, and closed at once. A Fleet that leases quota is stood in for
// by leaseStub, so Bulkhead.FleetRate is accepted as New would accept it.
func validate(cfg bulwark.Config) error {
	check := bulwark.Config{
		Default:        cfg.Default,
		Upstreams:      cfg.Upstreams,
		Routes:         cfg.Routes,
		MaxHosts:       cfg.MaxHosts,
		HostIdle:       cfg.HostIdle,
		TracerProvider: tracenoop.NewTracerProvider(),
		MeterProvider:  metricnoop.NewMeterProvider(),
	}
	if _, ok := cfg.Fleet.(bulwark.FleetLeaser); ok {
		check.Fleet = leaseStub{}
	}
	tr, err := bulwark.New(check)
	if err != nil {
		return err
	}
	return tr.Close()
}

// leaseStub is a FleetLeaser that does nothing, for validate.
type leaseStub struct{}

func (leaseStub) Publish(context.Context, bulwark.FleetUpdate) error { return nil }

func (leaseStub) Receive(ctx context.Context, _ *bulwark.FleetSink) error {
	<-ctx.Done()
	return ctx.Err()
}

func (leaseStub) Lease(ctx context.Context, _ bulwark.LeaseRequest) (bulwark.LeaseGrant, error) {
	return bulwark.LeaseGrant{}, context.Canceled
}
