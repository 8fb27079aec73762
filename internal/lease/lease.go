// Package lease keeps one process's share of a fleet-wide quota: tokens a
// lease granted, spent locally until the lease ends, and the demand that
// sizes the next lease. The idea is Doorman's (YouTube's global rate
// limiter): capacity is handed out ahead of need for a short time, so a
// request spends a token with an atomic decrement and never waits on the
// store that grants them.
package lease

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Pool is the tokens of the leases in force. Take is safe for concurrent
// use and lock-free; Grant and Want are called by the one goroutine that
// renews the lease. The zero Pool holds no lease.
type Pool struct {
	tokens atomic.Int64
	until  atomic.Int64 // unix nanoseconds the tokens may be spent until; 0: never leased
	asked  atomic.Int64 // Take calls since the last Want: the demand

	mu   sync.Mutex // Want's state
	last int64      // when Want last ran, unix nanoseconds
	rate float64    // demand estimate, takes a second
}

// Take spends one token at now (unix nanoseconds). ok says it got one;
// valid says a lease is in force, so that !ok && valid means the quota is
// spent for now, and !valid that there is no lease to judge by (none yet,
// or the last one ended).
func (p *Pool) Take(now int64) (ok, valid bool) {
	p.asked.Add(1)
	if now >= p.until.Load() {
		return false, false
	}
	// Bounded: each failed swap means another Take spent a token, and
	// there are finitely many.
	for {
		n := p.tokens.Load()
		if n <= 0 {
			return false, true
		}
		if p.tokens.CompareAndSwap(n, n-1) {
			return true, true
		}
	}
}

// Grant adds n tokens, to be spent before until (unix nanoseconds), at
// now. Tokens of a lease that has ended are void, not carried over; those
// still in force are, and their time extends to until. A grant of zero
// tokens still says the quota is spent until then.
func (p *Pool) Grant(n, until, now int64) {
	n = max(n, 0)
	if now >= p.until.Load() {
		p.tokens.Store(n)
	} else {
		p.tokens.Add(n)
	}
	if until > p.until.Load() {
		p.until.Store(until)
	}
}

// Tokens is what is left to spend at now, 0 when no lease is in force.
func (p *Pool) Tokens(now int64) int64 {
	if now >= p.until.Load() {
		return 0
	}
	return max(p.tokens.Load(), 0)
}

// Until is when the leases in force end (unix nanoseconds), 0 if never.
func (p *Pool) Until() int64 { return p.until.Load() }

// Demand is the demand estimate, in takes a second, as the last Want saw it.
func (p *Pool) Demand() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rate
}

// Want is how many tokens to ask for at now so that the pool covers ahead
// of demand: the demand since the last call (a moving average, half the
// weight on the newest interval, so a surge is followed within two
// renewals) times ahead, less the tokens in force, at most limit. Zero
// when nothing was asked for lately.
func (p *Pool) Want(now int64, ahead time.Duration, limit int64) int64 {
	n := p.asked.Swap(0)
	p.mu.Lock()
	dt := now - p.last
	if p.last == 0 || dt > int64(time.Minute) {
		dt = int64(ahead) // the first interval: take its length as ahead's
	}
	dt = max(dt, int64(time.Millisecond))
	p.last = now
	r := float64(n) / (float64(dt) / float64(time.Second))
	if p.rate == 0 {
		p.rate = r
	} else {
		p.rate = (p.rate + r) / 2
	}
	rate := p.rate
	p.mu.Unlock()
	if rate < 1e-3 {
		return 0
	}
	w := int64(math.Ceil(rate*ahead.Seconds())) - p.Tokens(now)
	return min(max(w, 0), limit)
}
