package bulwark

import (
	"fmt"
	"io"
	"math/bits"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// latencies is a log-linear histogram of durations: 8 buckets per power of
// two, so a percentile read from it is within 12.5 %.
type latencies struct {
	n   [64 * 8]int64
	max time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.max = max(l.max, d)
	if d < 8 {
		l.n[d]++
		return
	}
	e := bits.Len64(uint64(d)) - 1 // d in [2^e, 2^(e+1))
	sub := (uint64(d) >> (e - 3)) & 7
	l.n[e*8+int(sub)]++
}

func (l *latencies) merge(o *latencies) {
	for i := range l.n {
		l.n[i] += o.n[i]
	}
	l.max = max(l.max, o.max)
}

// quantile is the upper bound of the bucket holding quantile q.
func (l *latencies) quantile(q float64) time.Duration {
	var total int64
	for _, c := range l.n {
		total += c
	}
	want, seen := int64(q*float64(total)), int64(0)
	for i, c := range l.n {
		seen += c
		if seen > want {
			if i < 8 {
				return time.Duration(i)
			}
			e, sub := i/8, i%8
			return time.Duration((uint64(8+sub+1) << (e - 3)))
		}
	}
	return l.max
}

// BenchmarkUpdateLatency measures RoundTrip's latency distribution on the
// stub base (benchBase), over eight hosts with the default stack, in
// steady state and while another goroutine runs Update every millisecond, each
// Update moving a breaker threshold (breakers kept) and a bulkhead limit
// (bulkheads rebuilt) for every host. Update builds the new stacks without
// the Transport's lock and holds it only to swap them in, so the
// distributions should match but for the swaps' one lock hand-off: compare
// p99, p99.9 and max between the two. Figures: ns per RoundTrip, from a
// histogram within 12.5 %.
func BenchmarkUpdateLatency(b *testing.B) {
	for _, updating := range []bool{false, true} {
		name := "steady"
		if updating {
			name = "during-update"
		}
		b.Run(name, func(b *testing.B) {
			cfg := Config{Base: benchBase{}}
			tr := mustNew(b, cfg)
			reqs := make([]*http.Request, 8)
			for i := range reqs {
				reqs[i], _ = http.NewRequest("GET", fmt.Sprintf("http://h%d.internal/x", i), nil)
				resp, _ := tr.RoundTrip(reqs[i])
				resp.Body.Close()
			}
			stop := make(chan struct{})
			var updates atomic.Int64
			var wg sync.WaitGroup
			if updating {
				wg.Go(func() {
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						c := cfg
						c.Default.Breaker.FailureRate = 0.5 + float64(i%2)/10
						c.Default.Bulkhead.MaxConcurrent = 100 + i%2
						if err := tr.Update(c); err != nil {
							panic(err)
						}
						updates.Add(1)
						// 1,000 Updates a second, far more than any
						// operator makes, without taking a whole core
						// of the two this VM has from the requests.
						time.Sleep(time.Millisecond)
					}
				})
			}
			var mu sync.Mutex
			var all latencies
			var g atomic.Int64
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				req := reqs[int(g.Add(1))%len(reqs)]
				var l latencies
				for pb.Next() {
					start := time.Now()
					resp, err := tr.RoundTrip(req)
					if err != nil {
						panic(err)
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					l.add(time.Since(start))
				}
				mu.Lock()
				all.merge(&l)
				mu.Unlock()
			})
			b.StopTimer()
			close(stop)
			wg.Wait()
			b.ReportMetric(float64(all.quantile(0.5)), "p50-ns")
			b.ReportMetric(float64(all.quantile(0.99)), "p99-ns")
			b.ReportMetric(float64(all.quantile(0.999)), "p99.9-ns")
			b.ReportMetric(float64(all.max), "max-ns")
			if updating {
				b.ReportMetric(float64(updates.Load()), "updates")
			}
		})
	}
}
