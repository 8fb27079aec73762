package bulwark

import (
	"sync/atomic"
	"time"

	"github.com/bulwark-http/bulwark/internal/window"
)

// maxBudgetCount bounds the calls or retries a FleetBudgetCounts update
// may claim: ten million in a window is past any host's traffic, and a
// larger claim is hostile or broken.
const maxBudgetCount = 10_000_000

// fleetBudgetAnswer is how often, at most, a pod that calls a host but
// does not retry publishes its budget counts while other pods' arrive: so
// that its calls, which give the fleet's ratio its room, count too,
// without a healthy host costing a publish per call.
const fleetBudgetAnswer = time.Second

// shareCounts queues the budget's counts for the fleet. Under b.mu: the
// hand-off does not block.
func (b *retryBudget) shareCounts(now time.Time) {
	if b.fleet == nil {
		return
	}
	b.published.Store(now.UnixNano())
	b.fleet.countsChanged(b)
}

func (b *retryBudget) countsQueued() *atomic.Bool { return &b.queued }

// counts is the update that publishes the budget's window as it is now.
func (b *retryBudget) counts() FleetUpdate {
	now := time.Now()
	b.mu.Lock()
	s := b.win.Sum(now.UnixNano())
	b.mu.Unlock()
	return FleetUpdate{Kind: FleetBudgetCounts, Host: b.host, Until: now.Add(min(fleetCountsFor, b.span)),
		Calls: s[budgetCalls], Retries: s[budgetRetries]}
}

// adoptCounts keeps another pod's budget window, valid at most for this
// budget's window, and answers with this pod's own calls, at most every
// fleetBudgetAnswer, if it has any.
func (b *retryBudget) adoptCounts(u FleetUpdate, now time.Time) bool {
	var c window.Counts
	c[budgetCalls], c[budgetRetries] = u.Calls, u.Retries
	until := u.Until // at most fleetCountsFor from now (FleetSink.Apply)
	if cap := now.Add(b.span); until.After(cap) {
		until = cap
	}
	ok := b.peers.Set(u.From, c, until, now)
	if now.UnixNano()-b.published.Load() >= int64(fleetBudgetAnswer) {
		b.mu.Lock()
		own := b.win.Sum(now.UnixNano())
		if own[budgetCalls] > 0 {
			b.shareCounts(now)
		}
		b.mu.Unlock()
	}
	return ok
}
