//go:build fleetlong

package redisfleet

import (
	"flag"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

var sickFor = flag.Duration("sickpod.dur", 20*time.Second, "how long TestSickPodLong runs each scenario (the outages half of it down)")

// TestSickPodLong is TestSickPod's scenarios for longer (-sickpod.dur),
// over one redis-server and over a Cluster of three masters and three
// replicas. make bench runs it (build tag fleetlong):
//
//	cd redisfleet && go test -tags fleetlong -count=1 -v -run TestSickPodLong .
func TestSickPodLong(t *testing.T) {
	t.Run("single", func(t *testing.T) { checkSickFleet(t, singleNode(t), *sickFor) })
	t.Run("cluster", func(t *testing.T) {
		nodes := startCluster(t, 2*time.Second)
		checkSickFleet(t, func() redis.UniversalClient { return clusterClient(t, nodes) }, *sickFor)
	})
}
