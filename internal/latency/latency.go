// Package latency keeps an online estimate of a host's recent latency
// quantiles, for the hedge delay and for deadline-aware retries.
//
// It wraps DDSketch (github.com/DataDog/sketches-go) rather than a
// hand-written histogram: DDSketch's relative-error guarantee holds across
// the microseconds-to-minutes range a host's latency spans, its collapsing
// store bounds memory, and it is well kept and widely used. A hand-written
// log-bucket histogram measured no clearly smaller or faster here (the
// record path is dominated by the mutex and the clock, not the sketch), so
// the library wins. The package keeps the dependency behind three methods.
package latency

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/DataDog/sketches-go/ddsketch"
)

const (
	// accuracy is the sketch's relative error: 1 %, so a 5 ms latency
	// reads as 4.95 to 5.05 ms.
	accuracy = 0.01
	// maxBins bounds each sketch's store (the lowest bins collapse past it):
	// 1 % buckets from 1 µs cover past an hour in ~1,100 bins, so 512 keeps
	// everything from about 20 ms down to the lowest 1/16 of the range
	// exact, and memory fixed at a few KiB per host.
	maxBins = 512
	// refreshEvery is how many samples pass between two readings of the
	// quantiles, which are then served from atomics: reading a sketch costs
	// a walk over its bins, too much for every call.
	refreshEvery = 16
	// MinSamples is how many samples the window must hold before a
	// quantile is reported: fewer say nothing about the tail.
	MinSamples = 20
)

// Tracker is a host's recent latency. Two sketches take turns: samples go
// into the current one, quantiles are read from both, and every period the
// older is cleared and becomes the current, so the estimate covers between
// one and two periods back and follows the present. It is safe for
// concurrent use.
type Tracker struct {
	q      float64
	period int64 // ns

	mu        sync.Mutex
	cur, prev *ddsketch.DDSketch
	scratch   *ddsketch.DDSketch
	rotateAt  int64 // unix ns
	since     int   // samples since the last refresh
	n         int   // samples in cur

	quantile, median atomic.Int64 // ns; 0: not enough samples
	// plenty is set once the current sketch holds plentyCount samples:
	// then Want samples one call in eight.
	plenty atomic.Bool
}

// plentyCount is how many samples a period needs before Want thins them:
// enough for a p99 to rest on a handful of samples.
const plentyCount = 1000

// Want reports whether the caller should time this call and Record it:
// always until the current period holds plentyCount samples, then one call
// in eight, so that a busy host pays for the clock and the lock on an
// eighth of its calls.
func (t *Tracker) Want() bool {
	return !t.plenty.Load() || rand.Uint32()&7 == 0
}

// New returns a Tracker that reports quantile q (in (0, 1)) and the
// median, over a window of one to two periods.
func New(q float64, period time.Duration) *Tracker {
	return &Tracker{q: q, period: int64(period), cur: newSketch(), prev: newSketch(), scratch: newSketch()}
}

func newSketch() *ddsketch.DDSketch {
	s, err := ddsketch.LogCollapsingLowestDenseDDSketch(accuracy, maxBins)
	if err != nil {
		panic(err) // accuracy and maxBins are constants that New accepts
	}
	return s
}

// Record adds a latency d observed at now.
func (t *Tracker) Record(d time.Duration, now time.Time) {
	if d <= 0 {
		d = 1
	}
	pos := now.UnixNano()
	t.mu.Lock()
	if pos >= t.rotateAt {
		if t.rotateAt != 0 {
			t.prev, t.cur = t.cur, t.prev
			t.cur.Clear()
			t.plenty.Store(false)
			t.n = 0
			if pos >= t.rotateAt+t.period {
				// Idle for more than a period: the old samples are stale too.
				t.prev.Clear()
			}
		}
		t.rotateAt = pos + t.period
		t.since = refreshEvery // refresh now
	}
	_ = t.cur.Add(float64(d))
	if t.n++; t.n == plentyCount {
		t.plenty.Store(true)
	}
	t.since++
	if t.since >= refreshEvery {
		t.since = 0
		t.refresh()
	}
	t.mu.Unlock()
}

// refresh recomputes the served quantiles. Under mu.
func (t *Tracker) refresh() {
	t.scratch.Clear()
	_ = t.scratch.MergeWith(t.prev)
	_ = t.scratch.MergeWith(t.cur)
	if t.scratch.GetCount() < MinSamples {
		t.quantile.Store(0)
		t.median.Store(0)
		return
	}
	q, err1 := t.scratch.GetValueAtQuantile(t.q)
	m, err2 := t.scratch.GetValueAtQuantile(0.5)
	if err1 != nil || err2 != nil {
		return
	}
	t.quantile.Store(max(int64(q), 1))
	t.median.Store(max(int64(m), 1))
}

// Quantile is the configured quantile of recent latency; false until
// MinSamples have been recorded.
func (t *Tracker) Quantile() (time.Duration, bool) {
	v := t.quantile.Load()
	return time.Duration(v), v > 0
}

// Median is the median of recent latency; false until MinSamples have been
// recorded.
func (t *Tracker) Median() (time.Duration, bool) {
	v := t.median.Load()
	return time.Duration(v), v > 0
}

// Quantiles reads the quantiles qs (each in [0, 1]) of the latency
// recorded in the window that ends at now, in the order given, and how
// many samples they rest on; all zero below MinSamples. A sketch that
// Record would have rotated out by now is left out, so a host that went
// quiet reads as having no recent latency rather than its old one. It
// merges the sketches under the lock, a walk over their bins: for a
// snapshot or a scrape, not for every call.
func (t *Tracker) Quantiles(now time.Time, qs ...float64) ([]time.Duration, int64) {
	out := make([]time.Duration, len(qs))
	pos := now.UnixNano()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.scratch.Clear()
	switch {
	case t.rotateAt == 0 || pos >= t.rotateAt+t.period:
		// Nothing recorded, or all of it older than the window.
	case pos >= t.rotateAt:
		_ = t.scratch.MergeWith(t.cur) // prev would have been cleared
	default:
		_ = t.scratch.MergeWith(t.prev)
		_ = t.scratch.MergeWith(t.cur)
	}
	n := int64(t.scratch.GetCount())
	if n < MinSamples {
		return out, n
	}
	for i, q := range qs {
		if v, err := t.scratch.GetValueAtQuantile(q); err == nil {
			out[i] = max(time.Duration(v), 1)
		}
	}
	return out, n
}
