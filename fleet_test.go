package bulwark

import (
	"errors"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

func fleetPolicy() Policy {
	p := only(Policy{}, "breaker", "pushback")
	p.Breaker.MinCalls, p.Breaker.WindowCalls = 5, 10
	p.Breaker.OpenFor, p.Breaker.MaxOpenFor = 10*time.Second, 20*time.Second
	return p
}

func newPod(t *testing.T, f Fleet, base http.RoundTripper) *Transport {
	t.Helper()
	tr := mustNew(t, Config{Base: base, Default: fleetPolicy(), Fleet: f})
	t.Cleanup(func() { _ = tr.Close() })
	return tr
}

// TestFleetBreakerVerdict: one pod's trip stops the other pod's calls
// when nothing of its own contradicts it (its last call failed too, or it
// has not called the host yet), until the shared open time ends.
func TestFleetBreakerVerdict(t *testing.T) {
	for _, seenFirst := range []bool{true, false} {
		synctest.Test(t, func(t *testing.T) {
			hub := &memHub{}
			baseA, baseB := &statusBase{codes: []int{500}}, &statusBase{codes: []int{500, 200}}
			if !seenFirst {
				baseB.codes = []int{200}
			}
			a, b := newPod(t, &memFleet{hub: hub}, baseA), newPod(t, &memFleet{hub: hub}, baseB)
			if seenFirst {
				if code, err := sendOnce(t, b, "GET", "http://api.test/"); err != nil || code != 500 {
					t.Fatalf("pod B before: %d, %v", code, err)
				}
			}
			for range 5 {
				_, _ = sendOnce(t, a, "GET", "http://api.test/")
			}
			if s, _ := breakerState(a, "api.test:80"); s != CircuitOpen {
				t.Fatalf("pod A's breaker %v after 5 failures, want open", s)
			}
			synctest.Wait()
			sentB := baseB.sent()
			_, err := sendOnce(t, b, "GET", "http://api.test/")
			var oe *BreakerOpenError
			if !errors.As(err, &oe) || baseB.sent() != sentB {
				t.Fatalf("pod B after A's trip: %v, sent %d more; want a BreakerOpenError and nothing sent", err, baseB.sent()-sentB)
			}
			if d := time.Until(oe.ProbeAt); d <= 0 || d > 20*time.Second {
				t.Fatalf("adopted hold ends in %v, want within MaxOpenFor", d)
			}
			fs := b.Snapshot().Fleet
			if fs == nil || !fs.Connected || fs.Applied == 0 || fs.Ignored != 0 {
				t.Fatalf("pod B's fleet snapshot %+v", fs)
			}
			if fa := a.Snapshot().Fleet; fa.Published == 0 || fa.Dropped != 0 {
				t.Fatalf("pod A's fleet snapshot %+v, want published, none dropped", fa)
			}
			time.Sleep(time.Until(oe.ProbeAt) + time.Millisecond)
			if code, err := sendOnce(t, b, "GET", "http://api.test/"); err != nil || code != 200 {
				t.Fatalf("pod B after the hold: %d, %v; want its own breaker to let it through", code, err)
			}
		})
	}
}

// TestFleetAdoptedHoldBounded: a pod adopts a chain of holds from one pod
// for no longer than its own breaker would hold for as many trips in a
// row (OpenFor doubled each time, up to MaxOpenFor), whatever the
// tripping pod's generation; a success of its own starts the run afresh.
func TestFleetAdoptedHoldBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hub := &memHub{}
		base := &statusBase{codes: []int{500}}
		b := newPod(t, &memFleet{hub: hub}, base)
		b.randN = func(int64) int64 { return 0 }
		synctest.Wait()
		_, _ = sendOnce(t, b, "GET", "http://api.test/") // it fails: no contradiction
		hub.mu.Lock()
		sink := hub.sinks[0].s
		hub.mu.Unlock()
		held := func() time.Duration {
			h := b.Snapshot().Host("api.test:80")[0].Breaker
			if h.State != CircuitOpen {
				t.Fatalf("pod B %v, want the adopted hold", h.State)
			}
			return time.Until(h.OpenUntil)
		}
		// A chain from pod A: its 5th trip in a row asks for 40 s (over
		// MaxOpenFor, 20 s), then 40 s again; B's holds are its own 1st and
		// 2nd open times: 10 s, 20 s.
		for i, want := range []time.Duration{10 * time.Second, 20 * time.Second, 20 * time.Second} {
			sink.Apply(FleetUpdate{Kind: FleetBreakerOpen, Host: "api.test:80", From: "a", Generation: uint64(5 + i), Until: time.Now().Add(40 * time.Second)})
			if d := held(); d > want {
				t.Fatalf("hold %d adopted for %v, want at most %v", i+1, d, want)
			}
			time.Sleep(held() + time.Millisecond)
		}
		// A success of its own (the host answers it) ends the run.
		base.mu.Lock()
		base.codes = []int{200}
		base.mu.Unlock()
		if code, err := sendOnce(t, b, "GET", "http://api.test/"); err != nil || code != 200 {
			t.Fatalf("after the holds: %d, %v", code, err)
		}
		time.Sleep(fleetFresh + time.Second) // its success too old to contradict
		sink.Apply(FleetUpdate{Kind: FleetBreakerOpen, Host: "api.test:80", From: "a", Generation: 9, Until: time.Now().Add(40 * time.Second)})
		if d := held(); d > 10*time.Second {
			t.Fatalf("hold after a success adopted for %v, want at most OpenFor (10 s)", d)
		}
	})
}

