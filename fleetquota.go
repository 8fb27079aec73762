package bulwark

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bulwark-http/bulwark/internal/lease"
	"golang.org/x/time/rate"
)

// FleetLeaser is what a Fleet implements, besides Fleet, to share a
// rate-limit quota among the processes (Bulkhead.FleetRate): the store
// keeps one token bucket per host for the fleet, filling at the quota's
// rate, and each Lease takes up to Want tokens from it for the process
// that asks. The Transport asks from a goroutine of its own, a little
// ahead of need (every leaseEvery, for the demand of the next
// leaseAhead), so the request path only ever spends tokens it already has.
//
// The tokens of a lease may be spent for leaseFor after it was granted,
// by the asking process's clock; unspent, they are lost rather than kept,
// so a process that stops asking cannot send a burst of old tokens later.
// Over any stretch of time T the fleet is therefore granted at most
// Rate × T + Burst tokens, and sends them within leaseFor of the grant.
// Local answers come on top: before a process's first lease, while the
// store is unreachable, and while a renewal catches up with a surge of
// demand the store had room for, a process sends at its share of the
// quota (Rate / Pods); the last lasts one renewal at most, since a store
// that had no room for the surge grants less than asked and from then on
// the process refuses.
//
// Implementations must be safe for concurrent use.
type FleetLeaser interface {
	// Lease takes up to r.Want tokens from the fleet's bucket for r.Host.
	// It is called from one goroutine, with a context that bounds it; an
	// error makes the process answer locally until a Lease succeeds.
	Lease(ctx context.Context, r LeaseRequest) (LeaseGrant, error)
}

// LeaseRequest is one process's ask for tokens of a fleet quota.
type LeaseRequest struct {
	// Host is the "host:port" whose quota it is.
	Host string
	// Rate is the quota, in requests a second for the whole fleet, and
	// Burst the fleet bucket's size: what it may grant at once after a
	// quiet spell. Every process sends its own; processes configured
	// alike send the same.
	Rate  float64
	Burst int64
	// Want is how many tokens the process would spend before its next
	// ask, at least 0 (0 still renews its place among the processes).
	Want int64
}

// LeaseGrant is what a Lease granted.
type LeaseGrant struct {
	// Tokens granted, 0 ≤ Tokens ≤ Want.
	Tokens int64
	// Pods is how many processes asked for this quota lately, at least 1:
	// a process's fair share while the store is unreachable is Rate/Pods.
	Pods int
}

// The lease timings: renewals every leaseEvery, each sized for leaseAhead
// of demand, their tokens valid for leaseFor. leaseAhead covers a renewal
// late by a round trip or two; leaseFor lets a late renewal land before
// the tokens in hand run out, and bounds how late a token may be spent.
const (
	leaseEvery = 100 * time.Millisecond
	leaseAhead = 3 * leaseEvery
	leaseFor   = 5 * leaseEvery
	// leaseBurstFor is the fleet bucket's size, in seconds of the quota:
	// two renewals' worth, so a quiet fleet's first asks are met at once
	// without letting it burst far above the quota.
	leaseBurstFor = 2 * leaseEvery
	// leaseKickGap is the shortest time between two renewals.
	leaseKickGap = leaseEvery / 4
	// leaseIdle is how long a quota nobody takes from stays renewed.
	leaseIdle = time.Second
	// leaseForget is how long an unused quota is kept at all.
	leaseForget = time.Minute
	// maxFleetRate bounds Bulkhead.FleetRate (a million a second), so the
	// bucket's arithmetic stays exact in a float64 and in a Lua number.
	maxFleetRate = 1_000_000
)

// fleetQuota is a process's side of one host's fleet quota, shared by the
// host's bulkheads (its own, or every instance's when balanced) and kept
// across Update.
type fleetQuota struct {
	host       string
	rate       atomic.Uint64 // math.Float64bits of FleetRate
	failClosed atomic.Bool
	pool       lease.Pool

	failing  atomic.Bool  // the last Lease failed
	short    atomic.Bool  // the last Lease granted less than it asked for
	leased   atomic.Bool  // a Lease has succeeded once
	pods     atomic.Int64 // from the last grant
	lastUsed atomic.Int64 // unix nanoseconds, coarse (touchEvery)
	gone     atomic.Bool  // forgotten by the link: a take puts it back

	// fallback is the local answer while there is no lease to judge by:
	// FleetRate / pods a second, one at a time.
	fallback *rate.Limiter

	leases, leaseErrors, granted, refused, local atomic.Uint64
	link                                         *fleetLink
}

