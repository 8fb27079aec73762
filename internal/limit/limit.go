// Package limit learns a concurrency limit from the latency of completed
// requests: how many requests may be in flight to an upstream (or inside a
// server) before more of them only wait in its queue.
//
// The algorithm is a gradient, after Netflix's concurrency-limits Gradient2
// and Envoy's adaptive_concurrency filter: once per sample window it
// compares the window's mean latency with a long-term baseline and scales
// the limit by their ratio, plus a little headroom to keep probing upward.
// A gradient rather than Vegas because it needs no accurate "no-load"
// latency: Vegas counts the queue as limit × (1 − minRTT/RTT), so an
// upstream whose latency simply moved (a slower dependency, a bigger
// response) reads as a permanent queue until the minimum is re-measured,
// which means refusing traffic to find it (Envoy's minRTT window drops to
// its minimum concurrency to do so). A baseline that rises slowly and falls
// quickly follows a new steady latency without such probes, while a queue
// building up inside one window still shows as a gradient below one.
package limit

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Package defaults for Config's zero fields.
const (
	DefaultWindow     = 100 * time.Millisecond
	DefaultMinSamples = 10
	DefaultTolerance  = 1.25
	DefaultSmoothing  = 0.3
)

// Bounds of the gradient per window: a window can at most halve the limit,
// and it never grows by more than the headroom.
const minGradient = 0.5

// dropGradient caps the gradient of a window with a dropped request (a
// timeout, an overload answer): a dropped request is the plainest sign of a
// limit set too high, whatever the latencies said.
const dropGradient = 0.9

// The baseline falls by baseFall of the gap per window, so a recovered
// upstream is believed at once, and rises by at most baseRise of itself per
// window (1 % a second at the default window), so a queue that builds for
// seconds is not mistaken for the new normal. A limit already at its
// minimum lets the baseline rise as fast as it falls: latency that stays up
// however little is in flight is the upstream's, not a queue of ours.
const (
	baseRise = 0.001
	baseFall = 0.25
)

// Config bounds and tunes a Gradient. The zero value of each field but Min
// and Max takes the package default.
type Config struct {
	// Min and Max bound the limit: 1 ≤ Min ≤ Max.
	Min, Max int
	// Initial is the limit before the first window closes; zero means Max,
	// so nothing is refused before latency has been seen. It must lie in
	// [Min, Max].
	Initial int
	// Window is the shortest time a sample window covers; a window closes
	// at its first sample past Window that finds MinSamples in it.
	Window time.Duration
	// MinSamples is how many samples a window needs before it may close,
	// so a trickle of requests does not steer the limit on one or two.
	MinSamples int
	// Tolerance is how far above the baseline a window's mean latency may
	// be before the limit comes down (1.25: 25 % more). It must be ≥ 1.
	Tolerance float64
	// Smoothing in (0, 1] is how much of a decrease a window applies at
	// once; increases apply whole, so a recovered upstream gets its
	// capacity back within a few windows.
	Smoothing float64
}

// Gradient is an adaptive concurrency limit. Limit is one atomic load;
// Sample takes a mutex for O(1) work and allocates nothing. It is safe for
// concurrent use. Use New.
type Gradient struct {
	limit atomic.Int64 // the published limit, what Limit returns

	mu         sync.Mutex
	min, max   float64
	cur        float64 // the limit, unrounded
	tolerance  float64
	smoothing  float64
	window     int64 // ns
	minSamples int

	// The open sample window.
	started     bool
	start       int64 // ns
	sum         int64 // ns of latency
	n           int
	maxInflight int
	dropped     bool

	base float64 // ns, the long-term baseline; 0 before the first window
}

// ErrConfig is matched by every error New returns.
var ErrConfig = errors.New("limit: invalid config")

func configError(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrConfig}, args...)...)
}

