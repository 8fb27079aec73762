// Package limit learns a concurrency limit from the latency of completed
// requests: how many requests may be in flight to an upstream (or inside a
// server) before more of them only wait in its queue.
//
// The algorithm is a gradient, after Netflix's concurrency-limits Gradient2
// and Envoy's adaptive_concurrency filter: it compares a short window's
// mean latency with a baseline that rises slowly and falls quickly.
//
//   - Queueing (the ratio above Tolerance): the limit comes down at once to
//     what the upstream serves without a queue, by Little's law the
//     window's completions a second × the baseline latency; a cut at most
//     halves the limit, and never goes below what is in flight when the
//     callers were not pressing on it.
//   - No queue and the limit in use: probe upward by 1, doubling the step
//     each window in a row that still finds no queue, as TCP's slow start.
//   - The limit underused: decay toward Headroom × the peak in flight.
//
// After a change, samples for one latency are ignored. A soft limit
// (Config.Soft) is enforced only for Soft after a window that showed a
// queue while the callers pressed on the limit or piled up faster than the
// upstream answered; otherwise Admit lets a request past and raises the
// limit to what is in flight, and a soft cut comes down to the
// Little's-law level whole. Why a gradient rather than Gradient2's scaling
// or Vegas, and what latency cannot tell apart: see docs/design.md,
// "Bulkhead", in the module's repository.
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
	DefaultHeadroom   = 1.1
)

// dropGradient is the gradient of a window with a dropped request (a
// timeout, an overload answer) but latencies in tolerance: a dropped
// request is a sign of a limit set too high, whatever the latencies said,
// but not of how much too high.
const dropGradient = 0.9

// busyShare is the share of the limit in use that counts as "at the
// limit": only then does latency at the limit say whether more would fit.
// It lies above 1 ÷ minHeadroom, so that a limit decayed to Headroom × the
// peak does not read as in use.
const (
	busyShare   = 0.95
	minHeadroom = 1.1
)

// An underused limit (above Headroom × the peak in flight over a Window)
// gives up decay of the gap to Headroom × that peak per Window: about 2 s
// to come down most of the way, so one quiet spell costs little.
const decay = 0.2

// The baseline falls by baseFall of the gap per fallPer of windows, so a
// recovered upstream is believed at once, and, while the limit is not in
// use, rises by at most baseRise of itself per second of windows, so a
// queue that builds for seconds is not mistaken for the new normal. A limit already at its
// minimum lets the baseline rise as fast as it falls: latency that stays up
// however little is in flight is the upstream's, not a queue of ours.
const (
	baseRise = 0.01
	baseFall = 0.25
)

// A window lasts winBase baseline latencies if that is shorter than
// Window; baseFall is per fallPer of windows, so short windows do not pull
// the baseline down faster, nor onto their noise.
const (
	winBase = 2
	fallPer = 100 * time.Millisecond
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
	// Window is how long a sample window covers: it closes at its first
	// sample past Window that finds MinSamples in it, or earlier, after one
	// baseline latency, when its mean latency already says queueing.
	Window time.Duration
	// MinSamples is how many samples a window needs before it may close,
	// so a trickle of requests does not steer the limit on one or two.
	MinSamples int
	// Tolerance is how far above the baseline a window's mean latency may
	// be before the limit comes down (1.25: 25 % more). It must be ≥ 1.
	Tolerance float64
	// Smoothing in (0, 1] is how much of a 10 % step down a window with a
	// dropped request, but latencies in tolerance, applies. A window that
	// shows queueing comes down to its Little's-law level whole.
	Smoothing float64
	// Headroom ≥ 1.1 is how far above the peak in flight an underused limit
	// decays to: 1.1 keeps 10 % more than the callers have used lately,
	// so the next overload starts from a limit near what the load needs
	// (the fewer admitted past the capacity, the shorter the tail while
	// the limit comes down); more keeps bursts above the recent peak from
	// being refused while the limit grows back. +Inf never decays.
	Headroom float64
	// Soft, when positive, makes the limit soft while no window in the
	// last Soft has shown queueing (a mean latency above Tolerance, or a
	// dropped request): Admit then lets a request past the limit and
	// raises the limit to what is in flight, so a burst at the baseline
	// latency is never refused, and the limit is enforced only from the
	// first window that shows the upstream queueing. A soft limit that
	// cuts for queueing (a ratio of 2 or more) comes down to the
	// Little's-law level whole rather than by at most half per window: a
	// cut that was too deep costs at most Soft of refusals. Zero: the
	// limit is always enforced.
	Soft time.Duration
}

