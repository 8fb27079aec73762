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
