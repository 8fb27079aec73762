package bulwark

import (
	"sync"
	"time"
)

// fakeClock is an injected clock that only moves when told to.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

// newFakeClock starts at the real time, whole seconds: the attempt layer
// turns deadlines read on this clock into real context deadlines, so the
// fake clock may run ahead of the real one but never behind it.
func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Now().Truncate(time.Second)}
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}
