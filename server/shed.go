package server

import (
	"context"
	"math"
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/bulwark-http/bulwark/internal/fifo"
	"github.com/bulwark-http/bulwark/internal/limit"
	"github.com/bulwark-http/bulwark/internal/wire"
	"go.opentelemetry.io/otel/metric"
)

// A Shedder sets bulwark.NoRetryHeader (defined with the client's retry
// layer, which reads it) to "1" on every 503 it writes.

// numPriorities is bulwark.NumPriorities as an int, for the Shedder's
// arrays and loops.
const numPriorities = int(bulwark.NumPriorities)

// clamp maps an out-of-range priority to the least important one, so that a
// classifier's mistake can never buy a request the critical reserve.
func clamp(p bulwark.Priority) bulwark.Priority { return min(p, bulwark.PriorityTest) }

// DefaultPriority is the Shedder's default classifier:
// bulwark.RequestPriority, the priority bulwark's client also gives the
// request (bulwark.PriorityHeader, then bulwark.WithPriority, then the
// method), so that the client's pushback pauses exactly the priorities a
// Shedder refused.
//
// The header is trusted as sent. A service reachable by callers who should
// not choose their own priority must strip or overwrite it at its edge, or
// configure ShedConfig.Classify with a function of something it trusts
// (the route, an authenticated principal).
func DefaultPriority(r *http.Request) bulwark.Priority { return bulwark.RequestPriority(r) }

// Package defaults for ShedConfig.
const (
	// DefaultMaxQueueWait bounds a queued request's wait when its context
	// has no sooner deadline. It is CoDel's interval: a queue that has not
	// drained within 100 ms is a standing queue, not a burst being absorbed,
	// and the requests at its back are better refused than served late.
	DefaultMaxQueueWait = 100 * time.Millisecond

	// DefaultReservedCritical is the share of workers only
	// bulwark.PriorityCritical requests may use, so that a flood of reads cannot crowd out the work
	// that must go on (Stripe reserves capacity for creating charges).
	DefaultReservedCritical = 0.1

	// DefaultShedRetryAfter is the Retry-After a Shedder's 503 carries: long
	// enough for a burst to pass, short enough that a caller who honours it
	// is not kept away from a recovered server.
	DefaultShedRetryAfter = time.Second
)

// DefaultWorkers returns the concurrency limit used when ShedConfig.Workers
// is zero: twice GOMAXPROCS. A CPU-bound handler saturates the machine at
// GOMAXPROCS; the second share keeps the CPUs busy while handlers block
// briefly on a database or a downstream call, without letting so much work
// in that every request slows down together. Handlers that mostly wait on
// I/O should set Workers from Little's law: the target rate times the
// healthy latency (1,000 req/s × 50 ms = 50 workers).
func DefaultWorkers() int { return 2 * runtime.GOMAXPROCS(0) }

