package bulwark

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bulwark-http/bulwark/internal/peers"
	"github.com/bulwark-http/bulwark/internal/window"
	"github.com/bulwark-http/bulwark/internal/wire"
)

// Fleet shares per-host state between the processes (pods) that call the
// same upstreams, so that they act as one: breaker counts and trips, 429
// and 503 pauses, and retry-budget counts. Set it as Config.Fleet;
// bulwark's redisfleet module implements it over Redis, and the core never
// imports a store's client.
//
// Nothing on the request path waits on a Fleet: updates go to a bounded
// queue without blocking (full, they are dropped and counted in
// FleetSnapshot.Dropped), one goroutine of the Transport's calls Publish,
// another runs Receive, and Transport.Close stops both. If the store is
// down, slow or partitioned, each pod keeps its own local decisions.
//
// Counts are added up, verdicts weighed: the fleet trips after about
// MinCalls failed calls fleet-wide, but another pod's trip or pause binds
// a pod only while no recent answer of its own from the host contradicts
// it, and never longer, or with fewer ways out, than the same verdict
// reached from its own answers. A pod's own DNS and dial failures are
// left out of what it publishes. So one pod whose path is broken cannot
// black out the fleet, while a host down for everyone is still cut off.
// See docs/design.md, "The fleet".
//
// A rate-limit quota for the whole fleet (Bulkhead.FleetRate) also needs
// FleetLeaser. Implementations must be safe for concurrent use by the two
// goroutines.
type Fleet interface {
	// Publish shares one update with the other pods. It is called from a
	// single goroutine, never on the request path, with a context that
	// bounds it (fleetOpTimeout); an error is counted and logged once per
	// outage. A FleetBreakerCounts update need not be kept: it is stale
	// after fleetCountsFor anyway.
	Publish(ctx context.Context, u FleetUpdate) error
	// Receive delivers what the other pods publish to sink until ctx is
	// done or the connection fails; it returns the reason. It should call
	// sink.Connected once it is receiving, and first hand the sink the
	// state the store still holds, so a pod that starts late or reconnects
	// catches up. The Transport calls it again, after a backoff, when it
	// returns before ctx is done. A pod's own updates must be left out
	// (redisfleet does so by its ID): its own counts would count twice.
	// The Fleet sets FleetUpdate.From to the publishing pod's identity.
	Receive(ctx context.Context, sink *FleetSink) error
}

// FleetKind is what a FleetUpdate says.
type FleetKind uint8

const (
	// FleetBreakerOpen says a pod's breaker for Host tripped and holds
	// until Until.
	FleetBreakerOpen FleetKind = iota + 1
	// FleetPushback says Host answered a pod with 429 or 503 and a
	// Retry-After that ends at Until.
	FleetPushback
	// FleetBreakerCounts is a pod's closed breaker window for Host:
	// Calls, Failures and Slow, without the failures that were the pod's
	// own (see Fleet).
	FleetBreakerCounts
	// FleetBudgetCounts is a pod's retry-budget window for Host: Calls
	// and Retries.
	FleetBudgetCounts
	// FleetBreakerClosed says the pod From, whose own trip of Generation
	// held Host open (its FleetBreakerOpen), closed its breaker again: its
	// half-open round succeeded. A pod that holds the host open by that
	// very verdict ends the hold; any other hold stands. Until is only how
	// long the news is worth passing on (a few seconds).
	FleetBreakerClosed
)

// String returns "breaker-open", "pushback", "breaker-counts",
// "budget-counts" or "breaker-closed".
func (k FleetKind) String() string {
	switch k {
	case FleetBreakerOpen:
		return "breaker-open"
	case FleetPushback:
		return "pushback"
	case FleetBreakerCounts:
		return "breaker-counts"
	case FleetBudgetCounts:
		return "budget-counts"
	case FleetBreakerClosed:
		return "breaker-closed"
	}
	return "fleet-kind(" + strconv.Itoa(int(k)) + ")"
}