// TestFleetAggregatedCounts: four pods that each see a quarter of
// MinCalls' failures trip together: the pod whose failure brings the
// fleet's count to MinCalls trips, and the others adopt its verdict.
func TestFleetAggregatedCounts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hub := &memHub{}
		base := &statusBase{codes: []int{500}}
		var pods []*Transport
		for range 4 {
			p := fleetPolicy()
			p.Breaker.MinCalls, p.Breaker.WindowCalls = 8, 8
			tr := mustNew(t, Config{Base: base, Default: p, Fleet: &memFleet{hub: hub}})
			t.Cleanup(func() { _ = tr.Close() })
			pods = append(pods, tr)
		}
		synctest.Wait()
		for round := range 2 {
			for i, tr := range pods {
				if s, _ := breakerState(tr, "api.test:80"); s == CircuitOpen {
					t.Fatalf("pod %d open after round %d, fleet-wide %d failures; want 8 first", i, round, base.sent())
				}
				_, _ = sendOnce(t, tr, "GET", "http://api.test/")
				synctest.Wait()
			}
		}
		if base.sent() != 8 {
			t.Fatalf("%d calls sent, want 8", base.sent())
		}
		for i, tr := range pods {
			if s, _ := breakerState(tr, "api.test:80"); s != CircuitOpen {
				t.Fatalf("pod %d %v after 8 failures fleet-wide, want open", i, s)
			}
		}
		// The counts came from the other pods only: no pod counted its own
		// twice (the first trip came at the 8th failure, not before).
		if f := pods[0].Snapshot().Fleet; f.Ignored != 0 || f.Dropped != 0 {
			t.Fatalf("fleet snapshot %+v", f)
		}
	})
}

// TestFleetCountsExpire: other pods' counts stop counting after
// fleetCountsFor, so an old burst trips nothing.
func TestFleetCountsExpire(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hub := &memHub{}
		base := &statusBase{codes: []int{500}}
		a, b := newPod(t, &memFleet{hub: hub}, base), newPod(t, &memFleet{hub: hub}, base)
		synctest.Wait()
		_, _ = sendOnce(t, b, "GET", "http://api.test/") // b has the host
		for range 3 {
			_, _ = sendOnce(t, a, "GET", "http://api.test/")
		}
		synctest.Wait()
		time.Sleep(fleetCountsFor + time.Second)
		_, _ = sendOnce(t, b, "GET", "http://api.test/")
		if s, _ := breakerState(b, "api.test:80"); s != CircuitClosed {
			t.Fatalf("pod B %v with 2 own failures and 3 stale ones, want closed", s)
		}
		_, _ = sendOnce(t, a, "GET", "http://api.test/")
		synctest.Wait()
		for range 2 {
			_, _ = sendOnce(t, b, "GET", "http://api.test/")
		}
		if s, _ := breakerState(b, "api.test:80"); s != CircuitOpen {
			t.Fatalf("pod B %v with 4 own failures and 4 fresh ones of A (MinCalls 5), want open", s)
		}
	})
}

