package redisfleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// go-redis's line per failed dial, at Debug (dropped), as the README
	// says to set it: the tests kill servers on purpose.
	redis.SetLogger(DebugLog{})
	// go-redis's redialer of a pool whose dials all failed (a dead node)
	// sleeps a second between tries and sees the pool closed only then.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}

// redisServer is a redis-server of the test's own on 127.0.0.1, with no
// persistence, that the test can kill and start again on the same port.
type redisServer struct {
	t    testing.TB
	port int
	dir  string
	conf string   // a config file, first on the command line when set
	args []string // more of redis-server's options
	cmd  *exec.Cmd
}

// startRedis starts a redis-server for the test, or skips the test when
// the binary is absent (CI installs it: .ci/run).
func startRedis(t testing.TB, args ...string) *redisServer {
	t.Helper()
	return startRedisConf(t, "", args...)
}

// startRedisConf is startRedis with a config file, written to the
// server's own directory (Sentinel rewrites it).
func startRedisConf(t testing.TB, conf string, args ...string) *redisServer {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not installed (apt-get install redis-server; .ci/run installs it): skipping the tests against a real Redis")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	s := &redisServer{t: t, port: port, dir: t.TempDir(), args: args}
	if conf != "" {
		s.conf = filepath.Join(s.dir, "redis.conf")
		if err := os.WriteFile(s.conf, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	s.start()
	t.Cleanup(s.kill)
	return s
}

func (s *redisServer) addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

func (s *redisServer) start() {
	s.t.Helper()
	var conf []string
	if s.conf != "" {
		conf = []string{s.conf}
	}
	s.cmd = exec.Command("redis-server", append(append(conf, "--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir, "--daemonize", "no", "--loglevel", "warning"), s.args...)...)
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: s.addr(), MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("redis-server on %s did not answer: %v", s.addr(), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *redisServer) kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
		s.cmd = nil
	}
}

// client is a go-redis client with small timeouts and no retries, as a
// user of the fleet should configure it.
func (s *redisServer) client(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.addr(), DialTimeout: 200 * time.Millisecond,
		ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond, MaxRetries: -1, PoolSize: 4})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// pod is one process of the fleet: a Transport with its own Redis client.
func pod(t *testing.T, s *redisServer, prefix string) *bulwark.Transport {
	t.Helper()
	return podOver(t, s.client(t), prefix, 10*time.Second)
}

// podOver is a pod over the Redis client c whose only layer is a breaker
// (5 calls of 10 trip it) that opens for openFor, up to twice that.
func podOver(t *testing.T, c redis.UniversalClient, prefix string, openFor time.Duration) *bulwark.Transport {
	t.Helper()
	f, err := New(c, Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	p := bulwark.Policy{}
	p.Retry.Disabled = true
	p.Bulkhead.Disabled = true
	p.Breaker.MinCalls, p.Breaker.WindowCalls = 5, 10
	p.Breaker.OpenFor, p.Breaker.MaxOpenFor = openFor, 2*openFor
	return newTransport(t, bulwark.Config{Default: p, Fleet: f})
}

// newTransport is a Transport closed, with its connections, when the
// test ends.
func newTransport(t *testing.T, cfg bulwark.Config) *bulwark.Transport {
	t.Helper()
	tr, err := bulwark.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = tr.Close()
		tr.CloseIdleConnections()
	})
	return tr
}

// upstream is an httptest server answering code, counting what it got.
type upstream struct {
	*httptest.Server
	hits atomic.Int64
	code atomic.Int64
}

func newUpstream(t *testing.T, code int, header http.Header) *upstream {
	u := &upstream{}
	u.code.Store(int64(code))
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.hits.Add(1)
		for k, v := range header {
			w.Header()[k] = v
		}
		w.WriteHeader(int(u.code.Load()))
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) host() string { return u.Listener.Addr().String() }

func get(t *testing.T, tr http.RoundTripper, url string) (int, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// eventually polls cond every 10 ms for up to 10 s: real Redis, real time,
// on a loaded machine, so no tight bound.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func connected(tr *bulwark.Transport) bool {
	f := tr.Snapshot().Fleet
	return f != nil && f.Connected
}

func fleetOf(tr *bulwark.Transport) bulwark.FleetSnapshot { return *tr.Snapshot().Fleet }

// trip sends failing requests through tr until its breaker opens, at most
// MinCalls of them (fewer when other pods' failures count too).
func trip(t *testing.T, tr http.RoundTripper, url string) {
	t.Helper()
	for range 5 {
		code, err := get(t, tr, url)
		if errors.Is(err, bulwark.ErrBreakerOpen) {
			return
		}
		if err != nil || code != 500 {
			t.Fatalf("tripping request: %d, %v", code, err)
		}
	}
	if _, err := get(t, tr, url); !errors.Is(err, bulwark.ErrBreakerOpen) {
		t.Fatalf("after 5 failures: %v, want the breaker open", err)
	}
}

// tripShared has pod b call a new sick host once, then pod a trip its
// breaker on it, and returns how long b took to adopt a's trip, and the
// sick host; it fails after within, naming what and both pods' fleet
// state.
func tripShared(t *testing.T, a, b *bulwark.Transport, what string, within time.Duration) (time.Duration, *upstream) {
	t.Helper()
	sick := newUpstream(t, 500, nil)
	if _, err := get(t, b, sick.URL); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	trip(t, a, sick.URL)
	for {
		h := b.Snapshot().Host(sick.host())
		if len(h) == 1 && h[0].Breaker.State == bulwark.CircuitOpen {
			return time.Since(start), sick
		}
		if time.Since(start) > within {
			t.Fatalf("%s: pod B did not adopt pod A's trip within %v: A %+v, B %+v", what, within, fleetOf(a), fleetOf(b))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// refused reports whether tr refuses url with err's kind without sending.
func refusedBy(t *testing.T, tr http.RoundTripper, url string, target error) bool {
	_, err := get(t, tr, url)
	return errors.Is(err, target)
}

// TestBreakerVerdictShared: pod A's trip stops pod B, which has called the
// host before, and pod C, started after the trip, without either sending a
// single request more to the sick host.
func TestBreakerVerdictShared(t *testing.T) {
	s := startRedis(t)
	sick := newUpstream(t, 500, nil)
	a, b := pod(t, s, "t1:"), pod(t, s, "t1:")
	eventually(t, "both pods subscribed", func() bool { return connected(a) && connected(b) })
	if _, err := get(t, b, sick.URL); err != nil {
		t.Fatal(err)
	}
	trip(t, a, sick.URL)
	eventually(t, "pod B to adopt A's verdict", func() bool {
		h := b.Snapshot().Host(sick.host())
		return len(h) == 1 && h[0].Breaker.State == bulwark.CircuitOpen
	})
	before := sick.hits.Load()
	_, err := get(t, b, sick.URL)
	var oe *bulwark.BreakerOpenError
	if !errors.As(err, &oe) || sick.hits.Load() != before {
		t.Fatalf("pod B: %v (sent %d more), want a BreakerOpenError without sending", err, sick.hits.Load()-before)
	}
	if d := time.Until(oe.ProbeAt); d <= 0 || d > 20*time.Second {
		t.Fatalf("adopted hold ends in %v, want within MaxOpenFor", d)
	}
	c := pod(t, s, "t1:")
	eventually(t, "pod C to catch up from the keys", func() bool { return fleetOf(c).Applied > 0 })
	if !refusedBy(t, c, sick.URL, bulwark.ErrBreakerOpen) || sick.hits.Load() != before {
		t.Fatalf("pod C sent to the sick host: %d hits, want %d", sick.hits.Load(), before)
	}
	// Another prefix is another fleet.
	d := pod(t, s, "other:")
	eventually(t, "pod D subscribed", func() bool { return connected(d) })
	if code, err := get(t, d, sick.URL); err != nil || code != 500 {
		t.Fatalf("pod D of another fleet: %d, %v; want it to call", code, err)
	}
	if f := fleetOf(a); f.Published == 0 || f.PublishErrors != 0 || f.Dropped != 0 || f.Ignored != 0 {
		t.Fatalf("pod A's fleet: %+v", f)
	}
}

// TestPushbackShared: pod A's Retry-After pauses pod B for that host.
func TestPushbackShared(t *testing.T) {
	s := startRedis(t)
	busy := newUpstream(t, 429, http.Header{"Retry-After": {"20"}})
	a, b := pod(t, s, "t2:"), pod(t, s, "t2:")
	eventually(t, "both pods subscribed", func() bool { return connected(a) && connected(b) })
	if code, err := get(t, a, busy.URL); err != nil || code != 429 {
		t.Fatalf("pod A: %d, %v", code, err)
	}
	eventually(t, "pod B to adopt A's pause", func() bool { return fleetOf(b).Applied > 0 })
	_, err := get(t, b, busy.URL)
	var pe *bulwark.PushbackError
	if !errors.As(err, &pe) || busy.hits.Load() != 1 {
		t.Fatalf("pod B: %v (%d hits), want a PushbackError without sending", err, busy.hits.Load())
	}
	if d := time.Until(pe.Until); d < 15*time.Second || d > 20*time.Second {
		t.Fatalf("shared pause ends in %v, want about 20s", d)
	}
}

// TestRedisRestart: with Redis killed, no request fails because of it and
// each pod decides alone; the outage shows in Snapshot; once an empty
// Redis is back, the pods resubscribe and sharing resumes.
func TestRedisRestart(t *testing.T) {
	s := startRedis(t)
	ok := newUpstream(t, 200, nil)
	sick := newUpstream(t, 500, nil)
	a, b := pod(t, s, "t3:"), pod(t, s, "t3:")
	eventually(t, "both pods subscribed", func() bool { return connected(a) && connected(b) })

	s.kill()
	eventually(t, "pods to see Redis gone", func() bool { return !connected(a) && !connected(b) })
	for i := range 50 {
		for _, tr := range []*bulwark.Transport{a, b} {
			if code, err := get(t, tr, ok.URL); err != nil || code != 200 {
				t.Fatalf("request %d with Redis down: %d, %v", i, code, err)
			}
		}
	}
	trip(t, a, sick.URL) // local decision, publish fails
	eventually(t, "the failed publish to show", func() bool { return fleetOf(a).PublishErrors > 0 })
	if f := fleetOf(a); f.LastError == "" || f.LastErrorAt.IsZero() {
		t.Fatalf("pod A's fleet with Redis down: %+v", f)
	}
	if code, err := get(t, b, sick.URL); err != nil || code != 500 {
		t.Fatalf("pod B with Redis down: %d, %v; want it to decide alone", code, err)
	}

	s.start()
	eventually(t, "pods to resubscribe", func() bool { return connected(a) && connected(b) })
	sick2 := newUpstream(t, 500, nil)
	trip(t, a, sick2.URL)
	eventually(t, "pod B to adopt the verdict after the restart", func() bool {
		return refusedBy(t, b, sick2.URL, bulwark.ErrBreakerOpen)
	})
	if h := sick2.hits.Load(); h > 5+4 {
		t.Fatalf("sick host got %d calls, want pod A's 5 and fewer than B's own MinCalls", h)
	}
}

// TestHostileValues: garbage under the fleet's keys and on its channel is
// ignored and counted, costs no request, and a hold read from Redis is
// capped by the reader's policy.
func TestHostileValues(t *testing.T) {
	s := startRedis(t)
	ok := newUpstream(t, 200, nil)
	c := s.client(t)
	ctx := t.Context()
	p := "t4:"
	far := strconv.FormatInt(time.Now().Add(23*time.Hour).UnixMilli(), 10)
	tooFar := strconv.FormatInt(time.Now().Add(48*time.Hour).UnixMilli(), 10)
	garbage := map[string]string{
		p + "breaker:" + ok.host():                 "garbage",
		p + "breaker:a.test:80":                    "1|1|" + tooFar + "|1|0|0|0,0,0|x|a.test:80",
		p + "breaker:b.test:80":                    "1|1|" + far + "|1|0|0|0,0,0|x|c.test:80", // key and host disagree
		p + "pause:d.test:80":                      "2|2|" + far + "|0|0|0|0,0,0|x|d.test:80", // unknown version
		p + "pause:e.test:80":                      "1|2|" + far + "|0|0|9|0,0,0|x|e.test:80", // no such priority
		p + "pause:f.test:80":                      "1|2|-5|0|0|0|0,0,0|x|f.test:80",
		p + "breaker:" + string(make([]byte, 600)): "1|1|" + far + "|1|0|0|0,0,0|x|" + string(make([]byte, 600)) + ":80",
	}
	for k, v := range garbage {
		if err := c.Set(ctx, k, v, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.HSet(ctx, p+"breaker:g.test:80", "x", "y").Err(); err != nil {
		t.Fatal(err)
	}
	c.Expire(ctx, p+"breaker:g.test:80", time.Minute)
	b := pod(t, s, p)
	eventually(t, "the garbage to be counted", func() bool { return fleetOf(b).Ignored >= uint64(len(garbage)+1) })
	for _, msg := range []string{"", "garbage", "1|1|" + far, "1|1|" + tooFar + "|1|0|0|0,0,0|x|h.test:80", "1|x|1|1|0|0|0,0,0|x|h.test:80"} {
		if err := c.Publish(ctx, p+"updates", msg).Err(); err != nil {
			t.Fatal(err)
		}
	}
	want := uint64(len(garbage) + 1 + 5)
	eventually(t, "the published garbage to be counted", func() bool { return fleetOf(b).Ignored >= want })
	if f := fleetOf(b); f.Ignored != want || f.Applied != 0 {
		t.Fatalf("fleet %+v, want %d ignored and none applied", f, want)
	}
	if code, err := get(t, b, ok.URL); err != nil || code != 200 {
		t.Fatalf("request after the garbage: %d, %v", code, err)
	}
	// A well-formed hold of 23 hours is obeyed for MaxOpenFor only (by a
	// pod whose last call to the host failed: one answered declines it).
	sick := newUpstream(t, 500, nil)
	if code, err := get(t, b, sick.URL); err != nil || code != 500 {
		t.Fatalf("request to the sick host: %d, %v", code, err)
	}
	if err := c.Publish(ctx, p+"updates", "1|1|"+far+"|1|0|0|0,0,0|x|"+sick.host()).Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the long hold to be adopted", func() bool { return fleetOf(b).Applied > 0 })
	_, err := get(t, b, sick.URL)
	var oe *bulwark.BreakerOpenError
	if !errors.As(err, &oe) || time.Until(oe.ProbeAt) > 20*time.Second {
		t.Fatalf("after a 23 h hold: %v, want open for at most MaxOpenFor", err)
	}
}

// TestKeysExpire: what a pod writes expires with the hold, so keys do not
// accumulate.
func TestKeysExpire(t *testing.T) {
	s := startRedis(t)
	c := s.client(t)
	f, _ := New(c, Options{Prefix: "t5:"})
	until := time.Now().Add(2 * time.Second)
	for i := range 20 {
		u := bulwark.FleetUpdate{Kind: bulwark.FleetBreakerOpen, Host: fmt.Sprintf("h%d.test:80", i), Until: until, Generation: 1}
		if err := f.Publish(t.Context(), u); err != nil {
			t.Fatal(err)
		}
	}
	keys, _ := c.Keys(t.Context(), "t5:*").Result()
	if len(keys) != 20 {
		t.Fatalf("%d keys, want 20", len(keys))
	}
	for _, k := range keys {
		if ttl := c.PTTL(t.Context(), k).Val(); ttl <= 0 || ttl > 2*time.Second {
			t.Fatalf("key %s has TTL %v, want the hold's", k, ttl)
		}
	}
	// A shorter hold published later does not shorten the longer one.
	short := bulwark.FleetUpdate{Kind: bulwark.FleetBreakerOpen, Host: "h0.test:80", Until: time.Now().Add(500 * time.Millisecond)}
	if err := f.Publish(t.Context(), short); err != nil {
		t.Fatal(err)
	}
	if ttl := c.PTTL(t.Context(), "t5:breaker:h0.test:80").Val(); ttl < time.Second {
		t.Fatalf("TTL %v after a shorter hold, want the longer kept", ttl)
	}
	eventually(t, "the keys to expire", func() bool {
		n, _ := c.Keys(t.Context(), "t5:*").Result()
		return len(n) == 0
	})
}

// TestCountsAggregated: failures seen by two pods add up: the fleet trips
// after MinCalls failures in all, not MinCalls each.
func TestCountsAggregated(t *testing.T) {
	s := startRedis(t)
	sick := newUpstream(t, 500, nil)
	a, b := pod(t, s, "t6:"), pod(t, s, "t6:")
	eventually(t, "both pods subscribed", func() bool { return connected(a) && connected(b) })
	_, _ = get(t, a, sick.URL)
	_, _ = get(t, b, sick.URL)
	peers := func(tr *bulwark.Transport) int64 { return tr.Snapshot().Host(sick.host())[0].Breaker.FleetFailures }
	eventually(t, "pod A to hold pod B's counts", func() bool { return peers(a) == 1 })
	_, _ = get(t, a, sick.URL)
	_, _ = get(t, a, sick.URL)
	eventually(t, "pod B to hold pod A's counts", func() bool { return peers(b) == 3 })
	if st := b.Snapshot().Host(sick.host())[0].Breaker.State; st != bulwark.CircuitClosed {
		t.Fatalf("pod B %v at 4 failures fleet-wide, want closed", st)
	}
	_, _ = get(t, b, sick.URL) // the fifth
	if !refusedBy(t, b, sick.URL, bulwark.ErrBreakerOpen) {
		t.Fatal("pod B not open after the fleet's fifth failure")
	}
	eventually(t, "pod A to adopt B's verdict", func() bool {
		return a.Snapshot().Host(sick.host())[0].Breaker.State == bulwark.CircuitOpen
	})
	if h := sick.hits.Load(); h != 5 {
		t.Fatalf("sick host got %d calls, want MinCalls (5) fleet-wide", h)
	}
}

// TestPublishOverwritesGarbage: whatever a hold's key holds that the
// decoder rejects (a value that does not parse, a hold past a day, another
// host's, an oversized value, a key of another type), a trip overwrites it
// and is published; a longer valid hold is kept and nothing is published.
func TestPublishOverwritesGarbage(t *testing.T) {
	s := startRedis(t)
	c := s.client(t)
	ctx := t.Context()
	f, _ := New(c, Options{Prefix: "t7:", ID: "me"})
	ps := c.Subscribe(ctx, "t7:updates")
	defer ps.Close()
	if _, err := ps.ReceiveTimeout(ctx, time.Second); err != nil {
		t.Fatal(err)
	}
	host := "h.test:80"
	key := "t7:breaker:" + host
	far := time.Now().Add(23 * time.Hour).UnixMilli()
	tooFar := strconv.FormatInt(time.Now().Add(48*time.Hour).UnixMilli(), 10)
	long := "1|1|" + strconv.FormatInt(far, 10) + "|1|0|0|0,0,0|x|"
	for _, tc := range []struct {
		name string
		set  func() error
	}{
		{"unparsable", func() error { return c.Set(ctx, key, "1|1|99999999999999|x", 0).Err() }},
		{"past a day", func() error { return c.Set(ctx, key, "1|1|"+tooFar+"|1|0|0|0,0,0|x|"+host, 0).Err() }},
		{"another host", func() error { return c.Set(ctx, key, long+"other.test:80", 0).Err() }},
		{"oversized", func() error { return c.Set(ctx, key, long+host+strings.Repeat(" ", 1000), 0).Err() }},
		{"list", func() error { return c.LPush(ctx, key, "x").Err() }},
		{"hash", func() error { return c.HSet(ctx, key, "x", "y").Err() }},
	} {
		c.Del(ctx, key)
		if err := tc.set(); err != nil {
			t.Fatal(err)
		}
		u := bulwark.FleetUpdate{Kind: bulwark.FleetBreakerOpen, Host: host, Until: time.Now().Add(5 * time.Second), Generation: 1}
		if err := f.Publish(ctx, u); err != nil {
			t.Fatalf("%s: Publish: %v", tc.name, err)
		}
		if v, err := c.Get(ctx, key).Result(); err != nil || v != f.encode(u) {
			t.Fatalf("%s: key holds %q, %v; want the trip", tc.name, v, err)
		}
		if ttl := c.PTTL(ctx, key).Val(); ttl <= 0 || ttl > 5*time.Second {
			t.Fatalf("%s: TTL %v, want the hold's", tc.name, ttl)
		}
		m, err := ps.ReceiveTimeout(ctx, time.Second)
		if msg, ok := m.(*redis.Message); err != nil || !ok || msg.Payload != f.encode(u) {
			t.Fatalf("%s: published %v, %v; want the trip", tc.name, m, err)
		}
	}
	// A longer hold in force is kept, and the shorter one is not news.
	c.Set(ctx, key, long+host, time.Minute)
	u := bulwark.FleetUpdate{Kind: bulwark.FleetBreakerOpen, Host: host, Until: time.Now().Add(5 * time.Second)}
	if err := f.Publish(ctx, u); err != nil {
		t.Fatal(err)
	}
	if v := c.Get(ctx, key).Val(); v != long+host {
		t.Fatalf("key holds %q, want the longer hold kept", v)
	}
	if m, err := ps.ReceiveTimeout(ctx, 200*time.Millisecond); err == nil {
		t.Fatalf("published %v, want nothing", m)
	}
}
