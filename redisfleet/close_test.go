package redisfleet

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/redis/go-redis/v9"
)

// TestBreakerCloseShared: when the upstream recovers, pod A, which
// tripped, finds it with a spaced probe, closes after its half-open round
// and publishes the close; pod B, which adopted A's trip, answers long
// before the open time it adopted ends (16-20 s here, so at least 16 s
// after the recovery if nothing ended it), on A's close or on a spaced
// probe of its own; and a pod started after the close does not adopt the
// ended hold from Redis.
func TestBreakerCloseShared(t *testing.T) {
	s := startRedis(t)
	c := s.client(t)
	const prefix = "t9:"
	// Spaced probes every 1.6-2 s; a half-open round of 10.
	newPod := func() *bulwark.Transport { return podOver(t, s.client(t), prefix, 20*time.Second) }
	up := newUpstream(t, 500, nil)
	a, b := newPod(), newPod()
	eventually(t, "both pods subscribed", func() bool { return connected(a) && connected(b) })
	if _, err := get(t, b, up.URL); err != nil {
		t.Fatal(err)
	}
	trip(t, a, up.URL)
	eventually(t, "pod B to adopt A's trip", func() bool {
		return b.Snapshot().Host(up.host())[0].Breaker.State == bulwark.CircuitOpen
	})
	key := prefix + "breaker:" + up.host()
	if n := c.Exists(t.Context(), key).Val(); n != 1 {
		t.Fatalf("%s: %d keys after A's trip, want A's hold", key, n)
	}
	up.code.Store(200)
	recovered := time.Now()
	var tookB time.Duration
	// Both pods called every 20 ms, for at most 12 s (a bounded loop):
	// A's probe finds the recovery within a spacing, its round of 10
	// takes a few hundred ms more.
	for i := 0; tookB == 0; i++ {
		if i == 600 {
			t.Fatalf("pod B not answered in 600 rounds (%v) after the upstream recovered: A %+v, B %+v",
				time.Since(recovered), fleetOf(a), fleetOf(b))
		}
		_, _ = get(t, a, up.URL)
		if code, err := get(t, b, up.URL); err == nil && code == 200 {
			tookB = time.Since(recovered)
		} else if !errors.Is(err, bulwark.ErrBreakerOpen) {
			t.Fatalf("pod B: %d, %v; want refused or answered", code, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("pod B answered %v after the upstream recovered", tookB)
	// At the earliest, without the close, B's hold ends 16 s after A's
	// trip: 8 s leaves room for a loaded machine on both sides.
	if tookB > 8*time.Second {
		t.Fatalf("pod B answered %v after the upstream recovered, want within 8 s (A's spacing is at most 2 s)", tookB)
	}
	// B resumes on A's close or on a spaced probe of its own, whichever
	// comes first; A closes after its half-open round either way.
	eventually(t, "pod A closed", func() bool {
		_, _ = get(t, a, up.URL)
		return a.Snapshot().Host(up.host())[0].Breaker.State == bulwark.CircuitClosed
	})
	eventually(t, key+" deleted after A closed", func() bool { return c.Exists(t.Context(), key).Val() == 0 })
	// A pod started now reads no hold for the host: it calls.
	hits := up.hits.Load()
	d := newPod()
	eventually(t, "pod D subscribed", func() bool { return connected(d) })
	if code, err := get(t, d, up.URL); err != nil || code != 200 || up.hits.Load() != hits+1 {
		t.Fatalf("pod D, started after A closed: %d, %v, %d sent; want it sent", code, err, up.hits.Load()-hits)
	}
	if f := fleetOf(a); f.PublishErrors != 0 || f.Dropped != 0 {
		t.Fatalf("pod A's fleet %+v", f)
	}
	if f := fleetOf(b); f.Ignored != 0 {
		t.Fatalf("pod B's fleet %+v, want nothing ignored", f)
	}
}

// TestPublishClosed: a close deletes the host's breaker key only when it
// holds the closing process's own hold of that generation, and is
// published whatever the key holds; a corrupt value it leaves is still
// ignored and counted by a pod that reads the keys later.
func TestPublishClosed(t *testing.T) {
	s := startRedis(t)
	c := s.client(t)
	ctx := t.Context()
	const prefix = "t10:"
	me, _ := New(c, Options{Prefix: prefix, ID: "me"})
	other, _ := New(c, Options{Prefix: prefix, ID: "other"})
	ps := c.Subscribe(ctx, prefix+"updates")
	defer ps.Close()
	if _, err := ps.ReceiveTimeout(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	host := "h.test:80"
	key := prefix + "breaker:" + host
	open := func(f *Fleet, gen uint64) bulwark.FleetUpdate {
		return bulwark.FleetUpdate{Kind: bulwark.FleetBreakerOpen, Host: host, Until: time.Now().Add(time.Minute), Generation: gen}
	}
	for _, tc := range []struct {
		name    string
		set     func() error
		deleted bool
	}{
		{"own hold", func() error { return c.Set(ctx, key, me.encode(open(me, 2)), time.Minute).Err() }, true},
		{"own older hold", func() error { return c.Set(ctx, key, me.encode(open(me, 1)), time.Minute).Err() }, false},
		{"another's hold", func() error { return c.Set(ctx, key, other.encode(open(other, 2)), time.Minute).Err() }, false},
		{"garbage", func() error { return c.Set(ctx, key, "garbage", time.Minute).Err() }, false},
		{"hash", func() error { return c.HSet(ctx, key, "x", "y").Err() }, false},
		{"none", func() error { return nil }, false},
	} {
		c.Del(ctx, key)
		if err := tc.set(); err != nil {
			t.Fatal(err)
		}
		u := bulwark.FleetUpdate{Kind: bulwark.FleetBreakerClosed, Host: host, Until: time.Now().Add(5 * time.Second), Generation: 2}
		if err := me.Publish(ctx, u); err != nil {
			t.Fatalf("%s: Publish: %v", tc.name, err)
		}
		if n := c.Exists(ctx, key).Val(); (n == 0) != (tc.deleted || tc.name == "none") {
			t.Fatalf("%s: %d keys after the close, want deleted %v", tc.name, n, tc.deleted)
		}
		m, err := ps.ReceiveTimeout(ctx, time.Second)
		if msg, ok := m.(*redis.Message); err != nil || !ok || msg.Payload != me.encode(u) {
			t.Fatalf("%s: published %v, %v; want the close", tc.name, m, err)
		}
	}
	// The garbage a close left is ignored and counted by a pod that
	// catches up; a close stored under the key (never written there) is
	// garbage too.
	if err := c.Set(ctx, key, "garbage", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	until := strconv.FormatInt(time.Now().Add(time.Minute).UnixMilli(), 10)
	if err := c.Set(ctx, prefix+"breaker:g.test:80", "1|5|"+until+"|1|0|0|0,0,0|x|g.test:80", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	p := pod(t, s, prefix)
	eventually(t, "the garbage to be counted", func() bool { return fleetOf(p).Ignored >= 2 })
	if f := fleetOf(p); f.Ignored != 2 || f.Applied != 0 {
		t.Fatalf("fleet %+v, want 2 ignored, none applied", f)
	}
}
