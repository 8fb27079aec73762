package bulwark

import (
	"math"
	"math/rand/v2"
	"net/http"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bulwark-http/bulwark/internal/window"
)

// Package defaults for Throttle.
const (
	defaultThrottleK      = 2.0
	defaultThrottleWindow = time.Minute
)

// throttleBuckets is how many buckets the throttle's window rolls in; a
// Window shorter than minThrottleWindow cannot give each one 10 ms.
const (
	throttleBuckets   = 10
	minThrottleWindow = 100 * time.Millisecond
)

// ThrottledError is the error for a request the host's throttle refused.
// It matches ErrThrottled. One value is made per host and shared; do not
// modify it.
type ThrottledError struct {
	Host string // "host:port"
}

func (e *ThrottledError) Error() string { return ErrThrottled.Error() + " for " + e.Host }

// Unwrap returns ErrThrottled.
func (e *ThrottledError) Unwrap() error { return ErrThrottled }

func (e *ThrottledError) refusalKind() kind { return kindThrottled }

// Throttle is client-side adaptive throttling, as Google's SRE book
// (chapter 21, "Handling Overload") describes it: over the last Window,
// each host's attempts (requests) and the ones it accepted (accepts) are
// counted, and a new attempt is refused locally, with a *ThrottledError,
// with probability
//
//	max(0, (requests − K·accepts) / (requests + 1))
//
// so a host that accepts everything is never throttled, and one that
// accepts little gets a trickle of about K times what it accepts, enough to
// see it recover, instead of everything the callers offer. It sheds
// gradually, before the breaker trips and while it recovers. Refusals count
// as requests, not accepts; refusals by the layers below (an open breaker,
// a full bulkhead) and calls the caller gave up on count as neither. An
// accept is any answer but a failure by the breaker's reckoning (5xx but
// 501, 429, bulwark's timeouts, transport errors). The fallback answers a
// refusal as it answers an open breaker.
//
// The zero value is off; set Enabled.
type Throttle struct {
	// K is how many requests per accept the host may receive before
	// refusals start: 2 lets through twice what it accepts. Lower is more
	// aggressive. Zero inherits from Default, then 2; it must be ≥ 1.
	K float64

	// Window is how far back requests and accepts are counted, in ten
	// buckets. Zero inherits from Default, then one minute; it must be at
	// least 100 ms.
	Window time.Duration

	// MaxProbability caps the refusal probability, in [0, 1]. Zero
	// inherits from Default, then 1: only the formula bounds it.
	MaxProbability float64

	// Enabled turns the throttle on for the upstream (or for every
	// upstream, set in Default). An upstream inherits it from Default
	// unless it sets Disabled.
	Enabled bool

	// Disabled turns the throttle off for an upstream whose Default set
	// Enabled. Setting both is an error.
	Disabled bool

	// Shadow runs the throttle in shadow mode: it counts and draws as it
	// would, and where it would refuse it reports the refusal (the
	// bulwark.shadow.rejections counter, a span event,
	// ThrottleSnapshot.WouldReject) and sends the request anyway, so K can
	// be tuned on real traffic before it is enforced. The counts then hold
	// what the host really received, which an enforcing throttle's would
	// not. An upstream inherits Shadow from Default (or-ed).
	Shadow bool
}

func (t Throttle) inherit(parent Throttle) Throttle {
	t.K = cmpOrFloat(t.K, parent.K)
	if t.Window == 0 {
		t.Window = parent.Window
	}
	t.MaxProbability = cmpOrFloat(t.MaxProbability, parent.MaxProbability)
	t.Enabled = !t.Disabled && (t.Enabled || parent.Enabled)
	t.Shadow = t.Shadow || parent.Shadow
	return t
}

func cmpOrFloat(a, b float64) float64 {
	if a != 0 {
		return a
	}
	return b
}

func (t Throttle) withDefaults() Throttle {
	t.K = cmpOrFloat(t.K, defaultThrottleK)
	if t.Window == 0 {
		t.Window = defaultThrottleWindow
	}
	t.MaxProbability = cmpOrFloat(t.MaxProbability, 1)
	return t
}

func (t Throttle) validate() error {
	switch {
	case !(t.K >= 1) || math.IsInf(t.K, 0):
		return fieldError("Throttle.K", t.K, "must be a finite number ≥ 1")
	case t.Window < minThrottleWindow:
		return fieldError("Throttle.Window", t.Window, "must be ≥ "+minThrottleWindow.String())
	case !(t.MaxProbability >= 0 && t.MaxProbability <= 1):
		return fieldError("Throttle.MaxProbability", t.MaxProbability, "must be in [0, 1]")
	}
	return nil
}

// Counter kinds of the throttle's window.
const (
	thRequests = iota
	thAccepts
)

// throttleLayer is per host, just above the breaker: below pushback, whose
// pause is the host's explicit word and refuses first, and outside the
// breaker, so that a breaker refusal is not counted as a request the host
// turned down and a throttle refusal never reaches the breaker's window,
// since it says nothing about the host. Below the retry layer, it counts
// attempts, as the host receives them.
type throttleLayer struct {
	next     layer
	e        env
	k, maxP  float64
	randN    func(int64) int64
	rejected *ThrottledError
	shadow   bool
	policy   Throttle // what it was built for: its counts are kept while this holds
	// The counts, shared with the throttle of a stack Update builds for
	// the same host and Throttle policy, so they outlive the change.
	*throttleCounts
}

// throttleCounts is a host's throttle state.
type throttleCounts struct {
	mu       sync.Mutex
	w        *window.Window
	reported float64 // the probability last reported
	// The probability (float64 bits) as of the last count, published for
	// decisions before pubUntil (the window's Steady), until which the
	// counts change only under mu: a decision then takes no lock.
	pubP     atomic.Uint64
	pubUntil atomic.Int64
	// wouldReject counts the refusals of a throttle in shadow mode.
	wouldReject atomic.Uint64
	refused     atomic.Uint64 // since the state was made
}

