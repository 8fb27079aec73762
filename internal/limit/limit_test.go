package limit

import (
	"errors"
	"testing"
	"time"
)

type done struct {
	arrive, end int64
}

// simulate offers rate requests a second (evenly spaced) for phases of
// (duration, cores), each call with a deadline, through g's limit, in 1 ms
// steps, and returns per phase the successes, refusals, timeouts and the
// limit at the phase's end, with the limit sampled each 100 ms.
type phase struct {
	d     time.Duration
	cores int
}

type phaseStats struct {
	ok, refused, timeouts int
	limits                []int // every 100 ms
}

func simulate(t *testing.T, g *Gradient, rate int, deadline, service time.Duration, phases []phase) []phaseStats {
	t.Helper()
	const step = int64(time.Millisecond)
	var (
		now      int64
		inflight int
		credit   int
		queue    []int64 // arrival times waiting at the server
		running  []done  // in service
		out      = make([]phaseStats, len(phases))
		cores    int
	)
	end := int64(0)
	for pi, ph := range phases {
		cores = ph.cores
		end += int64(ph.d)
		for ; now < end; now += step {
			// Completions.
			kept := running[:0]
			for _, r := range running {
				if r.end > now {
					kept = append(kept, r)
					continue
				}
				lat := r.end - r.arrive
				dropped := lat > int64(deadline)
				if dropped {
					out[pi].timeouts++
				} else {
					out[pi].ok++
				}
				g.Sample(now, time.Duration(lat), inflight, dropped)
				inflight--
			}
			running = kept
			// Callers whose deadline passed in the queue give up; the
			// client sees a timeout and frees its slot.
			qk := queue[:0]
			for _, a := range queue {
				if now-a > int64(deadline) {
					out[pi].timeouts++
					g.Sample(now, deadline, inflight, true)
					inflight--
					continue
				}
				qk = append(qk, a)
			}
			queue = qk
			// Arrivals, rate per second in whole requests per step.
			credit += rate
			for ; credit >= 1000; credit -= 1000 {
				if inflight >= g.Limit() {
					out[pi].refused++
					continue
				}
				inflight++
				queue = append(queue, now)
			}
			// Free cores take from the queue.
			for len(running) < cores && len(queue) > 0 {
				running = append(running, done{arrive: queue[0], end: now + int64(service)})
				queue = queue[1:]
			}
			if now%int64(100*time.Millisecond) == 0 {
				out[pi].limits = append(out[pi].limits, g.Limit())
			}
		}
	}
	return out
}

// TestGradientCapacityDrop runs the capacity drop scenario (40 → 10 → 40
// cores of 20 ms, 1,200 calls a second, 250 ms deadlines) on virtual time:
// the limit comes down near what 10 cores need during the drop and goes
// back up once they return, and goodput holds in every phase.
func TestGradientCapacityDrop(t *testing.T) {
	g, err := New(Config{Min: 1, Max: 100})
	if err != nil {
		t.Fatal(err)
	}
	ph := []phase{{5 * time.Second, 40}, {10 * time.Second, 10}, {5 * time.Second, 40}}
	st := simulate(t, g, 1200, 250*time.Millisecond, 20*time.Millisecond, ph)
	for i, s := range st {
		secs := ph[i].d.Seconds()
		t.Logf("phase %d (%d cores): ok %.0f/s, refused %.0f/s, timeouts %.0f/s, limit %v",
			i, ph[i].cores, float64(s.ok)/secs, float64(s.refused)/secs, float64(s.timeouts)/secs, s.limits)
	}
	// Goodput: ≥ 95 % of min(offered, capacity) in every phase.
	for i, want := range []float64{1140, 475, 1140} {
		if got := float64(st[i].ok) / ph[i].d.Seconds(); got < want {
			t.Errorf("phase %d: %.0f ok/s, want ≥ %.0f", i, got, want)
		}
	}
	// Within 2 s of the drop the limit is near what 10 cores need (10
	// in service, a little queue), and stays there.
	for j, l := range st[1].limits[20:] {
		if l < 7 || l > 18 {
			t.Errorf("drop phase at %v: limit %d, want in [7, 18]", time.Duration(j+20)*100*time.Millisecond, l)
			break
		}
	}
	// Within 2 s of the restore it is back at or above what 40 cores at
	// 1,200 calls a second need (24 in flight).
	for j, l := range st[2].limits[20:] {
		if l < 24 {
			t.Errorf("restore phase at %v: limit %d, want ≥ 24", time.Duration(j+20)*100*time.Millisecond, l)
			break
		}
	}
	if st[1].timeouts > 0 || st[2].timeouts > 0 {
		t.Errorf("timeouts: drop %d, restore %d, want none", st[1].timeouts, st[2].timeouts)
	}
}