// FleetUpdate is one piece of per-host state shared through a Fleet.
type FleetUpdate struct {
	Kind FleetKind
	// Host is the "host:port", as errors and Snapshot spell it. State is
	// shared by host:port, whatever the scheme.
	Host string
	// Until is when the open time or pause ends. Pods compare it against
	// their own clocks, so clock skew between pods shortens or lengthens a
	// shared hold by the skew; the receiving side caps it (MaxOpenFor,
	// Retry.MaxRetryAfter) either way.
	Until time.Time
	// Generation is, for a breaker verdict, the publisher's trips in a row
	// (1 for a first trip): what its open time doubled from; for
	// FleetBreakerClosed, that of the trip it closed after.
	Generation uint64
	// Shed, for a pushback, says the pause is a Shedder's refusal of
	// Priority (and less important priorities); otherwise it pauses every
	// request to the host.
	Shed     bool
	Priority Priority
	// Calls, Failures and Slow are, for FleetBreakerCounts, what the
	// publisher's window holds; Calls and Retries, for FleetBudgetCounts,
	// what its retry budget's window holds.
	Calls, Failures, Slow, Retries int64
	// From names the publishing pod, as the Fleet knows it (at most 64
	// bytes); receiving pods keep one set of counts per From.
	From string
}

// fleetProbeGrace is how much longer than the pod that tripped the others
// may hold a verdict (within their own open time): time for its probes to
// fail and its next verdict to arrive.
const fleetProbeGrace = time.Second

// fleetClosedFor is how long a FleetBreakerClosed is worth delivering: the
// hold it ends is adopted from a verdict published the same way, so a
// close that takes longer than this to arrive was lost with the store, and
// the hold ends by its own time. A store may drop an update whose Until
// has passed before it publishes it.
const fleetClosedFor = 5 * time.Second

// maxFleetHold is the longest hold a fleet update may ask for: past it the
// update is ignored as hostile or broken, not capped (as for Retry-After).
const maxFleetHold = wire.MaxRetryAfter

// fleetQueue bounds the updates waiting to be published: trips and pauses
// are rare, so a full queue means the store is far behind, and newer
// updates are dropped rather than blocking a request.
const fleetQueue = 256

// fleetOpTimeout bounds one Publish.
const fleetOpTimeout = time.Second

// Backoff between Receive attempts while the store is unreachable.
const (
	fleetMinBackoff = 50 * time.Millisecond
	fleetMaxBackoff = 2 * time.Second
)

// fleetCountsFor is how long a pod's published counts count in the
// others' decisions: long enough to span a burst of failures across the
// fleet, short enough that an old burst does not trip a breaker later.
const fleetCountsFor = 10 * time.Second

// fleetFresh is how long a success of this pod's own contradicts another
// pod's trip or pause (while no failure came after it): as long as counts
// count.
const fleetFresh = fleetCountsFor

// maxFleetPeers bounds the pods whose counts a breaker keeps.
const maxFleetPeers = peers.Max

// maxBudgetCount bounds the calls or retries a FleetBudgetCounts update
// may claim: ten million in a window is past any host's traffic, and a
// larger claim is hostile or broken.
const maxBudgetCount = 10_000_000

// maxFleetPending bounds the updates kept for hosts this process has not
// called yet, applied when it first does.
const maxFleetPending = 1024

// FleetSnapshot is the health of the Transport's link to its Fleet, as
// Snapshot reports it.
type FleetSnapshot struct {
	// Connected says Receive is running and said it was receiving.
	Connected bool
	// LastError is the last error from Publish or Receive, and when; empty
	// when there has been none.
	LastError   string
	LastErrorAt time.Time
	// Published counts updates published; PublishErrors those Publish
	// failed; Dropped those dropped because the queue was full.
	Published, PublishErrors, Dropped uint64
	// Received counts updates handed to the sink; Applied those that
	// changed a local hold or pause (or were kept for a host not called
	// yet); Ignored those refused as invalid (by the sink, or reported
	// through FleetSink.Invalid by the Fleet): a growing count means
	// something writes garbage where the fleet's state lives.
	Received, Applied, Ignored uint64
	// Declined counts the trips of other pods that a host's breaker
	// weighed and did not adopt: its own latest call, or a third pod's,
	// was answered (see Fleet). A growing count beside another pod's
	// trips is that pod's own path failing, not the host.
	Declined uint64
}

