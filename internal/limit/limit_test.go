package limit

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
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
	limits                []int   // every 100 ms
	lat                   []int64 // of the successes, ns
}

// p99 is the 99th percentile of the phase's successful latencies.
func (s phaseStats) p99() time.Duration {
	if len(s.lat) == 0 {
		return 0
	}
	l := slices.Clone(s.lat)
	slices.Sort(l)
	return time.Duration(l[min(len(l)-1, len(l)*99/100)])
}

func simulate(t *testing.T, g *Gradient, rate int, deadline, service time.Duration, phases []phase, rng *rand.Rand) []phaseStats {
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
					out[pi].lat = append(out[pi].lat, lat)
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
			// Arrivals, rate per second in whole requests per step, or
			// Poisson with rng.
			credit += rate
			arrivals := credit / 1000
			credit %= 1000
			if rng != nil {
				arrivals = poisson(rng, float64(rate)/1000)
			}
			for range arrivals {
				if inflight >= g.Limit() {
					out[pi].refused++
					continue
				}
				inflight++
				queue = append(queue, now)
			}
			// Free cores take from the queue.
			for len(running) < cores && len(queue) > 0 {
				d := int64(service)
				if rng != nil {
					// Uniform in [0.75, 1.25] × service.
					d = int64(float64(service) * (0.75 + rng.Float64()/2))
				}
				running = append(running, done{arrive: queue[0], end: now + d})
				queue = queue[1:]
			}
			if now%int64(100*time.Millisecond) == 0 {
				out[pi].limits = append(out[pi].limits, g.Limit())
			}
		}
	}
	return out
}

// poisson draws from a Poisson distribution of mean m (Knuth's method; m
// is small here).
func poisson(rng *rand.Rand, m float64) int {
	l, k, p := math.Exp(-m), 0, 1.0
	for ; k < 100; k++ {
		p *= rng.Float64()
		if p <= l {
			break
		}
	}
	return k
}

// TestGradientCapacityDrop runs the capacity drop scenario (40 → 10 → 40
// cores of 20 ms, 1,200 calls a second, 250 ms deadlines, 5 s / 10 s / 5 s)
// on virtual time and checks the targets in every phase:
//   - from 2 s after each change on, the limit lies within ±25 % of the
//     level the capacity needs. With 10 cores that is 10 (all of them busy,
//     no queue): [7.5, 12.5]. With 40 cores the load needs 24 in flight
//     (1,200/s × 20 ms) and the cores serve 40 without a queue: the limit
//     lies in [0.75 × 24, 1.25 × 40] = [18, 50];
//   - goodput ≥ 95 % of min(offered, capacity): 1,140/s, 475/s, 1,140/s;
//   - the p99 of successes ≤ 40 ms, twice the service time;
//   - no call times out.
func TestGradientCapacityDrop(t *testing.T) {
	testCapacityDrop(t, nil, dropTargets{band: 0.25, okShare: 0.95, p99: 40 * time.Millisecond})
}

// TestGradientCapacityDropNoisy is the same scenario with Poisson arrivals
// and service times spread uniformly over ±25 %, five seeds. Noise puts
// the targets at their edge (over 20 seeds: drop p99 33–46 ms, 6 of them
// above 40; drop goodput 476–483/s; restore 1,137–1,190/s, one below
// 1,140; drop limit 8–16 from 2 s on), so this
// holds looser bounds: a guard against oscillation and collapse, not the
// targets.
func TestGradientCapacityDropNoisy(t *testing.T) {
	for seed := range uint64(5) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			testCapacityDrop(t, rand.New(rand.NewPCG(18, seed)), dropTargets{band: 0.6, okShare: 0.9, p99: 50 * time.Millisecond})
		})
	}
}

// dropTargets are the bounds testCapacityDrop holds: the limit within
// ±band of the need from 2 s after each change, goodput ≥ okShare of
// min(offered, capacity), the successes' p99 ≤ p99.
type dropTargets struct {
	band, okShare float64
	p99           time.Duration
}

func testCapacityDrop(t *testing.T, rng *rand.Rand, tg dropTargets) {
	g, err := New(Config{Min: 1, Max: 100})
	if err != nil {
		t.Fatal(err)
	}
	ph := []phase{{5 * time.Second, 40}, {10 * time.Second, 10}, {5 * time.Second, 40}}
	st := simulate(t, g, 1200, 250*time.Millisecond, 20*time.Millisecond, ph, rng)
	// With 10 cores the need is 10 (all busy, no queue). With 40 the load
	// needs 24 in flight (1,200/s × 20 ms) and the cores serve 40 without
	// a queue: the band runs from (1 − band) × 24 to (1 + band) × 40.
	want := []struct{ lo, hi, ok float64 }{
		{(1 - tg.band) * 24, (1 + tg.band) * 40, 1200},
		{(1 - tg.band) * 10, (1 + tg.band) * 10, 500},
		{(1 - tg.band) * 24, (1 + tg.band) * 40, 1200},
	}
	for i, s := range st {
		secs := ph[i].d.Seconds()
		t.Logf("phase %d (%d cores): ok %.0f/s, p99 %v, refused %.0f/s, timeouts %.0f/s, limit %v",
			i, ph[i].cores, float64(s.ok)/secs, s.p99(), float64(s.refused)/secs, float64(s.timeouts)/secs, s.limits)
		if got, w := float64(s.ok)/secs, tg.okShare*want[i].ok; got < w {
			t.Errorf("phase %d: %.0f ok/s, want ≥ %.0f", i, got, w)
		}
		if p := s.p99(); p > tg.p99 {
			t.Errorf("phase %d: p99 %v, want ≤ %v", i, p, tg.p99)
		}
		if s.timeouts > 0 {
			t.Errorf("phase %d: %d timeouts, want none", i, s.timeouts)
		}
		for j, l := range s.limits[20:] {
			if float64(l) < want[i].lo || float64(l) > want[i].hi {
				t.Errorf("phase %d at %v: limit %d, want in [%.1f, %.1f]", i, time.Duration(j+20)*100*time.Millisecond, l, want[i].lo, want[i].hi)
				break
			}
		}
	}
}

