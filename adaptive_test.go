package bulwark

import (
	"errors"
	"math"
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
