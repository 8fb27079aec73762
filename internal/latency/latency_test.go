package latency

import (
	"testing"
	"time"
)

func TestQuantileFollowsThePresent(t *testing.T) {
	tr := New(0.99, time.Second)
	now := time.Unix(1000, 0)
	if _, ok := tr.Quantile(); ok {
		t.Fatal("a quantile before any sample")
	}
	for i := range 1000 {
		d := 5 * time.Millisecond
		if i%100 == 0 {
			d = time.Second
		}
		tr.Record(d, now.Add(time.Duration(i)*time.Microsecond))
	}
	q, ok := tr.Quantile()
	if !ok || q < 4900*time.Microsecond || q > 1010*time.Millisecond {
		t.Fatalf("p99 = %v, %v", q, ok)
	}
	m, _ := tr.Median()
	if m < 4900*time.Microsecond || m > 5100*time.Microsecond {
		t.Fatalf("median = %v", m)
	}
	// Two periods later every sample is 200 ms: the old ones are gone.
	later := now.Add(2500 * time.Millisecond)
	for i := range 100 {
		tr.Record(200*time.Millisecond, later.Add(time.Duration(i)*time.Microsecond))
	}
	m, _ = tr.Median()
	if m < 197*time.Millisecond || m > 203*time.Millisecond {
		t.Fatalf("median after the change = %v", m)
	}
}

func BenchmarkRecord(b *testing.B) {
	tr := New(0.99, time.Second)
	now := time.Now()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		tr.Record(time.Duration(4_000_000+i%2_000_000), now)
	}
}

// TestQuantiles: the quantiles read on demand match the samples, are zero
// below MinSamples, and leave out what the window no longer holds.
func TestQuantiles(t *testing.T) {
	tr := New(0.99, time.Second)
	now := time.Unix(1000, 0)
	if qs, n := tr.Quantiles(now, 0.5); n != 0 || qs[0] != 0 {
		t.Fatalf("Quantiles before any sample = %v, %d; want 0, 0", qs, n)
	}
	// 1 ms, 2 ms, … 1,000 ms: the p50 is 500 ms, the p99 990, the p99.9 999.
	for i := range 1000 {
		tr.Record(time.Duration(i+1)*time.Millisecond, now.Add(time.Duration(i)*time.Microsecond))
	}
	qs, n := tr.Quantiles(now.Add(time.Millisecond), 0.5, 0.99, 0.999)
	if n != 1000 {
		t.Errorf("Quantiles rests on %d samples, want 1000", n)
	}
	for i, want := range []time.Duration{500 * time.Millisecond, 990 * time.Millisecond, 999 * time.Millisecond} {
		if lo, hi := want*98/100, want*102/100; qs[i] < lo || qs[i] > hi {
			t.Errorf("quantile %d = %v, want %v ± 2 %%", i, qs[i], want)
		}
	}
	// 1.5 s on, the samples are in the older sketch, still in the window;
	// 2.5 s on, past both periods, they are gone.
	if _, n := tr.Quantiles(now.Add(1500*time.Millisecond), 0.5); n != 1000 {
		t.Errorf("1.5 s later Quantiles rests on %d samples, want 1000", n)
	}
	if qs, n := tr.Quantiles(now.Add(2500*time.Millisecond), 0.5); n != 0 || qs[0] != 0 {
		t.Errorf("2.5 s later Quantiles = %v, %d; want 0, 0", qs, n)
	}
	tr2 := New(0.99, time.Second)
	for range MinSamples - 1 {
		tr2.Record(time.Millisecond, now)
	}
	if qs, n := tr2.Quantiles(now, 0.5); n != MinSamples-1 || qs[0] != 0 {
		t.Errorf("below MinSamples Quantiles = %v, %d; want 0 and %d", qs, n, MinSamples-1)
	}
}