// TestFleetPushback: one pod's Retry-After pauses the other pod too, for
// the whole host and for a Shedder's tier.
func TestFleetPushback(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hub := &memHub{}
		baseA := &statusBase{codes: []int{429}, header: http.Header{"Retry-After": {"30"}}}
		baseB := &statusBase{codes: []int{200}}
		a, b := newPod(t, &memFleet{hub: hub}, baseA), newPod(t, &memFleet{hub: hub}, baseB)
		_, _ = sendOnce(t, a, "GET", "http://api.test/")
		synctest.Wait()
		_, err := sendOnce(t, b, "GET", "http://api.test/")
		var pe *PushbackError
		if !errors.As(err, &pe) || baseB.sent() != 0 {
			t.Fatalf("pod B: %v, sent %d; want a PushbackError and nothing sent", err, baseB.sent())
		}
		if d := time.Until(pe.Until); d <= 29*time.Second || d > 30*time.Second {
			t.Fatalf("shared pause ends in %v, want 30s", d)
		}

		baseA.header = http.Header{"Retry-After": {"30"}, ShedPriorityHeader: {"low"}}
		_, _ = sendOnce(t, a, "GET", "http://shed.test/")
		synctest.Wait()
		req, _ := http.NewRequestWithContext(WithPriority(t.Context(), PriorityLow), "GET", "http://shed.test/", nil)
		if _, err := b.RoundTrip(req); !errors.Is(err, ErrPushback) {
			t.Fatalf("low-priority request on pod B: %v, want ErrPushback", err)
		}
		if code, err := sendOnce(t, b, "GET", "http://shed.test/"); err != nil || code != 200 {
			t.Fatalf("default-priority request on pod B: %d, %v; want it sent", code, err)
		}
	})
}

// TestFleetHostileUpdates: what a store hands the sink is validated: junk
// is ignored and counted, and a hold is capped by the receiving policy.
func TestFleetHostileUpdates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hub := &memHub{}
		// Its one call fails: nothing of its own contradicts a hold.
		b := newPod(t, &memFleet{hub: hub}, &statusBase{codes: []int{500}})
		synctest.Wait()
		if _, err := sendOnce(t, b, "GET", "http://api.test/"); err != nil {
			t.Fatal(err)
		}
		hub.mu.Lock()
		sink := hub.sinks[0].s
		hub.mu.Unlock()
		now := time.Now()
		for _, u := range []FleetUpdate{
			{Kind: 0, Host: "api.test:80", Until: now.Add(time.Second)},
			{Kind: 9, Host: "api.test:80", Until: now.Add(time.Second)},
			{Kind: FleetBreakerOpen, Host: "", Until: now.Add(time.Second)},
			{Kind: FleetBreakerOpen, Host: "api.test", Until: now.Add(time.Second)},
			{Kind: FleetBreakerOpen, Host: "api.test:80", Until: now.Add(48 * time.Hour)},
			{Kind: FleetPushback, Host: "api.test:80", Until: now.Add(time.Second), Shed: true, Priority: NumPriorities},
			{Kind: FleetPushback, Host: "api.test:80", Until: now.Add(time.Second), Priority: 200},
			{Kind: FleetBudgetCounts, Host: "api.test:80", Until: now.Add(time.Second), From: "x", Calls: 1, Retries: maxBudgetCount + 1},
			{Kind: FleetBudgetCounts, Host: "api.test:80", Until: now.Add(time.Second), From: "x", Calls: -1},
			{Kind: FleetBudgetCounts, Host: "api.test:80", Until: now.Add(time.Second), Calls: 1},
			{Kind: FleetBreakerClosed, Host: "api.test:80", Until: now.Add(time.Second), Generation: 1},
			{Kind: FleetBreakerClosed, Host: "api.test:80", Until: now.Add(time.Second), From: "x"},
		} {
			sink.Apply(u)
		}
		sink.Invalid(errors.New("corrupt"))
		fs := b.Snapshot().Fleet
		if fs.Ignored != 13 || fs.Applied != 0 {
			t.Fatalf("fleet snapshot %+v, want 13 ignored, none applied", fs)
		}
		if s, _ := breakerState(b, "api.test:80"); s != CircuitClosed {
			t.Fatalf("breaker %v after junk, want closed", s)
		}
		// A past time changes nothing; a long hold is capped at MaxOpenFor.
		sink.Apply(FleetUpdate{Kind: FleetBreakerOpen, Host: "api.test:80", Until: now.Add(-time.Second)})
		sink.Apply(FleetUpdate{Kind: FleetBreakerOpen, Host: "api.test:80", Until: now.Add(23 * time.Hour)})
		h := b.Snapshot().Host("api.test:80")[0]
		if h.Breaker.State != CircuitOpen || h.Breaker.OpenUntil.After(now.Add(20*time.Second)) {
			t.Fatalf("breaker %+v, want open until at most MaxOpenFor from now", h.Breaker)
		}
		// And the pending table is bounded.
		for i := range 3 * maxFleetPending {
			sink.Apply(FleetUpdate{Kind: FleetPushback, Host: "h" + strconv.Itoa(i) + ".test:80", Until: now.Add(time.Minute)})
		}
		b.fleet.pendMu.Lock()
		n := len(b.fleet.pending)
		b.fleet.pendMu.Unlock()
		if n > maxFleetPending {
			t.Fatalf("%d pending updates kept, want at most %d", n, maxFleetPending)
		}
	})
}