// ShedConfig configures a Shedder. The zero value is ready to use.
type ShedConfig struct {
	// Workers is how many requests the wrapped handler serves at once.
	// Zero means DefaultWorkers().
	Workers int

	// Queue is how many requests may wait for a worker. Zero means half of
	// Workers, at least one: the SRE book's figure for steady traffic, so
	// that overload turns into fast refusals rather than a growing backlog.
	// Negative means no queue: a request that finds no free worker is
	// refused at once.
	Queue int

	// MaxQueueWait is the longest a request waits in the queue. A request
	// whose context has a sooner deadline (DeadlineHandler sets one from the
	// caller's deadline header) waits at most until that deadline. Either
	// way, a request whose patience ran out is refused, never handed to the
	// handler: its caller has stopped waiting for the answer. Zero means
	// DefaultMaxQueueWait; negative is an error. There is no upper bound:
	// the instant a wait ends saturates rather than overflows, so a huge
	// value means waiting for the caller's deadline or departure alone.
	MaxQueueWait time.Duration

	// ReservedCritical is the fraction of Workers, in [0, 1), held back for
	// bulwark.PriorityCritical requests: the other priorities start (or leave the
	// queue) only while more than the reserve is free, so a critical
	// arrival finds a worker even when reads and writes have taken all they
	// may. Critical requests may use every worker. The reserve is rounded up
	// to a whole worker and always leaves at least one worker to the other
	// priorities. Zero means DefaultReservedCritical; negative means no
	// reserve.
	ReservedCritical float64

	// RetryAfter is the wait a refusal's Retry-After header asks for,
	// rounded up to whole seconds. Zero means DefaultShedRetryAfter;
	// negative, or more than 24 hours, is an error: bulwark's own client
	// ignores a longer Retry-After as absurd, so the Shedder would be
	// asking for nothing.
	RetryAfter time.Duration

	// Classify gives a request's priority. It runs on every request, so it
	// must be cheap and must not read the body. Nil means DefaultPriority.
	Classify func(*http.Request) bulwark.Priority

	// MeterProvider receives the Shedder's metrics: Stats as observable
	// instruments, read at each collection (see Shedder), under the
	// instrumentation scope github.com/bulwark-http/bulwark/server with the
	// module's version. Nil means otel.GetMeterProvider(); a noop provider
	// turns them off.
	MeterProvider metric.MeterProvider

	// Adaptive makes the worker count learn from the handler's latency,
	// with the gradient the client's adaptive bulkhead uses (see
	// bulwark.Bulkhead.Adaptive): it starts at Workers, which is its ceiling, and
	// comes down to no fewer than MinWorkers while the handler's latency
	// rises above its baseline, so a handler whose capacity shrank gets
	// the work it can do and the rest is queued or refused fast. The
	// critical reserve stays a share of the current count.
	Adaptive bool

	// MinWorkers is an adaptive worker count's floor. Zero means 1; more
	// than Workers is an error. Ignored unless Adaptive.
	MinWorkers int

	// Name, when set, is the bulwark.shed.name attribute of every point of
	// the Shedder's metrics, so that several Shedders on one MeterProvider
	// (one per listener, or per handler) stay apart. Empty means no such
	// attribute.
	Name string

	// Shadow runs the Shedder in shadow mode: it queues, displaces and
	// times out as it would, and counts each refusal it would make
	// (ShedStats.Shed, the bulwark.shed.refused metric with
	// bulwark.shed.shadow "true"), but serves the request anyway, outside
	// the worker count, so the counts are what an enforcing Shedder would
	// report on the same traffic. A queued request still waits as long as
	// it would have. A caller who went away (ShedCanceled) is answered as
	// before. Use it to size Workers and Queue on production traffic.
	Shadow bool
}

// ShedReason says why a Shedder refused a request.
type ShedReason uint8

// The reasons a request is refused.
const (
	// ShedQueueFull: no free worker and no room in the queue for the
	// request's priority.
	ShedQueueFull ShedReason = iota
	// ShedWaitedTooLong: the request waited in the queue past its patience
	// (its context's deadline or MaxQueueWait), or arrived with its deadline
	// already past.
	ShedWaitedTooLong
	// ShedDisplaced: the request was queued, and a more important one took
	// its place when the queue was full.
	ShedDisplaced
	// ShedCanceled: the request's context was canceled (its caller went
	// away) while it waited.
	ShedCanceled

	// NumShedReasons is how many reasons there are, one past ShedCanceled:
	// the length of ShedStats.Shed. Ranging over it yields every
	// ShedReason. It is not a reason itself.
	NumShedReasons
)

// numShedReasons is NumShedReasons as an int.
const numShedReasons = int(NumShedReasons)

var shedReasonNames = [numShedReasons]string{"queue_full", "waited_too_long", "displaced", "canceled"}

// String returns the reason's snake_case name, suitable as a metric label.
func (r ShedReason) String() string {
	if int(r) < numShedReasons {
		return shedReasonNames[r]
	}
	return "ShedReason(" + strconv.Itoa(int(r)) + ")"
}