// fleetLink is a Transport's side of its Fleet: the queue, the
// goroutines (publish, receive, and with a FleetLeaser renew leases) and
// the counters. The layers that share state reach it through
// fleetPublisher and leaseLink, and it reaches them through fleetMember
// and countsSource, reading none of their fields.
type fleetLink struct {
	f      Fleet
	logger *slog.Logger
	hosts  fleetMember // the Transport's hosts, to which the sink applies updates
	out    chan FleetUpdate
	dirty  chan countsSource // breakers and budgets whose counts are to be published
	sink   FleetSink

	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once

	connected atomic.Bool
	// roundOK says the current Receive said it was receiving, so the
	// next one starts from the shortest backoff.
	roundOK   atomic.Bool
	unhealthy atomic.Bool // logged as down, not yet as back

	published, publishErrs, dropped atomic.Uint64
	received, applied, ignored      atomic.Uint64
	declinedN                       atomic.Uint64

	errMu     sync.Mutex
	lastErr   string
	lastErrAt time.Time

	pendMu  sync.Mutex
	pending map[fleetKey]FleetUpdate // at most maxFleetPending

	quotas fleetQuotas // Bulkhead.FleetRate's leases
}

// fleetKey is what one update overwrites: a kind of state of one host.
type fleetKey struct {
	kind     FleetKind
	host     string
	shed     bool
	priority Priority
}

// newFleetLink starts the goroutines of a link to f, or returns nil when
// f is nil. Updates received are applied through hosts; the link's own
// troubles are logged to logger.
func newFleetLink(f Fleet, logger *slog.Logger, hosts fleetMember) *fleetLink {
	if f == nil {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &fleetLink{f: f, logger: logger, hosts: hosts, out: make(chan FleetUpdate, fleetQueue), dirty: make(chan countsSource, fleetQueue), cancel: cancel,
		pending: make(map[fleetKey]FleetUpdate)}
	l.sink.l = l
	l.wg.Add(2)
	go l.publishLoop(ctx)
	go l.receiveLoop(ctx)
	if lr, ok := f.(FleetLeaser); ok {
		l.quotas = fleetQuotas{leaser: lr, kick: make(chan struct{}, 1), m: make(map[string]leaseHolder)}
		l.wg.Add(1)
		go l.leaseLoop(ctx)
	}
	return l
}

// close stops the link's goroutines and waits for them (Transport.Close);
// nil-safe, and calling it again does nothing.
func (l *fleetLink) close() {
	if l == nil {
		return
	}
	l.once.Do(func() {
		l.cancel()
		l.wg.Wait()
	})
}

// fleetMember is what shares state through the fleet: a layer of a host
// (breaker, pushback, retry budget), a host (its layers), or the
// Transport (its hosts). applyFleet applies an update another pod
// published, already validated and capped (FleetSink.Apply), and reports
// whether it changed anything; a member ignores the kinds that are not
// its own.
type fleetMember interface {
	applyFleet(u FleetUpdate, now time.Time) bool
}

// fleetPublisher is the link as a layer sees it: where the layer hands
// what it shares, without blocking. A layer holds a nil one when there
// is no Fleet, and for a route's layers, which stay local.
type fleetPublisher interface {
	// publish queues u for the other pods.
	publish(u FleetUpdate)
	// countsChanged queues the source's counts, coalesced (see
	// fleetLink.countsChanged).
	countsChanged(b countsSource)
	// declined counts a trip another pod published that the layer
	// weighed and did not adopt (FleetSnapshot.Declined).
	declined()
}

// publisher returns l as a layer's fleetPublisher: nil when l is nil, so
// that a layer can tell there is no Fleet.
func (l *fleetLink) publisher() fleetPublisher {
	if l == nil {
		return nil
	}
	return l
}

// publish hands u to the publisher without blocking; nil-safe.
func (l *fleetLink) publish(u FleetUpdate) {
	if l == nil {
		return
	}
	select {
	case l.out <- u:
	default:
		l.dropped.Add(1)
	}
}

func (l *fleetLink) declined() {
	if l != nil {
		l.declinedN.Add(1)
	}
}

// countsSource is a window whose counts the fleet shares: a host's
// breaker, or its retry budget.
type countsSource interface {
	// counts is the update that publishes the window as it is now.
	counts() FleetUpdate
	// countsQueued is the source's flag that its counts wait in the
	// queue: set by countsChanged, cleared when they are read.
	countsQueued() *atomic.Bool
}

// countsChanged queues b's counts for publishing, unless they already
// wait: the update sent reads the window when it goes, so one queued per
// host is enough however many calls count meanwhile. Under the source's
// locks: the hand-off does not block.
func (l *fleetLink) countsChanged(b countsSource) {
	if l == nil || !b.countsQueued().CompareAndSwap(false, true) {
		return
	}
	select {
	case l.dirty <- b:
	default:
		b.countsQueued().Store(false)
		l.dropped.Add(1)
	}
}

func (l *fleetLink) publishLoop(ctx context.Context) {
	defer l.wg.Done()
	for {
		var u FleetUpdate
		select {
		case <-ctx.Done():
			return
		case b := <-l.dirty:
			b.countsQueued().Store(false)
			u = b.counts()
		case u = <-l.out:
		}
		pctx, cancel := context.WithTimeout(ctx, fleetOpTimeout)
		err := l.f.Publish(pctx, u)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			l.publishErrs.Add(1)
			l.fail(err)
			continue
		}
		l.published.Add(1)
		l.recovered()
	}
}

