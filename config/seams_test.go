package config

// The seam table of the loader: each row drives a file through config and
// the Transport it is applied to, where the two meet (Update's checks
// against the running Transport, Snapshot.Config's record, Parse's
// version). The root's seam table cannot hold them: it never imports its
// neighbours.

import "testing"

var seamRows = []struct {
	name string
	run  func(t *testing.T)
}{
	{"Apply × Update, fleet quota (FleetRate), Watch", seamApplyFleetRate},
	{"Apply × refusal, declared version, Snapshot", seamApplyRefusalVersion},
	{"Marshal × Parse, version", seamMarshalVersion},
}

func TestSeams(t *testing.T) {
	for _, row := range seamRows {
		t.Run(row.name, row.run)
	}
}