// TestFleetDown: a store that fails or hangs costs no request: local
// decisions stand, the failure shows in Snapshot, and a full queue drops.
func TestFleetDown(t *testing.T) {
	for _, f := range []*memFleet{{hub: &memHub{}, down: true}, {hub: &memHub{}, stuck: true}} {
		synctest.Test(t, func(t *testing.T) {
			base := &statusBase{codes: []int{200}}
			tr := newPod(t, f, base)
			for range 10 {
				if code, err := sendOnce(t, tr, "GET", "http://api.test/"); err != nil || code != 200 {
					t.Fatalf("request with the fleet down: %d, %v", code, err)
				}
			}
			// Far more pauses than the queue holds, each on its own host.
			base.codes = []int{429}
			base.header = http.Header{"Retry-After": {"5"}}
			for i := range fleetQueue + 50 {
				_, _ = sendOnce(t, tr, "GET", "http://h"+strconv.Itoa(i)+".test/")
			}
			if _, err := sendOnce(t, tr, "GET", "http://h1.test/"); !errors.Is(err, ErrPushback) {
				t.Fatalf("local pause with the fleet down: %v, want ErrPushback", err)
			}
			time.Sleep(3 * time.Second)
			fs := tr.Snapshot().Fleet
			if fs.LastError == "" || fs.Published != 0 || fs.PublishErrors == 0 {
				t.Fatalf("fleet snapshot %+v, want publish errors", fs)
			}
			if f.down && fs.Connected {
				t.Fatalf("fleet snapshot %+v, want disconnected", fs)
			}
			if f.stuck && fs.Dropped == 0 {
				t.Fatalf("fleet snapshot %+v, want drops with Publish stuck", fs)
			}
		})
	}
}

