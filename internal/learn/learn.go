// Package learn keeps a host's healthy latency: the p99.9 and the median
// of the attempts its caller judged successes, over the last one to two
// periods, and a baseline p99.9 that follows it at a bounded rate. The
// deadline layer's learned attempt timeout and the breaker's learned
// slow-call threshold are both multiples of that baseline.
//
// It is lock-free: a sample is two atomic adds into a log-bucketed
// histogram, and the quantiles are recomputed every few samples by
// whichever recorder wins a flag, never waited for. It does not use
// internal/latency's DDSketch, whose Add needs a mutex.
package learn

import (
	"math"
	"math/bits"
	"math/rand/v2"
	"sync/atomic"
	"time"
)

const (
	// Quantile is the quantile of healthy latency the baseline is: the
	// p99.9 the field's advice names as where a timeout belongs.
	Quantile = 0.999
	// MinSamples is how many healthy samples the window must hold for
	// there to be a baseline: the first comes with the MinSamples-th. A
	// p99.9 over fewer is the largest sample seen (a p99.5 at 200), which
	// errs long; fewer than that says too little. At 10 calls a second it
	// takes 20 s.
	MinSamples = 200
	// Period is how long each of the two histograms gathers samples: the
	// window covers the last one to two periods, so the quantiles forget a
	// past that is more than ten minutes old.
	Period = 5 * time.Minute
	// Doubling is how fast the baseline may move: by at most ×2 (or ÷2)
	// per Doubling, about 15 % a minute, compounded. That is faster than a
	// host that creeps 10 % a minute and slower than one whose latency
	// doubles in a minute because it queues: within an incident the
	// baseline moves a few tens of percent, over an hour it can move 4,000×.
	Doubling = 5 * time.Minute
	// refreshEvery is how many samples pass between two recomputations of
	// the quantiles (a walk over 2 × nBuckets counters).
	refreshEvery = 32
	// plentyCount is how many samples a period needs before Want thins
	// them to one call in eight.
	plentyCount = 2000
)

// The histogram: 16 buckets per power of two of nanoseconds (each at
// most 6.25 % wide), from 2^minExp ns (16 µs; anything shorter counts
// there) to 2^(maxExp+1) ns (137 s; anything longer counts in the last).
const (
	subBits  = 4
	subCount = 1 << subBits
	minExp   = 14
	maxExp   = 36
	nBuckets = (maxExp - minExp + 1) * subCount
)

// bucket is the index of the bucket that holds ns.
func bucket(ns int64) int {
	if ns < 1<<minExp {
		return 0
	}
	e := bits.Len64(uint64(ns)) - 1
	if e > maxExp {
		return nBuckets - 1
	}
	sub := int(uint64(ns)>>(e-subBits)) & (subCount - 1)
	return (e-minExp)*subCount + sub
}

// upper is the upper end of bucket i, what a quantile falling in it
// reads as: an estimate that errs long, never short.
func upper(i int) int64 {
	e, sub := i/subCount+minExp, int64(i%subCount)
	return (subCount + sub + 1) << (e - subBits)
}

// Estimator is one host's healthy latency. The zero value is not usable;
// call New. It is safe for concurrent use.
type Estimator struct {
	epoch time.Time // positions are monotonic nanoseconds since it

	gens     [2][nBuckets]atomic.Uint64
	count    [2]atomic.Int64
	cur      atomic.Uint32 // the generation samples go into
	rotateAt atomic.Int64  // position of the next rotation
	plenty   atomic.Bool
	since    atomic.Uint32 // samples since the last refresh
	busy     atomic.Bool   // a refresh is under way

	// Written by the refresher alone (busy), read by anyone.
	p50, p999 atomic.Int64 // ns, of the window; 0: too few samples
	base      atomic.Int64 // ns: the rate-limited p99.9; 0: never learned
	baseAt    int64        // position of the last move of base (refresher's)
	n         atomic.Int64 // samples in the window at the last refresh
}

// New returns an empty Estimator.
func New(now time.Time) *Estimator {
	e := &Estimator{epoch: now}
	e.rotateAt.Store(int64(Period))
	return e
}

// pos is now's position: since epoch, on the monotonic clock when now
// has a monotonic reading (time.Now's do), so a jump of the wall clock
// moves nothing. Never negative.
func (e *Estimator) pos(now time.Time) int64 {
	return max(int64(now.Sub(e.epoch)), 0)
}

