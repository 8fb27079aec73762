package redisfleet

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
)

// okBase answers every request at once with 200 and no body, so that a
// benchmark measures the layers above it.
type okBase struct{}

func (okBase) RoundTrip(req *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, Body: http.NoBody, Header: http.Header{}, Request: req}, nil
}

func benchTransport(b *testing.B, f bulwark.Fleet) *bulwark.Transport {
	p := bulwark.Policy{}
	p.Retry.Disabled, p.Bulkhead.Disabled, p.Timeout.Disabled = true, true, true
	tr, err := bulwark.New(bulwark.Config{Base: okBase{}, Default: p, Fleet: f})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = tr.Close() })
	return tr
}

func roundTrips(b *testing.B, rt http.RoundTripper) {
	req, _ := http.NewRequest("GET", "http://api.test/", nil)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		resp, err := rt.RoundTrip(req)
		if err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
	}
}

// BenchmarkFleet is a call through bulwark's breaker and pushback layers
// with and without a Fleet over a real redis-server: the difference is
// what the fleet costs a request, with no Redis round trip in it.
func BenchmarkFleet(b *testing.B) {
	b.Run("local", func(b *testing.B) { roundTrips(b, benchTransport(b, nil)) })
	b.Run("redisfleet", func(b *testing.B) {
		s := startRedis(b)
		f, err := New(s.client(b), Options{Prefix: "bench:"})
		if err != nil {
			b.Fatal(err)
		}
		tr := benchTransport(b, f)
		eventually(b, "subscribed", func() bool { return connected(tr) })
		roundTrips(b, tr)
	})
}

// redisStore is gobreaker's SharedDataStore over go-redis: a lock by SET NX
// with a TTL, the state by GET and SET, each one round trip.
type redisStore struct{ c *redis.Client }

func (s redisStore) Lock(name string) error {
	for range 1000 {
		ok, err := s.c.SetNX(context.Background(), name, "1", 5*time.Second).Result()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		time.Sleep(time.Millisecond)
	}
	return errors.New("lock not acquired")
}

func (s redisStore) Unlock(name string) error { return s.c.Del(context.Background(), name).Err() }

func (s redisStore) GetData(name string) ([]byte, error) {
	v, err := s.c.Get(context.Background(), name).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	return v, err
}

func (s redisStore) SetData(name string, data []byte) error {
	return s.c.Set(context.Background(), name, data, 0).Err()
}

// BenchmarkGobreaker is gobreaker v2's local breaker and its
// DistributedCircuitBreaker on the same redis-server, around the same
// base, for comparison with BenchmarkFleet.
func BenchmarkGobreaker(b *testing.B) {
	req, _ := http.NewRequest("GET", "http://api.test/", nil)
	call := func() (*http.Response, error) { return okBase{}.RoundTrip(req) }
	b.Run("local", func(b *testing.B) {
		cb := gobreaker.NewCircuitBreaker[*http.Response](gobreaker.Settings{Name: "api"})
		b.ReportAllocs()
		for b.Loop() {
			resp, err := cb.Execute(call)
			if err != nil {
				b.Fatal(err)
			}
			resp.Body.Close()
		}
	})
	b.Run("distributed", func(b *testing.B) {
		s := startRedis(b)
		cb, err := gobreaker.NewDistributedCircuitBreaker[*http.Response](redisStore{s.client(b)}, gobreaker.Settings{Name: "api"})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			resp, err := cb.Execute(call)
			if err != nil {
				b.Fatal(err)
			}
			resp.Body.Close()
		}
	})
}

// BenchmarkFleetPaired times a call through a Transport without a Fleet
// and one with a redisfleet, alternately in one loop, so that the load of
// a shared machine falls on both alike: local-ns/op and fleet-ns/op are
// the means of each, delta-ns/op their difference.
func BenchmarkFleetPaired(b *testing.B) {
	s := startRedis(b)
	f, err := New(s.client(b), Options{Prefix: "bench:"})
	if err != nil {
		b.Fatal(err)
	}
	local, fleet := benchTransport(b, nil), benchTransport(b, f)
	eventually(b, "subscribed", func() bool { return connected(fleet) })
	req, _ := http.NewRequest("GET", "http://api.test/", nil)
	var tl, tf time.Duration
	one := func(rt http.RoundTripper) time.Duration {
		start := time.Now()
		resp, err := rt.RoundTrip(req)
		d := time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
		return d
	}
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		if n%2 == 0 {
			tl += one(local)
			tf += one(fleet)
		} else {
			tf += one(fleet)
			tl += one(local)
		}
		n++
	}
	b.ReportMetric(float64(tl.Nanoseconds())/float64(n), "local-ns/op")
	b.ReportMetric(float64(tf.Nanoseconds())/float64(n), "fleet-ns/op")
	b.ReportMetric(float64((tf-tl).Nanoseconds())/float64(n), "delta-ns/op")
}

// BenchmarkQuota is a call through a bulkhead with a local rate limit
// (Bulkhead.Rate, golang.org/x/time/rate) and one with a fleet quota
// (Bulkhead.FleetRate, leased from a real redis-server), both of a million
// a second: what deciding on a leased token costs a request next to a
// local token bucket, with no Redis round trip on the path. A loop this
// tight can ask for more than a million a second: the refused share is
// reported (refused/op), and a refusal is a decision too.
func BenchmarkQuota(b *testing.B) {
	for _, fleet := range []bool{false, true} {
		name := map[bool]string{false: "local-rate", true: "fleet-rate"}[fleet]
		b.Run(name, func(b *testing.B) {
			p := bulwark.Policy{}
			p.Retry.Disabled, p.Breaker.Disabled, p.Timeout.Disabled = true, true, true
			p.Bulkhead.MaxConcurrent = 1000
			cfg := bulwark.Config{Base: okBase{}}
			if fleet {
				s := startRedis(b)
				f, err := New(s.client(b), Options{Prefix: "benchq:"})
				if err != nil {
					b.Fatal(err)
				}
				cfg.Fleet = f
				p.Bulkhead.FleetRate = 1_000_000
			} else {
				p.Bulkhead.Rate, p.Bulkhead.Burst = 1_000_000, 1_000_000
			}
			cfg.Default = p
			tr, err := bulwark.New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = tr.Close() })
			req, _ := http.NewRequest("GET", "http://api.test/", nil)
			if fleet {
				// The first lease is a round trip away: wait for it.
				_, _ = tr.RoundTrip(req)
				eventually(b, "the first lease", func() bool {
					h := tr.Snapshot().Host("api.test:80")
					return len(h) == 1 && h[0].Quota != nil && h[0].Quota.Leases > 0
				})
			}
			refused := 0
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if quotaCall(b, tr, req) {
					refused++
				}
			}
			b.ReportMetric(float64(refused)/float64(b.N), "refused/op")
		})
	}
}

// quotaCall sends req through rt and reports whether a rate limit refused
// it; any other error ends the benchmark. (A function of its own: the same
// body written inline in the b.Loop loop crashed go1.26's compiler, an
// internal compiler error in unique/handle.go.)
func quotaCall(b *testing.B, rt http.RoundTripper, req *http.Request) bool {
	resp, err := rt.RoundTrip(req)
	switch {
	case err == nil:
		resp.Body.Close()
		return false
	case errors.Is(err, bulwark.ErrRateLimited):
		return true
	}
	b.Fatal(err)
	return false
}