// TestGradientSteadyLatencyNeverRefuses: an upstream at any steady
// latency, however long, keeps a limit above what the callers use.
func TestGradientSteadyLatencyNeverRefuses(t *testing.T) {
	for _, lat := range []time.Duration{time.Millisecond, 200 * time.Millisecond, 5 * time.Second} {
		g, err := New(Config{Min: 10, Max: 1000})
		if err != nil {
			t.Fatal(err)
		}
		now := int64(0)
		for i := range 100_000 {
			now += int64(time.Millisecond)
			if l, _ := g.Sample(now, lat, 80+i%40, false); l < 240 {
				t.Fatalf("latency %v, sample %d: limit %d, want ≥ 240 (twice the peak in flight)", lat, i, l)
			}
		}
	}
}

func TestGradientBounds(t *testing.T) {
	g, err := New(Config{Min: 5, Max: 50, Initial: 20})
	if err != nil {
		t.Fatal(err)
	}
	now := int64(0)
	// Latency climbing without end: the limit comes down to Min, no lower.
	for i := range 10_000 {
		now += int64(time.Millisecond)
		g.Sample(now, time.Duration(i+1)*time.Millisecond, 50, true)
	}
	if l := g.Limit(); l != 5 {
		t.Errorf("after rising latency: limit %d, want Min 5", l)
	}
	// Flat latency with the limit in use: it goes up to Max, no higher.
	for range 10_000 {
		now += int64(time.Millisecond)
		g.Sample(now, time.Millisecond, g.Limit(), false)
	}
	if l := g.Limit(); l != 50 {
		t.Errorf("after flat latency: limit %d, want Max 50", l)
	}
}

func TestGradientConfig(t *testing.T) {
	for _, c := range []Config{
		{Min: 0, Max: 10},
		{Min: 10, Max: 5},
		{Min: 1, Max: 10, Initial: 11},
		{Min: 1, Max: 10, Window: -1},
		{Min: 1, Max: 10, MinSamples: -1},
		{Min: 1, Max: 10, Tolerance: 0.5},
		{Min: 1, Max: 10, Smoothing: 1.5},
		{Min: 1, Max: 10, Smoothing: -0.1},
	} {
		if _, err := New(c); !errors.Is(err, ErrConfig) {
			t.Errorf("New(%+v) = %v, want ErrConfig", c, err)
		}
	}
	if g, err := New(Config{Min: 1, Max: 10}); err != nil || g.Limit() != 10 {
		t.Errorf("New(1..10) = %v, %v; want limit 10", g, err)
	}
}

func TestGradientSampleAllocs(t *testing.T) {
	g, _ := New(Config{Min: 1, Max: 100})
	now := int64(0)
	if n := testing.AllocsPerRun(1000, func() {
		now += int64(time.Millisecond)
		g.Sample(now, time.Millisecond, 10, false)
	}); n != 0 {
		t.Errorf("Sample allocates %v times, want 0", n)
	}
}

func BenchmarkGradientSample(b *testing.B) {
	g, _ := New(Config{Min: 1, Max: 100})
	b.ReportAllocs()
	now := int64(0)
	for b.Loop() {
		now += int64(time.Microsecond)
		g.Sample(now, time.Millisecond, 10, false)
	}
}