// ShedStats is a snapshot of a Shedder's state and counters. The counters
// only grow; subtract two snapshots for a rate. The arrays are indexed by
// bulwark.Priority and ShedReason, and sized by bulwark.NumPriorities and
// NumShedReasons, so that a loop over every counter reads:
//
//	for r := range server.NumShedReasons {
//		for p := range bulwark.NumPriorities {
//			use(r, p, st.Shed[r][p])
//		}
//	}
//
// The zero ShedStats is a Shedder that has seen no request.
type ShedStats struct {
	InFlight int // requests in the wrapped handler now
	Queued   int // requests waiting for a worker now

	// Served counts the requests handed to the wrapped handler, by priority.
	Served [bulwark.NumPriorities]uint64
	// Shed counts refused requests by reason, then priority; in shadow
	// mode (ShedConfig.Shadow), the requests it would have refused, which
	// it served: those are not in Served.
	Shed [NumShedReasons][bulwark.NumPriorities]uint64
	// ServedRetries and ShedRetries count the requests among those that
	// were retries (see isRetry): a retry waits behind every first
	// attempt of its priority.
	ServedRetries, ShedRetries uint64
	// Workers is the worker count in force: ShedConfig.Workers, or the
	// adaptive count's current value.
	Workers int
}

// ShedTotal is the number of refused requests, all reasons and priorities.
func (s ShedStats) ShedTotal() uint64 {
	var n uint64
	for _, byPrio := range s.Shed {
		for _, c := range byPrio {
			n += c
		}
	}
	return n
}

// Shedder is an http.Handler middleware that protects the handler it wraps
// from more work than it can do: at most Workers requests in the handler at
// once, a short queue in front ordered by bulwark.Priority, and past that a
// 503 at once, with Retry-After, bulwark.NoRetryHeader, ShedReasonHeader and
// bulwark.ShedPriorityHeader. A full queue gives a more important arrival
// the place of its least important waiter, freed workers go to the most
// important waiter, a share of them is kept for bulwark.PriorityCritical,
// and retries are shed before first attempts of their priority. A queued
// request whose caller's patience ran out is dropped before it is served.
// Build one with NewShedder; it is safe for concurrent use.
//
// NewShedder registers, with ShedConfig.MeterProvider, observable
// instruments that read the counters Stats reads, so they cost the request
// path nothing:
//
//	bulwark.shed.served    counter {bulwark.shed.priority}                       requests handed to the handler (ShedStats.Served)
//	bulwark.shed.refused   counter {bulwark.shed.reason, bulwark.shed.priority}  requests answered 503 (ShedStats.Shed)
//	bulwark.shed.in_flight gauge                                                 requests in the handler now
//	bulwark.shed.queued    gauge                                                 requests waiting for a worker now
//	bulwark.shed.workers   gauge                                                 the worker count in force (ShedStats.Workers; it moves when Adaptive)
//
// bulwark.shed.priority is a Priority's String, bulwark.shed.reason a
// ShedReason's. Several Shedders on one MeterProvider need a ShedConfig.Name
// each (bulwark.shed.name), or their points share series. A registration
// error goes to otel.Handle. See docs/design.md, "The server half".
type Shedder struct {
	next        http.Handler
	classify    func(*http.Request) bulwark.Priority
	workers     int             // limit for PriorityCritical; with Adaptive, the ceiling
	lim         *limit.Gradient // nil unless Adaptive
	reserveFrac float64         // the critical reserve's share, for an adaptive count
	shared      int             // limit for every other priority: workers minus the reserve
	queueCap    int
	maxWait     time.Duration
	shadow      bool
	// retryAfter is the Retry-After value, shared by every refusal so that
	// writing one allocates nothing. Its capacity equals its length, so a
	// later Header().Add copies rather than writing into it.
	retryAfter []string
	// now is the clock queue-wait decisions read; tests replace it.
	now func() time.Time

	mu       sync.Mutex
	inflight int                                  // guarded by mu
	queue    [numRanks]fifo.List[waiter, *waiter] // guarded by mu; one per rank (priority, then first attempt or retry)
	queued   int                                  // guarded by mu; sum of the lists' lengths

	// Mirrors of inflight and queued, written under mu, so Stats reads
	// them without contending with the hot path.
	statInflight atomic.Int64
	statQueued   atomic.Int64
	served       [numPriorities]atomic.Uint64
	shed         [numShedReasons][numPriorities]atomic.Uint64
	servedRetry  atomic.Uint64
	shedRetry    atomic.Uint64
}

