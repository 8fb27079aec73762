package bulwark

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"pgregory.net/rapid"
)

// The fleet's contracts (see Fleet) against a model: pods over an
// in-memory fleet, a host that is up or down for all, and each pod's own
// path, which may break (every dial refused). Random histories of calls,
// breaks, mends, outages and clock jumps; after each step the model
// checks:
//
//  1. own failures stay own: while the host is up for all, a pod all of
//     whose failures were dials refused while another pod's latest counts
//     showed the host answering it publishes no trip;
//  2. weighed, not obeyed: a pod whose own latest attempt was answered,
//     within fleetFresh, holds no adopted hold;
//  3. no stronger than local: an adopted hold ends within the pod's own
//     open time for k trips in a row, k the trips delivered to it since
//     its last answered attempt (OpenFor doubled k-1 times, up to
//     MaxOpenFor);
//  4. a pause is weighed too: a pod whose own latest answer, within
//     fleetFresh, had no 429 or 503 is not paused (a pod's own proxy may
//     answer it 503 with a Retry-After, which pauses it and is published);
//  5. a chain of pauses is bounded: a pod whose latest answer was not a
//     429 or 503 is paused no later than MaxRetryAfter after the first
//     pause it could adopt since that answer.

// weighHub is the in-memory store of the model test: it delivers each
// update to the other pods at once, records the trips each pod publishes,
// the latest counts of each pod that each other pod holds (counts are kept
// only by a pod that has called the host), and counts the trips delivered
// to each.
type weighHub struct {
	mu       sync.Mutex
	sinks    map[int]*FleetSink
	attached map[int]bool                // the pod has called the host
	seen     map[int]map[int]FleetUpdate // by receiving pod, each other pod's latest counts
	opens    map[int]int                 // trips published, by pod
	got      map[int]int                 // trips delivered, by pod
	pushes   map[int][]time.Time         // pauses delivered, by pod
}

type weighFleet struct {
	hub *weighHub
	id  int
}

func (f *weighFleet) Publish(_ context.Context, u FleetUpdate) error {
	u.From = fmt.Sprint("pod", f.id)
	f.hub.mu.Lock()
	defer f.hub.mu.Unlock()
	switch u.Kind {
	case FleetBreakerOpen:
		f.hub.opens[f.id]++
	}
	for id, s := range f.hub.sinks {
		if id != f.id {
			switch {
			case u.Kind == FleetBreakerOpen:
				f.hub.got[id]++
			case u.Kind == FleetPushback:
				f.hub.pushes[id] = append(f.hub.pushes[id], time.Now())
			case u.Kind == FleetBreakerCounts && f.hub.attached[id]:
				f.hub.seen[id][f.id] = u
			}
			s.Apply(u)
		}
	}
	return nil
}

func (f *weighFleet) Receive(ctx context.Context, s *FleetSink) error {
	f.hub.mu.Lock()
	f.hub.sinks[f.id] = s
	f.hub.mu.Unlock()
	s.Connected()
	<-ctx.Done()
	f.hub.mu.Lock()
	delete(f.hub.sinks, f.id)
	f.hub.mu.Unlock()
	return ctx.Err()
}

// weighWorld is the host and the pods' paths to it.
type weighWorld struct {
	mu     sync.Mutex
	down   bool         // the host answers 503 to everyone
	broken map[int]bool // the pod's own dials are refused
	proxy  map[int]bool // the pod's own proxy answers 503, Retry-After 3
}

type weighBase struct {
	w  *weighWorld
	id int
}

func (b *weighBase) RoundTrip(req *http.Request) (*http.Response, error) {
	b.w.mu.Lock()
	broken, down, proxy := b.w.broken[b.id], b.w.down, b.w.proxy[b.id]
	b.w.mu.Unlock()
	if broken {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	}
	if proxy {
		return &http.Response{StatusCode: 503, Header: http.Header{"Retry-After": {"3"}}, Body: http.NoBody, Request: req}, nil
	}
	code := 200
	if down {
		code = 503
	}
	return &http.Response{StatusCode: code, Header: http.Header{}, Body: http.NoBody, Request: req}, nil
}

