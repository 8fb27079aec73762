package redisfleet

// The seam table of the fleet's configuration: each row drives, against a
// real redis-server, a change of the store where it meets the processes
// that follow it (their Transports, their acks, their Snapshot.Config),
// as the root's seam table drives the Transport's features where they
// meet. The root cannot hold these rows: it never imports its
// neighbours.

import "testing"

var seamRows = []struct {
	name string
	run  func(t *testing.T)
}{
	{"canary share × store, follower", seamCanaryShareStore},
	{"rollback × first canary, follower, status", seamRollbackFirstCanary},
	{"canary × first canary, follower, status", seamFirstCanaryShrink},
	{"push × fleet quota (FleetRate), follower", seamPushFleetRate},
	{"refusal × declared version, status, Snapshot", seamRefusalVersion},
}

func TestSeams(t *testing.T) {
	for _, row := range seamRows {
		t.Run(row.name, row.run)
	}
}