func (l *fleetLink) receiveLoop(ctx context.Context) {
	defer l.wg.Done()
	backoff := fleetMinBackoff
	for ctx.Err() == nil {
		l.roundOK.Store(false)
		err := l.f.Receive(ctx, &l.sink)
		l.connected.Store(false)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			err = errors.New("bulwark: Fleet.Receive returned")
		}
		l.fail(err)
		if l.roundOK.Load() {
			backoff = fleetMinBackoff
		}
		tm := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			tm.Stop()
			return
		case <-tm.C:
		}
		backoff = min(2*backoff, fleetMaxBackoff)
	}
}

// fail records err and logs the first error of an outage.
func (l *fleetLink) fail(err error) {
	now := time.Now()
	l.errMu.Lock()
	l.lastErr, l.lastErrAt = err.Error(), now
	l.errMu.Unlock()
	if l.unhealthy.CompareAndSwap(false, true) {
		l.logger.Warn("bulwark: fleet unreachable, using local state only", "error", err)
	}
}

// recovered logs the end of an outage.
func (l *fleetLink) recovered() {
	if l.unhealthy.CompareAndSwap(true, false) {
		l.logger.Info("bulwark: fleet reachable again")
	}
}

func (l *fleetLink) snapshot() *FleetSnapshot {
	if l == nil {
		return nil
	}
	s := &FleetSnapshot{
		Connected: l.connected.Load(),
		Published: l.published.Load(), PublishErrors: l.publishErrs.Load(), Dropped: l.dropped.Load(),
		Received: l.received.Load(), Applied: l.applied.Load(), Ignored: l.ignored.Load(),
		Declined: l.declinedN.Load(),
	}
	l.errMu.Lock()
	s.LastError, s.LastErrorAt = l.lastErr, l.lastErrAt
	l.errMu.Unlock()
	return s
}

// FleetSink is where a Fleet's Receive hands what it received. Its methods
// are safe for concurrent use and never block on requests.
type FleetSink struct{ l *fleetLink }

// Connected tells the Transport that Receive is receiving (Snapshot shows
// it, and an outage logged as begun is logged as over).
func (s *FleetSink) Connected() {
	s.l.connected.Store(true)
	s.l.roundOK.Store(true)
	s.l.recovered()
}

// Invalid counts a value the Fleet read from its store and could not
// accept (corrupt, hostile, from an unknown version); it shows in
// FleetSnapshot.Ignored.
func (s *FleetSink) Invalid(error) { s.l.ignored.Add(1) }