// Header values shared by every refusal, allocated once.
var (
	shedNoRetryValue   = []string{"1"}
	shedContentType    = []string{"text/plain; charset=utf-8"}
	shedNoSniff        = []string{"nosniff"}
	shedBody           = []byte("bulwark: server overloaded, retry later\n")
	shedContentLength  = []string{strconv.Itoa(len(shedBody))}
	shedReasonHdrValue = func() (v [numShedReasons][]string) {
		for i, n := range shedReasonNames {
			v[i] = []string{n}
		}
		return v
	}()
	// priorityHdrValue is a priority's name as the value of
	// ShedPriorityHeader. Its capacity equals its length, so a later
	// Header().Add copies.
	priorityHdrValue = func() (v [numPriorities][]string) {
		for i, n := range wire.PriorityNames {
			v[i] = []string{n}
		}
		return v
	}()
)

// ShedReasonHeader is the response header on a Shedder's 503 that names the
// ShedReason, for logs and debugging; clients should not branch on it.
const ShedReasonHeader = "Bulwark-Shed-Reason"

// NewShedder returns a Shedder that serves next under cfg. A bad cfg is an
// error matching bulwark.ErrInvalidConfig, never a panic.
func NewShedder(next http.Handler, cfg ShedConfig) (*Shedder, error) {
	if next == nil {
		return nil, &shedError{ce: &bulwark.ConfigError{Reason: "NewShedder: nil handler"}}
	}
	if cfg.Workers < 0 {
		return nil, shedFieldError("Workers", cfg.Workers, "must be ≥ 0")
	}
	if cfg.MaxQueueWait < 0 {
		return nil, shedFieldError("MaxQueueWait", cfg.MaxQueueWait, "must be ≥ 0")
	}
	if math.IsNaN(cfg.ReservedCritical) || cfg.ReservedCritical >= 1 {
		return nil, shedFieldError("ReservedCritical", cfg.ReservedCritical, "must be < 1")
	}
	if cfg.RetryAfter < 0 {
		return nil, shedFieldError("RetryAfter", cfg.RetryAfter, "must be ≥ 0")
	}
	if cfg.RetryAfter > wire.MaxRetryAfter {
		// The bound also keeps the rounding up below from overflowing.
		return nil, shedFieldError("RetryAfter", cfg.RetryAfter, "must be at most 24h: a bulwark client ignores a longer Retry-After")
	}

	workers := cfg.Workers
	if workers == 0 {
		workers = DefaultWorkers()
	}
	if cfg.MinWorkers < 0 || (cfg.Adaptive && cfg.MinWorkers > workers) {
		return nil, shedFieldError("MinWorkers", cfg.MinWorkers, "must be in [0, Workers]")
	}
	queue := cfg.Queue
	switch {
	case queue == 0:
		queue = max(1, workers/2)
	case queue < 0:
		queue = 0
	}
	reserved := 0
	switch frac := cfg.ReservedCritical; {
	case frac == 0:
		frac = DefaultReservedCritical
		fallthrough
	case frac > 0:
		reserved = min(int(math.Ceil(frac*float64(workers))), workers-1)
	}
	maxWait := cfg.MaxQueueWait
	if maxWait == 0 {
		maxWait = DefaultMaxQueueWait
	}
	retryAfter := cfg.RetryAfter
	if retryAfter == 0 {
		retryAfter = DefaultShedRetryAfter
	}
	// Whole seconds, rounded up: a Retry-After of 0 would invite the
	// immediate retry the refusal is meant to prevent.
	secs := int64((retryAfter + time.Second - 1) / time.Second)
	classify := cfg.Classify
	if classify == nil {
		classify = DefaultPriority
	}
	s := &Shedder{
		next:        next,
		classify:    classify,
		workers:     workers,
		shared:      workers - reserved,
		reserveFrac: reserveFrac(cfg.ReservedCritical),
		queueCap:    queue,
		maxWait:     maxWait,
		retryAfter:  []string{strconv.FormatInt(secs, 10)},
		now:         time.Now,
		shadow:      cfg.Shadow,
	}
	if cfg.Adaptive {
		// Validated: 1 ≤ MinWorkers ≤ workers.
		s.lim, _ = limit.New(limit.Config{Min: max(1, cfg.MinWorkers), Max: workers})
	}
	s.registerMetrics(cfg.MeterProvider, cfg.Name)
	return s, nil
}

