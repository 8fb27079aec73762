package main

import (
	"math"
	"slices"
	"sync"
	"time"
)

// kind says how a series' buckets turn into a number.
type kind int

const (
	kindLoad  kind = iota // events per second
	kindRate              // ok / total, 0..1
	kindP99               // 99th percentile of samples, in ms
	kindP50               // median of samples, in ms
	kindGauge             // mean of sampled levels (instances ejected)
)

// series is one measured row of a run: raw counts per bucket, so that
// 100 ms buckets can be summed into seconds without averaging averages.
type series struct {
	name  string
	kind  kind
	table bool          // shown as a column of the per-second table
	spark bool          // drawn as a sparkline row
	w     time.Duration // the timeline's bucket width
	num   []int64
	den   []int64     // kindRate and kindGauge only
	lat   [][]float64 // kindP99 and kindP50 only, milliseconds
}

// value is the series' value over buckets [i, j), and false when there
// is nothing to report there (a rate with no requests).
func (s *series) value(i, j int, width time.Duration) (float64, bool) {
	i, j = max(i, 0), min(j, len(s.num))
	if i >= j {
		return 0, false
	}
	switch s.kind {
	case kindLoad:
		var n int64
		for _, v := range s.num[i:j] {
			n += v
		}
		return float64(n) / (float64(j-i) * width.Seconds()), true
	case kindRate:
		var n, d int64
		for k := i; k < j; k++ {
			n += s.num[k]
			d += s.den[k]
		}
		if d == 0 {
			return 0, false
		}
		return float64(n) / float64(d), true
	case kindGauge:
		var n, d int64
		for k := i; k < j; k++ {
			n += s.num[k]
			d += s.den[k]
		}
		if d == 0 {
			return 0, false
		}
		return float64(n) / float64(d), true
	default:
		var all []float64
		for _, l := range s.lat[i:j] {
			all = append(all, l...)
		}
		if len(all) == 0 {
			return 0, false
		}
		if s.kind == kindP50 {
			return percentile(all, 0.5), true
		}
		return percentile(all, 0.99), true
	}
}

// empty reports whether the series recorded nothing at all (a run without
// the thing it measures, such as the plain client's breaker).
func (s *series) empty() bool {
	for i := range s.num {
		if s.num[i] != 0 || s.den != nil && s.den[i] != 0 {
			return false
		}
	}
	return true
}

// percentile returns the q-quantile (nearest rank) of xs; it sorts xs.
func percentile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	k := int(math.Ceil(q*float64(len(xs)))) - 1
	return xs[min(max(k, 0), len(xs)-1)]
}

// timeline records what happens during one run into fixed-width buckets
// from start. It has a fixed number of buckets, so a run cannot grow it;
// events outside the run are dropped. It is safe for concurrent use.
type timeline struct {
	start time.Time
	width time.Duration
	n     int

	mu     sync.Mutex
	order  []*series
	byName map[string]*series
}

func newTimeline(start time.Time, width, length time.Duration) *timeline {
	return &timeline{start: start, width: width, n: int((length + width - 1) / width), byName: map[string]*series{}}
}

// define adds a series; rows appear in the order they are defined.
func (tl *timeline) define(name string, k kind, table, spark bool) {
	s := &series{name: name, kind: k, table: table, spark: spark, w: tl.width, num: make([]int64, tl.n)}
	switch k {
	case kindRate, kindGauge:
		s.den = make([]int64, tl.n)
	case kindP99, kindP50:
		s.lat = make([][]float64, tl.n)
	}
	tl.mu.Lock()
	tl.order = append(tl.order, s)
	tl.byName[name] = s
	tl.mu.Unlock()
}

func (tl *timeline) bucket(at time.Time) int {
	d := at.Sub(tl.start)
	if d < 0 {
		return -1
	}
	if b := int(d / tl.width); b < tl.n {
		return b
	}
	return -1
}

// count adds one event at instant at to a load series.
func (tl *timeline) count(name string, at time.Time) {
	b := tl.bucket(at)
	if b < 0 {
		return
	}
	tl.mu.Lock()
	tl.byName[name].num[b]++
	tl.mu.Unlock()
}

// outcome adds one request started at instant at to a rate series.
func (tl *timeline) outcome(name string, at time.Time, ok bool) {
	b := tl.bucket(at)
	if b < 0 {
		return
	}
	tl.mu.Lock()
	s := tl.byName[name]
	s.den[b]++
	if ok {
		s.num[b]++
	}
	tl.mu.Unlock()
}

// level adds one sample of a gauge series at instant at.
func (tl *timeline) level(name string, at time.Time, v int64) {
	b := tl.bucket(at)
	if b < 0 {
		return
	}
	tl.mu.Lock()
	s := tl.byName[name]
	s.num[b] += v
	s.den[b]++
	tl.mu.Unlock()
}

// latency adds one sample, for a request started at instant at.
func (tl *timeline) latency(name string, at time.Time, d time.Duration) {
	b := tl.bucket(at)
	if b < 0 {
		return
	}
	tl.mu.Lock()
	s := tl.byName[name]
	s.lat[b] = append(s.lat[b], float64(d)/float64(time.Millisecond))
	s.num[b]++
	tl.mu.Unlock()
}

// get returns a series by name; the run is over when callers read it.
func (tl *timeline) get(name string) *series {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return tl.byName[name]
}

// at is the bucket index of an offset from the start.
func (tl *timeline) at(d time.Duration) int { return int(d / tl.width) }

// recoveredAt is the first bucket at or after from such that every bucket
// from it up to (not including) until that had requests in rate series
// name has a success rate of at least want; -1 if there is none.
func (tl *timeline) recoveredAt(name string, from, until int, want float64) int {
	s := tl.get(name)
	until = min(until, tl.n)
	first := -1
	for b := from; b < until; b++ {
		if s.den[b] == 0 {
			continue
		}
		if float64(s.num[b])/float64(s.den[b]) >= want {
			if first < 0 {
				first = b
			}
		} else {
			first = -1
		}
	}
	return first
}

// width is the bucket width of the series' timeline.
func (s *series) width() time.Duration { return s.w }
