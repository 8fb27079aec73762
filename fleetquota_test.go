package bulwark

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// memBucket is a fleet quota's token bucket in memory, as a store would
// keep it: filled at the rate asked, at most burst, shared by its pods.
type memBucket struct {
	mu     sync.Mutex
	tokens float64
	ts     time.Time
	pods   map[*memLeaser]time.Time
	calls  int
}

// memLeaser is one pod's Fleet and FleetLeaser over a memHub and a
// memBucket. down fails its leases; hostile grants absurd values.
type memLeaser struct {
	memFleet
	b             *memBucket
	mu            sync.Mutex
	down, hostile bool
}

func (f *memLeaser) set(down, hostile bool) {
	f.mu.Lock()
	f.down, f.hostile = down, hostile
	f.mu.Unlock()
}

func (f *memLeaser) Lease(ctx context.Context, r LeaseRequest) (LeaseGrant, error) {
	f.mu.Lock()
	down, hostile := f.down, f.hostile
	f.mu.Unlock()
	if down {
		return LeaseGrant{}, errors.New("store down")
	}
	if hostile {
		return LeaseGrant{Tokens: math.MaxInt64, Pods: -7}, nil
	}
	b := f.b
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls++
	now := time.Now()
	if b.pods == nil {
		b.pods = map[*memLeaser]time.Time{}
		b.tokens, b.ts = float64(r.Burst), now
	}
	b.tokens = min(float64(r.Burst), b.tokens+now.Sub(b.ts).Seconds()*r.Rate)
	b.ts = now
	b.pods[f] = now
	for p, at := range b.pods {
		if now.Sub(at) > time.Second {
			delete(b.pods, p)
		}
	}
	// At most a fair share of the burst, as redisfleet's lease script
	// grants: a plain first-come bucket lets whichever pod's renewal runs
	// first take every token, and the pods' shares then depend on the
	// order in which goroutines happen to run.
	share := max(1, int64(math.Ceil(float64(r.Burst)/float64(len(b.pods)))))
	g := min(r.Want, int64(b.tokens), share)
	b.tokens -= float64(g)
	return LeaseGrant{Tokens: g, Pods: len(b.pods)}, nil
}

func quotaPolicy(rate float64) Policy {
	p := only(Policy{}, "bulkhead")
	p.Bulkhead.MaxConcurrent = 1000
	p.Bulkhead.FleetRate = rate
	return p
}

func newQuotaPod(t *testing.T, f Fleet, base *statusBase, p Policy) *Transport {
	t.Helper()
	tr := mustNew(t, Config{Base: base, Default: p, Fleet: f})
	t.Cleanup(func() { _ = tr.Close() })
	return tr
}