// shedError reports a bad ShedConfig. It unwraps to a *bulwark.ConfigError,
// so it matches bulwark.ErrInvalidConfig, but reads without the client's "Default" scope.
type shedError struct{ ce *bulwark.ConfigError }

func (e *shedError) Error() string {
	if e.ce.Field == "" {
		return "bulwark: " + e.ce.Reason
	}
	return "bulwark: ShedConfig." + e.ce.Field + " = " + formatValue(e.ce.Value) + ": " + e.ce.Reason
}
func (e *shedError) Unwrap() error { return e.ce }

func shedFieldError(field string, value any, reason string) error {
	return &shedError{ce: &bulwark.ConfigError{Field: field, Value: value, Reason: reason}}
}

func formatValue(v any) string {
	switch v := v.(type) {
	case int:
		return strconv.Itoa(v)
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64)
	case time.Duration:
		return v.String()
	case string:
		return v
	}
	return "?"
}

// ServeHTTP serves r through the wrapped handler if a worker is free or
// becomes free within r's patience, and refuses it with a 503 otherwise.
func (s *Shedder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := clamp(s.classify(r))
	rk := rankOf(p, isRetry(r.Header))
	if ok, why := s.admit(r.Context(), rk); !ok {
		s.refuseRank(w, r, rk, why)
		return
	}
	s.serve(w, r, p, rk)
}

// admit asks for a worker for a request of rank rk whose context is ctx:
// a free one it may use, or one that becomes free while it waits in the
// queue within its patience (its context's deadline if sooner than
// MaxQueueWait). It reports whether the request holds a worker, and if
// not, why.
func (s *Shedder) admit(ctx context.Context, rk rank) (ok bool, why ShedReason) {
	s.mu.Lock()
	// Every change of state hands free workers to the waiters who may use
	// them (dispatchLocked), so a free worker this request may use means no
	// waiter of its priority or above is being passed over.
	if s.inflight < s.limitLocked(rk.priority()) {
		s.inflight++
		s.statInflight.Store(int64(s.inflight))
		s.mu.Unlock()
		return true, 0
	}
	// No worker: queue, unless the request's patience is already spent.
	if err := ctx.Err(); err != nil {
		s.mu.Unlock()
		return false, doneReason(ctx)
	}
	now := s.now()
	patience := now.Add(s.maxWait)
	d, hasDeadline := ctx.Deadline()
	byDeadline := hasDeadline && d.Before(patience)
	if byDeadline {
		patience = d
	}
	if !now.Before(patience) {
		s.mu.Unlock()
		return false, ShedWaitedTooLong
	}
	wt, queued := s.enqueueLocked(rk, patience)
	s.mu.Unlock()
	if !queued {
		return false, ShedQueueFull
	}
	return s.wait(ctx, wt, !byDeadline)
}

