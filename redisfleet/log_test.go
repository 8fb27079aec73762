package redisfleet

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/redis/go-redis/v9"
)

// records is a slog.Handler that keeps every record's level and message.
type records struct {
	mu   sync.Mutex
	msgs map[slog.Level][]string
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *records) WithGroup(string) slog.Handler            { return r }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs[rec.Level] = append(r.msgs[rec.Level], rec.Message)
	return nil
}

func (r *records) at(l slog.Level) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.msgs[l]...)
}

// TestOutageLoggedOnce: with go-redis's logger routed as the README says,
// an outage of Redis under load (a trip, a leased quota) is logged once
// by each pod at Warn and its end once at Info; go-redis's own dial failures
// are there at Debug only.
func TestOutageLoggedOnce(t *testing.T) {
	s := startRedis(t)
	rec := &records{msgs: map[slog.Level][]string{}}
	logger := slog.New(rec)
	redis.SetLogger(DebugLog{Logger: logger})
	t.Cleanup(func() { redis.SetLogger(DebugLog{}) }) // as TestMain sets it

	ok := newUpstream(t, 200, nil)
	sick := newUpstream(t, 500, nil)
	// Two pods: one that trips, one under a leased quota.
	pods := make([]*bulwark.Transport, 2)
	for i := range pods {
		f, err := New(s.client(t), Options{Prefix: "l1:"})
		if err != nil {
			t.Fatal(err)
		}
		p := bulwark.Policy{}
		p.Retry.Disabled = true
		p.Breaker.MinCalls, p.Breaker.WindowCalls = 5, 10
		if i == 1 {
			p.Bulkhead.MaxConcurrent = 1000
			p.Bulkhead.FleetRate = 1000
		}
		pods[i] = newTransport(t, bulwark.Config{Default: p, Fleet: f, Logger: logger})
	}
	tr, quota := pods[0], pods[1]
	eventually(t, "the pods subscribed", func() bool { return connected(tr) && connected(quota) })
	eventually(t, "the quota leased", func() bool {
		_, _ = get(t, quota, ok.URL)
		q := quotaOf(quota, ok.host())
		return q != nil && !q.Local && q.Leases > 0
	})

	s.kill()
	l := startLoad(t, pods, ok.URL, 5*time.Millisecond)
	eventually(t, "the pods to see Redis gone", func() bool { return !connected(tr) && !connected(quota) })
	trip(t, tr, sick.URL)
	time.Sleep(2 * time.Second)
	s.start()
	eventually(t, "the pods to resubscribe", func() bool { return connected(tr) && connected(quota) })
	eventually(t, "the pod to lease again", func() bool { return !quotaOf(quota, ok.host()).Local })
	l.end()
	if l.other.Load() != 0 {
		t.Fatalf("%d requests failed during the outage (%v), want none", l.other.Load(), l.lastOther.Load())
	}
	count := func(l slog.Level, prefix string) (n int) {
		for _, m := range rec.at(l) {
			if strings.HasPrefix(m, prefix) {
				n++
			}
		}
		return n
	}
	if n, m := count(slog.LevelWarn, "bulwark: fleet"), count(slog.LevelInfo, "bulwark: fleet"); n != len(pods) || m != len(pods) {
		t.Fatalf("the fleet's outage logged %d times at Warn and its end %d at Info, want once per pod: %q", n, m, rec.at(slog.LevelWarn))
	}
	for _, l := range []slog.Level{slog.LevelInfo, slog.LevelWarn, slog.LevelError} {
		if n := count(l, "redis:"); n != 0 {
			t.Fatalf("%d of go-redis's lines at %v, want them at Debug only", n, l)
		}
	}
	debug := rec.at(slog.LevelDebug)
	if len(debug) == 0 {
		t.Fatal("nothing at Debug: go-redis's own lines were not routed")
	}
	t.Logf("%d of go-redis's lines at Debug", len(debug))
}
