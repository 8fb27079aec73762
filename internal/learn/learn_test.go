package learn

import (
	"testing"
	"time"
)

func TestBucketBounds(t *testing.T) {
	for _, ns := range []int64{1, 1 << 14, 20_000, 5_000_000, 99_999_999, 1 << 36, 1 << 40, 1 << 62} {
		i := bucket(ns)
		if i < 0 || i >= nBuckets {
			t.Fatalf("bucket(%d) = %d, out of range", ns, i)
		}
		if ns >= 1<<minExp && ns < 1<<(maxExp+1) {
			if up := upper(i); up < ns || float64(up) > float64(ns)*1.07 {
				t.Errorf("upper(bucket(%d)) = %d, want in [ns, ns×1.07]", ns, up)
			}
		}
	}
}

// record adds n samples of d, one every gap from *now.
func record(e *Estimator, now *time.Time, n int, d, gap time.Duration) {
	for range n {
		*now = now.Add(gap)
		e.Record(d, *now)
	}
}

func TestBaselineNeedsSamplesAndIsNeverZero(t *testing.T) {
	now := time.Unix(1000, 0)
	e := New(now)
	if _, ok := e.Baseline(); ok {
		t.Fatal("a baseline before any sample")
	}
	// Zero and negative latencies count as the least; quantiles are read
	// every refreshEvery samples.
	record(e, &now, MinSamples-2, 0, time.Millisecond)
	e.Record(-time.Second, now)
	if b, ok := e.Baseline(); ok {
		t.Fatalf("Baseline() = %v, %v after %d samples, want none before %d", b, ok, MinSamples-1, MinSamples)
	}
	// The MinSamples-th gives the first baseline, whatever refreshEvery is.
	e.Record(0, now)
	b, ok := e.Baseline()
	if !ok || b <= 0 {
		t.Fatalf("Baseline() = %v, %v after %d samples of ≤ 0, want a positive one", b, ok, MinSamples)
	}
	// An idle hour: the window empties, the baseline stays.
	now = now.Add(time.Hour)
	record(e, &now, 5, 10*time.Millisecond, time.Millisecond)
	if b2, ok := e.Baseline(); !ok || b2 != b {
		t.Fatalf("after an idle hour Baseline() = %v, %v, want %v kept", b2, ok, b)
	}
}

func TestBaselineMovesAtBoundedRate(t *testing.T) {
	now := time.Unix(1000, 0)
	e := New(now)
	record(e, &now, 1000, 20*time.Millisecond, 10*time.Millisecond)
	b0, _ := e.Baseline()
	// A minute of answers 10× slower: the baseline moves by at most
	// 2^(1/5) (plus a refresh's worth of time).
	record(e, &now, 6000, 200*time.Millisecond, 10*time.Millisecond)
	b1, _ := e.Baseline()
	if float64(b1) > float64(b0)*1.16 {
		t.Fatalf("a minute of 10× moved the baseline %v → %v, want ≤ ×1.16", b0, b1)
	}
	// An hour of it: followed.
	record(e, &now, 360_000, 200*time.Millisecond, 10*time.Millisecond)
	b2, _ := e.Baseline()
	if b2 < 200*time.Millisecond || b2 > 215*time.Millisecond {
		t.Fatalf("after an hour at 200 ms the baseline is %v, want ≈ 200 ms", b2)
	}
}

// TestClockJump: positions are monotonic durations since New, so a wall
// clock reading far behind or ahead (no monotonic reading) neither
// breaks rotation nor moves the baseline past its rate.
func TestClockJump(t *testing.T) {
	now := time.Now() // with a monotonic reading
	e := New(now)
	for i := range 1000 {
		e.Record(20*time.Millisecond, now.Add(time.Duration(i)*time.Millisecond))
	}
	b0, _ := e.Baseline()
	back := time.Unix(0, 0) // no monotonic reading, 50 years back
	for range 1000 {
		e.Record(time.Second, back)
	}
	ahead := now.Round(0).Add(1000 * time.Hour) // no monotonic reading, far ahead
	for range 1000 {
		e.Record(20*time.Millisecond, ahead)
	}
	b1, ok := e.Baseline()
	if !ok || b1 <= 0 || b1 > 2*time.Second {
		t.Fatalf("after clock jumps Baseline() = %v, %v (was %v), want positive and bounded by the samples", b1, ok, b0)
	}
}

func BenchmarkRecord(b *testing.B) {
	e := New(time.Now())
	now := time.Now()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		e.Record(time.Duration(4_000_000+i%2_000_000), now)
	}
}