// Apply validates u and applies it to this process's state for u.Host, or
// keeps it for when the host is first called. An invalid update (unknown
// kind or priority, a host that is not "host:port", a hold past a day) is
// ignored and counted. A valid hold is capped by the host's policy
// (Breaker.MaxOpenFor, Retry.MaxRetryAfter). An update whose time has
// passed changes nothing.
func (s *FleetSink) Apply(u FleetUpdate) {
	l := s.l
	l.received.Add(1)
	now := time.Now()
	if !validFleetUpdate(u, now) {
		l.ignored.Add(1)
		return
	}
	if !u.Until.After(now) {
		return
	}
	if u.Kind == FleetBreakerCounts || u.Kind == FleetBudgetCounts {
		// Counts matter only to a host in use: nothing is kept for later.
		// They count for fleetCountsFor at most.
		if cap := now.Add(fleetCountsFor); u.Until.After(cap) {
			u.Until = cap
		}
		if l.hosts.applyFleet(u, now) {
			l.applied.Add(1)
		}
		return
	}
	if u.Kind == FleetBreakerClosed {
		// Nothing kept: it ends what is kept. A host first called later
		// must not adopt the hold it ended (attach replays pending).
		dropped := l.dropPendingOpen(u)
		if l.hosts.applyFleet(u, now) || dropped {
			l.applied.Add(1)
		}
		return
	}
	// Kept before the hosts are looked at, so that a host created
	// meanwhile finds it (attach runs under the Transport's lock, after
	// the host is in its map).
	applied := l.keepPending(u, now)
	l.hosts.applyFleet(u, now)
	if applied {
		l.applied.Add(1)
	}
}

// keepPending keeps the hold u for a host first called later, unless one
// of its kind that lasts as long is kept already or the store is full of
// holds still in force; it reports whether u was kept.
func (l *fleetLink) keepPending(u FleetUpdate, now time.Time) bool {
	k := fleetKey{kind: u.Kind, host: u.Host, shed: u.Shed, priority: u.Priority}
	l.pendMu.Lock()
	defer l.pendMu.Unlock()
	if len(l.pending) >= maxFleetPending {
		for pk, pu := range l.pending {
			if !pu.Until.After(now) {
				delete(l.pending, pk)
			}
		}
	}
	if old, ok := l.pending[k]; ok || len(l.pending) < maxFleetPending {
		if !ok || u.Until.After(old.Until) {
			l.pending[k] = u
			return true
		}
	}
	return false
}

// dropPendingOpen forgets the hold kept for a host not called yet when it
// is the verdict the close c ends: the same pod's trip of the same
// generation. A longer hold kept from another pod stays.
func (l *fleetLink) dropPendingOpen(c FleetUpdate) bool {
	k := fleetKey{kind: FleetBreakerOpen, host: c.Host}
	l.pendMu.Lock()
	defer l.pendMu.Unlock()
	if u, ok := l.pending[k]; ok && u.From == c.From && u.Generation == c.Generation {
		delete(l.pending, k)
		return true
	}
	return false
}

func validFleetUpdate(u FleetUpdate, now time.Time) bool {
	switch {
	case !validFleetKind(u):
		return false
	case len(u.Host) == 0 || len(u.Host) > 300:
		return false
	case u.Until.After(now.Add(maxFleetHold)):
		return false
	case u.Priority >= NumPriorities:
		return false
	}
	h, p, err := net.SplitHostPort(u.Host)
	return err == nil && h != "" && p != ""
}

// validFleetKind is validFleetUpdate's part for u's kind and what that
// kind carries: a known kind, and a sender and counts in bounds.
func validFleetKind(u FleetUpdate) bool {
	from := u.From != "" && len(u.From) <= 64
	switch u.Kind {
	case FleetBreakerOpen, FleetPushback:
		return true
	case FleetBreakerClosed:
		return from && u.Generation != 0
	case FleetBreakerCounts:
		return from && inRange(u.Calls, window.MaxCalls) && inRange(u.Failures, u.Calls) && inRange(u.Slow, u.Calls)
	case FleetBudgetCounts:
		return from && inRange(u.Calls, maxBudgetCount) && inRange(u.Retries, maxBudgetCount)
	}
	return false
}