// Want reports whether the caller should record this call's latency:
// always until the current period holds plentyCount samples, then one call
// in eight, which keeps the quantiles and spares a busy host the cost.
func (e *Estimator) Want() bool {
	return !e.plenty.Load() || rand.Uint32()&7 == 0
}

// Record adds the latency d of a healthy attempt that ended at now. It
// reports whether the quantiles were recomputed.
func (e *Estimator) Record(d time.Duration, now time.Time) bool {
	pos := e.pos(now)
	if r := e.rotateAt.Load(); (pos >= r || r-pos > 2*int64(Period)) && e.rotateAt.CompareAndSwap(r, pos+int64(Period)) {
		e.rotate(pos >= r+int64(Period))
	}
	g := e.cur.Load()
	e.gens[g][bucket(max(int64(d), 1))].Add(1)
	if e.count[g].Add(1) == plentyCount {
		e.plenty.Store(true)
	}
	// Every refreshEvery samples, and on every sample from the
	// MinSamples-th until the first baseline, so that a host has one
	// after exactly MinSamples healthy samples, not at the next multiple
	// of refreshEvery (224).
	due := e.since.Add(1)%refreshEvery == 0 ||
		e.base.Load() == 0 && e.count[0].Load()+e.count[1].Load() >= MinSamples
	if !due || !e.busy.CompareAndSwap(false, true) {
		return false
	}
	e.refresh(pos)
	e.busy.Store(false)
	return true
}

// rotate makes the older generation the current one, empty; stale (idle
// for more than a period) clears the other too.
func (e *Estimator) rotate(stale bool) {
	old := e.cur.Load()
	next := old ^ 1
	e.clear(next)
	if stale {
		e.clear(old)
	}
	e.plenty.Store(false)
	e.cur.Store(next)
}

func (e *Estimator) clear(g uint32) {
	for i := range e.gens[g] {
		e.gens[g][i].Store(0)
	}
	e.count[g].Store(0)
}

// refresh recomputes the window's quantiles and moves the baseline toward
// its p99.9, by at most ×2 per Doubling since its last move. Under busy.
func (e *Estimator) refresh(pos int64) {
	var h [nBuckets]uint64
	var total uint64
	for g := range e.gens {
		for i := range h {
			c := e.gens[g][i].Load()
			h[i] += c
			total += c
		}
	}
	e.n.Store(int64(total))
	if total < MinSamples {
		// Too few to say anything: the window keeps its last word (an idle
		// host's baseline outlives the idle hour), never zero.
		return
	}
	q999 := quantile(&h, total, Quantile)
	e.p999.Store(q999)
	e.p50.Store(quantile(&h, total, 0.5))
	b := e.base.Load()
	if b == 0 {
		e.base.Store(q999)
		e.baseAt = pos
		return
	}
	el := min(max(pos-e.baseAt, 0), int64(20*Doubling)) // 20 doublings is a million times: more never matters
	f := math.Exp2(float64(el) / float64(Doubling))
	lo, hi := int64(float64(b)/f), int64(math.Ceil(float64(b)*f))
	e.base.Store(min(max(q999, lo, 1), hi))
	e.baseAt = pos
}

// quantile is the q-quantile of the histogram h of total samples: the
// upper end of the bucket that holds the sample of rank ⌈q·total⌉.
func quantile(h *[nBuckets]uint64, total uint64, q float64) int64 {
	rank := uint64(math.Ceil(q * float64(total)))
	var cum uint64
	for i := range h {
		cum += h[i]
		if cum >= rank {
			return upper(i)
		}
	}
	return upper(nBuckets - 1)
}

// Baseline is the host's healthy p99.9 as it moves at a bounded rate;
// false until MinSamples healthy samples have been seen. Never zero when
// true.
func (e *Estimator) Baseline() (time.Duration, bool) {
	b := e.base.Load()
	return time.Duration(b), b > 0
}

// Window is the window's median and p99.9 as last computed, and how many
// samples it held then; zeros before MinSamples.
func (e *Estimator) Window() (p50, p999 time.Duration, n int64) {
	return time.Duration(e.p50.Load()), time.Duration(e.p999.Load()), e.n.Load()
}