// offer sends one request every every from each pod for d, and returns
// how many each pod got through and how many were refused by a rate
// limit; any other error fails the test.
func offer(t *testing.T, pods []*Transport, every, d time.Duration) (sent, refused []int) {
	t.Helper()
	sent, refused = make([]int, len(pods)), make([]int, len(pods))
	var wg sync.WaitGroup
	var mu sync.Mutex
	var bad error
	for i, tr := range pods {
		wg.Go(func() {
			for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(every) {
				code, err := sendOnce(t, tr, "GET", "http://api.test/")
				mu.Lock()
				switch {
				case err == nil && code == 200:
					sent[i]++
				case errors.Is(err, ErrRateLimited):
					var re *RateLimitError
					if !errors.As(err, &re) || re.Host != "api.test:80" {
						bad = err
					}
					refused[i]++
				default:
					bad = err
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if bad != nil {
		t.Fatalf("a request failed otherwise than by the rate limit: %v", bad)
	}
	return sent, refused
}

func sum(v []int) int {
	n := 0
	for _, x := range v {
		n += x
	}
	return n
}

// TestFleetQuotaShared: four pods offering 400 requests a second against
// a fleet quota of 40 send, together, the quota and no more (plus the
// bucket's burst and the first lease's local answers); every pod gets a
// share; refusals are RateLimitErrors; the Snapshot shows the lease.
func TestFleetQuotaShared(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hub, b := &memHub{}, &memBucket{}
		base := &statusBase{codes: []int{200}}
		var pods []*Transport
		for range 4 {
			pods = append(pods, newQuotaPod(t, &memLeaser{memFleet: memFleet{hub: hub}, b: b}, base, quotaPolicy(40)))
		}
		const secs = 10
		sent, refused := offer(t, pods, 10*time.Millisecond, secs*time.Second)
		// The first lease is a round trip away; until it lands each pod
		// answers alone (one request each, at most, in fake time).
		limit := 40*secs + int(math.Ceil(40*leaseBurstFor.Seconds())) + len(pods)
		t.Logf("sent %v (%d), refused %d, limit %d", sent, sum(sent), sum(refused), limit)
		if n := sum(sent); n > limit || n < 40*secs*9/10 {
			t.Fatalf("the fleet sent %d in %d s (%v), want about %d and at most %d", n, secs, sent, 40*secs, limit)
		}
		for i, n := range sent {
			if n < 40*secs/len(pods)/4 {
				t.Errorf("pod %d sent %d of %v: starved", i, n, sent)
			}
		}
		if sum(refused) == 0 {
			t.Fatal("nothing refused at 10 × the quota")
		}
		q := pods[0].Snapshot().Host("api.test:80")[0].Quota
		if q == nil || q.FleetRate != 40 || q.Pods != 4 || q.Leases == 0 || q.Granted == 0 || q.Refused == 0 || q.Local || q.LeaseErrors != 0 {
			t.Fatalf("pod 0's quota snapshot %+v", q)
		}
	})
}

// TestFleetQuotaUnderQuota: a fleet that asks for less than the quota is
// never refused: leases run ahead of demand.
func TestFleetQuotaUnderQuota(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hub, b := &memHub{}, &memBucket{}
		base := &statusBase{codes: []int{200}}
		var pods []*Transport
		for range 4 {
			pods = append(pods, newQuotaPod(t, &memLeaser{memFleet: memFleet{hub: hub}, b: b}, base, quotaPolicy(100)))
		}
		// 4 × 20 a second against 100.
		sent, refused := offer(t, pods, 50*time.Millisecond, 5*time.Second)
		if sum(refused) != 0 {
			t.Fatalf("under the quota: %v refused (%v sent)", refused, sent)
		}
	})
}

// TestFleetQuotaStoreDown: with the store gone, no request fails because
// of it: each pod goes on at its last share of the quota (or its own
// Rate), the outage shows in Snapshot, and leases resume when the store
// is back. With FleetFailClosed, the pods refuse instead.
func TestFleetQuotaStoreDown(t *testing.T) {
	for _, tc := range []struct {
		name       string
		localRate  float64
		failClosed bool
	}{{"last share", 0, false}, {"own Rate", 15, false}, {"fail closed", 0, true}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				hub, b := &memHub{}, &memBucket{}
				base := &statusBase{codes: []int{200}}
				p := quotaPolicy(40)
				p.Bulkhead.Rate = tc.localRate
				p.Bulkhead.FleetFailClosed = tc.failClosed
				var fs []*memLeaser
				var pods []*Transport
				for range 2 {
					f := &memLeaser{memFleet: memFleet{hub: hub}, b: b}
					fs = append(fs, f)
					pods = append(pods, newQuotaPod(t, f, base, p))
				}
				// 2 × 10 a second, under the quota of 40. Fail-closed, a
				// pod's first request comes before its first lease, and
				// is refused.
				_, refused := offer(t, pods, 100*time.Millisecond, 2*time.Second)
				if want := map[bool]int{false: 0, true: 2}[tc.failClosed]; sum(refused) != want {
					t.Fatalf("store up, under the quota: %v refused, want %d", refused, want)
				}
				for _, f := range fs {
					f.set(true, false)
				}
				sent, refused := offer(t, pods, 100*time.Millisecond, 3*time.Second)
				switch {
				case tc.failClosed:
					// The tokens in hand are spent; then nothing goes.
					if sum(sent) > 2*int(leaseAhead/(100*time.Millisecond)+2) || sum(refused) == 0 {
						t.Fatalf("fail closed, store down: sent %v, refused %v", sent, refused)
					}
				case sum(refused) != 0:
					t.Fatalf("store down, under the share: %v refused, want none", refused)
				}
				q := pods[0].Snapshot().Host("api.test:80")[0].Quota
				if !q.Local || q.LeaseErrors == 0 || (!tc.failClosed && q.LocalAnswers == 0) {
					t.Fatalf("quota snapshot with the store down %+v", q)
				}
				if !tc.failClosed {
					// Over the quota, the local answer is still a limit:
					// each pod's share (20), or its own Rate (15).
					sent, _ = offer(t, pods, 10*time.Millisecond, 4*time.Second)
					share := 20.0
					if tc.localRate > 0 {
						share = tc.localRate
					}
					if n, want := sum(sent), int(2*share*4); n > want+4 || n < want*8/10 {
						t.Fatalf("store down, over the quota: sent %d (%v) in 4 s, want about %d", n, sent, want)
					}
				}
				for _, f := range fs {
					f.set(false, false)
				}
				time.Sleep(time.Second)
				if _, refused := offer(t, pods, 100*time.Millisecond, 2*time.Second); sum(refused) != 0 {
					t.Fatalf("store back, under the quota: %v refused", refused)
				}
				if q := pods[0].Snapshot().Host("api.test:80")[0].Quota; q.Local {
					t.Fatalf("quota snapshot with the store back %+v, want leased", q)
				}
			})
		})
	}
}

// TestFleetQuotaHostileGrant: a grant of more than was asked, or of a
// nonsense pod count, is clamped: a pod never holds more than it wanted.
func TestFleetQuotaHostileGrant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &memLeaser{memFleet: memFleet{hub: &memHub{}}, b: &memBucket{}}
		f.set(false, true)
		base := &statusBase{codes: []int{200}}
		tr := newQuotaPod(t, f, base, quotaPolicy(10))
		sent, _ := offer(t, []*Transport{tr}, 10*time.Millisecond, 2*time.Second)
		q := tr.Snapshot().Host("api.test:80")[0].Quota
		// Each grant is at most one burst's worth (Want's cap): 2 tokens
		// every renewal, not MaxInt64.
		if perRenewal := float64(q.Granted) / float64(q.Leases); perRenewal > float64(leaseBurst(10)) || q.Pods != 1 {
			t.Fatalf("hostile grants kept: %+v (sent %v)", q, sent)
		}
	})
}