// inRange reports whether 0 ≤ n ≤ hi.
func inRange(n, hi int64) bool { return n >= 0 && n <= hi }

// attach applies to a new host, named host, what the fleet said of it
// before this process called it. The Transport calls it under its lock,
// after the host is in its map. (The host's breaker and pushback layers
// got the link when compose built them; a route's breaker has none: the
// fleet shares per-host state.)
func (l *fleetLink) attach(host string, hs fleetMember) {
	if l == nil {
		return
	}
	now := time.Now()
	l.pendMu.Lock()
	var ups []FleetUpdate
	for k, u := range l.pending {
		if k.host == host && u.Until.After(now) {
			ups = append(ups, u)
		}
	}
	l.pendMu.Unlock()
	for _, u := range ups {
		hs.applyFleet(u, now)
	}
}

// Quotas by lease: the contract a store implements (FleetLeaser), and the
// link's lease loop, which renews each host's quota (fleetquota.go)
// through leaseHolder.

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

// fleetQuotas is a link's quotas, by host: what its lease loop renews.
type fleetQuotas struct {
	leaser FleetLeaser // nil: the Fleet leases nothing
	kick   chan struct{}
	mu     sync.Mutex
	m      map[string]leaseHolder
}

// leaseHolder is a host's share of a fleet quota as the lease loop sees
// it (the bulkhead's fleetQuota, fleetquota.go).
type leaseHolder interface {
	// lastUse is when the quota was last taken from, in unix
	// nanoseconds: an idle quota is not renewed, and in the end
	// forgotten.
	lastUse() int64
	// forget marks it dropped from the renewals; revive unmarks it and
	// reports whether it was marked, so that its next use puts it back
	// (fleetLink.keepLease).
	forget()
	revive() bool
	// ask is its next LeaseRequest, at now.
	ask(now time.Time) LeaseRequest
	// grant records tokens (at most want, the ask's) granted at got, with
	// the pods the store counted; leaseFailed records a Lease that failed.
	grant(tokens, want, pods int64, got time.Time)
	leaseFailed()
}

// leaseLink is the link as a fleet quota sees it: where it is registered
// for renewals, put back after it was forgotten, and asks for an early
// renewal. Nil when the Fleet leases nothing.
type leaseLink interface {
	// lease calls f under the registry's lock with the quota held for
	// host (nil if none) and keeps what f returns.
	lease(host string, f func(held leaseHolder) leaseHolder)
	keepLease(host string, h leaseHolder)
	kickLease()
}

// leasing returns l as a quota's leaseLink: nil when there is no Fleet
// or it leases nothing.
func (l *fleetLink) leasing() leaseLink {
	if l == nil || l.quotas.leaser == nil {
		return nil
	}
	return l
}

func (l *fleetLink) lease(host string, f func(held leaseHolder) leaseHolder) {
	l.quotas.mu.Lock()
	defer l.quotas.mu.Unlock()
	l.quotas.m[host] = f(l.quotas.m[host])
}

// keepLease puts back a quota the renewals forgot, now used again.
func (l *fleetLink) keepLease(host string, h leaseHolder) {
	l.quotas.mu.Lock()
	if h.revive() {
		if _, ok := l.quotas.m[host]; !ok {
			l.quotas.m[host] = h
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
	qs := make([]leaseHolder, 0, len(l.quotas.m))
	for h, q := range l.quotas.m {
		switch idle := now.UnixNano() - q.lastUse(); {
		case idle > int64(leaseForget):
			q.forget()
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
		r := q.ask(now)
		g, err := l.quotas.leaser.Lease(rctx, r)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			q.leaseFailed()
			l.fail(err)
			continue
		}
		// What the store said is untrusted: never more than asked.
		tokens := min(max(g.Tokens, 0), r.Want)
		pods := int64(min(max(g.Pods, 1), maxFleetPeers))
		q.grant(tokens, r.Want, pods, time.Now())
		l.recovered()
	}
}