// take spends a token of the fleet's quota at now, or reports that the
// request should be refused. hasLocal says the bulkhead has a Rate of its
// own, which then is the local answer.
func (q *fleetQuota) take(now time.Time, hasLocal bool) bool {
	ns := now.UnixNano()
	if ns-q.lastUsed.Load() > int64(touchEvery) {
		q.lastUsed.Store(ns)
		if q.gone.Load() {
			q.link.keepQuota(q)
		}
	}
	ok, valid := q.pool.Take(ns)
	if ok {
		return true
	}
	if valid && !q.failing.Load() {
		if q.short.Load() {
			// The store granted less than asked: the fleet's quota is
			// spent for now.
			q.refused.Add(1)
			return false
		}
		// The store had room, demand outran the last ask: ask again
		// now, and meanwhile send at this process's share.
		q.link.kickLease()
		return q.answerLocally(now, false)
	}
	if !valid {
		q.link.kickLease() // demand and no lease: ask now, not at the next tick
	}
	// No lease to judge by: none yet, or the store is unreachable.
	if q.failClosed.Load() {
		q.refused.Add(1)
		return false
	}
	return q.answerLocally(now, hasLocal)
}

// answerLocally is the answer without a token: the bulkhead's own Rate
// when it has one (applied after this), else this process's share.
func (q *fleetQuota) answerLocally(now time.Time, hasLocal bool) bool {
	if hasLocal || q.fallback.AllowN(now, 1) {
		q.local.Add(1)
		return true
	}
	q.refused.Add(1)
	return false
}

func (q *fleetQuota) fleetRate() float64 { return math.Float64frombits(q.rate.Load()) }

// setPolicy applies a host's (possibly updated) Bulkhead policy.
func (q *fleetQuota) setPolicy(p Bulkhead) {
	q.rate.Store(math.Float64bits(p.FleetRate))
	q.failClosed.Store(p.FleetFailClosed)
	q.fallback.SetLimit(rate.Limit(p.FleetRate / float64(max(1, q.pods.Load()))))
}

// burst is the fleet bucket's size for the quota.
func (q *fleetQuota) burst() int64 { return leaseBurst(q.fleetRate()) }

func leaseBurst(rate float64) int64 { return max(1, int64(math.Ceil(rate*leaseBurstFor.Seconds()))) }

// QuotaSnapshot is a host's fleet quota (Bulkhead.FleetRate) as this
// process sees it, in Snapshot.
type QuotaSnapshot struct {
	// FleetRate is the quota, in requests a second for the fleet.
	FleetRate float64
	// Tokens is what this process holds of it now, until LeaseUntil.
	Tokens     int64
	LeaseUntil time.Time
	// Demand is this process's recent demand, in requests a second, and
	// Pods how many processes shared the quota at the last lease.
	Demand float64
	Pods   int
	// Local says the process answers alone (no lease yet, or the store is
	// unreachable): from Bulkhead.Rate, its last share, or, with
	// FleetFailClosed, by refusing.
	Local bool
	// Leases counts the leases granted and LeaseErrors those that failed;
	// Granted the tokens received; Refused the requests refused for the
	// quota; LocalAnswers the requests sent on a local answer.
	Leases, LeaseErrors, Granted, Refused, LocalAnswers uint64
}

func (q *fleetQuota) snapshot(now time.Time) *QuotaSnapshot {
	ns := now.UnixNano()
	s := &QuotaSnapshot{FleetRate: q.fleetRate(), Tokens: q.pool.Tokens(ns), Demand: q.pool.Demand(),
		Pods: int(q.pods.Load()), Local: q.failing.Load() || !q.leased.Load() || ns >= q.pool.Until(),
		Leases: q.leases.Load(), LeaseErrors: q.leaseErrors.Load(), Granted: q.granted.Load(),
		Refused: q.refused.Load(), LocalAnswers: q.local.Load()}
	if u := q.pool.Until(); u > 0 {
		s.LeaseUntil = time.Unix(0, u)
	}
	return s
}

