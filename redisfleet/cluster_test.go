package redisfleet

import (
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/redis/go-redis/v9"
)

// startCluster starts a Redis Cluster of three masters, each with a
// replica, on 127.0.0.1; a node that misses its pings for nodeTimeout is
// failed over.
func startCluster(t *testing.T, nodeTimeout time.Duration) []*redisServer {
	t.Helper()
	if _, err := exec.LookPath("redis-cli"); err != nil {
		t.Skip("redis-cli not installed (it comes with redis-server): skipping the Cluster test")
	}
	nodes := make([]*redisServer, 6)
	addrs := make([]string, len(nodes))
	for i := range nodes {
		nodes[i] = startRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", strconv.FormatInt(nodeTimeout.Milliseconds(), 10))
		addrs[i] = nodes[i].addr()
	}
	out, err := exec.Command("redis-cli", append(append([]string{"--cluster", "create"}, addrs...),
		"--cluster-replicas", "1", "--cluster-yes")...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	for _, n := range nodes {
		c := n.client(t)
		eventually(t, "the cluster to be ok on "+n.addr(), func() bool {
			info, err := c.ClusterInfo(t.Context()).Result()
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				return false
			}
			repl, err := c.Info(t.Context(), "replication").Result()
			return err == nil && (strings.Contains(repl, "role:master\\r\\nconnected_slaves:1") ||
				strings.Contains(repl, "role:master\r\nconnected_slaves:1") || strings.Contains(repl, "master_link_status:up"))
		})
	}
	return nodes
}

// clusterClient is a go-redis Cluster client with the README's options.
func clusterClient(t testing.TB, nodes []*redisServer) *redis.ClusterClient {
	addrs := make([]string, len(nodes))
	for i, n := range nodes {
		addrs[i] = n.addr()
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, DialTimeout: 200 * time.Millisecond,
		ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestClusterFailover: killing the master that owns the channel's slot
// fails no request, and the pods share trips again within seconds of its
// replica's promotion, not at go-redis's next periodic reload of the
// cluster map (a minute by default).
func TestClusterFailover(t *testing.T) {
	nodes := startCluster(t, 2*time.Second)
	ok := newUpstream(t, 200, nil)
	pods := make([]*bulwark.Transport, 2)
	for i := range pods {
		pods[i] = podOver(t, clusterClient(t, nodes), "c1:", 10*time.Second)
	}
	a, b := pods[0], pods[1]
	// A third pod leases a fleet quota (fail-open) for host quotaUp.
	fq, err := New(clusterClient(t, nodes), Options{Prefix: "c1:"})
	if err != nil {
		t.Fatal(err)
	}
	pq := bulwark.Policy{}
	pq.Retry.Disabled = true
	pq.Breaker.Disabled = true
	pq.Bulkhead.MaxConcurrent = 1000
	pq.Bulkhead.FleetRate = 1000
	q := newTransport(t, bulwark.Config{Default: pq, Fleet: fq})
	eventually(t, "both pods subscribed", func() bool { return connected(a) && connected(b) })
	// shared reports how long pod B, which has called a sick host once,
	// took to adopt pod A's trip of it, which reached the sick host with
	// A's 5 calls and B's 1 only.
	shared := func(what string, within time.Duration) time.Duration {
		took, sick := tripShared(t, a, b, what, within)
		if n := sick.hits.Load(); n > 6 {
			t.Fatalf("%s: the sick host got %d calls, want A's 5 and B's 1", what, n)
		}
		return took
	}
	shared("before the failover", 5*time.Second)

	l := startLoad(t, pods, ok.URL, 10*time.Millisecond)
	// The master of the channel's slot, which holds both pods' subscription.
	c := clusterClient(t, nodes)
	slot, err := c.ClusterKeySlot(t.Context(), "c1:updates").Result()
	if err != nil {
		t.Fatal(err)
	}
	shards, err := c.ClusterShards(t.Context()).Result()
	if err != nil {
		t.Fatal(err)
	}
	// owner is the server of the master that owns slot.
	owner := func(slot int64) *redisServer {
		for _, sh := range shards {
			for _, r := range sh.Slots {
				if r.Start > slot || slot > r.End {
					continue
				}
				for _, sn := range sh.Nodes {
					for _, n := range nodes {
						if sn.Role == "master" && n.port == int(sn.Port) {
							return n
						}
					}
				}
			}
		}
		return nil
	}
	victim := owner(slot)
	victimSlots := func(slot int64) bool { return owner(slot) == victim }
	if victim == nil {
		t.Fatalf("no master for slot %d in %+v", slot, shards)
	}
	// A quota host whose keys are on the victim too.
	var quotaUp *upstream
	for range 100 {
		u := newUpstream(t, 200, nil)
		s, err := c.ClusterKeySlot(t.Context(), fq.quotaKeys(u.host())[0]).Result()
		if err != nil {
			t.Fatal(err)
		}
		if victimSlots(s) {
			quotaUp = u
			break
		}
	}
	if quotaUp == nil {
		t.Fatal("no quota host on the victim in 100 tries")
	}
	lq := startLoad(t, []*bulwark.Transport{q}, quotaUp.URL, 10*time.Millisecond)
	eventually(t, "the quota pod leasing", func() bool {
		qs := quotaOf(q, quotaUp.host())
		return qs != nil && !qs.Local && qs.Leases > 3
	})
	killed := time.Now()
	victim.kill()
	eventually(t, "the pods to see their subscription gone", func() bool { return !connected(a) && !connected(b) })
	// The replica is promoted after about twice the node timeout; then
	// each pod should find it at once. 20 s is well under go-redis's
	// minute between reloads of the cluster map.
	for !connected(a) || !connected(b) {
		if time.Since(killed) > 20*time.Second {
			t.Fatalf("pods not subscribed again 20 s after the kill: A %+v, B %+v", fleetOf(a), fleetOf(b))
		}
		time.Sleep(10 * time.Millisecond)
	}
	back := time.Since(killed)
	leases := quotaOf(q, quotaUp.host()).Leases
	for qs := quotaOf(q, quotaUp.host()); qs.Local || qs.Leases < leases+3; qs = quotaOf(q, quotaUp.host()) {
		if time.Since(killed) > 20*time.Second {
			t.Fatalf("quota pod not leasing again 20 s after the kill: %+v", qs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("the quota pod leases again %v after the kill", time.Since(killed))
	took := shared("after the failover", 5*time.Second)
	t.Logf("pods subscribed again %v after the kill; a trip then took %v to reach the other pod", back, took)
	l.end()
	lq.end()
	if lq.other.Load() != 0 {
		t.Fatalf("%d requests under the quota failed across the failover (%v), want none", lq.other.Load(), lq.lastOther.Load())
	}
	if l.other.Load() != 0 {
		t.Fatalf("%d requests failed across the failover (%v), want none", l.other.Load(), l.lastOther.Load())
	}
}
