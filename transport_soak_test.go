//go:build soak

package bulwark

import (
	"testing"
	"time"
)

// TestSoak is the long stress behind `make soak`: 200,000 calls over 50
// goroutines and five hosts, in rounds of fresh seeds, every invariant of
// stress checked on each call.
func TestSoak(t *testing.T) {
	const rounds, per = 20, 10000
	var total time.Duration
	for r := 0; r < rounds; r++ {
		total += stress(t, per, 50, uint64(100+r))
	}
	t.Logf("%d calls in %v: %.0f req/s", rounds*per, total.Round(time.Millisecond), float64(rounds*per)/total.Seconds())
}
