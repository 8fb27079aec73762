package redisfleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/bulwark-http/bulwark/config"
)

// configPod is one process following the fleet's configuration: a
// Transport with its own Redis client and a ConfigFollower running until
// the test ends.
type configPod struct {
	id string
	tr *bulwark.Transport
	fl *ConfigFollower
}

func followingPod(t *testing.T, s *redisServer, prefix, id string, reg config.Registry) *configPod {
	t.Helper()
	f, err := New(s.client(t), Options{Prefix: prefix, ID: id})
	if err != nil {
		t.Fatal(err)
	}
	p := bulwark.Policy{}
	p.Retry.Disabled = true
	tr := newTransport(t, bulwark.Config{Default: p, Fleet: f})
	// A Resync longer than any test: what reaches a pod here comes by the
	// channel or by reading the store when (re)subscribing.
	fl := f.ConfigFollower(tr, FollowOptions{Registry: reg, Logger: slog.New(slog.DiscardHandler), Resync: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := fl.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done }) // before the Transport closes
	return &configPod{id: id, tr: tr, fl: fl}
}

func (p *configPod) version() string {
	if c := p.tr.Snapshot().Config; c != nil {
		return c.Version
	}
	return ""
}

// controller is a Fleet used only to push and read the status, as
// bulwarkctl uses one.
func controller(t *testing.T, s *redisServer, prefix string) *Fleet {
	f, err := New(s.client(t), Options{Prefix: prefix, ID: "ctl"})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func followingAll(t *testing.T, pods []*configPod) {
	t.Helper()
	eventually(t, "every pod following", func() bool {
		for _, p := range pods {
			if !p.fl.Stats().Connected {
				return false
			}
		}
		return true
	})
}

// runWithin waits until every pod runs the version want says it should,
// and fails after within (counted from since); it returns how long the
// slowest took.
func runWithin(t *testing.T, pods []*configPod, want func(*configPod) string, since time.Time, within time.Duration) time.Duration {
	t.Helper()
	for {
		ok := true
		for _, p := range pods {
			ok = ok && p.version() == want(p)
		}
		took := time.Since(since)
		if ok {
			return took
		}
		if took > within {
			var got []string
			for _, p := range pods {
				got = append(got, p.id+"="+p.version()+" (want "+want(p)+")")
			}
			t.Fatalf("after %v: %s", took, strings.Join(got, ", "))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func all(v string) func(*configPod) string { return func(*configPod) string { return v } }

// acked waits until ConfigStatus shows every pod's ack of seq, and returns
// the status.
func acked(t *testing.T, ctl *Fleet, pods []*configPod, seq int64) ConfigStatus {
	t.Helper()
	var st ConfigStatus
	eventually(t, "every pod's ack of push "+strconv.FormatInt(seq, 10), func() bool {
		var err error
		st, err = ctl.ConfigStatus(t.Context())
		if err != nil || len(st.Processes) != len(pods) {
			return false
		}
		for _, p := range st.Processes {
			if p.Seq != seq {
				return false
			}
		}
		return true
	})
	return st
}

// The pushed versions set Timeout.Attempt: a learned one may be as short
// as 50 ms, which a request to a local upstream outlasts when the race
// detector and a restarting redis-server stall a loaded machine, and the
// outage test counts every failed request.
const pushV1 = `version: v1
default:
  retry: {disabled: true}
  timeout: {attempt: 2s}
  breaker: {failureRate: 0.5, minCalls: 20, windowCalls: 40}
`

// pushV2 moves one threshold: Update keeps the breakers' windows.
const pushV2 = `version: v2
default:
  retry: {disabled: true}
  timeout: {attempt: 2s}
  breaker: {failureRate: 0.3, minCalls: 20, windowCalls: 40}
`

const pushV3 = `version: v3
default:
  retry: {disabled: true}
  timeout: {attempt: 2s}
  breaker: {failureRate: 0.3, minCalls: 10, windowCalls: 40}
`

// halfInCanary starts four following pods, and says which are in a canary
// of 50 % (by their IDs, some and not all).
func halfInCanary(t *testing.T, s *redisServer, prefix string) ([]*configPod, map[string]bool) {
	t.Helper()
	ids := []string{"pod-a", "pod-b", "pod-c", "pod-d"}
	var pods []*configPod
	in := map[string]bool{}
	for _, id := range ids {
		pods = append(pods, followingPod(t, s, prefix, id, config.Registry{}))
		in[id] = InCanary(id, 0.5)
	}
	if n := len(slicesFilter(ids, func(id string) bool { return in[id] })); n == 0 || n == len(ids) {
		t.Fatalf("the pods' IDs put %d of %d in a canary of 50%%: pick IDs that split", n, len(ids))
	}
	return pods, in
}

// TestConfigPush: a push reaches every process within a second, each
// records in Redis what it runs, and a breaker's window survives a change
// of threshold; a canary reaches the processes InCanary names and no
// other; promotion and rollback move the fleet as documented.
func TestConfigPush(t *testing.T) {
	s := startRedis(t)
	const prefix = "c1:"
	pods, in := halfInCanary(t, s, prefix)
	followingAll(t, pods)
	ctl := controller(t, s, prefix)
	ctx := t.Context()

	start := time.Now()
	r, err := ctl.PushConfig(ctx, []byte(pushV1), PushOptions{})
	if err != nil || r.Version != "v1" || r.Canary {
		t.Fatalf("push v1: %+v, %v", r, err)
	}
	t.Logf("v1 ran on %d pods %v after the push began", len(pods), runWithin(t, pods, all("v1"), start, time.Second))
	st := acked(t, ctl, pods, r.Seq)
	for _, p := range st.Processes {
		if p.Running != "v1" || p.Refused != "" || p.Error != "" || p.Canary {
			t.Fatalf("ack %+v, want v1 running", p)
		}
	}

	// Two failures in each pod's window, eight in the fleet's, below
	// MinCalls; v2 changes only FailureRate, so Update keeps the windows.
	sick := newUpstream(t, 500, nil)
	for _, p := range pods {
		for range 2 {
			if code, err := get(t, p.tr, sick.URL); err != nil || code != 500 {
				t.Fatalf("%d, %v", code, err)
			}
		}
	}
	start = time.Now()
	r, err = ctl.PushConfig(ctx, []byte(pushV2), PushOptions{})
	if err != nil || r.Previous != "v1" {
		t.Fatalf("push v2: %+v, %v", r, err)
	}
	t.Logf("v2 ran on %d pods %v after the push began", len(pods), runWithin(t, pods, all("v2"), start, time.Second))
	for _, p := range pods {
		if h := p.tr.Snapshot().Host(sick.host()); len(h) != 1 || h[0].Breaker.Failures != 2 {
			t.Fatalf("%s after v2: %+v, want the breaker's window of 2 failures kept", p.id, h)
		}
	}

	// The same bytes pushed again keep v1 to roll back to, and are not
	// applied again.
	if r, err = ctl.PushConfig(ctx, []byte(pushV2), PushOptions{}); err != nil || r.Previous != "v1" {
		t.Fatalf("push v2 again: %+v, %v; want v1 kept as the previous", r, err)
	}
	acked(t, ctl, pods, r.Seq)
	for _, p := range pods {
		if n := p.fl.Stats().Applied; n != 2 {
			t.Fatalf("%s applied %d versions after v1, v2, v2 again; want 2", p.id, n)
		}
	}

	// A canary of 50 %: the pods InCanary names run v3, the others v2.
	start = time.Now()
	r, err = ctl.PushConfig(ctx, []byte(pushV3), PushOptions{Canary: 0.5})
	if err != nil || !r.Canary || r.Version != "v3" {
		t.Fatalf("canary v3: %+v, %v", r, err)
	}
	canary := func(p *configPod) string {
		if in[p.id] {
			return "v3"
		}
		return "v2"
	}
	runWithin(t, pods, canary, start, time.Second)
	st = acked(t, ctl, pods, r.Seq)
	if st.Stable != "v2" || st.Canary != "v3" || st.Share != 0.5 || st.Previous != "v1" {
		t.Fatalf("status during the canary: %+v", st)
	}
	for _, p := range st.Processes {
		if p.Canary != in[p.ID] || p.Running != map[bool]string{true: "v3", false: "v2"}[in[p.ID]] {
			t.Fatalf("ack during the canary: %+v", p)
		}
	}
	// Rolling back a canary returns its pods to the stable version.
	start = time.Now()
	if r, err = ctl.RollbackConfig(ctx); err != nil || r.Version != "v2" {
		t.Fatalf("rollback of the canary: %+v, %v", r, err)
	}
	runWithin(t, pods, all("v2"), start, time.Second)

	// A canary promoted reaches every pod; a rollback then returns all to
	// the version before it, once.
	if _, err = ctl.PushConfig(ctx, []byte(pushV3), PushOptions{Canary: 0.5}); err != nil {
		t.Fatal(err)
	}
	runWithin(t, pods, canary, time.Now(), 10*time.Second)
	start = time.Now()
	if r, err = ctl.PromoteConfig(ctx); err != nil || r.Version != "v3" || r.Previous != "v2" {
		t.Fatalf("promote: %+v, %v", r, err)
	}
	runWithin(t, pods, all("v3"), start, time.Second)
	if _, err := ctl.PromoteConfig(ctx); !errors.Is(err, ErrNoConfig) {
		t.Fatalf("promote with no canary: %v, want ErrNoConfig", err)
	}
	start = time.Now()
	if r, err = ctl.RollbackConfig(ctx); err != nil || r.Version != "v2" || r.Previous != "" {
		t.Fatalf("rollback: %+v, %v", r, err)
	}
	runWithin(t, pods, all("v2"), start, time.Second)
	if _, err := ctl.RollbackConfig(ctx); !errors.Is(err, ErrNoConfig) {
		t.Fatalf("second rollback: %v, want ErrNoConfig", err)
	}
	// A process that starts runs the latest version.
	start = time.Now()
	late := followingPod(t, s, prefix, "pod-e", config.Registry{})
	t.Logf("a pod started after the pushes ran v2 %v after it was made", runWithin(t, []*configPod{late}, all("v2"), start, time.Second))
	for _, p := range pods {
		if st := p.fl.Stats(); st.Refused != 0 || st.Ignored != 0 || st.Applied < 4 {
			t.Fatalf("%s: %+v", p.id, st)
		}
	}
}

func slicesFilter(s []string, keep func(string) bool) []string {
	var out []string
	for _, v := range s {
		if keep(v) {
			out = append(out, v)
		}
	}
	return out
}

// TestConfigPushRefused: a push every process refuses (a bad value pushed
// unchecked, a function the processes' registry lacks) leaves each running
// its version, and the status shows each refusal with its error; a store
// that does not decode (too large, of another type) is ignored and
// counted, and the next good push applies.
func TestConfigPushRefused(t *testing.T) {
	s := startRedis(t)
	const prefix = "c2:"
	var pods []*configPod
	for i := range 4 {
		pods = append(pods, followingPod(t, s, prefix, "pod-"+strconv.Itoa(i), config.Registry{}))
	}
	followingAll(t, pods)
	ctl := controller(t, s, prefix)
	ctx := t.Context()
	r, err := ctl.PushConfig(ctx, []byte(pushV1), PushOptions{})
	if err != nil {
		t.Fatal(err)
	}
	runWithin(t, pods, all("v1"), time.Now(), 10*time.Second)

	bad := "version: bad-1\ndefault:\n  breaker: {failureRate: 2}\n"
	if _, err := ctl.PushConfig(ctx, []byte(bad), PushOptions{}); err == nil || !strings.Contains(err.Error(), "breaker.failureRate") {
		t.Fatalf("checked push of a bad value: %v, want it refused before Redis", err)
	}
	start := time.Now()
	if r, err = ctl.PushConfig(ctx, []byte(bad), PushOptions{Unchecked: true}); err != nil {
		t.Fatal(err)
	}
	refusals := func(seq int64, version, msg string) time.Duration {
		t.Helper()
		for {
			st, err := ctl.ConfigStatus(ctx)
			n := 0
			for _, p := range st.Processes {
				if p.Seq == seq && p.Refused == version && strings.Contains(p.Error, msg) && p.Running == "v1" {
					n++
				}
			}
			if err == nil && n == len(pods) {
				return time.Since(start)
			}
			if time.Since(start) > time.Second {
				t.Fatalf("after %v, %d of %d refusals of %s shown: %+v, %v", time.Since(start), n, len(pods), version, st, err)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	t.Logf("%d refusals of a bad value shown %v after the push began", len(pods), refusals(r.Seq, "bad-1", "breaker.failureRate"))
	for _, p := range pods {
		c := p.tr.Snapshot().Config
		if c.Version != "v1" || c.Rejected == nil || c.Rejected.Version != "bad-1" || !strings.Contains(c.Rejected.Error, "failureRate") {
			t.Fatalf("%s: %+v, want v1 running and bad-1 rejected", p.id, c)
		}
	}

	// Valid for the pusher, whose registry has the fallback; not for the
	// processes: a binary older than the file.
	named := "version: named-1\ndefault:\n  fallback: {func: last-rate}\n"
	reg := config.Registry{Fallbacks: map[string]func(*http.Request, error) (*http.Response, error){
		"last-rate": func(*http.Request, error) (*http.Response, error) { return nil, errors.New("none") },
	}}
	start = time.Now()
	if r, err = ctl.PushConfig(ctx, []byte(named), PushOptions{Registry: reg}); err != nil {
		t.Fatal(err)
	}
	refusals(r.Seq, "named-1", `unknown name "last-rate"`)

	// A store that does not decode: ignored, counted, shown; v1 stays.
	c := s.client(t)
	key := prefix + "config"
	for i, corrupt := range []func() error{
		func() error {
			return c.HSet(ctx, key, "stable.data", strings.Repeat("#", config.MaxBytes+1), "seq", "50").Err()
		},
		func() error { return c.HSet(ctx, key, "stable.data", "x", "stable.version", "", "seq", "99").Err() },
		func() error {
			return c.HSet(ctx, key, "stable.version", "v9", "canary.share", "20000", "seq", "100").Err()
		},
		// SET replaces the hash in one command: every state a pod may read
		// between the cases is corrupt, so each hint is counted once.
		func() error { return c.Set(ctx, key, "garbage", 0).Err() },
	} {
		before := pods[0].fl.Stats().Ignored
		if err := corrupt(); err != nil {
			t.Fatal(err)
		}
		// A hint that names no state read yet: the pods read the store.
		c.Publish(ctx, prefix+"config:push", "ffff:"+strconv.Itoa(1000+i))
		eventually(t, "the corrupt store to be counted", func() bool { return pods[0].fl.Stats().Ignored > before })
		for _, p := range pods {
			if v := p.version(); v != "v1" {
				t.Fatalf("corrupt store %d: %s runs %q, want v1", i, p.id, v)
			}
		}
	}
	eventually(t, "the corrupt store shown in the acks", func() bool {
		st, _ := ctl.ConfigStatus(ctx)
		n := 0
		for _, p := range st.Processes {
			if strings.HasPrefix(p.Error, "store: ") {
				n++
			}
		}
		return n == len(pods)
	})
	// Garbage on the channel is counted and read nothing.
	before := pods[0].fl.Stats().Ignored
	for _, msg := range []string{"", "garbage", "1", "ffff:-1", "XY:1", strings.Repeat("9", 40)} {
		c.Publish(ctx, prefix+"config:push", msg)
	}
	eventually(t, "the garbage messages to be counted", func() bool { return pods[0].fl.Stats().Ignored == before+6 })
	// Garbage among the acks is counted, not shown, as is the store.
	c.HSet(ctx, prefix+"config:{acks}", "ghost", "{not json", strings.Repeat("x", 100), "{}")
	if st, err := ctl.ConfigStatus(ctx); err != nil || st.Ignored != 3 || len(st.Processes) != len(pods) {
		t.Fatalf("status with garbage: %+v, %v; want the store and 2 acks ignored, the pods' acks shown", st, err)
	}
	c.Del(ctx, key)
	c.HSet(ctx, key, "epoch", "not:hex")

	// The next push replaces the garbage (and an epoch that is not one of
	// a push's, which would make its hint ignored) and applies.
	start = time.Now()
	if r, err = ctl.PushConfig(ctx, []byte(pushV2), PushOptions{}); err != nil {
		t.Fatal(err)
	}
	runWithin(t, pods, all("v2"), start, time.Second)
	st := acked(t, ctl, pods, r.Seq)
	if st.Ignored != 2 {
		t.Fatalf("status: %d ignored, want the 2 garbage acks", st.Ignored)
	}
	for _, p := range st.Processes {
		if p.Error != "" || p.Refused != "" || p.Running != "v2" {
			t.Fatalf("ack after a good push: %+v", p)
		}
	}
	for _, p := range pods {
		if st := p.fl.Stats(); st.Refused != 2 || st.Ignored < 10 {
			t.Fatalf("%s: %+v, want 2 refused, the 4 corrupt stores and 6 garbage messages ignored", p.id, st)
		}
	}
}

// TestConfigPushRedisDown: Redis killed while a push is under way (the
// pusher retrying); no request fails meanwhile; once Redis is back the
// push lands and every process runs it within a second of the restart.
func TestConfigPushRedisDown(t *testing.T) {
	s := startRedis(t)
	const prefix = "c3:"
	var pods []*configPod
	for i := range 3 {
		pods = append(pods, followingPod(t, s, prefix, "pod-"+strconv.Itoa(i), config.Registry{}))
	}
	followingAll(t, pods)
	ctl := controller(t, s, prefix)
	if _, err := ctl.PushConfig(t.Context(), []byte(pushV1), PushOptions{}); err != nil {
		t.Fatal(err)
	}
	runWithin(t, pods, all("v1"), time.Now(), 10*time.Second)

	// Steady traffic through every pod, each request counted.
	ok := newUpstream(t, 200, nil)
	var sent, failed atomic.Int64
	var lastErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, p := range pods {
		wg.Go(func() {
			for range 5000 { // bounded: about 25 s at most
				select {
				case <-stop:
					return
				case <-time.After(5 * time.Millisecond):
				}
				sent.Add(1)
				if code, err := get(t, p.tr, ok.URL); err != nil || code != 200 {
					failed.Add(1)
					lastErr.Store(strconv.Itoa(code) + " " + errString(err))
				}
			}
		})
	}
	stopTraffic := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopTraffic()

	s.kill()
	eventually(t, "the pods to see Redis gone", func() bool {
		for _, p := range pods {
			if p.fl.Stats().Connected {
				return false
			}
		}
		return true
	})
	// The push is retried as an operator runs bulwarkctl again: each try
	// a new client, so go-redis's pool of a client whose dials all failed
	// (it dials again only once a second) does not delay the push.
	pushed := make(chan error, 1)
	go func() {
		var err error
		for range 200 { // bounded: 10 s
			c := s.client(t)
			pusher, _ := New(c, Options{Prefix: prefix, ID: "ctl"})
			_, err = pusher.PushConfig(context.Background(), []byte(pushV2), PushOptions{})
			_ = c.Close()
			if err == nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		pushed <- err
	}()
	time.Sleep(2 * time.Second) // the outage, real: Redis is a process
	back := time.Now()          // before the restart: the figure includes Redis's start
	s.start()
	took := runWithin(t, pods, all("v2"), back, time.Second)
	t.Logf("every pod ran v2 %v after redis-server was restarted", took)
	if err := <-pushed; err != nil {
		t.Fatalf("push: %v", err)
	}
	stopTraffic()
	if n, f := sent.Load(), failed.Load(); n < 100 || f != 0 {
		t.Fatalf("%d requests, %d failed (%v); want many, none failed", n, f, lastErr.Load())
	}
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// TestInCanary: the selection is deterministic, monotonic in the share,
// and about proportional over many IDs.
func TestInCanary(t *testing.T) {
	n10, n50 := 0, 0
	for i := range 10000 {
		id := "pod-" + strconv.Itoa(i)
		a, b := InCanary(id, 0.1), InCanary(id, 0.5)
		if a && !b {
			t.Fatalf("%s in the 10%% canary but not the 50%% one", id)
		}
		if a != InCanary(id, 0.1) {
			t.Fatalf("%s: not deterministic", id)
		}
		if a {
			n10++
		}
		if b {
			n50++
		}
	}
	if n10 < 900 || n10 > 1100 || n50 < 4800 || n50 > 5200 {
		t.Fatalf("of 10000 IDs, %d in 10%% and %d in 50%%", n10, n50)
	}
	if InCanary("x", 0) || !InCanary("x", 1) || !InCanary("x", 2) {
		t.Fatal("share 0 must take none, 1 and more all")
	}
	for i := range 100 {
		if id := "pod-" + strconv.Itoa(i); InCanary(id, math.NaN()) || InCanary(id, -1) {
			t.Fatalf("%s in a canary of NaN or -1, which is no share", id)
		}
	}
}

// TestParseStore: what a process accepts of the store.
func TestParseStore(t *testing.T) {
	for _, tc := range []struct {
		res []string
		ok  bool
	}{
		{[]string{}, true},
		{[]string{"e:3"}, false}, // unmoved, but known is "e:2"
		{[]string{"e:2"}, true},
		{[]string{"e:3", "v1", "data", "", "", ""}, true},
		{[]string{"e:3", "v1", "data", "v2", "d2", "2500"}, true},
		{[]string{"e:3", "", "", "v2", "d2", "2500"}, true},
		{[]string{":3", "v1", "data", "", "", ""}, false},
		{[]string{"e:x", "v1", "data", "", "", ""}, false},
		{[]string{"e:3", "v1", "", "", "", ""}, false},
		{[]string{"e:3", "", "data", "", "", ""}, false},
		{[]string{"e:3", "v\n1", "data", "", "", ""}, false},
		{[]string{"e:3", "v1", "data", "v2", "d2", "10000"}, false},
		{[]string{"e:3", "v1", "data", "v2", "d2", "0"}, false},
		{[]string{"e:3", "v1", "data", "v2", "", "2500"}, false},
		{[]string{"e:3", "v1", "data", "", "", "2500"}, false},
		{[]string{"e:3", "v1", "data", "", ""}, false},
	} {
		_, err := parseStore(tc.res, "e:2")
		if (err == nil) != tc.ok {
			t.Errorf("parseStore(%q) = %v, want ok %v", tc.res, err, tc.ok)
		}
	}
}

// TestCanaryInShadow: the rollout the README describes. A canary pushes a
// stricter threshold in shadow mode: the canary's breaker trips on a host
// failing a third of its calls and reports the refusals it would make
// (WouldReject) while sending every request, and its trip is not the
// fleet's: the enforcing pod, on the old threshold, keeps calling. Pushed
// again without shadow, the canary enforces it.
func TestCanaryInShadow(t *testing.T) {
	s := startRedis(t)
	const prefix = "c4:"
	var canaryPod, stablePod *configPod
	for i := 0; canaryPod == nil || stablePod == nil; i++ {
		if i > 100 {
			t.Fatal("no ID in and none out of a 50% canary among 100")
		}
		id := "pod-" + strconv.Itoa(i)
		switch in := InCanary(id, 0.5); {
		case in && canaryPod == nil:
			canaryPod = followingPod(t, s, prefix, id, config.Registry{})
		case !in && stablePod == nil:
			stablePod = followingPod(t, s, prefix, id, config.Registry{})
		}
	}
	pods := []*configPod{canaryPod, stablePod}
	followingAll(t, pods)
	ctl := controller(t, s, prefix)
	ctx := t.Context()
	loose := "version: loose\ndefault:\n  retry: {disabled: true}\n  breaker: {failureRate: 0.9, minCalls: 6, windowCalls: 12}\n"
	if _, err := ctl.PushConfig(ctx, []byte(loose), PushOptions{}); err != nil {
		t.Fatal(err)
	}
	runWithin(t, pods, all("loose"), time.Now(), 10*time.Second)
	// Open for an hour: its spaced probes (one per open time ÷ 10) then
	// stay far off, so the enforcing canary's refusal below is its own.
	strict := "version: strict-shadow\ndefault:\n  retry: {disabled: true}\n  breaker: {failureRate: 0.3, minCalls: 6, windowCalls: 12, openFor: 1h, shadow: true}\n"
	if _, err := ctl.PushConfig(ctx, []byte(strict), PushOptions{Canary: 0.5}); err != nil {
		t.Fatal(err)
	}
	runWithin(t, pods, func(p *configPod) string {
		return map[bool]string{true: "strict-shadow", false: "loose"}[p == canaryPod]
	}, time.Now(), 10*time.Second)

	// A host failing one call in three: over 0.3, under 0.9.
	var n atomic.Int64
	up := &upstream{Server: httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if n.Add(1)%3 == 0 {
			w.WriteHeader(500)
		}
	}))}
	t.Cleanup(up.Close)
	for range 12 {
		if _, err := get(t, canaryPod.tr, up.URL); err != nil {
			t.Fatalf("canary in shadow refused: %v", err)
		}
	}
	br := canaryPod.tr.Snapshot().Host(up.host())[0].Breaker
	if br.State != bulwark.CircuitOpen || !br.Shadow || br.WouldReject == 0 {
		t.Fatalf("canary's breaker %+v, want open in shadow, with refusals it would have made", br)
	}
	time.Sleep(200 * time.Millisecond) // what a published trip takes to arrive, many times over
	for range 3 {
		if _, err := get(t, stablePod.tr, up.URL); err != nil {
			t.Fatalf("the enforcing pod adopted the shadow canary's trip: %v", err)
		}
	}

	// Enforced on the canary: pushed again without shadow.
	strict = strings.Replace(strings.Replace(strict, ", shadow: true", "", 1), "strict-shadow", "strict", 1)
	if _, err := ctl.PushConfig(ctx, []byte(strict), PushOptions{Canary: 0.5}); err != nil {
		t.Fatal(err)
	}
	runWithin(t, pods, func(p *configPod) string {
		return map[bool]string{true: "strict", false: "loose"}[p == canaryPod]
	}, time.Now(), 10*time.Second)
	if _, err := get(t, canaryPod.tr, up.URL); !errors.Is(err, bulwark.ErrBreakerOpen) {
		t.Fatalf("canary enforcing: %v, want its open breaker to refuse", err)
	}
}

// TestConfigPushCluster: on a Redis Cluster the store is one key and the
// acks two keys of one slot (a hash tag), so each script runs where its
// keys live; a push, a canary and the status work as on one node.
func TestConfigPushCluster(t *testing.T) {
	nodes := startCluster(t, 5*time.Second)
	const prefix = "c5:"
	var pods []*configPod
	in := map[string]bool{}
	for _, id := range []string{"pod-a", "pod-b", "pod-c", "pod-d"} {
		f, err := New(clusterClient(t, nodes), Options{Prefix: prefix, ID: id})
		if err != nil {
			t.Fatal(err)
		}
		tr := newTransport(t, bulwark.Config{Fleet: f})
		fl := f.ConfigFollower(tr, FollowOptions{Logger: slog.New(slog.DiscardHandler), Resync: time.Minute})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = fl.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		pods = append(pods, &configPod{id: id, tr: tr, fl: fl})
		in[id] = InCanary(id, 0.5)
	}
	followingAll(t, pods)
	ctl, err := New(clusterClient(t, nodes), Options{Prefix: prefix, ID: "ctl"})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := ctl.PushConfig(t.Context(), []byte(pushV1), PushOptions{}); err != nil {
		t.Fatal(err)
	}
	runWithin(t, pods, all("v1"), start, time.Second)
	start = time.Now()
	r, err := ctl.PushConfig(t.Context(), []byte(pushV2), PushOptions{Canary: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	runWithin(t, pods, func(p *configPod) string { return map[bool]string{true: "v2", false: "v1"}[in[p.id]] }, start, time.Second)
	st := acked(t, ctl, pods, r.Seq)
	if st.Stable != "v1" || st.Canary != "v2" || st.Ignored != 0 {
		t.Fatalf("status on a Cluster: %+v", st)
	}
}

// redisContents reads every key of the server, each by its type, as one
// comparable text: what a refused change must leave as it was.
func redisContents(t *testing.T, s *redisServer) string {
	t.Helper()
	c := s.client(t)
	ctx := t.Context()
	keys, err := c.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		typ, err := c.Type(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		var v any
		switch typ {
		case "hash":
			v, err = c.HGetAll(ctx, k).Result()
		case "zset":
			v, err = c.ZRangeWithScores(ctx, k, 0, -1).Result()
		case "string":
			v, err = c.Get(ctx, k).Result()
		default:
			t.Fatalf("key %s of type %s: read it here too", k, typ)
		}
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s (%s) = %v\n", k, typ, v)
	}
	return b.String()
}

// seamCanaryShareStore: a canary share outside [0.0001, 0.9999] (one
// basis point to all but one; 0.99999 too, not rounded down) is
// refused with ErrCanaryShare before anything is stored: every key in
// Redis reads the same after, and the following process runs what it ran.
func seamCanaryShareStore(t *testing.T) {
	s := startRedis(t)
	const prefix = "c5:"
	pod := followingPod(t, s, prefix, "pod-a", config.Registry{})
	followingAll(t, []*configPod{pod})
	ctl := controller(t, s, prefix)
	ctx := t.Context()
	for _, v := range []string{pushV1, pushV2} {
		if _, err := ctl.PushConfig(ctx, []byte(v), PushOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	r, err := ctl.PushConfig(ctx, []byte(pushV3), PushOptions{Canary: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	acked(t, ctl, []*configPod{pod}, r.Seq)
	before, running := redisContents(t, s), pod.version()
	for _, share := range []float64{10, 25, 1, 1.5, math.NaN(), math.Inf(1), math.Inf(-1), -0.1, 0.00005, 0.00009, 0.99991, 0.99999, 0.999999999, 0.99999999999} {
		_, err := ctl.PushConfig(ctx, []byte(pushV1), PushOptions{Canary: share})
		if !errors.Is(err, ErrCanaryShare) || !strings.Contains(err.Error(), "from 0.0001 (one basis point) to 0.9999") {
			t.Errorf("PushConfig(Canary: %v) = %v, want ErrCanaryShare saying what a share is", share, err)
		}
		if after := redisContents(t, s); after != before {
			t.Fatalf("PushConfig(Canary: %v) changed Redis:\nbefore:\n%s\nafter:\n%s", share, before, after)
		}
	}
	if v := pod.version(); v != running {
		t.Fatalf("the pod runs %s after the refusals, want %s", v, running)
	}
	// The edges of the range: one basis point, and a share written in
	// decimal counted as written.
	for _, tc := range []struct {
		share float64
		want  float64
	}{{0.0001, 0.0001}, {0.29, 0.29}, {0.9999, 0.9999},
		// As bulwarkctl computes them from 0.01% and 99.99%.
		{0.01 / 100, 0.0001}, {99.99 / 100, 0.9999}} {
		if _, err := ctl.PushConfig(ctx, []byte(pushV3), PushOptions{Canary: tc.share}); err != nil {
			t.Fatalf("PushConfig(Canary: %v): %v", tc.share, err)
		}
		if st, err := ctl.ConfigStatus(ctx); err != nil || st.Share != tc.want {
			t.Fatalf("status after a canary of %v: share %v, %v; want %v", tc.share, st.Share, err, tc.want)
		}
	}
}

// firstCanaryFleet starts four following pods (halfInCanary) and pushes
// v3 as the fleet's first configuration, a canary of 50 %, returning once
// each pod runs what it is to run (v3 in the canary, what it was built
// with outside) and acknowledged the push.
func firstCanaryFleet(t *testing.T, prefix string) (*redisServer, []*configPod, map[string]bool, *Fleet, Pushed) {
	t.Helper()
	s := startRedis(t)
	pods, in := halfInCanary(t, s, prefix)
	followingAll(t, pods)
	ctl := controller(t, s, prefix)
	r, err := ctl.PushConfig(t.Context(), []byte(pushV3), PushOptions{Canary: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	runWithin(t, pods, func(p *configPod) string {
		if in[p.id] {
			return "v3"
		}
		return ""
	}, time.Now(), 10*time.Second)
	acked(t, ctl, pods, r.Seq)
	return s, pods, in, ctl, r
}

// seamRollbackFirstCanary: when a fleet's first push is a canary, a
// rollback has no stable version for the canary's processes to return to:
// it is refused with ErrNoConfig, saying so, Redis is unchanged, and the
// status and the processes agree (the canary goes on). A push to every
// process then replaces it.
func seamRollbackFirstCanary(t *testing.T) {
	s, pods, in, ctl, r := firstCanaryFleet(t, "c6:")
	ctx := t.Context()
	canary := func(p *configPod) string {
		if in[p.id] {
			return "v3"
		}
		return ""
	}
	before := redisContents(t, s)
	_, err := ctl.RollbackConfig(ctx)
	if !errors.Is(err, ErrNoConfig) || !strings.Contains(err.Error(), `canary "v3" is the fleet's first configuration`) {
		t.Fatalf("rollback of a first canary: %v, want ErrNoConfig saying there is no stable version", err)
	}
	if after := redisContents(t, s); after != before {
		t.Fatalf("a refused rollback changed Redis:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	st, err := ctl.ConfigStatus(ctx)
	if err != nil || st.Canary != "v3" || st.Stable != "" || st.Seq != r.Seq {
		t.Fatalf("status after the refused rollback: %+v, %v; want the canary v3 still", st, err)
	}
	for _, p := range st.Processes {
		if p.Canary != in[p.ID] || p.Running != canary(&configPod{id: p.ID}) {
			t.Fatalf("ack after the refused rollback: %+v", p)
		}
	}
	runWithin(t, pods, canary, time.Now(), time.Second)
	start := time.Now()
	if r, err = ctl.PushConfig(ctx, []byte(pushV1), PushOptions{}); err != nil || r.Canary || r.Previous != "" {
		t.Fatalf("push v1 over the first canary: %+v, %v", r, err)
	}
	runWithin(t, pods, all("v1"), start, time.Second)
	if st, err = ctl.ConfigStatus(ctx); err != nil || st.Canary != "" || st.Stable != "v1" {
		t.Fatalf("status after the push: %+v, %v", st, err)
	}
}

// seamPushFleetRate: a file with a Bulkhead.FleetRate passes the pusher's
// check (a file names no Fleet: the processes' own is what leases) and is
// applied by every process, whose Transport has this Redis fleet.
func seamPushFleetRate(t *testing.T) {
	s := startRedis(t)
	const prefix = "c7:"
	pods := []*configPod{followingPod(t, s, prefix, "pod-a", config.Registry{}), followingPod(t, s, prefix, "pod-b", config.Registry{})}
	followingAll(t, pods)
	ctl := controller(t, s, prefix)
	// Unchecked first, so that the processes' check is the only one.
	for i, o := range []PushOptions{{Unchecked: true}, {}} {
		v := "rated-" + strconv.Itoa(i)
		start := time.Now()
		r, err := ctl.PushConfig(t.Context(), fmt.Appendf(nil, "version: %s\nupstreams:\n  pay.internal:\n    bulkhead: {fleetRate: 10%d}\n", v, i), o)
		if err != nil {
			t.Fatalf("push of a fleetRate (%+v): %v", o, err)
		}
		for _, p := range acked(t, ctl, pods, r.Seq).Processes {
			if p.Running != v || p.Refused != "" || p.Error != "" {
				t.Fatalf("ack %+v, want %s running", p, v)
			}
		}
		runWithin(t, pods, all(v), start, 10*time.Second)
	}
}

// seamRefusalVersion: a pushed file that declares v7 but does not
// decode (an unknown field, a value of the wrong type) is refused as v7 in
// the status and in each process's Snapshot.Config alike.
func seamRefusalVersion(t *testing.T) {
	s := startRedis(t)
	const prefix = "c8:"
	pods := []*configPod{followingPod(t, s, prefix, "pod-a", config.Registry{}), followingPod(t, s, prefix, "pod-b", config.Registry{})}
	followingAll(t, pods)
	ctl := controller(t, s, prefix)
	for i, file := range []string{"version: v7\nbogus: 1\n", "version: v7\ndefault: {retry: {maxAttempts: two}}\n"} {
		r, err := ctl.PushConfig(t.Context(), []byte(file), PushOptions{Unchecked: true})
		if err != nil || r.Version != "v7" {
			t.Fatalf("push %d: %+v, %v", i, r, err)
		}
		for _, p := range acked(t, ctl, pods, r.Seq).Processes {
			if p.Refused != "v7" || p.Error == "" {
				t.Fatalf("push %d: ack %+v, want v7 refused", i, p)
			}
		}
		for _, p := range pods {
			if c := p.tr.Snapshot().Config; c == nil || c.Rejected == nil || c.Rejected.Version != "v7" {
				t.Fatalf("push %d: %s's Snapshot().Config = %+v, want v7 refused as the status names it", i, p.id, c)
			}
		}
	}
}

// seamFirstCanaryShrink: while the fleet's first canary runs (no stable
// version), a canary that would reach fewer processes is refused with
// ErrCanaryShare and Redis is unchanged: the processes it would leave
// would keep running a version the store no longer holds, shown on it by
// the status. A canary of the same or a larger share replaces it, and
// every process then runs what the store holds for it.
func seamFirstCanaryShrink(t *testing.T) {
	s, pods, in, ctl, _ := firstCanaryFleet(t, "c9:")
	ctx := t.Context()
	canaryOf := func(v string, share float64) func(*configPod) string {
		return func(p *configPod) string {
			if InCanary(p.id, share) {
				return v
			}
			return ""
		}
	}
	before := redisContents(t, s)
	left := false
	for id := range in {
		left = left || in[id] && !InCanary(id, 0.0001)
	}
	if !left {
		t.Fatal("no pod leaves the 50% canary for one of 0.0001: pick other IDs")
	}
	// Any smaller share is refused, whether or not one of these pods is
	// between the two.
	for _, share := range []float64{0.0001, 0.1, 0.4999} {
		_, err := ctl.PushConfig(ctx, []byte(pushV2), PushOptions{Canary: share})
		if !errors.Is(err, ErrCanaryShare) || !strings.Contains(err.Error(), `the canary "v3" of 50% is the fleet's first configuration`) {
			t.Fatalf("a canary of %v over the first canary of 50%%: %v, want ErrCanaryShare saying why", share, err)
		}
		if after := redisContents(t, s); after != before {
			t.Fatalf("a refused canary of %v changed Redis:\nbefore:\n%s\nafter:\n%s", share, before, after)
		}
	}
	runWithin(t, pods, canaryOf("v3", 0.5), time.Now(), time.Second)
	// The same share, then a larger one: no process leaves the canary, and
	// each runs the store's canary or, outside it, what it was built with.
	for _, c := range []struct {
		v     string
		data  string
		share float64
	}{{"v2", pushV2, 0.5}, {"v1", pushV1, 0.9999}} {
		start := time.Now()
		r, err := ctl.PushConfig(ctx, []byte(c.data), PushOptions{Canary: c.share})
		if err != nil || !r.Canary {
			t.Fatalf("a canary of %v over the first canary: %+v, %v", c.share, r, err)
		}
		runWithin(t, pods, canaryOf(c.v, c.share), start, 10*time.Second)
		st := acked(t, ctl, pods, r.Seq)
		if st.Stable != "" || st.Canary != c.v {
			t.Fatalf("status after a canary of %v: %+v", c.share, st)
		}
		for _, p := range st.Processes {
			if p.Canary != InCanary(p.ID, c.share) || p.Running != canaryOf(c.v, c.share)(&configPod{id: p.ID}) {
				t.Fatalf("ack after a canary of %v: %+v", c.share, p)
			}
		}
	}
}

// TestPushNoConfig: a file that holds no Config at all (nothing but
// whitespace, a byte-order mark, comments or a document marker; a scalar
// or a list) is refused by PushConfig, -unchecked too, as every process
// would refuse it whatever its Registry: Redis is unchanged and the stable
// version stays. An unchecked push still stores what only the processes'
// Registry can judge.
func TestPushNoConfig(t *testing.T) {
	s := startRedis(t)
	const prefix = "c10:"
	pod := followingPod(t, s, prefix, "pod-a", config.Registry{})
	followingAll(t, []*configPod{pod})
	ctl := controller(t, s, prefix)
	ctx := t.Context()
	r, err := ctl.PushConfig(ctx, []byte(pushV1), PushOptions{})
	if err != nil {
		t.Fatal(err)
	}
	acked(t, ctl, []*configPod{pod}, r.Seq)
	before := redisContents(t, s)
	for _, file := range []string{"", " ", "\n\n", "\t\n", "\r\n", "# nothing\n", "\ufeff", "\ufeff\n", "\ufeff# x\n---\n",
		"---\n", "--- # x\n", "---\n...\n", "null\n", "~", "[]\n", "42\n", `""`} {
		for _, o := range []PushOptions{{Unchecked: true}, {}} {
			_, err := ctl.PushConfig(ctx, []byte(file), o)
			if err == nil {
				t.Errorf("PushConfig(%q, Unchecked: %v) stored a file with no Config", file, o.Unchecked)
			}
			if after := redisContents(t, s); after != before {
				t.Fatalf("PushConfig(%q, Unchecked: %v) changed Redis:\nbefore:\n%s\nafter:\n%s", file, o.Unchecked, before, after)
			}
		}
	}
	if v := pod.version(); v != "v1" {
		t.Fatalf("the pod runs %q, want v1", v)
	}
	// What the empty Registry refuses but a program's may hold.
	named := "version: named\nupstreams:\n  pay.internal:\n    fallback: {func: cached}\n"
	if _, err := ctl.PushConfig(ctx, []byte(named), PushOptions{}); err == nil {
		t.Fatal("a checked push of an unknown name was stored")
	}
	if r, err := ctl.PushConfig(ctx, []byte(named), PushOptions{Unchecked: true}); err != nil || r.Version != "named" {
		t.Fatalf("an unchecked push of an unknown name: %+v, %v", r, err)
	}
}
