package server

import (
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/bulwark-http/bulwark"
)

// A Shedder's admission outside ServeHTTP, for work that is not an
// http.Handler's: a gRPC server's calls (package bulwarkgrpc), a queue's
// consumer. The request these methods take is what ServeHTTP would have
// been given, or one made to stand for the work (for gRPC, a POST to the
// full method name carrying the call's metadata as its header): the
// Shedder reads its priority (ShedConfig.Classify), whether it is a
// retry (its header) and its patience (its context), and nothing else.
// One pool of workers then serves both: a service answering HTTP and
// gRPC sheds both by the same priorities.

// ShedError is a Shedder's refusal of work it was asked to admit by Admit
// or Precheck: what ServeHTTP's 503 says in its headers.
type ShedError struct {
	Reason   ShedReason       // why (ServeHTTP's ShedReasonHeader)
	Priority bulwark.Priority // the priority refused (bulwark.ShedPriorityHeader)
	// RetryAfter is the wait ShedConfig.RetryAfter asks for, rounded up to
	// whole seconds as ServeHTTP's Retry-After header is.
	RetryAfter time.Duration
}

func (e *ShedError) Error() string {
	return "bulwark: server overloaded: shed " + e.Priority.String() + " (" + e.Reason.String() + ")"
}

// Admit asks for a worker for r as ServeHTTP does, waiting in the queue
// within r's patience, and returns release, which the caller must call
// exactly once when the work ends (a second call does nothing), or a
// *ShedError when the Shedder refuses it. It blocks at most until r's
// patience runs out; a stream that holds its worker holds it until
// release, however long that is. In shadow mode (ShedConfig.Shadow) a
// refusal is counted and the work admitted on no worker.
func (s *Shedder) Admit(r *http.Request) (release func(), err error) {
	p := clamp(s.classify(r))
	rk := rankOf(p, isRetry(r.Header))
	if ok, why := s.admit(r.Context(), rk); !ok {
		return s.refusal(rk, why)
	}
	s.started(p, rk)
	var start time.Time
	if s.lim != nil {
		start = time.Now()
	}
	var done atomic.Bool
	return func() {
		if !done.CompareAndSwap(false, true) {
			return
		}
		if s.lim != nil {
			s.sample(start)
		}
		s.release()
	}, nil
}

// Precheck refuses r at once if ServeHTTP or Admit would refuse it on
// arrival for want of room: no worker free to its priority and no place
// in the queue it could take. Such a refusal is counted as theirs
// (ShedQueueFull) and returned as a *ShedError. Otherwise it returns nil
// and takes nothing: Admit or ServeHTTP still decides. It never blocks,
// which makes it fit a check ahead of the work, on a path that must not
// wait, such as a gRPC server's tap.ServerInHandle, which runs before the
// call's message is read. In shadow mode it counts the refusal and
// returns nil.
func (s *Shedder) Precheck(r *http.Request) error {
	p := clamp(s.classify(r))
	rk := rankOf(p, isRetry(r.Header))
	s.mu.Lock()
	full := s.inflight >= s.limitLocked(p) && s.queued >= s.queueCap && s.victimLocked(rk) == nil
	s.mu.Unlock()
	if !full {
		return nil
	}
	if _, err := s.refusal(rk, ShedQueueFull); err != nil {
		return err
	}
	return nil
}

// refusal counts a refusal of rank rk for why and returns it as Admit
// does: an error, or in shadow mode a release that does nothing.
func (s *Shedder) refusal(rk rank, why ShedReason) (func(), error) {
	if rk.retry() {
		s.shedRetry.Add(1)
	}
	if s.counted(rk.priority(), why) {
		return func() {}, nil
	}
	return nil, &ShedError{Reason: why, Priority: rk.priority(), RetryAfter: s.retryAfterDuration()}
}

// retryAfterDuration is the Retry-After value as a duration.
func (s *Shedder) retryAfterDuration() time.Duration {
	secs, _ := strconv.ParseInt(s.retryAfter[0], 10, 64)
	return time.Duration(secs) * time.Second
}
