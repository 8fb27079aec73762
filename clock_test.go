package bulwark

import "time"

// fakeClock is the clock of a test that runs in a testing/synctest bubble:
// bulwark and gobreaker read time.Now, which the bubble fakes, so advancing
// the clock is sleeping, which in a bubble returns as soon as every other
// goroutine of the bubble is blocked. Outside a bubble it would really
// sleep: use it only inside synctest.Test.
type fakeClock struct{}

func newFakeClock() *fakeClock { return &fakeClock{} }

func (*fakeClock) now() time.Time { return time.Now() }

func (*fakeClock) advance(d time.Duration) { time.Sleep(d) }