// weighPod is the model's view of one pod.
type weighPod struct {
	answered   time.Time // its last attempt answered 200 (zero: none)
	okLast     bool      // no attempt failed since
	gotAtOK    int       // hub.got when it was
	unexcused  bool      // a failure the contract does not call its own
	everFailed bool
	sent       time.Time // its last attempt was answered, with any status
	pushedBack bool      // that answer was a 429 or 503
}

type weighStep struct {
	op  string // call, break, mend, down, up, proxy, unproxy, sleep
	pod int
	d   time.Duration
}

func TestFleetWeighModel(t *testing.T) {
	const pods = 3
	rapid.Check(t, func(rt *rapid.T) {
		steps := rapid.SliceOfN(rapid.Custom(func(rt *rapid.T) weighStep {
			return weighStep{
				op:  rapid.SampledFrom([]string{"call", "call", "call", "call", "break", "mend", "down", "up", "proxy", "unproxy", "sleep"}).Draw(rt, "op"),
				pod: rapid.IntRange(0, pods-1).Draw(rt, "pod"),
				d:   time.Duration(rapid.IntRange(1, 4000).Draw(rt, "ms")) * time.Millisecond,
			}
		}), 1, 120).Draw(rt, "steps")
		var f propFailure
		defer f.report(rt)
		synctest.Test(t, func(t *testing.T) { runWeighModel(t, &f, pods, steps) })
	})
}