// Gradient is an adaptive concurrency limit. Limit is one atomic load;
// Sample takes a mutex for O(1) work and allocates nothing. It is safe for
// concurrent use. Use New.
type Gradient struct {
	limit atomic.Int64 // the published limit, what Limit returns
	// queuedAt (ns) is when a window last showed queueing; 0: never.
	queuedAt atomic.Int64
	soft     int64 // ns; 0: a hard limit

	mu         sync.Mutex
	min, max   float64
	cur        float64 // the limit, unrounded
	tolerance  float64
	smoothing  float64
	headroom   float64
	window     int64 // ns
	minSamples int

	// The open sample window.
	started     bool
	start       int64 // ns
	sum         int64 // ns of latency
	n           int
	maxInflight int
	dropped     bool
	// In flight at the window's first and latest sample.
	firstInflight, lastInflight int

	base float64 // ns, the long-term baseline; 0 before the first window
	step float64 // the next probe upward
	// holdUntil (ns) is one latency after the last change of the limit:
	// samples before it came from requests admitted under the old one.
	holdUntil int64
	lastShort float64 // ns, the mean latency of the last window
	// The peak in flight since decayStart (ns): the last decay or change.
	decayStart int64
	decayPeak  float64
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
	if c.Headroom == 0 {
		c.Headroom = DefaultHeadroom
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
	case !(c.Headroom >= minHeadroom):
		return nil, configError("Headroom %v, want ≥ %v", c.Headroom, minHeadroom)
	case c.Soft < 0:
		return nil, configError("Soft %v, want ≥ 0", c.Soft)
	}
	g := &Gradient{
		min:        float64(c.Min),
		max:        float64(c.Max),
		cur:        float64(c.Initial),
		tolerance:  c.Tolerance,
		smoothing:  c.Smoothing,
		headroom:   c.Headroom,
		window:     int64(c.Window),
		minSamples: c.MinSamples,
		soft:       int64(c.Soft),
		step:       1,
	}
	g.limit.Store(int64(c.Initial))
	return g, nil
}

// Limit returns the current limit, in [Min, Max].
func (g *Gradient) Limit() int { return int(g.limit.Load()) }

// Admit reports whether a request that finds inflight requests in flight,
// the limit or more, may go all the same: only a soft limit (Config.Soft)
// that no window has shown queueing for the last Soft before now, and
// never past Max. It then raises the limit to inflight + 1, so that the
// next cut for queueing starts from what was in flight.
func (g *Gradient) Admit(now int64, inflight int) bool {
	if g.soft == 0 || float64(inflight+1) > g.max {
		return false
	}
	if q := g.queuedAt.Load(); q != 0 && now-q < g.soft {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	n := float64(inflight + 1)
	if n > g.cur {
		g.cur = n
		g.limit.Store(int64(inflight + 1))
	}
	g.decayPeak = max(g.decayPeak, n)
	g.decayStart = now
	return true
}

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
	if now < g.holdUntil {
		// Admitted under the limit before the last change: it says
		// nothing about the new one.
		return int(g.limit.Load()), false
	}
	if !g.started {
		g.started, g.start, g.firstInflight = true, now, inflight
	}
	g.lastInflight = inflight
	g.sum += int64(latency)
	g.n++
	g.maxInflight = max(g.maxInflight, inflight)
	g.dropped = g.dropped || dropped
	if !g.closes(now) {
		return int(g.limit.Load()), false
	}
	hold := g.update(now)
	g.started, g.sum, g.n, g.maxInflight, g.dropped = false, 0, 0, 0, false
	old := g.limit.Load()
	l := int64(math.Round(g.cur))
	g.limit.Store(l)
	if hold && l != old {
		g.holdUntil = now + int64(g.lastShort)
	}
	return int(l), l != old
}

// closes says whether the open window closes at now: once it holds
// MinSamples and covers Window, or one baseline latency if that is
// shorter, so that a fast upstream's limit follows a change within a few
// of its latencies rather than in steps of 100 ms.
func (g *Gradient) closes(now int64) bool {
	d := now - g.start
	if g.n < g.minSamples {
		return false
	}
	if d >= g.window || g.base > 0 && float64(d) >= winBase*g.base {
		return true
	}
	return g.base > 0 && float64(d) >= g.base && float64(g.sum) > g.tolerance*g.base*float64(g.n)
}

// cutMargin is how far above the Little's-law level a cut for queueing
// lands: halfway to Tolerance, so that a rate measured a little low in a
// short window does not leave cores idle, while the queue it allows (half
// the tolerated one) still reads as within tolerance.
func (g *Gradient) cutMargin() float64 { return 1 + (g.tolerance-1)/2 }

// growBelow is the ratio of latency to baseline below which a limit in use
// may grow: a quarter of the way to Tolerance, so that a limit sitting on
// the capacity, where one more in flight already shows as a queue of one,
// stays there.
func (g *Gradient) growBelow() float64 { return 1 + (g.tolerance-1)/4 }