// fleetQuotas is a link's quotas, by host.
type fleetQuotas struct {
	leaser FleetLeaser // nil: the Fleet leases nothing
	kick   chan struct{}
	mu     sync.Mutex
	m      map[string]*fleetQuota
}

// quota returns the host's quota, made or retuned for p; nil when p has
// none or there is nothing to lease from.
func (l *fleetLink) quota(host string, p Bulkhead) *fleetQuota {
	if l == nil || l.quotas.leaser == nil || p.FleetRate <= 0 {
		return nil
	}
	l.quotas.mu.Lock()
	defer l.quotas.mu.Unlock()
	q := l.quotas.m[host]
	if q == nil {
		q = &fleetQuota{host: host, link: l, fallback: rate.NewLimiter(rate.Limit(p.FleetRate), 1)}
		q.pods.Store(1)
		q.lastUsed.Store(time.Now().UnixNano())
		l.quotas.m[host] = q
	}
	q.setPolicy(p)
	return q
}

// keepQuota puts back a quota the renewals forgot, now used again.
func (l *fleetLink) keepQuota(q *fleetQuota) {
	l.quotas.mu.Lock()
	if q.gone.CompareAndSwap(true, false) {
		if _, ok := l.quotas.m[q.host]; !ok {
			l.quotas.m[q.host] = q
		}
	}
	l.quotas.mu.Unlock()
}

func (l *fleetLink) kickLease() {
	select {
	case l.quotas.kick <- struct{}{}:
	default:
	}
}

func (l *fleetLink) quotaSnapshot(host string) *QuotaSnapshot {
	if l == nil || l.quotas.leaser == nil {
		return nil
	}
	l.quotas.mu.Lock()
	q := l.quotas.m[host]
	l.quotas.mu.Unlock()
	if q == nil {
		return nil
	}
	return q.snapshot(time.Now())
}

// leaseLoop renews the quotas in use, every leaseEvery and whenever a
// request found no lease.
func (l *fleetLink) leaseLoop(ctx context.Context) {
	defer l.wg.Done()
	tk := time.NewTicker(leaseEvery)
	defer tk.Stop()
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
		case <-l.quotas.kick:
			// A kick asks early, but not more often than this: a
			// renewal is a round trip for every quota in use.
			if wait := leaseKickGap - time.Since(last); wait > 0 {
				tm := time.NewTimer(wait)
				select {
				case <-ctx.Done():
					tm.Stop()
					return
				case <-tm.C:
				}
			}
		}
		last = time.Now()
		l.renew(ctx, last)
	}
}

// renew asks for the next lease of every quota in use, one at a time (a
// Lease is a round trip; quotas are few), within one renewal's time.
func (l *fleetLink) renew(ctx context.Context, now time.Time) {
	l.quotas.mu.Lock()
	qs := make([]*fleetQuota, 0, len(l.quotas.m))
	for h, q := range l.quotas.m {
		switch idle := now.UnixNano() - q.lastUsed.Load(); {
		case idle > int64(leaseForget):
			q.gone.Store(true)
			delete(l.quotas.m, h)
		case idle <= int64(leaseIdle):
			qs = append(qs, q)
		}
	}
	l.quotas.mu.Unlock()
	if len(qs) == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, 2*leaseEvery)
	defer cancel()
	for _, q := range qs {
		burst := q.burst()
		want := q.pool.Want(now.UnixNano(), leaseAhead, burst)
		g, err := l.quotas.leaser.Lease(rctx, LeaseRequest{Host: q.host, Rate: q.fleetRate(), Burst: burst, Want: want})
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			q.failing.Store(true)
			q.leaseErrors.Add(1)
			l.fail(err)
			continue
		}
		// What the store said is untrusted: never more than asked.
		tokens := min(max(g.Tokens, 0), want)
		pods := int64(min(max(g.Pods, 1), maxFleetPeers))
		got := time.Now()
		q.pool.Grant(tokens, got.Add(leaseFor).UnixNano(), got.UnixNano())
		q.short.Store(tokens < want)
		q.leases.Add(1)
		q.granted.Add(uint64(tokens))
		if q.pods.Swap(pods) != pods {
			q.fallback.SetLimit(rate.Limit(q.fleetRate() / float64(pods)))
		}
		q.leased.Store(true)
		q.failing.Store(false)
		l.recovered()
	}
}
