package bulwark

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/bulwark-http/bulwark/internal/lease"
	"golang.org/x/time/rate"
)

// fleetQuota is a process's side of one host's fleet quota, shared by the
// host's bulkheads (its own, or every instance's when balanced) and kept
// across Update. The link's lease loop renews it (leaseHolder).
type fleetQuota struct {
	host       string
	rate       atomic.Uint64 // math.Float64bits of FleetRate
	failClosed atomic.Bool
	pool       lease.Pool

	failing  atomic.Bool  // the last Lease failed
	short    atomic.Bool  // the last Lease granted less than it asked for
	leased   atomic.Bool  // a Lease has succeeded once
	pods     atomic.Int64 // from the last grant
	lastUsed atomic.Int64 // unix nanoseconds, coarse (quotaTouchEvery)
	gone     atomic.Bool  // forgotten by the link: a take puts it back

	// fallback is the local answer while there is no lease to judge by:
	// FleetRate / pods a second, one at a time.
	fallback *rate.Limiter

	leases, leaseErrors, granted, refused, local atomic.Uint64
	link                                         leaseLink
}

// quotaTouchEvery is the resolution of a quota's last-used time: far
// finer than the lease loop's idle and forget times (leaseIdle,
// leaseForget), coarse enough that a busy host's quota is not written on
// every request.
const quotaTouchEvery = 10 * time.Millisecond

// newFleetQuota returns the host's quota, made or retuned for p; nil when
// p has none or there is nothing to lease from (link is nil).
func newFleetQuota(link leaseLink, host string, p Bulkhead) *fleetQuota {
	if link == nil || p.FleetRate <= 0 {
		return nil
	}
	var q *fleetQuota
	link.lease(host, func(held leaseHolder) leaseHolder {
		q, _ = held.(*fleetQuota)
		if q == nil {
			q = &fleetQuota{host: host, link: link, fallback: rate.NewLimiter(rate.Limit(p.FleetRate), 1)}
			q.pods.Store(1)
			q.lastUsed.Store(time.Now().UnixNano())
		}
		q.setPolicy(p)
		return q
	})
	return q
}

// take spends a token of the fleet's quota at now, or reports that the
// request should be refused. hasLocal says the bulkhead has a Rate of its
// own, which then is the local answer.
func (q *fleetQuota) take(now time.Time, hasLocal bool) bool {
	ns := now.UnixNano()
	if ns-q.lastUsed.Load() > int64(quotaTouchEvery) {
		q.lastUsed.Store(ns)
		if q.gone.Load() {
			q.link.keepLease(q.host, q)
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

// snapshot is the quota's piece of Snapshot, which the host's bulkheads
// hand on (see bulkheadLayer.snapshot); nil without a quota, and nil while
// the lease loop has forgotten it for want of use (until a take puts it
// back), as it is then no quota the process holds.
func (q *fleetQuota) snapshot(now time.Time) *QuotaSnapshot {
	if q == nil || q.gone.Load() {
		return nil
	}
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

// The lease loop's side of the quota (leaseHolder).

func (q *fleetQuota) lastUse() int64 { return q.lastUsed.Load() }

func (q *fleetQuota) forget() { q.gone.Store(true) }

func (q *fleetQuota) revive() bool { return q.gone.CompareAndSwap(true, false) }

func (q *fleetQuota) ask(now time.Time) LeaseRequest {
	burst := q.burst()
	want := q.pool.Want(now.UnixNano(), leaseAhead, burst)
	return LeaseRequest{Host: q.host, Rate: q.fleetRate(), Burst: burst, Want: want}
}

func (q *fleetQuota) grant(tokens, want, pods int64, got time.Time) {
	q.pool.Grant(tokens, got.Add(leaseFor).UnixNano(), got.UnixNano())
	q.short.Store(tokens < want)
	q.leases.Add(1)
	q.granted.Add(uint64(tokens))
	if q.pods.Swap(pods) != pods {
		q.fallback.SetLimit(rate.Limit(q.fleetRate() / float64(pods)))
	}
	q.leased.Store(true)
	q.failing.Store(false)
}

func (q *fleetQuota) leaseFailed() {
	q.failing.Store(true)
	q.leaseErrors.Add(1)
}
