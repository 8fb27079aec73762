package window_test

import (
	"math"
	"math/big"
	"strings"
	"testing"

	"go.uber.org/goleak"
	"pgregory.net/rapid"

	"github.com/bulwark-http/bulwark/internal/window"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// step is one call on a timeline: Add(pos, c), or Sum(pos) wanting want,
// or Reset.
type step struct {
	op   byte // 'a' Add, 's' Sum, 'r' Reset
	pos  int64
	c    window.Counts
	want window.Counts
}

func add(pos int64, c window.Counts) step    { return step{op: 'a', pos: pos, c: c} }
func sum(pos int64, want window.Counts) step { return step{op: 's', pos: pos, want: want} }
func reset() step                            { return step{op: 'r'} }

func TestTimeline(t *testing.T) {
	tests := []struct {
		name            string
		length, buckets int64
		steps           []step
	}{{
		// Width 2: buckets [0,2), [2,4), ... and the sum covers 9 or 10
		// positions.
		name: "slides a bucket at a time", length: 10, buckets: 5,
		steps: []step{
			sum(0, window.Counts{}),
			add(0, window.Counts{1}),
			add(1, window.Counts{1, 1}),
			sum(1, window.Counts{2, 1}),
			add(2, window.Counts{1}),
			sum(3, window.Counts{3, 1}),
			add(9, window.Counts{1}),
			sum(9, window.Counts{4, 1}),
			sum(10, window.Counts{2}), // [0,2) out
			sum(11, window.Counts{2}),
			sum(12, window.Counts{1}), // [2,4) out
			sum(19, window.Counts{}),  // [8,10) out
		},
	}, {
		name: "an old position counts into the newest bucket", length: 10, buckets: 5,
		steps: []step{
			add(10, window.Counts{1}),
			add(3, window.Counts{0, 0, 1}), // clock stepped back
			sum(10, window.Counts{1, 0, 1}),
			sum(3, window.Counts{1, 0, 1}), // no rewind either
			sum(19, window.Counts{1, 0, 1}),
			sum(20, window.Counts{}), // both left with bucket [10,12)
		},
	}, {
		name: "zero counts still advance the window", length: 10, buckets: 5,
		steps: []step{
			add(0, window.Counts{5}),
			add(10, window.Counts{}),
			sum(0, window.Counts{}),
		},
	}, {
		name: "part of the buckets expire", length: 10, buckets: 5,
		steps: []step{
			add(0, window.Counts{1}),
			add(2, window.Counts{2}),
			add(4, window.Counts{4}),
			add(6, window.Counts{8}),
			sum(13, window.Counts{12}), // [6,8) newest-but-3: [0,6) out
			add(13, window.Counts{16}),
			sum(14, window.Counts{24}),
		},
	}, {
		name: "negative positions use floor division", length: 10, buckets: 5,
		steps: []step{
			add(-3, window.Counts{1}), // bucket [-4,-2)
			add(-2, window.Counts{2}), // bucket [-2,0)
			add(-1, window.Counts{4}),
			sum(-1, window.Counts{7}),
			sum(5, window.Counts{7}), // [-4,-2) newest-but-4
			sum(6, window.Counts{6}),
			sum(8, window.Counts{}),
		},
	}, {
		name: "jumps across the whole int64 range", length: 10, buckets: 5,
		steps: []step{
			add(math.MinInt64, window.Counts{1}),
			sum(math.MinInt64, window.Counts{1}),
			add(math.MaxInt64, window.Counts{0, 1}),
			sum(math.MaxInt64, window.Counts{0, 1}),
			sum(math.MinInt64, window.Counts{0, 1}),
		},
	}, {
		name: "width 1 across the whole int64 range", length: 5, buckets: 5,
		steps: []step{
			add(math.MinInt64, window.Counts{1}),
			add(math.MinInt64+4, window.Counts{2}),
			sum(math.MinInt64+4, window.Counts{3}),
			sum(math.MinInt64+5, window.Counts{2}),
			add(math.MaxInt64, window.Counts{4}),
			sum(math.MaxInt64, window.Counts{4}),
		},
	}, {
		// Width ceil((2^63-1)/1024) = 2^53: MinInt64 is in bucket -1024,
		// MaxInt64 in bucket 1023.
		name: "the widest window", length: math.MaxInt64, buckets: 1024,
		steps: []step{
			add(math.MinInt64, window.Counts{1}),
			sum(-1, window.Counts{1}), // bucket -1
			add(0, window.Counts{2}),
			sum(0, window.Counts{2}), // bucket 0: -1024 out
			add(math.MaxInt64, window.Counts{4}),
			sum(math.MaxInt64, window.Counts{6}),
		},
	}, {
		name: "reset starts afresh at the next position", length: 10, buckets: 5,
		steps: []step{
			add(100, window.Counts{1}),
			reset(),
			sum(0, window.Counts{}),
			add(0, window.Counts{1}),
			sum(9, window.Counts{1}),
			reset(),
			add(-50, window.Counts{1}),
			sum(-50, window.Counts{1}),
			sum(-41, window.Counts{1}),
			sum(-40, window.Counts{}),
		},
	}, {
		// Width ceil(10/4) = 3: four buckets span 12 positions, two more
		// than length.
		name: "buckets that do not divide length", length: 10, buckets: 4,
		steps: []step{
			add(0, window.Counts{1}),
			sum(11, window.Counts{1}),
			sum(12, window.Counts{}),
		},
	}, {
		name: "a bucket per position is exact", length: 100, buckets: 100,
		steps: []step{
			add(0, window.Counts{1}),
			add(1, window.Counts{1}),
			sum(99, window.Counts{2}),
			sum(100, window.Counts{1}),
			sum(101, window.Counts{}),
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, err := window.New(tt.length, int(tt.buckets))
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range tt.steps {
				switch s.op {
				case 'a':
					w.Add(s.pos, s.c)
				case 'r':
					w.Reset()
				case 's':
					if got := w.Sum(s.pos); got != s.want {
						t.Errorf("step %d: Sum(%d) = %v, want %v", i, s.pos, got, s.want)
					}
				}
			}
		})
	}
}

func TestNewErrors(t *testing.T) {
	tests := []struct {
		length  int64
		buckets int
	}{
		{0, 1},
		{-1, 1},
		{math.MinInt64, 1},
		{10, 0},
		{10, -1},
		{10, 11},
		{2000, 1025},
		{math.MaxInt64, 1025},
	}
	for _, tt := range tests {
		w, err := window.New(tt.length, tt.buckets)
		if err == nil || w != nil {
			t.Errorf("New(%d, %d) = %v, %v, want nil and an error", tt.length, tt.buckets, w, err)
			continue
		}
		if !strings.HasPrefix(err.Error(), "window: ") {
			t.Errorf("New(%d, %d) error %q, want it to start %q", tt.length, tt.buckets, err, "window: ")
		}
	}
	for _, ok := range []struct {
		length  int64
		buckets int
	}{{1, 1}, {1024, 1024}, {math.MaxInt64, 1}, {math.MaxInt64, 1024}} {
		if _, err := window.New(ok.length, ok.buckets); err != nil {
			t.Errorf("New(%d, %d): %v", ok.length, ok.buckets, err)
		}
	}
}

// model is the naive window: every event kept with the bucket number it
// was credited to, in exact arithmetic, so it shares no shortcut with
// Window's ring, floor division or uint64 differences.
type model struct {
	width, buckets *big.Int
	started        bool
	head           *big.Int // newest bucket number seen
	events         []event
}

type event struct {
	num *big.Int
	c   window.Counts
}

func newModel(length, buckets int64) *model {
	b := big.NewInt(buckets)
	width := new(big.Int).Add(big.NewInt(length), new(big.Int).Sub(b, big.NewInt(1)))
	width.Quo(width, b) // ceil(length/buckets), length > 0
	return &model{width: width, buckets: b}
}

// see makes pos's bucket number the newest if it is newer, and returns the
// newest.
func (m *model) see(pos int64) *big.Int {
	num := new(big.Int).Div(big.NewInt(pos), m.width) // Euclidean: floor for width > 0
	if !m.started || num.Cmp(m.head) > 0 {
		m.started, m.head = true, num
	}
	return m.head
}

func (m *model) add(pos int64, c window.Counts) {
	m.events = append(m.events, event{num: m.see(pos), c: c})
}

func (m *model) sum(pos int64) window.Counts {
	head := m.see(pos)
	var s window.Counts
	for _, e := range m.events {
		if new(big.Int).Sub(head, e.num).Cmp(m.buckets) < 0 {
			for k := range s {
				s[k] += e.c[k]
			}
		}
	}
	return s
}

func (m *model) reset() { m.started, m.events = false, nil }

func TestMatchesModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		length := rapid.OneOf(
			rapid.Int64Range(1, 64),
			rapid.Int64Range(1, math.MaxInt64),
			rapid.Just(int64(math.MaxInt64)),
		).Draw(t, "length")
		buckets := rapid.Int64Range(1, min(length, 1024)).Draw(t, "buckets")
		w, err := window.New(length, int(buckets))
		if err != nil {
			t.Fatalf("New(%d, %d): %v", length, buckets, err)
		}
		m := newModel(length, buckets)
		width := (length-1)/buckets + 1
		counts := rapid.SliceOfN(rapid.Int64Range(-3, 1000), window.Kinds, window.Kinds)

		// rapid draws small values of a range most often, so the common
		// cases come first in each: move forwards a little, Add.
		pos := rapid.Int64().Draw(t, "start")
		for range rapid.IntRange(50, 400).Draw(t, "steps") {
			switch move := rapid.IntRange(0, 39).Draw(t, "move"); {
			case move < 36: // nearby, in whole buckets plus a part of one
				bs := rapid.Int64Range(0, buckets+2).Draw(t, "buckets forwards")
				if move >= 32 {
					bs = -1 - bs // sometimes back
				}
				off := rapid.Int64Range(0, width-1).Draw(t, "offset")
				pos = clamp(new(big.Int).Add(big.NewInt(pos), new(big.Int).Mul(big.NewInt(bs), big.NewInt(width))), off)
			case move < 38: // anywhere: a jump of any size, either way
				pos = rapid.Int64().Draw(t, "pos")
			default:
				pos = rapid.SampledFrom([]int64{math.MinInt64, -1, 0, math.MaxInt64}).Draw(t, "edge")
			}
			switch op := rapid.IntRange(0, 39).Draw(t, "op"); {
			case op < 24:
				var c window.Counts
				if op < 20 { // else zero counts, which must still move the window
					copy(c[:], counts.Draw(t, "counts"))
				}
				w.Add(pos, c)
				m.add(pos, c)
				// Sum at Add's position moves nothing further.
				if got, want := w.Sum(pos), m.sum(pos); got != want {
					t.Fatalf("after Add(%d, %v): Sum(%d) = %v, want %v", pos, c, pos, got, want)
				}
			case op < 39:
				if got, want := w.Sum(pos), m.sum(pos); got != want {
					t.Fatalf("Sum(%d) = %v, want %v", pos, got, want)
				}
			default:
				w.Reset()
				m.reset()
				if got, want := w.Sum(pos), m.sum(pos); got != want {
					t.Fatalf("after Reset: Sum(%d) = %v, want %v", pos, got, want)
				}
			}
			// Until Steady, a Sum anywhere gives what the last one did.
			if st := w.Steady(); st > math.MinInt64 && st > pos {
				before := m.sum(pos)
				lo := pos
				if w3 := 3 * uint64(width); width < 1<<61 && uint64(st)-uint64(pos) > w3 {
					lo = st - int64(w3) // the last three buckets' worth
				}
				q := rapid.Int64Range(lo, st-1).Draw(t, "steady pos")
				if got, want := w.Sum(q), m.sum(q); got != want || got != before {
					t.Fatalf("Steady() = %d: Sum(%d) = %v, model %v, want %v as at %d", st, q, got, want, before, pos)
				}
			}
		}
	})
}

// clamp is x+off held within int64.
func clamp(x *big.Int, off int64) int64 {
	x.Add(x, big.NewInt(off))
	switch {
	case x.Cmp(big.NewInt(math.MaxInt64)) > 0:
		return math.MaxInt64
	case x.Cmp(big.NewInt(math.MinInt64)) < 0:
		return math.MinInt64
	}
	return x.Int64()
}

func TestZeroAllocs(t *testing.T) {
	w, err := window.New(1000, 10)
	if err != nil {
		t.Fatal(err)
	}
	var pos int64
	allocs := testing.AllocsPerRun(1000, func() {
		pos += 37
		w.Add(pos, window.Counts{1, 1})
		_ = w.Sum(pos)
		if pos%1000 == 0 {
			_ = w.Sum(pos + 5000) // a jump that clears everything
		}
	})
	if allocs != 0 {
		t.Errorf("Add and Sum: %v allocs per run, want 0", allocs)
	}
}

func BenchmarkAdd(b *testing.B) {
	w, err := window.New(100, 10)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	var pos int64
	for b.Loop() {
		pos++
		w.Add(pos, window.Counts{1, 0, 1})
	}
}
