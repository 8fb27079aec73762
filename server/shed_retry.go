package server

import (
	"math"
	"net/http"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/bulwark-http/bulwark/internal/wire"
)

// Retries are shed first: within one priority, a Shedder queues a retry
// behind every first attempt, hands freed workers to first attempts before
// retries, and lets a first attempt arriving at a full queue take a
// retry's place. Under overload the retries, which the overload itself
// made, are the work to refuse first: a first attempt served is a call
// that may end; a retry served instead still leaves that call to fail and
// be retried in its turn.

// rank orders a Shedder's queues: priority first, then a first attempt
// before a retry.
type rank uint8

// numRanks is how many ranks there are: two per priority.
const numRanks = 2 * numPriorities

func rankOf(p bulwark.Priority, retry bool) rank {
	r := rank(2 * p)
	if retry {
		r++
	}
	return r
}

func (r rank) priority() bulwark.Priority { return bulwark.Priority(r / 2) }
func (r rank) retry() bool                { return r%2 == 1 }

// firstOf is the head of priority p's queues: its first attempts, then its
// retries.
func (s *Shedder) firstOf(p bulwark.Priority) *waiter {
	if w := s.queue[rankOf(p, false)].Front(); w != nil {
		return w
	}
	return s.queue[rankOf(p, true)].Front()
}

// refuseRank refuses a request of rank rk, counting a retry's refusal.
func (s *Shedder) refuseRank(w http.ResponseWriter, r *http.Request, rk rank, why ShedReason) {
	if rk.retry() {
		s.shedRetry.Add(1)
	}
	s.refuse(w, r, rk.priority(), why)
}

// isRetry reports whether a request says it is a retry: bulwark.AttemptHeader
// (bulwark's client) above 1, grpc-previous-rpc-attempts (gRPC's retry
// support) above 0, or x-envoy-attempt-count (Envoy's router) above 1. A
// value that does not parse says nothing: a first attempt.
func isRetry(h http.Header) bool {
	return wire.HeaderAbove(h, bulwark.AttemptHeader, 1) ||
		wire.HeaderAbove(h, "Grpc-Previous-Rpc-Attempts", 0) ||
		wire.HeaderAbove(h, "X-Envoy-Attempt-Count", 1)
}

// capacityLocked is the worker count in force and the share of it the
// non-critical priorities may use. With Adaptive both follow the learned
// limit, the reserve a share of it as ShedConfig.ReservedCritical says.
func (s *Shedder) capacityLocked() (workers, shared int) {
	if s.lim == nil {
		return s.workers, s.shared
	}
	workers = s.lim.Limit()
	reserved := 0
	if s.reserveFrac > 0 {
		reserved = min(int(math.Ceil(s.reserveFrac*float64(workers))), workers-1)
	}
	return workers, workers - reserved
}

// reserveFrac is the critical reserve's share that ReservedCritical means.
func reserveFrac(v float64) float64 {
	switch {
	case v == 0:
		return DefaultReservedCritical
	case v < 0:
		return 0
	}
	return v
}

// sample feeds the adaptive worker count one handler run that started at
// start; when the count rose, waiters get the new workers.
func (s *Shedder) sample(start time.Time) {
	now := time.Now()
	s.mu.Lock()
	inflight := s.inflight
	s.mu.Unlock()
	old := s.lim.Limit()
	if l, changed := s.lim.Sample(now.UnixNano(), now.Sub(start), inflight, false); changed && l > old {
		s.mu.Lock()
		s.dispatchLocked()
		s.statInflight.Store(int64(s.inflight))
		s.mu.Unlock()
	}
}