// TestFleetQuotaConfig: a FleetRate nothing would enforce, or out of
// range, is a *ConfigError from New and from Update.
func TestFleetQuotaConfig(t *testing.T) {
	for _, tc := range []struct {
		f    Fleet
		rate float64
	}{{nil, 10}, {&memFleet{hub: &memHub{}}, 10}, {&memLeaser{memFleet: memFleet{hub: &memHub{}}, b: &memBucket{}}, -1},
		{&memLeaser{memFleet: memFleet{hub: &memHub{}}, b: &memBucket{}}, math.NaN()},
		{&memLeaser{memFleet: memFleet{hub: &memHub{}}, b: &memBucket{}}, 2 * maxFleetRate}} {
		_, err := New(Config{Default: quotaPolicy(tc.rate), Fleet: tc.f})
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != "Bulkhead.FleetRate" {
			t.Errorf("New(FleetRate %v, Fleet %T) = %v, want a ConfigError for Bulkhead.FleetRate", tc.rate, tc.f, err)
		}
	}
	tr := mustNew(t, Config{Fleet: &memFleet{hub: &memHub{}}})
	defer tr.Close()
	var ce *ConfigError
	if err := tr.Update(Config{Upstreams: map[string]Policy{"api.test": quotaPolicy(5)}}); !errors.As(err, &ce) || ce.Upstream != "api.test" {
		t.Errorf("Update with a FleetRate and no leaser = %v, want a ConfigError", err)
	}
}

// TestFleetQuotaAfterUpdate: Update retunes a host's quota in place (the
// lease state is the host's, not the policy's), and removing FleetRate
// stops it.
func TestFleetQuotaAfterUpdate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &memLeaser{memFleet: memFleet{hub: &memHub{}}, b: &memBucket{}}
		base := &statusBase{codes: []int{200}}
		tr := newQuotaPod(t, f, base, quotaPolicy(40))
		offer(t, []*Transport{tr}, 10*time.Millisecond, time.Second)
		before := tr.Snapshot().Host("api.test:80")[0].Quota
		if err := tr.Update(Config{Base: base, Default: quotaPolicy(80), Fleet: f}); err != nil {
			t.Fatal(err)
		}
		sent, _ := offer(t, []*Transport{tr}, 5*time.Millisecond, 2*time.Second)
		after := tr.Snapshot().Host("api.test:80")[0].Quota
		if after == nil || after.FleetRate != 80 || after.Leases <= before.Leases || after.Granted <= before.Granted {
			t.Fatalf("quota after Update %+v (before %+v)", after, before)
		}
		if n := sum(sent); n < 2*80*9/10 || n > 2*80+int(leaseBurst(80))+2 {
			t.Fatalf("after Update to 80/s: %d sent in 2 s", n)
		}
		if err := tr.Update(Config{Base: base, Default: quotaPolicy(0), Fleet: f}); err != nil {
			t.Fatal(err)
		}
		sent, refused := offer(t, []*Transport{tr}, 5*time.Millisecond, time.Second)
		if sum(refused) != 0 || sum(sent) < 190 {
			t.Fatalf("FleetRate removed: sent %v, refused %v; want no limit", sent, refused)
		}
	})
}

// TestFleetQuotaBalanced: a balanced upstream's instances share the
// host's quota, and the Snapshot shows it beside their own bulkheads.
func TestFleetQuotaBalanced(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &memLeaser{memFleet: memFleet{hub: &memHub{}}, b: &memBucket{}}
		base := &statusBase{codes: []int{200}}
		p := quotaPolicy(40)
		p.Endpoints.Addrs = []string{"10.0.0.1:80", "10.0.0.2:80"}
		tr := mustNew(t, Config{Base: base, Upstreams: map[string]Policy{"api.test": p}, Fleet: f})
		t.Cleanup(func() { _ = tr.Close() })
		// Under the quota: offer fails on a refusal, which names the
		// instance, not the host.
		offer(t, []*Transport{tr}, 50*time.Millisecond, time.Second)
		h := tr.Snapshot().Host("api.test:80")[0]
		if q := h.Quota; q == nil || q.FleetRate != 40 || q.Leases == 0 {
			t.Fatalf("balanced host's quota snapshot %+v", q)
		}
		if h.Bulkhead != nil || len(h.Endpoints) != 2 {
			t.Fatalf("balanced host: Bulkhead %+v, Endpoints %+v; want nil and two", h.Bulkhead, h.Endpoints)
		}
		for _, e := range h.Endpoints {
			if e.Bulkhead == nil || e.Bulkhead.MaxConcurrent != 1000 || e.Requests == 0 {
				t.Errorf("instance %s: %+v, want its own bulkhead and requests", e.Addr, e)
			}
		}
	})
}