// update closes the sample window: the window moves the limit, then the
// baseline.
func (g *Gradient) update(now int64) (hold bool) {
	short := float64(g.sum) / float64(g.n)
	if short <= 0 {
		short = 1 // all-zero latencies: nothing to compare, nothing queued
	}
	if g.base == 0 {
		g.base = short
	}
	ratio := short / g.base
	g.lastShort = short
	peak := float64(g.maxInflight)
	g.decayPeak = max(g.decayPeak, peak)
	// queued: the window says the upstream queues (or drops), which
	// keeps a soft limit enforced.
	grow, hold, queued := false, false, false
	switch {
	case ratio > g.tolerance || g.dropped:
		// Queueing. The window's completions a second are what the
		// upstream serves; by Little's law it serves them without a
		// queue at that rate × the baseline in flight: come down to that
		// at once (with a margin, cutMargin). The rate counts the n−1 gaps between the window's n
		// completions; a short window of bunched completions can still
		// overstate it, so the limit comes down at least by the gradient
		// (Tolerance ÷ ratio). A dropped request with latencies in
		// tolerance says only "less": a smoothed step down.
		rate := float64(g.n-1) / float64(max(1, now-g.start))
		target := min(rate*g.base*g.cutMargin(), g.cur*g.tolerance/ratio)
		if !(ratio > g.tolerance) {
			target = g.cur * (1 - g.smoothing*(1-dropGradient))
		}
		// At most halve per window: a stall that looks like a queue
		// (a pause of the process, a burst of dialling) costs half the
		// limit, not all of it, and the next window can cut again. A
		// soft limit far past its tolerance cuts whole: the queue is
		// certain, and a cut too deep lasts at most Soft.
		if g.soft == 0 {
			target = max(target, g.cur/2)
		}
		// A soft limit's in flight that grew within the window by more
		// than the tolerated queue of its n completions ((Tolerance − 1)
		// × n: arrivals more than Tolerance × the completions), and by
		// more than twice the arrivals' own noise (√n of n): completions
		// fall behind what the callers send, so their rate is what the
		// upstream serves, pressed on the limit or not. Against n, not
		// the peak in flight: a window under a queue closes after one
		// baseline, so growth against the peak (which the queue itself
		// raises) missed a capacity drop at 1,200 calls a second while
		// the queue reached three service times.
		growth := float64(g.lastInflight - g.firstInflight)
		building := g.soft > 0 && growth > (g.tolerance-1)*float64(g.n) && growth > 2*math.Sqrt(float64(g.n))
		if peak < busyShare*float64(g.limit.Load()) && !building {
			// The callers were not pressing on the limit: the
			// completions a second are what they sent, not what the
			// upstream can serve (a cold start dialling connections, a
			// slower upstream), so do not refuse what is already in
			// flight; only stop more from piling in. A soft limit
			// is not in the way of anyone yet: it stays where it is.
			target = max(target, peak)
			if g.soft > 0 {
				target = g.cur
			}
		} else {
			queued = true
		}
		g.cur = min(g.cur, target)
		hold = true
		queued = queued || g.dropped
	case peak >= busyShare*float64(g.limit.Load()) && ratio <= g.growBelow():
		// In use up to the limit and no queue to speak of: probe upward,
		// by 1 and then doubling the step each window in a row that
		// still finds no queue (TCP's slow start, in windows), so a
		// limit that sits on the capacity probes by one and a recovered
		// upstream gets its capacity back in a few windows.
		g.cur += g.step
		g.step = min(2*g.step, g.cur)
		grow, hold = true, true
	case g.headroom*g.decayPeak < g.cur:
		// Underused: decay toward headroom × the peak, once per Window
		// (the peak over all of it, not over one short window), so the
		// next overload starts from a limit near what the load needs.
		if now-g.decayStart >= g.window {
			g.cur -= decay * (g.cur - g.headroom*g.decayPeak)
			g.decayStart, g.decayPeak = now, 0
		}
	}
	if !grow {
		g.step = 1
	}
	if !hold && peak >= busyShare*float64(g.limit.Load()) && ratio > g.growBelow() {
		// Pressing on the limit with some queue, if less than Tolerance:
		// the upstream is at its capacity.
		queued = true
	}
	if queued {
		g.queuedAt.Store(max(now, 1))
	}
	if hold {
		g.decayStart, g.decayPeak = now, 0
	}
	g.cur = min(g.max, max(g.min, g.cur))
	switch {
	case short <= g.base || g.cur <= g.min || g.soft > 0 && !queued:
		// A soft limit in nobody's way, with nothing piling up: the
		// latency is the upstream's own, followed as fast as a fall.
		g.base += (1 - math.Pow(1-baseFall, float64(now-g.start)/float64(fallPer))) * (short - g.base)
	case peak < busyShare*float64(g.limit.Load()):
		// Latency that rose while the callers were not pressing on the
		// limit is the upstream's own; at the limit it may be the queue
		// the limit lets build, and a baseline that crept up on it would
		// let the limit creep up too.
		g.base = min(short, g.base*(1+baseRise*float64(now-g.start)/float64(time.Second)))
	}
	return hold
}