// TestFleetCloseWithout: Close without a Fleet, and twice, is harmless.
func TestFleetCloseWithout(t *testing.T) {
	tr := mustNew(t, Config{})
	for range 2 {
		if err := tr.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if tr.Snapshot().Fleet != nil {
		t.Fatal("a Fleet snapshot without a Fleet")
	}
}

// TestFleetAfterUpdate: a host rebuilt by Update still shares, whether its
// breaker was kept (a threshold moved) or made anew (the window changed).
func TestFleetAfterUpdate(t *testing.T) {
	for _, change := range []func(*Policy){
		func(p *Policy) { p.Breaker.FailureRate = 0.4 },
		func(p *Policy) { p.Breaker.WindowCalls = 20 },
	} {
		synctest.Test(t, func(t *testing.T) {
			hub := &memHub{}
			baseA, baseB := &statusBase{codes: []int{200}}, &statusBase{codes: []int{200}}
			a, b := newPod(t, &memFleet{hub: hub}, baseA), newPod(t, &memFleet{hub: hub}, baseB)
			_, _ = sendOnce(t, a, "GET", "http://api.test/")
			p := fleetPolicy()
			change(&p)
			if err := a.Update(Config{Base: baseA, Default: p}); err != nil {
				t.Fatal(err)
			}
			baseA.mu.Lock()
			baseA.codes = []int{500}
			baseA.mu.Unlock()
			for range 5 {
				_, _ = sendOnce(t, a, "GET", "http://api.test/")
			}
			synctest.Wait()
			if _, err := sendOnce(t, b, "GET", "http://api.test/"); !errors.Is(err, ErrBreakerOpen) || baseB.sent() != 0 {
				t.Fatalf("pod B after A's trip past an Update: %v, %d sent", err, baseB.sent())
			}
		})
	}
}

// TestFleetTripBeforeSending: when the other pods' counts with this pod's
// own already meet the trip condition, the pod trips before its next call
// instead of sending it and tripping on its failure (its own latest call
// failed: one answered would outweigh the counts); below the condition,
// the call goes.
func TestFleetTripBeforeSending(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hub := &memHub{}
		base := &statusBase{codes: []int{200, 500}}
		b := newPod(t, &memFleet{hub: hub}, base)
		synctest.Wait()
		if code, err := sendOnce(t, b, "GET", "http://api.test/"); err != nil || code != 200 {
			t.Fatal(code, err)
		}
		hub.mu.Lock()
		sink := hub.sinks[0].s
		hub.mu.Unlock()
		until := time.Now().Add(5 * time.Second)
		// 1 + 3 calls, 1 failure: below MinCalls (5); then 2 + 3 calls, 2
		// failures, under the failure rate.
		sink.Apply(FleetUpdate{Kind: FleetBreakerCounts, Host: "api.test:80", From: "p1", Until: until, Calls: 3, Failures: 1})
		if code, err := sendOnce(t, b, "GET", "http://api.test/"); err != nil || code != 500 || base.sent() != 2 {
			t.Fatalf("below the condition: %d, %v, %d sent; want the call sent", code, err, base.sent())
		}
		// 2 + 3 + 4 calls, 1 + 1 + 3 failures: 9 calls, 5 failures, over 50 %.
		sink.Apply(FleetUpdate{Kind: FleetBreakerCounts, Host: "api.test:80", From: "p2", Until: until, Calls: 4, Failures: 3})
		_, err := sendOnce(t, b, "GET", "http://api.test/")
		var oe *BreakerOpenError
		if !errors.As(err, &oe) || base.sent() != 2 {
			t.Fatalf("at the condition: %v, %d sent; want a BreakerOpenError and nothing more sent", err, base.sent())
		}
		h := b.Snapshot().Host("api.test:80")[0].Breaker
		if h.State != CircuitOpen || h.Trips != 1 || h.Calls != 0 {
			t.Fatalf("breaker %+v, want open after one trip, its window reset", h)
		}
		synctest.Wait()
		if fs := b.Snapshot().Fleet; fs.Published == 0 {
			t.Fatalf("fleet %+v: the trip was not published", fs)
		}
	})
}

// TestFleetClosedPending: a pod that has not called a host yet keeps the
// fleet's hold for it (attach applies it on the first call) until the pod
// that tripped publishes that it closed again; after that, the first call
// goes, on a pod that was receiving all along and on one started later.
func TestFleetClosedPending(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hub := &memHub{}
		baseA, baseB := &statusBase{codes: []int{500}}, &statusBase{codes: []int{200}}
		a, b := newPod(t, &memFleet{hub: hub}, baseA), newPod(t, &memFleet{hub: hub}, baseB)
		synctest.Wait()
		for range 5 {
			_, _ = sendOnce(t, a, "GET", "http://api.test/")
		}
		synctest.Wait()
		pendingOpen := func(tr *Transport) (FleetUpdate, bool) {
			tr.fleet.pendMu.Lock()
			defer tr.fleet.pendMu.Unlock()
			u, ok := tr.fleet.pending[fleetKey{kind: FleetBreakerOpen, host: "api.test:80"}]
			return u, ok
		}
		held, ok := pendingOpen(b)
		if !ok {
			t.Fatal("pod B keeps no hold for the host it has not called, after A's trip")
		}
		baseA.mu.Lock()
		baseA.codes = []int{200}
		baseA.mu.Unlock()
		// A's spaced probe finds the host answering within a spacing (at
		// most 1 s), and its half-open round of 10 closes it.
		for i := 0; ; i++ {
			if s, _ := breakerState(a, "api.test:80"); s == CircuitClosed {
				break
			}
			if i == 100 {
				t.Fatal("pod A not closed 5 s after the host recovered")
			}
			time.Sleep(50 * time.Millisecond)
			_, _ = sendOnce(t, a, "GET", "http://api.test/")
		}
		synctest.Wait() // A's close delivered
		if !held.Until.After(time.Now()) {
			t.Fatalf("A closed after the hold it published ended (%v): the hold would not apply anyway", held.Until)
		}
		if _, ok := pendingOpen(b); ok {
			t.Fatal("pod B still keeps the hold after A closed")
		}
		if code, err := sendOnce(t, b, "GET", "http://api.test/"); err != nil || code != 200 || baseB.sent() != 1 {
			t.Fatalf("pod B's first call after A closed: %d, %v, %d sent; want it sent", code, err, baseB.sent())
		}
		// A pod started now catches up with the store (open, then closed)
		// and adopts nothing either.
		baseC := &statusBase{codes: []int{200}}
		c := newPod(t, &memFleet{hub: hub}, baseC)
		synctest.Wait()
		if code, err := sendOnce(t, c, "GET", "http://api.test/"); err != nil || code != 200 || baseC.sent() != 1 {
			t.Fatalf("pod C, started after A closed: %d, %v, %d sent; want it sent", code, err, baseC.sent())
		}
		if fs := b.Snapshot().Fleet; fs.Ignored != 0 {
			t.Fatalf("pod B's fleet snapshot %+v, want nothing ignored", fs)
		}
	})
}

