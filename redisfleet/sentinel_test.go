package redisfleet

import (
	"context"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/redis/go-redis/v9"
)

// sentinelGroup is a master, its replica and three sentinels on
// 127.0.0.1, the master named "fleet".
type sentinelGroup struct {
	master, replica *redisServer
	sentinels       []*redisServer
}

func startSentinels(t *testing.T) *sentinelGroup {
	t.Helper()
	g := &sentinelGroup{master: startRedis(t)}
	g.replica = startRedis(t, "--replicaof", "127.0.0.1", strconv.Itoa(g.master.port))
	rc := g.replica.client(t)
	eventually(t, "the replica in sync", func() bool {
		info, err := rc.Info(t.Context(), "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	})
	conf := "sentinel monitor fleet 127.0.0.1 " + strconv.Itoa(g.master.port) + " 2\n" +
		"sentinel down-after-milliseconds fleet 2000\n" +
		"sentinel failover-timeout fleet 10000\n"
	for range 3 {
		g.sentinels = append(g.sentinels, startRedisConf(t, conf, "--sentinel"))
	}
	sc := g.sentinel(t)
	eventually(t, "the sentinels to know the replica and each other", func() bool {
		m, err := sc.Master(t.Context(), "fleet").Result()
		return err == nil && m["num-slaves"] == "1" && m["num-other-sentinels"] == "2"
	})
	return g
}

func (g *sentinelGroup) addrs() []string {
	a := make([]string, len(g.sentinels))
	for i, s := range g.sentinels {
		a[i] = s.addr()
	}
	return a
}

func (g *sentinelGroup) sentinel(t testing.TB) *redis.SentinelClient {
	c := redis.NewSentinelClient(&redis.Options{Addr: g.sentinels[0].addr(), DialTimeout: time.Second, ReadTimeout: time.Second})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// client is a go-redis Sentinel client with the README's options.
func (g *sentinelGroup) client(t testing.TB) *redis.Client {
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "fleet", SentinelAddrs: g.addrs(),
		DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestSentinelFailover: a planned failover (SENTINEL FAILOVER) moves the
// commands to the new master while a subscription may stay on the old
// one, which still answers; each pod notices that its own heartbeat does
// not come back and subscribes again, so trips are shared again within
// seconds, and no request fails.
func TestSentinelFailover(t *testing.T) {
	g := startSentinels(t)
	ok := newUpstream(t, 200, nil)
	pods := make([]*bulwark.Transport, 2)
	for i := range pods {
		pods[i] = podOver(t, g.client(t), "s1:", 10*time.Second)
	}
	a, b := pods[0], pods[1]
	eventually(t, "both pods subscribed", func() bool { return connected(a) && connected(b) })
	// shared reports how long pod B, which has called a sick host once,
	// took to adopt pod A's trip of it, or fails after within.
	shared := func(what string, within time.Duration) time.Duration {
		took, _ := tripShared(t, a, b, what, within)
		return took
	}
	shared("before the failover", 5*time.Second)

	l := startLoad(t, pods, ok.URL, 10*time.Millisecond)
	sc := g.sentinel(t)
	if err := sc.Failover(t.Context(), "fleet").Err(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	eventually(t, "the replica promoted", func() bool {
		addr, err := sc.GetMasterAddrByName(t.Context(), "fleet").Result()
		return err == nil && addr[1] == strconv.Itoa(g.replica.port)
	})
	promoted := time.Since(start)
	took := shared("after the failover", 6*time.Second)
	t.Logf("replica promoted %v after SENTINEL FAILOVER; a trip then took %v to reach the other pod", promoted, took)
	l.end()
	if l.other.Load() != 0 {
		t.Fatalf("%d requests failed across the failover (%v), want none", l.other.Load(), l.lastOther.Load())
	}
}

// TestSubscriptionSplit is the split a Sentinel failover can leave,
// made certain: new connections go to another server (as a failover
// client's do once it learns the new master) and the old one closes its
// command connections but keeps the subscriptions, answering their PINGs
// and getting nothing published. Each pod notices that its heartbeat does
// not come back, subscribes on the new server, and catches up from the
// keys there.
func TestSubscriptionSplit(t *testing.T) {
	old, next := startRedis(t), startRedis(t)
	var target atomic.Pointer[string]
	oldAddr, nextAddr := old.addr(), next.addr()
	target.Store(&oldAddr)
	client := func() *redis.Client {
		var d net.Dialer
		c := redis.NewClient(&redis.Options{Addr: "fleet-master", MaxRetries: -1,
			DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond,
			Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return d.DialContext(ctx, network, *target.Load())
			}})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	pods := make([]*bulwark.Transport, 2)
	for i := range pods {
		pods[i] = podOver(t, client(), "s2:", 10*time.Second)
	}
	a, b := pods[0], pods[1]
	eventually(t, "both pods subscribed", func() bool { return connected(a) && connected(b) })

	target.Store(&nextAddr)
	if err := old.client(t).ClientKillByFilter(t.Context(), "TYPE", "normal").Err(); err != nil {
		t.Fatal(err)
	}
	sick := newUpstream(t, 500, nil)
	if _, err := get(t, b, sick.URL); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	trip(t, a, sick.URL)
	for {
		h := b.Snapshot().Host(sick.host())
		if len(h) == 1 && h[0].Breaker.State == bulwark.CircuitOpen {
			break
		}
		if time.Since(start) > 5*time.Second {
			t.Fatalf("pod B did not adopt pod A's trip within 5 s of the split: A %+v, B %+v", fleetOf(a), fleetOf(b))
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("pod B adopted the trip %v after it, across the split", time.Since(start))
	if n := sick.hits.Load(); n != 6 {
		t.Fatalf("the sick host got %d calls, want A's 5 and B's 1", n)
	}
}
