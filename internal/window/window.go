// Package window keeps rolling sums of a few counters over the last stretch
// of a position axis: time (unix nanoseconds) for a time window, or a
// running sequence number for a window of the last N events. The circuit
// breaker keeps its outcomes in one (count- or time-based) and the retry
// budget its calls and retries, so both slide, expire and sum the same way.
package window

import (
	"errors"
	"fmt"
	"math"
)

// Kinds is how many counters a window keeps per bucket.
const Kinds = 5

// maxBuckets bounds the memory of one window (a bucket is 48 bytes).
const maxBuckets = 1024

// Counts holds one value per counter kind; what each index means is the
// caller's (e.g. calls, failures, slow calls).
type Counts [Kinds]int64

// Window is a rolling sum of Counts over the last length positions, kept in
// buckets buckets of width = ceil(length/buckets) positions each, so it
// slides a bucket at a time rather than a position at a time: that keeps its
// memory and its cost per call independent of length.
//
// Bucket k holds positions [k*width, (k+1)*width), k by floor division, so
// negative positions work too. The newest bucket is the one of the greatest
// position given to Add or Sum since New or Reset; the sum covers it and the
// buckets-1 before it. For a position p in the newest bucket that is
// (buckets-1)*width + 1 + (p - floor(p/width)*width) positions ending at p:
// between (buckets-1)*width+1 and buckets*width. When buckets divides length
// (width*buckets == length) that is between length-width+1 and length; when
// it does not, up to buckets-1 positions more than length at the old end.
//
// It is not safe for concurrent use: callers lock. The zero Window is not
// usable; use New.
type Window struct {
	width   int64 // positions per bucket
	buckets int64 // bucket numbers the sum covers, newest included

	started bool  // head is set; false after New and Reset
	head    int64 // newest bucket number seen

	// The non-empty buckets, oldest first, as a ring: ring[(first+i) %
	// len(ring)] for i < n. Only buckets that got counts are kept, and
	// their numbers rise (Add credits into the newest bucket), so expiring
	// pops from the front and each bucket is pushed and popped once:
	// O(1) amortised however far a call moves the window.
	ring     []bucket
	first, n int

	total Counts // sum over the n buckets in ring
}

// bucket is the counts of one bucket number.
type bucket struct {
	num int64
	c   Counts
}

// MaxCalls bounds a window counted in calls, and so any count of calls one
// holds: a million is past any sane window, and keeps a tenth of it (one
// bucket's share) far from int overflow in every sum.
const MaxCalls = 1 << 20

// New returns a window over the last length positions in the given number
// of buckets. length ≥ 1, 1 ≤ buckets ≤ length, buckets ≤ 1024; otherwise
// it returns an error starting "window: ".
func New(length int64, buckets int) (*Window, error) {
	switch {
	case length < 1:
		return nil, fmt.Errorf("window: length %d, want ≥ 1", length)
	case buckets < 1:
		return nil, fmt.Errorf("window: %d buckets, want ≥ 1", buckets)
	case buckets > maxBuckets:
		return nil, fmt.Errorf("window: %d buckets, want ≤ %d", buckets, maxBuckets)
	case int64(buckets) > length:
		return nil, fmt.Errorf("window: %d buckets over length %d, want buckets ≤ length", buckets, length)
	}
	b := int64(buckets)
	return &Window{
		width:   (length-1)/b + 1, // ceil without overflow near MaxInt64
		buckets: b,
		ring:    make([]bucket, buckets),
	}, nil
}

// errZero is what the methods panic with on a zero Window.
var errZero = errors.New("window: zero Window; use New")

// Add adds c at position pos. A pos older than the newest bucket seen counts
// into the newest bucket (a clock that steps back, or concurrent callers out
// of order, never rewinds the window). Zero Counts still move the window to
// pos.
func (w *Window) Add(pos int64, c Counts) {
	w.advance(pos)
	if c == (Counts{}) {
		return
	}
	if w.n == 0 || w.ring[w.index(w.n-1)].num != w.head {
		// A new newest bucket. There is room: the ring holds buckets
		// entries with distinct numbers in (head-buckets, head], and
		// head's is not among them.
		w.ring[w.index(w.n)] = bucket{num: w.head}
		w.n++
	}
	last := &w.ring[w.index(w.n-1)]
	for k := range c {
		last.c[k] += c[k]
		w.total[k] += c[k]
	}
}

// Sum returns the counts of the buckets that still cover pos (it expires
// older buckets first, as Add does). A pos older than the newest bucket seen
// gets the sum as of the newest bucket.
func (w *Window) Sum(pos int64) Counts {
	w.advance(pos)
	return w.total
}

// Steady returns the first position at which Sum may differ, without
// another Add, from what Sum or Add last left: the start of the bucket after
// the newest, where the oldest may expire. A caller that publishes a value
// derived from the sum can use it until then without locking. Before the
// first Add or Sum, and past the last bucket int64 can hold, it returns
// math.MinInt64 and math.MaxInt64.
func (w *Window) Steady() int64 {
	if !w.started {
		return math.MinInt64
	}
	if w.head >= math.MaxInt64/w.width {
		return math.MaxInt64
	}
	return (w.head + 1) * w.width
}

// Reset empties the window; the next Add or Sum starts it afresh at its
// position.
func (w *Window) Reset() {
	w.started = false
	w.first, w.n = 0, 0
	w.total = Counts{}
}

// advance makes pos's bucket the newest if it is newer, and drops the
// buckets that no longer fall within the last w.buckets bucket numbers.
func (w *Window) advance(pos int64) {
	if w.ring == nil {
		panic(errZero)
	}
	num := floorDiv(pos, w.width)
	if !w.started {
		w.started, w.head = true, num
		return
	}
	if num <= w.head {
		return
	}
	// Differences of bucket numbers are taken in uint64: num > head, so
	// num-head is in [1, 2^64) and exact there, where int64 could
	// overflow (width 1, from MinInt64 to MaxInt64).
	if uint64(num)-uint64(w.head) >= uint64(w.buckets) {
		// Every bucket is out: clear them in one step, not one by one.
		w.head = num
		w.first, w.n = 0, 0
		w.total = Counts{}
		return
	}
	w.head = num
	for w.n > 0 {
		b := &w.ring[w.first]
		if uint64(w.head)-uint64(b.num) < uint64(w.buckets) {
			break
		}
		for k := range b.c {
			w.total[k] -= b.c[k]
		}
		w.first = w.index(1)
		w.n--
	}
}

// index is the ring slot i places after the oldest.
func (w *Window) index(i int) int {
	i += w.first
	if i >= len(w.ring) {
		i -= len(w.ring)
	}
	return i
}

// floorDiv is a/b rounded towards minus infinity, for b > 0, so bucket
// numbers keep their width across zero.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}
