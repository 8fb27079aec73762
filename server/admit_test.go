package server

import (
	"errors"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bulwark-http/bulwark"
)

// admitResult is one Admit's outcome, from a goroutine of its own.
type admitResult struct {
	release func()
	err     error
}

func admitAsync(s *Shedder, r *http.Request) <-chan admitResult {
	ch := make(chan admitResult, 1)
	go func() {
		rel, err := s.Admit(r)
		ch <- admitResult{rel, err}
	}()
	return ch
}

func shedErr(t *testing.T, err error) *ShedError {
	t.Helper()
	var se *ShedError
	if !errors.As(err, &se) {
		t.Fatalf("err = %v, want a *ShedError", err)
	}
	return se
}

// TestAdmit: Admit holds a worker until release, queues within the
// request's patience as ServeHTTP does, refuses with a *ShedError saying
// what ServeHTTP's headers say, and shares its workers with ServeHTTP.
func TestAdmit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGate()
		s, err := NewShedder(g, ShedConfig{Workers: 1, Queue: 1, ReservedCritical: -1, RetryAfter: 1500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		rel, err := s.Admit(newReq("POST", "/pkg.Svc/A", "low"))
		if err != nil {
			t.Fatalf("first Admit: %v", err)
		}
		if st := s.Stats(); st.InFlight != 1 || st.Served[bulwark.PriorityLow] != 1 {
			t.Fatalf("after one Admit: in flight %d, served low %d; want 1 and 1", st.InFlight, st.Served[bulwark.PriorityLow])
		}
		// The second waits in the queue; the third finds it full.
		queued := admitAsync(s, newReq("POST", "/pkg.Svc/A", "low"))
		synctest.Wait()
		_, err = s.Admit(newReq("POST", "/pkg.Svc/A", "low"))
		se := shedErr(t, err)
		if se.Reason != ShedQueueFull || se.Priority != bulwark.PriorityLow || se.RetryAfter != 2*time.Second {
			t.Errorf("refusal = %+v, want queue_full, low, 2s (Retry-After rounded up)", *se)
		}
		// An HTTP request shares the workers: it is refused too.
		if rec := serveNow(s, noBlock(newReq("GET", "/x", "low"))); rec.Code != http.StatusServiceUnavailable {
			t.Errorf("HTTP request beside a held worker and a full queue: %d, want 503", rec.Code)
		}
		rel()
		rel() // a second call does nothing
		res := <-queued
		if res.err != nil {
			t.Fatalf("queued Admit: %v", res.err)
		}
		if st := s.Stats(); st.InFlight != 1 || st.Queued != 0 {
			t.Fatalf("after release: in flight %d, queued %d; want 1 and 0 (the double release gave nothing back)", st.InFlight, st.Queued)
		}
		// A queued request whose patience runs out is refused.
		start := time.Now()
		_, err = s.Admit(newReq("POST", "/pkg.Svc/A", "low"))
		if se := shedErr(t, err); se.Reason != ShedWaitedTooLong || time.Since(start) != DefaultMaxQueueWait {
			t.Errorf("patience: %v after %v, want waited_too_long after %v", se.Reason, time.Since(start), DefaultMaxQueueWait)
		}
		res.release()
		if st := s.Stats(); st.InFlight != 0 || st.Shed[ShedQueueFull][bulwark.PriorityLow] != 2 || st.Shed[ShedWaitedTooLong][bulwark.PriorityLow] != 1 {
			t.Errorf("stats %+v: want nothing in flight, 2 queue_full and 1 waited_too_long", st)
		}
	})
}

// TestAdmitShadow: in shadow mode a refusal is counted and the work
// admitted on no worker; Precheck counts and lets by.
func TestAdmitShadow(t *testing.T) {
	s, err := NewShedder(newGate(), ShedConfig{Workers: 1, Queue: -1, ReservedCritical: -1, Shadow: true})
	if err != nil {
		t.Fatal(err)
	}
	rel1, err1 := s.Admit(newReq("POST", "/a", ""))
	rel2, err2 := s.Admit(newReq("POST", "/a", ""))
	if err1 != nil || err2 != nil {
		t.Fatalf("shadow Admit: %v, %v; want both admitted", err1, err2)
	}
	if err := s.Precheck(newReq("POST", "/a", "")); err != nil {
		t.Errorf("shadow Precheck with the worker held and no queue: %v, want nil (counted, let by)", err)
	}
	rel2()
	rel1()
	if st := s.Stats(); st.InFlight != 0 || st.ShedTotal() != 2 || st.Served[bulwark.PriorityHigh] != 1 {
		t.Errorf("stats %+v: want nothing in flight, two refusals counted (Admit's, Precheck's), one served (a POST is high)", st)
	}
}

// TestPrecheck: Precheck refuses exactly what Admit would refuse on
// arrival for want of room, counts it, and takes nothing otherwise.
func TestPrecheck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, err := NewShedder(newGate(), ShedConfig{Workers: 1, Queue: 1, ReservedCritical: -1})
		if err != nil {
			t.Fatal(err)
		}
		check := func(step, prio string, want bool) {
			t.Helper()
			err := s.Precheck(newReq("POST", "/a", prio))
			if got := err != nil; got != want {
				t.Errorf("%s: Precheck(%s) refused = %v, want %v (%v)", step, prio, got, want, err)
			}
			if err != nil {
				if se := shedErr(t, err); se.Reason != ShedQueueFull {
					t.Errorf("%s: reason %v, want queue_full", step, se.Reason)
				}
			}
		}
		check("a free worker", "normal", false)
		if st := s.Stats(); st.InFlight != 0 {
			t.Fatalf("Precheck took a worker: in flight %d", st.InFlight)
		}
		rel, _ := s.Admit(newReq("POST", "/a", "normal"))
		check("busy worker, empty queue", "normal", false)
		q := admitAsync(s, newReq("POST", "/a", "normal"))
		synctest.Wait()
		check("busy worker, full queue", "normal", true)
		check("busy worker, full queue", "low", true)
		check("a critical arrival displaces the normal waiter", "critical", false)
		check("a high arrival displaces the normal waiter", "high", false)
		if st := s.Stats(); st.Shed[ShedQueueFull][bulwark.PriorityNormal] != 1 || st.Shed[ShedQueueFull][bulwark.PriorityLow] != 1 || st.Queued != 1 {
			t.Errorf("stats %+v: want one refusal each of normal and low, the waiter still queued", st)
		}
		rel()
		(<-q).release()
	})
}
