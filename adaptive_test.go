package bulwark

import (
	"errors"
	"math"
	"net/http"
	"testing"
	"time"
)

func TestAdaptiveConfigErrors(t *testing.T) {
	for _, p := range []Policy{
		{Bulkhead: Bulkhead{Adaptive: true, MinConcurrent: 20, MaxConcurrent: 10}},
		{Bulkhead: Bulkhead{MinConcurrent: -1}},
		{Throttle: Throttle{Enabled: true, K: 0.5}},
		{Throttle: Throttle{Enabled: true, MaxProbability: 1.5}},
		{Throttle: Throttle{Enabled: true, MaxProbability: -0.1}},
		{Throttle: Throttle{Enabled: true, MaxProbability: math.NaN()}},
		{Throttle: Throttle{Enabled: true, Window: time.Millisecond}},
		{Throttle: Throttle{Enabled: true, Disabled: true}},
	} {
		var ce *ConfigError
		if _, err := New(Config{Default: p}); !errors.As(err, &ce) {
			t.Errorf("New(%+v) = %v, want a *ConfigError", p, err)
		}
	}
}

// TestUpdateKeepsThrottleCounts: an Update that leaves Throttle alone
// keeps its counts; one that changes it starts them afresh.
func TestUpdateKeepsThrottleCounts(t *testing.T) {
	cfg := Config{Base: &statusBase{codes: []int{503}}, Default: only(Policy{Throttle: Throttle{Enabled: true}})}
	tr := mustNew(t, cfg)
	tr.randN = func(n int64) int64 { return n - 1 }
	for range 5 {
		sendOnce(t, tr, http.MethodGet, "http://th.test/")
	}
	reqs := func() int64 { return tr.Snapshot().Host("th.test:80")[0].Throttle.Requests }
	cfg.Default.Breaker.FailureRate = 0.9 // another layer's change
	if err := tr.Update(cfg); err != nil {
		t.Fatal(err)
	}
	if got := reqs(); got != 5 {
		t.Errorf("after an unrelated Update: %d requests counted, want the 5 before it", got)
	}
	cfg.Default.Throttle.K = 3
	if err := tr.Update(cfg); err != nil {
		t.Fatal(err)
	}
	if got := reqs(); got != 0 {
		t.Errorf("after a Throttle change: %d requests counted, want 0", got)
	}
}