// limitLocked is how many workers a request of priority p may find busy
// and still start: every worker for bulwark.PriorityCritical, the shared
// ones for the others.
func (s *Shedder) limitLocked(p bulwark.Priority) int {
	workers, shared := s.capacityLocked()
	if p == bulwark.PriorityCritical {
		return workers
	}
	return shared
}

// serve runs the wrapped handler on a worker this request holds.
func (s *Shedder) serve(w http.ResponseWriter, r *http.Request, p bulwark.Priority, rk rank) {
	s.started(p, rk)
	if s.lim != nil {
		defer s.sample(time.Now())
	}
	// Deferred so that a panicking handler (net/http recovers it) still
	// gives its worker back.
	defer s.release()
	s.next.ServeHTTP(w, r)
}

// started counts a request of priority p and rank rk handed its worker.
func (s *Shedder) started(p bulwark.Priority, rk rank) {
	s.served[p].Add(1)
	if rk.retry() {
		s.servedRetry.Add(1)
	}
}

// release gives a worker back and hands it on.
func (s *Shedder) release() {
	s.mu.Lock()
	s.inflight--
	s.dispatchLocked()
	s.statInflight.Store(int64(s.inflight))
	s.mu.Unlock()
}

// refuse writes the 503. It never touches the wrapped handler, and on the
// hot rejection path allocates nothing of its own: every header value is
// shared.
func (s *Shedder) refuse(w http.ResponseWriter, r *http.Request, p bulwark.Priority, why ShedReason) {
	if s.counted(p, why) {
		// Counted as a refusal, served anyway, on no worker: the queue
		// and the workers stay what an enforcing Shedder's would be. A
		// caller who went away is not the Shedder's refusal.
		s.next.ServeHTTP(w, r)
		return
	}
	h := w.Header()
	h["Retry-After"] = s.retryAfter
	h[bulwark.NoRetryHeader] = shedNoRetryValue
	h[ShedReasonHeader] = shedReasonHdrValue[why]
	h[bulwark.ShedPriorityHeader] = priorityHdrValue[p]
	h["Content-Type"] = shedContentType
	h["Content-Length"] = shedContentLength
	h["X-Content-Type-Options"] = shedNoSniff
	w.WriteHeader(http.StatusServiceUnavailable)
	w.Write(shedBody)
}

// counted counts a refusal of priority p for why, and reports whether
// the request is served anyway: in shadow mode, every refusal but a caller
// who went away (ShedCanceled), which is not the Shedder's.
func (s *Shedder) counted(p bulwark.Priority, why ShedReason) (serveAnyway bool) {
	s.shed[why][p].Add(1)
	return s.shadow && why != ShedCanceled
}

// doneReason tells a deadline that passed from a caller that went away.
func doneReason(ctx context.Context) ShedReason {
	if ctx.Err() == context.Canceled {
		return ShedCanceled
	}
	return ShedWaitedTooLong
}

// A waiter's state moves once, under Shedder.mu, from waiting to one of the
// others; whoever moves it is the only one to send on ready.
const (
	waiting = iota
	granted // holds a worker
	dropped // displaced by a more important arrival
	expired // its patience ran out before a worker was free
	left    // gave up on its own (context done or timer); not signalled
)

// waiter is one queued request.
type waiter struct {
	prio     bulwark.Priority
	rank     rank
	state    uint8
	ready    chan struct{} // buffered: the one send never blocks
	patience time.Time     // the instant it stops waiting
	links    fifo.Links[waiter]
}

func (w *waiter) FIFOLinks() *fifo.Links[waiter] { return &w.links }

// enqueueLocked queues a request of priority p and the given patience, displacing a less important
// waiter if the queue is full. It reports false when there is no room.
func (s *Shedder) enqueueLocked(rk rank, patience time.Time) (*waiter, bool) {
	p := rk.priority()
	if s.queued >= s.queueCap {
		victim := s.victimLocked(rk)
		if victim == nil {
			return nil, false
		}
		s.settleLocked(victim, dropped)
	}
	w := &waiter{prio: p, rank: rk, patience: patience, ready: make(chan struct{}, 1)}
	s.queue[rk].Push(w)
	s.queued++
	s.statQueued.Store(int64(s.queued))
	return w, true
}

