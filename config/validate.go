package config

import (
	"context"

	"github.com/bulwark-http/bulwark"
)

// validate is bulwark.New's validation of cfg: Config.Validate, which
// builds and starts nothing. The one check that depends on more than the
// file is Bulkhead.FleetRate's, which needs a Fleet that leases quota: a
// file that names a Fleet is checked against it, as New would check it;
// one that names none leaves Config.Fleet to the program, which sets it
// before New, or to the Transport an Update applies the file to, so the
// check is theirs, against the Fleet that will run the policies (leaseStub
// stands in meanwhile).
func validate(cfg bulwark.Config) error {
	if cfg.Fleet == nil {
		cfg.Fleet = leaseStub{}
	}
	return cfg.Validate()
}

// leaseStub is a FleetLeaser for validate; Validate never calls it.
type leaseStub struct{}

func (leaseStub) Publish(context.Context, bulwark.FleetUpdate) error { return nil }

func (leaseStub) Receive(ctx context.Context, _ *bulwark.FleetSink) error {
	<-ctx.Done()
	return ctx.Err()
}

func (leaseStub) Lease(context.Context, bulwark.LeaseRequest) (bulwark.LeaseGrant, error) {
	return bulwark.LeaseGrant{}, context.Canceled
}
