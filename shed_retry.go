package bulwark

import (
	"net/http"
	"strconv"
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

func rankOf(p Priority, retry bool) rank {
	r := rank(2 * p)
	if retry {
		r++
	}
	return r
}

func (r rank) priority() Priority { return Priority(r / 2) }
func (r rank) retry() bool        { return r%2 == 1 }

// firstOf is the head of priority p's queues: its first attempts, then its
// retries.
func (s *Shedder) firstOf(p Priority) *waiter {
	if w := s.queue[rankOf(p, false)].head; w != nil {
		return w
	}
	return s.queue[rankOf(p, true)].head
}

// refuseRank refuses a request of rank rk, counting a retry's refusal.
func (s *Shedder) refuseRank(w http.ResponseWriter, rk rank, why ShedReason) {
	if rk.retry() {
		s.shedRetry.Add(1)
	}
	s.refuse(w, rk.priority(), why)
}

// isRetry reports whether a request says it is a retry: AttemptHeader
// (bulwark's client) above 1, grpc-previous-rpc-attempts (gRPC's retry
// support) above 0, or x-envoy-attempt-count (Envoy's router) above 1. A
// value that does not parse says nothing: a first attempt.
func isRetry(h http.Header) bool {
	return headerAbove(h, AttemptHeader, 1) ||
		headerAbove(h, "Grpc-Previous-Rpc-Attempts", 0) ||
		headerAbove(h, "X-Envoy-Attempt-Count", 1)
}

// headerAbove reports whether h's key holds one integer above n.
func headerAbove(h http.Header, key string, n int64) bool {
	v, ok := h[key]
	if !ok || len(v) != 1 {
		return false
	}
	s := trimOWS(v[0])
	if s == "" || len(s) > 18 || !allDigits(s) {
		return false
	}
	x, _ := strconv.ParseInt(s, 10, 64)
	return x > n
}