// victimLocked is the waiter a full queue gives up for an arrival of rank
// rk, nil if none: the least important waiter gives way to a more
// important arrival, the newest of the lowest rank, so that those who have
// waited longest keep their place. A first attempt outranks a retry of
// its own priority.
func (s *Shedder) victimLocked(rk rank) *waiter {
	for q := numRanks - 1; q > int(rk); q-- {
		if v := s.queue[q].Back(); v != nil {
			return v
		}
	}
	return nil
}

// settleLocked takes w out of the queue in state st and wakes it.
func (s *Shedder) settleLocked(w *waiter, st uint8) {
	s.queue[w.rank].Remove(w)
	s.queued--
	s.statQueued.Store(int64(s.queued))
	w.state = st
	if st != left {
		w.ready <- struct{}{}
	}
}

// dispatchLocked hands free workers to waiters, most important first. A
// waiter whose patience has run out is dropped rather than served: its
// caller has stopped waiting for the answer, so serving it is pure waste.
func (s *Shedder) dispatchLocked() {
	workers, shared := s.capacityLocked()
	for s.queued > 0 && s.inflight < workers {
		var w *waiter
		if w = s.firstOf(bulwark.PriorityCritical); w == nil && s.inflight < shared {
			for q := 2; q < numRanks && w == nil; q++ {
				w = s.queue[q].Front()
			}
		}
		if w == nil {
			return // only the critical reserve is free, and no critical waiter
		}
		if !s.now().Before(w.patience) {
			s.settleLocked(w, expired)
			continue
		}
		s.inflight++
		s.settleLocked(w, granted)
	}
}

// wait blocks a queued request until it is granted a worker, displaced,
// or its patience or context runs out, and reports whether it holds a
// worker, and if not, why. The context's Done ends a wait bounded by its
// deadline; a wait bounded by MaxQueueWait (useTimer) needs a timer of its
// own.
func (s *Shedder) wait(ctx context.Context, wt *waiter, useTimer bool) (ok bool, why ShedReason) {
	var (
		t     *time.Timer
		timer <-chan time.Time // nil, and never ready, without a timer
	)
	if useTimer {
		t = time.NewTimer(s.maxWait)
		timer = t.C
	}
	select {
	case <-wt.ready:
	case <-ctx.Done():
		why = doneReason(ctx)
	case <-timer:
		why = ShedWaitedTooLong
	}
	if t != nil {
		t.Stop()
	}
	s.mu.Lock()
	st := wt.state
	if st == waiting {
		s.settleLocked(wt, left)
	}
	s.mu.Unlock()

	switch st {
	case granted:
		if ctx.Err() != nil {
			// Granted as the context ended: the caller is gone, so give
			// the worker to someone still waiting for an answer.
			s.release()
			return false, doneReason(ctx)
		}
		return true, 0
	case dropped:
		return false, ShedDisplaced
	case expired:
		return false, ShedWaitedTooLong
	}
	return false, why // left on its own
}

// Stats returns a snapshot of the Shedder's state and counters. It takes no
// lock: each number is exact, but they are read one after another.
func (s *Shedder) Stats() ShedStats {
	st := ShedStats{
		InFlight: int(s.statInflight.Load()),
		Queued:   int(s.statQueued.Load()),
	}
	for p := range st.Served {
		st.Served[p] = s.served[p].Load()
	}
	for r := range st.Shed {
		for p := range st.Shed[r] {
			st.Shed[r][p] = s.shed[r][p].Load()
		}
	}
	st.ServedRetries, st.ShedRetries = s.servedRetry.Load(), s.shedRetry.Load()
	st.Workers = s.workers
	if s.lim != nil {
		st.Workers = s.lim.Limit()
	}
	return st
}
