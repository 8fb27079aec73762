package debug

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if a goroutine outlives them: a
// sampler left running by a handler nobody closed, above all.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