// TestFleetChainFreshPod: a chain of trips from one pod, arriving faster
// than the probe spacing, refuses a pod that has not called the host yet
// (so nothing of its own contradicts the first) for one spacing and a
// refusal at most: a hold adopted while one runs does not put off the
// probe, whose success then declines the rest of the chain.
func TestFleetChainFreshPod(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hub := &memHub{}
		b := newPod(t, &memFleet{hub: hub}, &statusBase{codes: []int{200}})
		synctest.Wait()
		hub.mu.Lock()
		sink := hub.sinks[0].s
		hub.mu.Unlock()
		const hold, every, step = time.Second, 30 * time.Millisecond, 10 * time.Millisecond
		stop := make(chan struct{})
		go func() {
			for i := range 200 {
				sink.Apply(FleetUpdate{Kind: FleetBreakerOpen, Host: "api.test:80", From: "sick", Generation: uint64(i + 1), Until: time.Now().Add(hold)})
				select {
				case <-stop:
					return
				case <-time.After(every):
				}
			}
		}()
		time.Sleep(step)
		// The first hold's spacing: its time (with the grace) ÷ HalfOpenCalls.
		spacing := (hold + hold/4) / DefaultHalfOpenCalls
		var refusedSince time.Time
		var longest time.Duration
		ok := 0
		for range 300 { // 3 s of calls, one every 10 ms
			if code, err := sendOnce(t, b, "GET", "http://api.test/"); err == nil && code == 200 {
				ok++
				if !refusedSince.IsZero() {
					longest = max(longest, time.Since(refusedSince))
				}
				refusedSince = time.Time{}
			} else if refusedSince.IsZero() {
				refusedSince = time.Now()
			}
			time.Sleep(step)
		}
		close(stop)
		if !refusedSince.IsZero() {
			longest = max(longest, time.Since(refusedSince))
		}
		if longest > spacing+2*step {
			t.Errorf("refused for %v in a row under a chain of trips every %v, want one spacing (%v) at most; %d of 300 calls answered", longest, every, spacing, ok)
		}
		if ok < 280 {
			t.Errorf("%d of 300 calls answered under the chain, want the probe's success to decline the rest", ok)
		}
	})
}