func newThrottle(next layer, p Throttle, e env, randN func(int64) int64) *throttleLayer {
	// Validated: Window ≥ 100 ms, so ten buckets fit.
	w, _ := window.New(int64(p.Window), throttleBuckets)
	return &throttleLayer{next: next, e: e, k: p.K, maxP: p.MaxProbability, randN: randN,
		rejected: &ThrottledError{Host: e.host}, shadow: p.Shadow, policy: p, throttleCounts: &throttleCounts{w: w}}
}

// probability is the SRE formula on the counts, capped.
func (t *throttleLayer) probability(c window.Counts) float64 {
	req, acc := float64(c[thRequests]), float64(c[thAccepts])
	return min(t.maxP, max(0, (req-t.k*acc)/(req+1)))
}

// randUnit draws uniformly from [0, 1): from the Transport's randN when a
// test set it, else from math/rand/v2's global source.
func (t *throttleLayer) randUnit() float64 {
	if t.randN != nil {
		return float64(t.randN(1<<53)) / (1 << 53)
	}
	return rand.Float64()
}

func (t *throttleLayer) roundTrip(req *http.Request, c call) (*http.Response, error) {
	// The window's position is when the attempt was sent: the retry
	// layer's reading when there is one, since a clock reading costs some
	// 70 ns on a VM. The answer is counted there too: a window of ten
	// buckets of Window/10 cannot tell the two apart, and a position that
	// has fallen behind the newest bucket counts into it.
	now := c.sent.UnixNano()
	if c.sent.IsZero() {
		now = time.Now().UnixNano()
	}
	if p := t.current(now); p > 0 && t.randUnit() < p {
		if t.shadow {
			t.wouldReject.Add(1)
			t.e.rep.shadowRejected(req.Context(), layerThrottle)
			return t.send(req, c, now)
		}
		t.record(now, 1, 0)
		t.refused.Add(1)
		t.e.rep.rejected(req.Context(), layerThrottle)
		closeBody(req)
		return nil, t.rejected
	}
	return t.send(req, c, now)
}

// shedding reports whether the throttle refuses some requests now: the
// hedger sends no hedge then.
func (t *throttleLayer) shedding() bool {
	return t.current(time.Now().UnixNano()) > 0
}

// current is the refusal probability at now: the published one while it
// holds, else computed (and published) under mu.
func (t *throttleLayer) current(now int64) float64 {
	if now < t.pubUntil.Load() {
		return math.Float64frombits(t.pubP.Load())
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.probability(t.w.Sum(now))
	t.publish(p)
	return p
}

// send sends req and counts the host's answer at now.
func (t *throttleLayer) send(req *http.Request, c call, now int64) (*http.Response, error) {
	resp, err := t.next.roundTrip(req, c)
	switch j := c.judge(resp, err); {
	case !j.k.fromHost():
		// Refused below, or the caller gave up: not the host's answer.
	case j.v.Outcome == OutcomeFailure:
		t.record(now, 1, 0)
	default:
		t.record(now, 1, 1)
	}
	return resp, err
}

// record counts requests and accepts at now, and reports the probability
// when it has moved by 0.1 or more since last reported.
func (t *throttleLayer) record(now int64, requests, accepts int64) {
	t.mu.Lock()
	t.w.Add(now, window.Counts{thRequests: requests, thAccepts: accepts})
	p := t.probability(t.w.Sum(now))
	t.publish(p)
	old := t.reported
	moved := math.Abs(p-old) >= 0.1 || (p == 0) != (old == 0)
	if moved {
		t.reported = p
	}
	t.mu.Unlock()
	if moved {
		t.e.rep.throttleChanged(old, p)
	}
}

// publish makes p the decision until the counts may change without mu.
// The caller holds mu. p is stored before pubUntil, so a reader that sees
// the new bound sees p or a later value.
func (t *throttleLayer) publish(p float64) {
	t.pubP.Store(math.Float64bits(p))
	t.pubUntil.Store(t.w.Steady())
}

// ThrottleSnapshot is a host's client-side throttle, as Snapshot reports it.
type ThrottleSnapshot struct {
	// Requests and Accepts are the counts over the window.
	Requests, Accepts int64
	// Probability is the chance a request is refused now.
	Probability float64
	// Shadow reports shadow mode (Throttle.Shadow), and WouldReject how
	// many requests it would have refused and sent instead.
	Shadow      bool
	WouldReject uint64
	// Refused is how many requests it has refused since the throttle was
	// built (see Transport.Update for what rebuilds it).
	Refused uint64
}

// snapshot is the throttle's piece of Snapshot.
func (t *throttleLayer) snapshot() *ThrottleSnapshot {
	t.mu.Lock()
	c := t.w.Sum(time.Now().UnixNano())
	t.mu.Unlock()
	return &ThrottleSnapshot{Requests: c[thRequests], Accepts: c[thAccepts], Probability: t.probability(c),
		Shadow: t.shadow, WouldReject: t.wouldReject.Load(), Refused: t.refused.Load()}
}

// keepFrom takes the counts of prev, the old stack's throttle (nil: none),
// when it was built for the same Throttle policy.
func (t *throttleLayer) keepFrom(prev *throttleLayer) {
	if prev != nil && reflect.DeepEqual(prev.policy, t.policy) {
		t.throttleCounts = prev.throttleCounts
	}
}

// show hands Snapshot the throttle's state (shower).
func (t *throttleLayer) show(put func(any)) { put(t.snapshot()) }