// New returns a Gradient for c, or an error matching ErrConfig.
func New(c Config) (*Gradient, error) {
	if c.Initial == 0 {
		c.Initial = c.Max
	}
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.MinSamples == 0 {
		c.MinSamples = DefaultMinSamples
	}
	if c.Tolerance == 0 {
		c.Tolerance = DefaultTolerance
	}
	if c.Smoothing == 0 {
		c.Smoothing = DefaultSmoothing
	}
	switch {
	case c.Min < 1:
		return nil, configError("Min %d, want ≥ 1", c.Min)
	case c.Max < c.Min:
		return nil, configError("Max %d < Min %d", c.Max, c.Min)
	case c.Initial < c.Min || c.Initial > c.Max:
		return nil, configError("Initial %d outside [%d, %d]", c.Initial, c.Min, c.Max)
	case c.Window < 0:
		return nil, configError("Window %v, want > 0", c.Window)
	case c.MinSamples < 1:
		return nil, configError("MinSamples %d, want ≥ 1", c.MinSamples)
	case !(c.Tolerance >= 1) || math.IsInf(c.Tolerance, 0):
		return nil, configError("Tolerance %v, want a finite number ≥ 1", c.Tolerance)
	case !(c.Smoothing > 0 && c.Smoothing <= 1):
		return nil, configError("Smoothing %v, want in (0, 1]", c.Smoothing)
	}
	g := &Gradient{
		min:        float64(c.Min),
		max:        float64(c.Max),
		cur:        float64(c.Initial),
		tolerance:  c.Tolerance,
		smoothing:  c.Smoothing,
		window:     int64(c.Window),
		minSamples: c.MinSamples,
	}
	g.limit.Store(int64(c.Initial))
	return g, nil
}

// Limit returns the current limit, in [Min, Max].
func (g *Gradient) Limit() int { return int(g.limit.Load()) }

// Sample records one completed request: now (unix nanoseconds, or any
// monotonic count of them), its latency, how many requests were in flight
// when it completed (itself included), and whether it was dropped (timed
// out or refused for overload). It returns the limit after the sample and
// whether the sample closed a window that changed it.
func (g *Gradient) Sample(now int64, latency time.Duration, inflight int, dropped bool) (limit int, changed bool) {
	if latency < 0 {
		latency = 0
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.started {
		g.started, g.start = true, now
	}
	g.sum += int64(latency)
	g.n++
	g.maxInflight = max(g.maxInflight, inflight)
	g.dropped = g.dropped || dropped
	if now-g.start < g.window || g.n < g.minSamples {
		return int(g.limit.Load()), false
	}
	g.update()
	g.started, g.sum, g.n, g.maxInflight, g.dropped = false, 0, 0, 0, false
	old := g.limit.Load()
	l := int64(math.Round(g.cur))
	g.limit.Store(l)
	return int(l), l != old
}

// update closes the sample window: the gradient moves the limit, then the
// window moves the baseline.
func (g *Gradient) update() {
	short := float64(g.sum) / float64(g.n)
	if short <= 0 {
		short = 1 // all-zero latencies: nothing to compare, nothing queued
	}
	if g.base == 0 {
		g.base = short
	}
	grad := min(1, max(minGradient, g.tolerance*g.base/short))
	if g.dropped {
		grad = min(grad, dropGradient)
	}
	var target float64
	switch {
	case grad < 1:
		// Queueing: come down by the gradient, smoothed, and add no
		// headroom, so the limit settles near tolerance × what the
		// upstream serves without a queue.
		target = g.cur + g.smoothing*(g.cur*grad-g.cur)
	case 2*float64(g.maxInflight) < g.cur:
		// The callers used less than half the limit: latency at that
		// concurrency says nothing about more, so do not grow on it.
		target = g.cur
	default:
		// Within tolerance and in use: probe upward by √limit, as
		// Gradient2's queue size does, so growth is fast when the limit
		// is small and gentle when it is large.
		target = g.cur + math.Sqrt(g.cur)
	}
	g.cur = min(g.max, max(g.min, target))
	switch {
	case short <= g.base || g.cur <= g.min:
		g.base += baseFall * (short - g.base)
	default:
		g.base = min(short, g.base*(1+baseRise))
	}
}