// TestGradientSteadyLatencyNeverRefuses: an upstream at any steady
// latency, however long, keeps a limit above what the callers use, by the
// headroom an underused limit decays to: Headroom × the peak in flight.
func TestGradientSteadyLatencyNeverRefuses(t *testing.T) {
	for _, headroom := range []float64{0, 2} {
		for _, lat := range []time.Duration{time.Millisecond, 200 * time.Millisecond, 5 * time.Second} {
			g, err := New(Config{Min: 10, Max: 1000, Headroom: headroom})
			if err != nil {
				t.Fatal(err)
			}
			// In flight cycles through 80..119; the floor is the
			// headroom × 119, rounded down.
			want := int(cmp.Or(headroom, DefaultHeadroom) * 119)
			now := int64(0)
			for i := range 100_000 {
				now += int64(time.Millisecond)
				if l, _ := g.Sample(now, lat, 80+i%40, false); l < want {
					t.Fatalf("headroom %v, latency %v, sample %d: limit %d, want ≥ %d", headroom, lat, i, l, want)
				}
			}
			if l := g.Limit(); l > want+2 {
				t.Errorf("headroom %v, latency %v: limit %d after 100 s, want it decayed to about %d", headroom, lat, l, want)
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
	// Latency climbing without end, every slot in use (completions a
	// second = limit ÷ latency): the limit comes down to Min, no lower.
	for i := range 10_000 {
		lat := time.Duration(i+1) * time.Millisecond
		now += int64(lat) / int64(g.Limit())
		g.Sample(now, lat, g.Limit(), true)
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
		{Min: 1, Max: 10, Headroom: 1.05},
		{Min: 1, Max: 10, Headroom: math.NaN()},
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

// TestGradientSlowBelowLimit: a stall while the callers use well under the
// limit (a cold start dialling connections, a pause) does not bring the
// limit below what is in flight: the completions a second are then what
// the callers send, not what the upstream can serve.
func TestGradientSlowBelowLimit(t *testing.T) {
	g, err := New(Config{Min: 1, Max: 100})
	if err != nil {
		t.Fatal(err)
	}
	now := int64(0)
	// 1,000 calls a second: at 20 ms for 300 ms (20 in flight), then for
	// 60 ms at 50 ms (50 in flight), as a stall would, then 20 ms again.
	// The callers do not press on the limit, which starts at 100.
	for i := range 1000 {
		lat, in := 20*time.Millisecond, 20
		if i >= 300 && i < 360 {
			lat, in = 50*time.Millisecond, 50
		}
		now += int64(time.Millisecond)
		if l, _ := g.Sample(now, lat, in, false); l < in {
			t.Fatalf("sample %d (%v, %d in flight): limit %d, want ≥ %d", i, lat, in, l, in)
		}
	}
}

// TestGradientSoftAdmit: a soft limit lets a request past it, and rises
// to what is in flight, until a window shows queueing; then it is
// enforced for Soft, and soft again after it. A hard limit never admits
// past itself.
func TestGradientSoftAdmit(t *testing.T) {
	const ms = int64(time.Millisecond)
	g, err := New(Config{Min: 2, Max: 50, Initial: 10, Soft: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if !g.Admit(0, 10) || g.Limit() != 11 {
		t.Fatalf("Admit(0, 10) on a soft limit of 10 before any queue: limit %d, want admitted and 11", g.Limit())
	}
	if g.Admit(0, 50) {
		t.Errorf("Admit(0, 50) = true, want false past Max")
	}
	// A window at 20 ms sets the baseline; the next, at 60 ms with the
	// limit in flight (pressing on it), is a queue.
	now := int64(0)
	for range 10 {
		now += 12 * ms
		g.Sample(now, 20*time.Millisecond, 11, false)
	}
	pressed := g.Limit()
	for range 20 {
		now += 6 * ms
		g.Sample(now, 60*time.Millisecond, pressed, false)
	}
	if l := g.Limit(); l >= pressed/2 {
		t.Fatalf("limit after windows at 3× the baseline pressed on %d: %d, want below half", pressed, l)
	}
	if g.Admit(now+500*ms, g.Limit()) {
		t.Errorf("Admit half a second after the queue = true, want false")
	}
	if !g.Admit(now+1100*ms, g.Limit()) {
		t.Errorf("Admit 1.1 s after the queue = false, want true")
	}
	h, _ := New(Config{Min: 2, Max: 50, Initial: 10})
	if h.Admit(0, 10) {
		t.Errorf("Admit on a hard limit = true, want false")
	}
}