func runWeighModel(t *testing.T, f *propFailure, n int, steps []weighStep) {
	hub := &weighHub{sinks: map[int]*FleetSink{}, attached: map[int]bool{}, seen: map[int]map[int]FleetUpdate{},
		opens: map[int]int{}, got: map[int]int{}, pushes: map[int][]time.Time{}}
	w := &weighWorld{broken: map[int]bool{}, proxy: map[int]bool{}}
	p := fleetPolicy()
	p.Retry.MaxRetryAfter = 4 * time.Second // so that a chain of pauses is soon longer
	trs := make([]*Transport, n)
	for i := range trs {
		tr, err := New(Config{Base: &weighBase{w, i}, Default: p, Fleet: &weighFleet{hub, i}})
		if err != nil {
			f.Fatalf("%v", err)
			return
		}
		defer tr.Close()
		trs[i] = tr
	}
	synctest.Wait()
	model := make([]weighPod, n)
	hostEverDown := false
	var history []string
	for _, s := range steps {
		now := time.Now()
		history = append(history, fmt.Sprintf("%s %d %v", s.op, s.pod, s.d))
		switch s.op {
		case "break", "mend":
			w.mu.Lock()
			w.broken[s.pod] = s.op == "break"
			w.mu.Unlock()
		case "down", "up":
			w.mu.Lock()
			w.down = s.op == "down"
			hostEverDown = hostEverDown || w.down
			w.mu.Unlock()
		case "proxy", "unproxy":
			w.mu.Lock()
			w.proxy[s.pod] = s.op == "proxy"
			w.mu.Unlock()
		case "sleep":
			time.Sleep(s.d)
		case "call":
			// Whether another pod's latest counts show the host answering
			// it, as the pod holds them when this attempt fails.
			hub.mu.Lock()
			if !hub.attached[s.pod] {
				hub.attached[s.pod], hub.seen[s.pod] = true, map[int]FleetUpdate{}
				if len(hub.pushes[s.pod]) > 0 {
					// Pauses delivered before the pod called the host are
					// kept by its fleet link and applied now, at its first call.
					hub.pushes[s.pod] = []time.Time{now}
				}
			}
			excused := false
			for _, u := range hub.seen[s.pod] {
				if u.Until.After(now) && answering(breakerCounts(u)) {
					excused = true
				}
			}
			hub.mu.Unlock()
			w.mu.Lock()
			broken, down := w.broken[s.pod], w.down
			w.mu.Unlock()
			code, err := sendOnce(t, trs[s.pod], "GET", "http://api.test/")
			m := &model[s.pod]
			if err == nil {
				m.sent, m.pushedBack = now, pushbackStatus(code)
			}
			switch {
			case err == nil && code == 200:
				hub.mu.Lock()
				m.answered, m.okLast, m.gotAtOK = now, true, hub.got[s.pod]
				hub.mu.Unlock()
			case errors.Is(err, ErrBreakerOpen), errors.Is(err, ErrPushback):
				// Refused: not sent, no evidence.
			default:
				m.okLast, m.everFailed = false, true
				if !broken || down || !excused || w.proxy[s.pod] {
					m.unexcused = true
				}
			}
		}
		synctest.Wait()
		now = time.Now()
		hub.mu.Lock()
		opens, got := maps.Clone(hub.opens), maps.Clone(hub.got)
		pushes := maps.Clone(hub.pushes)
		hub.mu.Unlock()
		for i, tr := range trs {
			m := model[i]
			h := tr.Snapshot().Host("api.test:80")
			if len(h) == 0 {
				continue // not called yet
			}
			b := h[0].Breaker
			// 1. Own failures stay own.
			if !hostEverDown && m.everFailed && !m.unexcused && opens[i] > 0 {
				f.Fatalf("pod %d published %d trips, every failure of its own dials refused while another pod was answered\n%s", i, opens[i], strings.Join(history, "\n"))
				return
			}
			adopted := b.State == CircuitOpen && b.Trips == 0 && b.Control == BreakerAuto
			// 2. Weighed, not obeyed.
			if adopted && m.okLast && !m.answered.IsZero() && now.Sub(m.answered) <= fleetFresh {
				f.Fatalf("pod %d holds an adopted hold until %v, its last attempt answered %v ago\n%s", i, b.OpenUntil, now.Sub(m.answered), strings.Join(history, "\n"))
				return
			}
			paused := h[0].Pushback.Until.After(now)
			// 4. A pause is weighed too.
			if paused && m.okLast && !m.answered.IsZero() && now.Sub(m.answered) <= fleetFresh {
				f.Fatalf("pod %d paused until %v, its last attempt answered %v ago\n%s", i, h[0].Pushback.Until, now.Sub(m.answered), strings.Join(history, "\n"))
				return
			}
			// 5. A chain of pauses is bounded.
			if paused && !m.pushedBack {
				since := m.sent // the first pause it could adopt came after its last answer
				if m.okLast && !m.answered.IsZero() {
					since = m.answered.Add(fleetFresh)
				}
				first := time.Time{}
				for _, at := range pushes[i] {
					if !at.Before(since) && (m.sent.IsZero() || at.After(since) || !m.okLast) {
						first = at
						break
					}
				}
				if bound := first.Add(p.Retry.MaxRetryAfter); first.IsZero() || h[0].Pushback.Until.After(bound) {
					f.Fatalf("pod %d paused until %v, the first pause it could adopt since its last answer (%v) delivered at %v; want at most MaxRetryAfter after it\n%s",
						i, h[0].Pushback.Until, m.sent, first, strings.Join(history, "\n"))
					return
				}
			}
			// 3. No stronger than local.
			if adopted {
				k := got[i]
				if !m.answered.IsZero() {
					k -= m.gotAtOK
				}
				if bound := openCeil(p.Breaker.OpenFor, p.Breaker.MaxOpenFor, max(k, 1)); b.OpenUntil.Sub(now) > bound {
					f.Fatalf("pod %d holds an adopted hold %v more, after %d trips delivered since its last answer; want at most %v\n%s",
						i, b.OpenUntil.Sub(now), k, bound, strings.Join(history, "\n"))
					return
				}
			}
		}
	}
}
