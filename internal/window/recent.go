package window

import "fmt"

// Recent holds exactly the last n events and the sums of their counters,
// where each event counts 0 or 1 of each kind: the count window of a
// circuit breaker, whose rates are over the last n calls and no other
// number. Window's buckets would make it hold between n − n/buckets + 1
// and n events, so a minimum of n events would be met only once per
// bucket.
//
// Hand-written: a ring of one byte per event with running sums is a
// dozen lines, where container/ring allocates an element per event and
// keeps no sums. Add and Sum are O(1); memory is n bytes (1 MiB at
// MaxCalls), allocated by NewRecent.
//
// It is not safe for concurrent use: callers lock. The zero Recent is not
// usable; use NewRecent.
type Recent struct {
	ring  []uint8 // a bit per kind for each event; ring[next] is the oldest once full
	next  int     // the slot the next event goes to
	n     int     // events held, at most len(ring)
	total Counts
}

// NewRecent returns a Recent of the last n events, 1 ≤ n ≤ MaxCalls;
// otherwise it returns an error starting "window: ".
func NewRecent(n int) (*Recent, error) {
	if n < 1 || n > MaxCalls {
		return nil, fmt.Errorf("window: %d recent events, want 1 to %d", n, MaxCalls)
	}
	return &Recent{ring: make([]uint8, n)}, nil
}

// Add records one event: c[k] is 1 if it is of kind k, and 0 otherwise
// (any other value counts as 1). The oldest event drops out once n are
// held.
func (r *Recent) Add(c Counts) {
	var bits uint8
	for k := range c {
		if c[k] != 0 {
			bits |= 1 << k
		}
	}
	if r.n == len(r.ring) {
		old := r.ring[r.next]
		for k := range r.total {
			r.total[k] -= int64(old >> k & 1)
		}
	} else {
		r.n++
	}
	r.ring[r.next] = bits
	for k := range r.total {
		r.total[k] += int64(bits >> k & 1)
	}
	if r.next++; r.next == len(r.ring) {
		r.next = 0
	}
}

// Sum returns, per kind, how many of the events held were of it.
func (r *Recent) Sum() Counts { return r.total }

// Total is Sum in place, for a caller on a hot path: read it, and do not
// keep or change it; the next Add or Reset changes it.
func (r *Recent) Total() *Counts { return &r.total }

// Len returns how many events it holds: min(n, events added since
// NewRecent or Reset).
func (r *Recent) Len() int { return r.n }

// Reset forgets every event.
func (r *Recent) Reset() {
	r.next, r.n, r.total = 0, 0, Counts{}
}
