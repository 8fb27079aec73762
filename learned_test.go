package bulwark

import (
	"testing"
	"time"
)

// TestLearnedBounds: the learned timeout is attemptFactor × the baseline,
// doubled per retry up to the ceiling, never under learnedFloor; the slow
// threshold slowFactor × the baseline within the same bounds; both the
// ceiling before anything is learned, and for a nil learned.
func TestLearnedBounds(t *testing.T) {
	var none *learned
	if d, ok := none.timeout(1, time.Second); d != time.Second || ok {
		t.Errorf("nil: timeout = %v, %v; want the ceiling", d, ok)
	}
	l := newLearned(nil)
	if d, ok := l.timeout(2, 10*time.Second); d != 10*time.Second || ok {
		t.Errorf("cold: timeout = %v, %v; want the ceiling", d, ok)
	}
	now := time.Now()
	for i := range 1000 {
		l.est.Record(40*time.Millisecond, now.Add(time.Duration(i)*time.Millisecond))
	}
	b, _ := l.est.Baseline()
	for _, tt := range []struct {
		attempt int
		ceiling time.Duration
		want    time.Duration
	}{
		{0, 10 * time.Second, 3 * b},
		{1, 10 * time.Second, 3 * b},
		{2, 10 * time.Second, 6 * b},
		{3, 10 * time.Second, 12 * b},
		{3, 200 * time.Millisecond, 200 * time.Millisecond},
		{9, 10 * time.Second, 10 * time.Second},
		{1, 50 * time.Millisecond, 50 * time.Millisecond},
	} {
		if got, ok := l.timeout(tt.attempt, tt.ceiling); got != tt.want || !ok {
			t.Errorf("timeout(%d, %v) = %v, %v; want %v (baseline %v)", tt.attempt, tt.ceiling, got, ok, tt.want, b)
		}
	}
	if got, _ := l.slowCall(5 * time.Second); got != 2*b {
		t.Errorf("slowCall = %v, want %v", got, 2*b)
	}
	if got := l.failingFor(); got != 12*b {
		t.Errorf("failingFor = %v, want the third attempt's timeout %v", got, 12*b)
	}
	// A slow host: the hold is the third attempt's timeout, at most
	// attemptCeiling as that timeout is (it was 4 × 3 × 7 s).
	s := newLearned(nil)
	for i := range 1000 {
		s.est.Record(7*time.Second, now.Add(time.Duration(i)*time.Millisecond))
	}
	if learnedCeiling != attemptCeiling {
		t.Errorf("learnedCeiling %v, attemptCeiling %v: want them equal", learnedCeiling, attemptCeiling)
	}
	if got := s.failingFor(); got != attemptCeiling {
		t.Errorf("slow host: failingFor = %v, want %v", got, attemptCeiling)
	}
	// A fast host: the floor.
	f := newLearned(nil)
	for i := range 1000 {
		f.est.Record(100*time.Microsecond, now.Add(time.Duration(i)*time.Millisecond))
	}
	if got, _ := f.timeout(1, 10*time.Second); got != learnedFloor {
		t.Errorf("fast host: timeout = %v, want the floor %v", got, learnedFloor)
	}
	if got, _ := f.slowCall(5 * time.Second); got != learnedFloor {
		t.Errorf("fast host: slowCall = %v, want the floor %v", got, learnedFloor)
	}
}

// TestLearnedClockJump: the wall clock jumps 50 years back and 1,000
// hours ahead while a host is learned (readings without a monotonic part,
// so the latencies measured across the jump are negative or enormous):
// every attempt's learned timeout stays within [learnedFloor, the static
// default] and the slow threshold within [learnedFloor, its ceiling]:
// never negative, never enormous.
func TestLearnedClockJump(t *testing.T) {
	start := time.Now()
	l := newLearned(nil)
	check := func(when string) {
		t.Helper()
		for attempt := range 8 {
			d, _ := l.timeout(attempt, attemptCeiling)
			if d < learnedFloor || d > attemptCeiling {
				t.Errorf("%s: timeout(%d) = %v, want within [%v, %v]", when, attempt, d, learnedFloor, attemptCeiling)
			}
		}
		if d, _ := l.slowCall(attemptCeiling / 2); d < learnedFloor || d > attemptCeiling/2 {
			t.Errorf("%s: slowCall = %v, want within [%v, %v]", when, d, learnedFloor, attemptCeiling/2)
		}
	}
	for i := range 1000 {
		now := start.Add(time.Duration(i) * 10 * time.Millisecond)
		l.est.Record(20*time.Millisecond, now)
	}
	check("healthy")
	b0, _ := l.est.Baseline()
	back := time.Unix(0, 0)                       // 50 years back, no monotonic reading
	ahead := start.Round(0).Add(1000 * time.Hour) // far ahead, no monotonic reading
	for i := range 3000 {
		sent := start.Add(10*time.Second + time.Duration(i)*time.Millisecond)
		switch i % 3 {
		case 0:
			l.est.Record(back.Sub(sent), back) // about -50 years
		case 1:
			l.est.Record(ahead.Sub(sent), ahead) // about +1,000 hours
		default:
			l.est.Record(20*time.Millisecond, sent)
		}
	}
	b1, _ := l.est.Baseline()
	t.Logf("baseline %v before the jumps, %v after", b0, b1)
	check("after the jumps")
}

// BenchmarkLearnedBounds is what an attempt pays to read its learned
// bounds: the attempt timeout (the deadline layer) and the slow-call
// threshold (the breaker), two atomic loads and a clamp each; what
// recording a sample costs is internal/learn's BenchmarkRecord, paid on
// one attempt in eight once the host is busy.
func BenchmarkLearnedBounds(b *testing.B) {
	l := newLearned(nil)
	now := time.Now()
	for i := range 1000 {
		l.est.Record(20*time.Millisecond, now.Add(time.Duration(i)*time.Millisecond))
	}
	b.ReportAllocs()
	var sink time.Duration
	for b.Loop() {
		d, _ := l.timeout(1, attemptCeiling)
		s, _ := l.slowCall(attemptCeiling / 2)
		sink += d + s
	}
	if sink == 0 {
		b.Fatal("no bounds read")
	}
}
