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
