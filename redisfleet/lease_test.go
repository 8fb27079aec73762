package redisfleet

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/redis/go-redis/v9"
)

// quotaPod is one process sharing a fleet quota of rate requests a
// second for every host.
func quotaPod(t *testing.T, s *redisServer, prefix string, rate float64, failClosed bool) *bulwark.Transport {
	t.Helper()
	f, err := New(s.client(t), Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	p := bulwark.Policy{}
	p.Retry.Disabled = true
	p.Breaker.Disabled = true
	p.Bulkhead.MaxConcurrent = 1000
	p.Bulkhead.FleetRate = rate
	p.Bulkhead.FleetFailClosed = failClosed
	return newTransport(t, bulwark.Config{Default: p, Fleet: f})
}

// load sends from every pod one request per every until stop is closed,
// counting what was sent, what a rate limit refused, and anything else.
type load struct {
	sent, refused, other atomic.Int64
	lastOther            atomic.Value
	wg                   sync.WaitGroup
	stop                 chan struct{}
}

func startLoad(t *testing.T, pods []*bulwark.Transport, url string, every time.Duration) *load {
	l := &load{stop: make(chan struct{})}
	for _, tr := range pods {
		l.wg.Go(func() {
			for {
				select {
				case <-l.stop:
					return
				case <-time.After(every):
				}
				code, err := get(t, tr, url)
				switch {
				case err == nil && code == 200:
					l.sent.Add(1)
				case errors.Is(err, bulwark.ErrRateLimited):
					l.refused.Add(1)
				default:
					l.other.Add(1)
					l.lastOther.Store(err)
				}
			}
		})
	}
	return l
}

func (l *load) end() { close(l.stop); l.wg.Wait() }

func quotaOf(tr *bulwark.Transport, host string) *bulwark.QuotaSnapshot {
	h := tr.Snapshot().Host(host)
	if len(h) != 1 {
		return nil
	}
	return h[0].Quota
}

// TestQuotaShared: four pods offering far more than a fleet quota of 50
// requests a second send, together, no more than the quota (plus the
// bucket's burst and each pod's first local answers), and each gets some.
func TestQuotaShared(t *testing.T) {
	s := startRedis(t)
	up := newUpstream(t, 200, nil)
	var pods []*bulwark.Transport
	for range 4 {
		pods = append(pods, quotaPod(t, s, "q1:", 50, false))
	}
	start := time.Now()
	l := startLoad(t, pods, up.URL, 2*time.Millisecond)
	time.Sleep(3 * time.Second)
	l.end()
	took := time.Since(start)
	hits := up.hits.Load()
	// The bucket grants at most 50 a second plus its burst (10); each pod
	// may answer alone once before its first lease, and at its share
	// while a renewal lags demand with the bucket not yet short.
	limit := int64(50*took.Seconds()*1.1) + 10 + 4
	t.Logf("%d sent in %v (%.0f/s), %d refused", hits, took, float64(hits)/took.Seconds(), l.refused.Load())
	if hits > limit || hits < 50 || l.refused.Load() == 0 || l.other.Load() != 0 {
		t.Fatalf("%d sent in %v (limit %d), %d refused, %d other errors (%v)", hits, took, limit, l.refused.Load(), l.other.Load(), l.lastOther.Load())
	}
	for i, tr := range pods {
		q := quotaOf(tr, up.host())
		if q == nil || q.Leases == 0 || q.Granted == 0 || q.LeaseErrors != 0 || q.Pods < 2 || q.Pods > 4 {
			t.Fatalf("pod %d's quota %+v", i, q)
		}
	}
}

// TestQuotaRedisRestart: under the quota, killing Redis fails no request
// (each pod answers at its last share), the outage shows in Snapshot, and
// the pods lease again once Redis is back, empty.
func TestQuotaRedisRestart(t *testing.T) {
	s := startRedis(t)
	up := newUpstream(t, 200, nil)
	a, b := quotaPod(t, s, "q2:", 200, false), quotaPod(t, s, "q2:", 200, false)
	pods := []*bulwark.Transport{a, b}
	l := startLoad(t, pods, up.URL, 50*time.Millisecond) // 2 × 20 a second at most
	eventually(t, "both pods leasing", func() bool {
		qa, qb := quotaOf(a, up.host()), quotaOf(b, up.host())
		return qa != nil && qb != nil && qa.Leases > 3 && qb.Leases > 3 && !qa.Local && qa.Pods == 2
	})
	s.kill()
	eventually(t, "pods to see Redis gone", func() bool {
		q := quotaOf(a, up.host())
		return q.Local && q.LeaseErrors > 0
	})
	sentDown := l.sent.Load()
	eventually(t, "requests sent with Redis down", func() bool { return l.sent.Load() > sentDown+20 })
	s.start()
	eventually(t, "leases after the restart", func() bool {
		q := quotaOf(a, up.host())
		return !q.Local && q.Leases > 0
	})
	errs := quotaOf(a, up.host()).LeaseErrors
	leases := quotaOf(a, up.host()).Leases
	eventually(t, "leasing again", func() bool { return quotaOf(a, up.host()).Leases > leases+3 })
	l.end()
	if l.refused.Load() != 0 || l.other.Load() != 0 {
		t.Fatalf("%d refused, %d failed (%v) under the quota across a Redis restart; want none", l.refused.Load(), l.other.Load(), l.lastOther.Load())
	}
	if q := quotaOf(a, up.host()); q.LeaseErrors != errs {
		t.Fatalf("lease errors went on after the restart: %+v", q)
	}
}

// TestQuotaFailClosed: a pod that opted into fail-closed refuses, without
// sending, while Redis is down; one that did not sends.
func TestQuotaFailClosed(t *testing.T) {
	s := startRedis(t)
	up := newUpstream(t, 200, nil)
	closed, open := quotaPod(t, s, "q3:", 100, true), quotaPod(t, s, "q3:", 100, false)
	s.kill()
	time.Sleep(700 * time.Millisecond) // past any lease in force (none yet)
	for range 5 {
		if _, err := get(t, closed, up.URL); !errors.Is(err, bulwark.ErrRateLimited) {
			t.Fatalf("fail-closed pod with Redis down: %v, want ErrRateLimited", err)
		}
		if code, err := get(t, open, up.URL); err != nil || code != 200 {
			t.Fatalf("fail-open pod with Redis down: %d, %v", code, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if h := up.hits.Load(); h != 5 {
		t.Fatalf("upstream got %d, want the fail-open pod's 5 only", h)
	}
}

// TestQuotaHostileValues: whatever the quota's keys hold (the wrong type,
// numbers that do not parse, are huge, negative or in the future), a
// lease grants no more than asked and no more than a burst, counts at
// least one process, and leaves keys that expire.
func TestQuotaHostileValues(t *testing.T) {
	s := startRedis(t)
	c := s.client(t)
	ctx := t.Context()
	f, _ := New(c, Options{Prefix: "q4:", ID: "me"})
	host := "api.test:443"
	keys := f.quotaKeys(host)
	future := time.Now().Add(time.Hour).UnixMilli()
	for i, set := range []func() error{
		func() error { return c.Set(ctx, keys[0], "garbage", 0).Err() },
		func() error { return c.HSet(ctx, keys[0], "tokens", "1e999", "ts", "0").Err() },
		func() error { return c.HSet(ctx, keys[0], "tokens", "nan", "ts", "x").Err() },
		func() error { return c.HSet(ctx, keys[0], "tokens", "-50", "ts", future).Err() },
		func() error { return c.HSet(ctx, keys[0], "tokens", "99999999", "ts", future).Err() },
		func() error { return c.Set(ctx, keys[1], "not a set", 0).Err() },
		func() error {
			z := make([]redis.Z, 2000)
			for j := range z {
				z[j] = redis.Z{Score: float64(time.Now().UnixMilli() + 60_000), Member: j}
			}
			return c.ZAdd(ctx, keys[1], z...).Err()
		},
	} {
		c.Del(ctx, keys...)
		if err := set(); err != nil {
			t.Fatal(err)
		}
		g, err := f.Lease(ctx, bulwark.LeaseRequest{Host: host, Rate: 100, Burst: 20, Want: 15})
		if err != nil {
			t.Fatalf("case %d: Lease: %v", i, err)
		}
		if g.Tokens < 0 || g.Tokens > 15 || g.Pods < 1 || g.Pods > maxQuotaPods {
			t.Fatalf("case %d: grant %+v, want 0..15 tokens and 1..%d pods", i, g, maxQuotaPods)
		}
		for _, k := range keys {
			if ttl := c.PTTL(ctx, k).Val(); ttl <= 0 || ttl > 5*time.Second {
				t.Fatalf("case %d: key %s TTL %v, want a short one", i, k, ttl)
			}
		}
	}
	// Invalid requests never reach Redis.
	for _, r := range []bulwark.LeaseRequest{{Host: host, Rate: 0, Burst: 1}, {Host: host, Rate: 1, Burst: 0}, {Host: host, Rate: 1, Burst: 1, Want: -1}} {
		if _, err := f.Lease(ctx, r); err == nil {
			t.Fatalf("Lease(%+v) accepted", r)
		}
	}
}

// TestQuotaBucket: one process alone gets the burst at once, then the
// refill, and never more than the rate over time, by Redis's clock.
func TestQuotaBucket(t *testing.T) {
	s := startRedis(t)
	f, _ := New(s.client(t), Options{Prefix: "q5:"})
	ctx := context.Background()
	r := bulwark.LeaseRequest{Host: "b.test:80", Rate: 100, Burst: 20, Want: 20}
	g, err := f.Lease(ctx, r)
	if err != nil || g.Tokens != 20 || g.Pods != 1 {
		t.Fatalf("first lease %+v, %v; want the burst of 20 for 1 pod", g, err)
	}
	start := time.Now()
	var got int64
	for time.Since(start) < time.Second {
		g, err := f.Lease(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		got += g.Tokens
		time.Sleep(10 * time.Millisecond)
	}
	if limit := int64(100*time.Since(start).Seconds()) + 1; got > limit || got < 30 {
		t.Fatalf("%d tokens granted in %v after the burst, want about 100 and at most %d", got, time.Since(start), limit)
	}
}

// TestQuotaFutureEntries: entries dated in the future under a quota's
// processes (garbage: every process writes Redis's now) neither count as
// processes nor make the cap drop a process that asked, and three pods
// behind 1,023 of them still get the fleet's rate.
func TestQuotaFutureEntries(t *testing.T) {
	s := startRedis(t)
	c := s.client(t)
	ctx := t.Context()
	f, _ := New(c, Options{Prefix: "q6:", ID: "me"})
	host := "f.test:80"
	pods := f.quotaKeys(host)[1]
	fakes := func(n int, score float64) []redis.Z {
		z := make([]redis.Z, n)
		for i := range z {
			z[i] = redis.Z{Score: score, Member: fmt.Sprintf("fake%d", i)}
		}
		return z
	}
	r := bulwark.LeaseRequest{Host: host, Rate: 100, Burst: 20, Want: 10}

	c.ZAdd(ctx, pods, fakes(maxQuotaPods-1, 1e15)...)
	if g, err := f.Lease(ctx, r); err != nil || g.Pods != 1 || g.Tokens != 10 {
		t.Fatalf("lease behind %d entries dated 1e15: %+v, %v; want 10 tokens for 1 pod", maxQuotaPods-1, g, err)
	}
	if n := c.ZCard(ctx, pods).Val(); n != 1 {
		t.Fatalf("%d processes left, want the asker only", n)
	}

	// Entries a little ahead of Redis's clock are within the tolerance,
	// but over the cap they go before any process that asked.
	c.Del(ctx, pods)
	now, err := c.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	c.ZAdd(ctx, pods, redis.Z{Score: float64(now.UnixMilli()), Member: "other"})
	c.ZAdd(ctx, pods, fakes(maxQuotaPods+10, float64(now.Add(quotaPodsFor/2).UnixMilli()))...)
	g, err := f.Lease(ctx, r)
	if err != nil || g.Pods != 2 {
		t.Fatalf("lease over the cap: %+v, %v; want 2 pods", g, err)
	}
	for _, m := range []string{"me", "other"} {
		if err := c.ZScore(ctx, pods, m).Err(); err != nil {
			t.Fatalf("process %s dropped by the cap: %v", m, err)
		}
	}

	// The figure: the leased quota holds its rate.
	up := newUpstream(t, 200, nil)
	c.ZAdd(ctx, "q7:quota:{"+up.host()+"}:pods", fakes(maxQuotaPods-1, 1e15)...)
	var ts []*bulwark.Transport
	for range 3 {
		ts = append(ts, quotaPod(t, s, "q7:", 100, false))
	}
	l := startLoad(t, ts, up.URL, 2*time.Millisecond)
	eventually(t, "the pods to lease", func() bool { return up.hits.Load() > 0 })
	start, before := time.Now(), up.hits.Load()
	time.Sleep(2 * time.Second)
	rate := float64(up.hits.Load()-before) / time.Since(start).Seconds()
	l.end()
	if rate < 60 || rate > 130 || l.other.Load() != 0 {
		t.Fatalf("%.0f req/s sent by 3 pods with FleetRate 100 (%d other errors), want about 100", rate, l.other.Load())
	}
}