// TestFleetPushbackWeighed: another pod's pause is weighed as its trip is.
// A pod whose local proxy answers 503 with a Retry-After, renewing its
// pause each time it ends, does not pause a pod the host answers; a
// liar's pause dated a day ahead does not either; a 503 of the pod's own
// adopts the pause it declined; and a pod with no answer of its own is
// held by a chain of such pauses for MaxRetryAfter at most before it
// sends again, and then declines the rest.
func TestFleetPushbackWeighed(t *testing.T) {
	t.Run("sick proxy", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			hub := &memHub{}
			sick := &statusBase{codes: []int{503}, header: http.Header{"Retry-After": {"1"}}}
			// The pushback layer alone: what is weighed here is the pause.
			pod := func(base http.RoundTripper) *Transport {
				tr := mustNew(t, Config{Base: base, Default: only(Policy{}, "pushback"), Fleet: &memFleet{hub: hub}})
				t.Cleanup(func() { _ = tr.Close() })
				return tr
			}
			a, b := pod(sick), pod(&statusBase{codes: []int{200}})
			synctest.Wait()
			// B is calling already when A's proxy breaks (a pod with no
			// answer yet is chain bounded's case).
			_, _ = sendOnce(t, b, "GET", "http://api.test/")
			ok := 0
			var lastErr error
			for i := range 400 { // 20 s, B every 50 ms, A every 100 ms
				if i%2 == 0 {
					_, _ = sendOnce(t, a, "GET", "http://api.test/")
					synctest.Wait() // its pause delivered
				}
				if code, err := sendOnce(t, b, "GET", "http://api.test/"); err == nil && code == 200 {
					ok++
				} else if lastErr == nil {
					lastErr = err
				}
				time.Sleep(50 * time.Millisecond)
			}
			if sick.sent() < 15 {
				t.Fatalf("the sick pod sent %d, want a pause renewed each second", sick.sent())
			}
			if ok < 396 {
				t.Errorf("healthy pod answered %d of 400 while a sick pod's proxy renewed its 503 pause, want ≥ 99 %% (first refusal: %v)", ok, lastErr)
			}
		})
	})
	t.Run("liar", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			hub := &memHub{}
			b := newPod(t, &memFleet{hub: hub}, &statusBase{codes: []int{200}})
			synctest.Wait()
			for range 100 {
				_, _ = sendOnce(t, b, "GET", "http://api.test/")
			}
			hub.mu.Lock()
			sink := hub.sinks[0].s
			hub.mu.Unlock()
			sink.Apply(FleetUpdate{Kind: FleetPushback, Host: "api.test:80", Until: time.Now().Add(23 * time.Hour), From: "liar"})
			if code, err := sendOnce(t, b, "GET", "http://api.test/"); err != nil || code != 200 {
				t.Fatalf("after a liar's pause: %d, %v; want the pod's fresh successes to decline it", code, err)
			}
			if d := b.Snapshot().Fleet.Declined; d == 0 {
				t.Errorf("Declined %d, want the liar's pause counted", d)
			}
		})
	})
	t.Run("own 503 adopts", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			hub := &memHub{}
			base := &statusBase{codes: []int{200, 503}}
			b := newPod(t, &memFleet{hub: hub}, base)
			synctest.Wait()
			_, _ = sendOnce(t, b, "GET", "http://api.test/")
			hub.mu.Lock()
			sink := hub.sinks[0].s
			hub.mu.Unlock()
			sink.Apply(FleetUpdate{Kind: FleetPushback, Host: "api.test:80", Until: time.Now().Add(10 * time.Second), From: "a"})
			if code, _ := sendOnce(t, b, "GET", "http://api.test/"); code != 503 {
				t.Fatalf("declined pause: %d, want the call sent (and answered 503)", code)
			}
			if _, err := sendOnce(t, b, "GET", "http://api.test/"); !errors.Is(err, ErrPushback) {
				t.Fatalf("after its own 503: %v, want the declined pause adopted", err)
			}
		})
	})
	t.Run("chain bounded", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			hub := &memHub{}
			base := &statusBase{codes: []int{200}}
			c := newPod(t, &memFleet{hub: hub}, base)
			synctest.Wait()
			hub.mu.Lock()
			sink := hub.sinks[0].s
			hub.mu.Unlock()
			stop := make(chan struct{})
			go func() {
				for range 200 {
					sink.Apply(FleetUpdate{Kind: FleetPushback, Host: "api.test:80", Until: time.Now().Add(23 * time.Hour), From: "sick"})
					select {
					case <-stop:
						return
					case <-time.After(500 * time.Millisecond):
					}
				}
			}()
			time.Sleep(time.Millisecond)
			maxRA := DefaultMaxRetryAfter // fleetPolicy leaves it to the default
			var first time.Time
			start, ok := time.Now(), 0
			for range 700 { // 70 s, one call every 100 ms
				if code, err := sendOnce(t, c, "GET", "http://api.test/"); err == nil && code == 200 {
					ok++
					if first.IsZero() {
						first = time.Now()
					}
				}
				time.Sleep(100 * time.Millisecond)
			}
			close(stop)
			if first.IsZero() || first.Sub(start) > maxRA+100*time.Millisecond {
				t.Fatalf("first call answered %v after the chain began, want within MaxRetryAfter (%v)", first.Sub(start), maxRA)
			}
			if want := 700 - int(maxRA/(100*time.Millisecond)) - 1; ok < want {
				t.Errorf("%d of 700 answered, want %d: after its first answer the pod declines the chain", ok, want)
			}
		})
	})
}

func budgetPolicy() Policy {
	p := only(Policy{}, "retry")
	p.Retry.MaxAttempts = 3
	p.Retry.Base, p.Retry.Cap = time.Millisecond, 5*time.Millisecond
	// A floor of 5 retries a second over a 2 s window: 10 retries a
	// window; a ratio too small to matter at this traffic.
	p.Retry.Budget = Budget{Ratio: 0.01, Window: 2 * time.Second, MinPerSecond: 5}
	return p
}

// TestFleetRetryBudget: four pods calling a host, each with a budget
// floor of 10 retries a window, retry about 10 times in all when they
// share the budget through a Fleet, against about 40 each alone. Each
// pod's fourth of its 36 calls fail at every attempt (7 retries each, 28
// wanted): few enough that the retry throttle, which holds every retry
// once five calls in a row failed, never holds, so the floor is what
// bounds them. A fifth pod that calls without retrying answers with its
// calls.
func TestFleetRetryBudget(t *testing.T) {
	for _, shared := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			hub := &memHub{}
			base := &scriptBase{step: func(_ int, req *http.Request) (*http.Response, error) {
				if req.URL.RawQuery == "fail" {
					return response(req, 500), nil
				}
				return response(req, 200), nil
			}}
			var pods []*Transport
			for range 4 {
				p := budgetPolicy()
				p.Retry.MaxAttempts = 8
				cfg := Config{Base: base, Default: p}
				if shared {
					cfg.Fleet = &memFleet{hub: hub}
				}
				tr := mustNew(t, cfg)
				t.Cleanup(func() { _ = tr.Close() })
				pods = append(pods, tr)
			}
			healthy := &statusBase{codes: []int{200}}
			var h *Transport
			if shared {
				h = mustNew(t, Config{Base: healthy, Default: budgetPolicy(), Fleet: &memFleet{hub: hub}})
				t.Cleanup(func() { _ = h.Close() })
			}
			calls := 0
			var wg sync.WaitGroup
			var mu sync.Mutex
			for _, tr := range pods {
				wg.Go(func() {
					for i := range 36 { // one every 50 ms: under the 2 s window
						url := "http://api.test/"
						if i%9 == 0 {
							url += "?fail"
						}
						_, _ = sendOnce(t, tr, "GET", url)
						mu.Lock()
						calls++
						mu.Unlock()
						time.Sleep(50 * time.Millisecond)
					}
				})
			}
			if h != nil {
				wg.Go(func() {
					for range 36 {
						_, _ = sendOnce(t, h, "GET", "http://api.test/")
						time.Sleep(50 * time.Millisecond)
					}
				})
			}
			wg.Wait()
			retries := base.calls() - calls
			t.Logf("shared %v: %d calls, %d retries", shared, calls, retries)
			if shared {
				// The fleet's floor is 10 a window (plus the ratio's 1 or
				// 2, the healthy pod's calls counted); a retry taken
				// before another pod's count arrived may add one.
				if retries > 10+2+2 || retries < 8 {
					t.Fatalf("shared budget: %d retries, want about 10", retries)
				}
				bs := pods[0].Snapshot().Host("api.test:80")[0].Budget
				if bs.FleetCalls == 0 || bs.FleetRetries == 0 {
					t.Fatalf("pod 0's budget %+v, want the fleet's counts", bs)
				}
				hs := h.Snapshot()
				if b := hs.Host("api.test:80")[0].Budget; b.FleetRetries == 0 || hs.Fleet.Published == 0 {
					t.Fatalf("healthy pod: budget %+v, fleet %+v; want it to hold the others' counts and answer with its own", b, hs.Fleet)
				}
			} else if retries < 30 {
				t.Fatalf("local budgets: %d retries, want about 4 × 10", retries)
			}
		})
	}
}
