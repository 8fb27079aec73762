package bulwark

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"pgregory.net/rapid"
)

// The breaker's reference model: the contract of the Breaker doc comment,
// written out as plainly as it reads, over the outcomes of the calls and
// the clock. It knows nothing of gobreaker, buckets or atomics. The
// state-machine test below drives a real Transport and the model with the
// same histories and fails where they disagree on any call's fate (sent or
// refused) or on any trip or close.
//
// A time window (Breaker.Window) holds the calls of the last Window and up
// to a tenth more (its buckets): the model judges the last nine tenths and
// the last whole Window apart, and where they disagree either verdict is
// within the contract, and the model follows the breaker's.
//
// What it leaves out, and why: the open time's random cut (the test sets
// it to none, so open times are exact), the fleet, the learned hold with
// a time window (whose start is within the same tolerance), and
// concurrent calls while the breaker is not closed (whose order is a race
// by nature; the half-open round's bound on them is
// TestBreakerHalfOpenConcurrency's).

// modelOp is one call's outcome, as opBase's letters: S 200, L 200 slow,
// F 503, R 429, E a transport error, T bulwark's attempt timeout, 4 404.
type modelOp byte

func (o modelOp) failed() bool     { return o == 'F' || o == 'R' || o == 'E' || o == 'T' }
func (o modelOp) unanswered() bool { return o == 'E' || o == 'T' }
func (o modelOp) answered() bool   { return o.failed() && o != 'T' } // any failure but a timeout
func (o modelOp) slow() bool       { return o == 'L' }
func (o modelOp) ignored() bool    { return o == '4' }
func (o modelOp) ok() bool         { return o == 'S' }

type modelState int

const (
	modelClosed modelState = iota
	modelOpen
	modelHalfOpen
)

// breakerModel is the contract. Its fields are the Breaker's figures and
// what the contract says the breaker remembers.
type breakerModel struct {
	windowCalls, minCalls, halfOpenCalls, consecutive int
	failureRate, slowRate                             float64
	openFor, maxOpenFor                               time.Duration
	learned                                           bool // SlowCall learned: the rates are held for the hold
	window                                            time.Duration

	state modelState
	// Closed: the last windowCalls counted calls (true: failed / slow),
	// the run of unanswered attempts and when it began, since when the
	// rate rules have been met.
	fails, slows []bool
	hard         []bool      // failed, and not by a timeout
	at           []time.Time // with a time window, when each call was judged
	run          int
	runSince     time.Time
	runErr       bool // the run has a transport error in it
	dueSince     time.Time
	// Open: until when, the spaced probes' spacing, when the next may go,
	// whether a request was refused since the last, how many requests the
	// open period still lets through.
	until, next time.Time
	spacing     time.Duration
	refused     bool
	left        int
	// Half-open: the probes that succeeded.
	succeeded int
	// Trips in a row, and in all.
	trips, total int
}

// openTime is OpenFor doubled on each trip in a row, capped.
func (m *breakerModel) openTime() time.Duration {
	d := m.openFor
	for i := 1; i < m.trips && d < m.maxOpenFor; i++ {
		d *= 2
	}
	return min(d, m.maxOpenFor)
}

func (m *breakerModel) trip(now time.Time) {
	m.state = modelOpen
	m.trips++
	m.total++
	d := m.openTime()
	m.until, m.spacing = now.Add(d), d/time.Duration(m.halfOpenCalls)
	m.next, m.refused, m.left = now.Add(m.spacing), false, m.halfOpenCalls
	m.forget()
}

// forget empties what a closed breaker counts: every state change does.
func (m *breakerModel) forget() {
	m.fails, m.slows, m.hard, m.at, m.run, m.dueSince, m.succeeded = nil, nil, nil, nil, 0, time.Time{}, 0
}

// admits says whether a request at now is sent: closed, always; open, a
// spaced probe once a spacing has passed and a request was refused since
// the last, while the open period keeps one request for the half-open
// round; half-open, the round's probes.
func (m *breakerModel) admits(now time.Time) bool {
	if m.state == modelOpen && !now.Before(m.until) {
		m.state = modelHalfOpen
	}
	switch m.state {
	case modelClosed, modelHalfOpen:
		return true
	}
	if !m.refused {
		m.refused = true
		return false
	}
	if now.Before(m.next) || m.left <= 1 {
		return false
	}
	m.next, m.refused = now.Add(m.spacing), false
	m.left--
	return true
}

// outcome takes a sent call's outcome, judged at now; hold is the learned
// hold then in force. ambiguous reports a time window's judgement that the
// contract's tolerance leaves open: the caller then trips the model if the
// breaker tripped.
func (m *breakerModel) outcome(op modelOp, now time.Time, hold time.Duration) (ambiguous bool) {
	if op.ignored() {
		return false
	}
	switch m.state {
	case modelOpen: // a spaced probe: a success ends the open time
		if op.ok() {
			m.state, m.left = modelHalfOpen, m.halfOpenCalls
			m.forget()
		}
		return false
	case modelHalfOpen: // every probe must succeed, and not slowly
		if !op.ok() {
			m.trip(now)
			return false
		}
		if m.succeeded++; m.succeeded >= m.halfOpenCalls {
			m.state, m.trips = modelClosed, 0
			m.forget()
		}
		return false
	}
	m.fails, m.slows, m.at = append(m.fails, op.failed()), append(m.slows, op.slow()), append(m.at, now)
	m.hard = append(m.hard, op.answered())
	if m.window == 0 && len(m.fails) > m.windowCalls {
		m.fails, m.slows, m.hard, m.at = m.fails[1:], m.slows[1:], m.hard[1:], m.at[1:]
	}
	if !op.unanswered() {
		m.run = 0
	} else if m.run++; m.run == 1 {
		m.runSince, m.runErr = now, false
	}
	m.runErr = m.runErr || op == 'E'
	runs := m.consecutive > 0 && m.run >= m.consecutive && (m.runErr || now.Sub(m.runSince) >= hold)
	if m.window > 0 {
		// The window holds the calls since some start between the last
		// Window and its last 9/10: the rates over every such span (a
		// rate over a middle span is not bounded by the two ends').
		tenth := (m.window-1)/10 + 1
		longest, shortest := now.Add(-m.window).Add(1), now.Add(-9*tenth)
		all, any := true, false
		for _, from := range append([]time.Time{longest, shortest}, m.at...) {
			if !from.Before(longest) && !from.After(shortest) {
				due, _ := m.dueFrom(from)
				all, any = all && due, any || due
			}
		}
		switch {
		case runs || all:
			m.trip(now)
		case any:
			return true
		}
		return false
	}
	due, answered := m.dueFrom(time.Time{})
	switch {
	case !due:
		m.dueSince = time.Time{}
	case m.dueSince.IsZero():
		m.dueSince = now
	}
	if due && (!m.learned || answered || now.Sub(m.dueSince) >= hold) || runs {
		m.trip(now)
	}
	return false
}

// dueFrom is the rate rules over the calls judged at from or later, and
// answered the failure rate met without counting timeouts.
func (m *breakerModel) dueFrom(from time.Time) (due, answered bool) {
	var calls, fails, slows, hard int
	for i, at := range m.at {
		if at.Before(from) {
			continue
		}
		calls++
		if m.fails[i] {
			fails++
		}
		if m.hard[i] {
			hard++
		}
		if m.slows[i] {
			slows++
		}
	}
	enough := calls > 0 && calls >= m.minCalls
	return enough && (float64(fails)/float64(calls) >= m.failureRate || float64(slows)/float64(calls) >= m.slowRate),
		enough && float64(hard)/float64(calls) >= m.failureRate
}

// modelStep is one step of a history: a call (or a batch of concurrent
// calls of one outcome) after a pause, a clock jump, or an Update of the
// thresholds.
type modelStep struct {
	op     modelOp
	gap    time.Duration
	batch  int // calls at once: 1, or 2 to 4
	update *Breaker
}

func (s modelStep) String() string {
	switch {
	case s.update != nil:
		return fmt.Sprintf("Update(FailureRate %.2f, SlowCallRate %.2f, MinCalls %d, ConsecutiveFailures %d)",
			s.update.FailureRate, s.update.SlowCallRate, s.update.MinCalls, s.update.ConsecutiveFailures)
	case s.op == 0:
		return fmt.Sprintf("+%v", s.gap)
	case s.batch > 1:
		return fmt.Sprintf("+%v %d×%c at once", s.gap, s.batch, s.op)
	}
	return fmt.Sprintf("+%v %c", s.gap, s.op)
}

// The attempt timeout of the model's policy, and how long a slow call
// takes: past a set SlowCall (2 s, past a healthy call) and past the
// learned one's ceiling (half the attempt timeout), so that a call is
// slow or not whatever has been learned, and within the attempt timeout.
const (
	modelAttempt = 8 * time.Second
	modelSlow    = 6 * time.Second
)

// drawModelHistory draws a breaker, a healthy call's latency and a
// history: maybe a healthy past, then segments of calls, each a failure
// process (a healthy run, a rate at random, a repeating pattern) at a call
// rate from 0.1 to 1,000 a second, between clock jumps and Updates.
func drawModelHistory(t *rapid.T) (Breaker, time.Duration, []modelStep) {
	windowCalls := rapid.IntRange(1, 40).Draw(t, "windowCalls")
	b := Breaker{
		WindowCalls:         windowCalls,
		MinCalls:            rapid.IntRange(1, windowCalls).Draw(t, "minCalls"),
		FailureRate:         rapid.SampledFrom([]float64{0.2, 0.5, 0.6, 1}).Draw(t, "failureRate"),
		SlowCallRate:        rapid.SampledFrom([]float64{0.3, 0.5, 1}).Draw(t, "slowRate"),
		ConsecutiveFailures: rapid.SampledFrom([]int{-1, 3, 10}).Draw(t, "consecutive"),
		OpenFor:             time.Duration(rapid.IntRange(1, 2000).Draw(t, "openForMs")) * time.Millisecond,
		HalfOpenCalls:       rapid.IntRange(1, 5).Draw(t, "halfOpen"),
	}
	b.MaxOpenFor = b.OpenFor * time.Duration(rapid.IntRange(1, 8).Draw(t, "maxOpenFactor"))
	if !rapid.Bool().Draw(t, "learned") {
		b.SlowCall = 2 * time.Second
	}
	if rapid.IntRange(0, 3).Draw(t, "timeWindow") == 0 {
		b.Window = rapid.SampledFrom([]time.Duration{100 * time.Millisecond, time.Second, 10 * time.Second, time.Minute}).Draw(t, "window")
		b.SlowCall = 2 * time.Second
	}
	var steps []modelStep
	// A healthy call takes latency: none, or 1 s, whose learned hold (12 ×
	// the p99.9) is past its cap, the attempt timeout.
	latency := rapid.SampledFrom([]time.Duration{0, time.Second}).Draw(t, "latency")
	if rapid.Bool().Draw(t, "baseline") {
		// A healthy past long enough for the host's latency to be learned
		// (and with it the hold).
		for range 300 {
			steps = append(steps, modelStep{op: 'S', gap: 10 * time.Millisecond, batch: 1})
		}
	}
	for range rapid.IntRange(1, 6).Draw(t, "segments") {
		switch rapid.IntRange(0, 9).Draw(t, "event") {
		case 0:
			steps = append(steps, modelStep{gap: time.Duration(rapid.IntRange(1, 600).Draw(t, "jumpS")) * time.Second})
		case 1:
			u := b
			u.FailureRate = rapid.SampledFrom([]float64{0.2, 0.5, 0.6, 1}).Draw(t, "newFailureRate")
			u.SlowCallRate = rapid.SampledFrom([]float64{0.3, 0.5, 1}).Draw(t, "newSlowRate")
			u.MinCalls = rapid.IntRange(1, windowCalls).Draw(t, "newMinCalls")
			u.ConsecutiveFailures = rapid.SampledFrom([]int{-1, 3, 10}).Draw(t, "newConsecutive")
			steps = append(steps, modelStep{update: &u})
		}
		gap := rapid.SampledFrom([]time.Duration{time.Millisecond, 10 * time.Millisecond, 50 * time.Millisecond,
			300 * time.Millisecond, time.Second, 10 * time.Second}).Draw(t, "gap")
		n := rapid.IntRange(1, 60).Draw(t, "calls")
		var next func(i int) modelOp
		switch rapid.IntRange(0, 2).Draw(t, "process") {
		case 0: // healthy
			next = func(int) modelOp { return 'S' }
		case 1: // at random, with one kind of failure
			bad := modelOp(rapid.SampledFrom([]byte("FRETL4")).Draw(t, "bad"))
			p := rapid.IntRange(0, 100).Draw(t, "failPct")
			next = func(int) modelOp {
				if rapid.IntRange(0, 99).Draw(t, "roll") < p {
					return bad
				}
				return 'S'
			}
		default: // a repeating pattern, e.g. a round robin over dead instances
			pat := rapid.SliceOfN(rapid.SampledFrom([]byte("SSFRETL4")), 1, 6).Draw(t, "pattern")
			next = func(i int) modelOp { return modelOp(pat[i%len(pat)]) }
		}
		for i := range n {
			s := modelStep{op: next(i), gap: gap, batch: 1}
			if rapid.IntRange(0, 9).Draw(t, "concurrent") == 0 {
				s.batch = rapid.IntRange(2, 4).Draw(t, "batch")
			}
			steps = append(steps, s)
		}
	}
	return b, latency, steps
}

// modelBase answers by the X-Op letter, as opBase, a healthy call after
// latency and a slow one after modelSlow; a request with X-Wait waits
// until release is closed.
type modelBase struct {
	latency time.Duration
	mu      sync.Mutex
	release chan struct{}
	calls   int
}

func (m *modelBase) RoundTrip(req *http.Request) (*http.Response, error) {
	m.mu.Lock()
	m.calls++
	release := m.release
	m.mu.Unlock()
	if req.Header.Get("X-Wait") != "" {
		<-release
	}
	code := 200
	switch req.Header.Get("X-Op") {
	case "F":
		code = 503
	case "R":
		code = 429
	case "4":
		code = 404
	case "E":
		return nil, errStub
	case "T":
		return nil, &timeoutError{limit: ErrAttemptTimeout, cause: errors.New("deadline")}
	case "L":
		time.Sleep(modelSlow)
	case "S":
		time.Sleep(m.latency)
	}
	return &http.Response{StatusCode: code, Status: http.StatusText(code), Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{}, Body: io.NopCloser(strings.NewReader("")), Request: req}, nil
}

func (m *modelBase) sent() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.calls
}

// TestBreakerMatchesModel: a Transport with the breaker and the attempt
// deadline (whose measurements the learned hold comes from), over an
// in-memory host, and the model, given the same random histories
// (outcomes ok, 5xx, 429, timeout, transport error, slow and ignored; at
// random, in patterns and healthy runs; 0.1 to 1,000 calls a second; with
// and without a healthy past; batches of concurrent calls; clock jumps;
// Updates of the thresholds), agree on every call: refused or sent (a
// probe, while open), and on every trip and close (the snapshot's trips
// in a row and in all). More histories: -rapid.checks=10000.
func TestBreakerMatchesModel(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		b, latency, steps := drawModelHistory(rt)
		var f propFailure
		defer f.report(rt)
		synctest.Test(t, func(t *testing.T) {
			runBreakerModel(&f, t, b, latency, steps)
		})
	})
}

func runBreakerModel(f *propFailure, t *testing.T, b Breaker, latency time.Duration, steps []modelStep) {
	base := &modelBase{latency: latency}
	cfg := func(b Breaker) Config {
		// The attempt deadline is there for the learned bounds, which it
		// measures; it is set, so it cuts no call here.
		p := Policy{Breaker: b, Timeout: Timeout{Attempt: modelAttempt, Total: time.Minute}}
		return Config{Base: base, Default: only(p, "breaker", "timeout")}
	}
	tr, err := New(cfg(b))
	if err != nil {
		f.Fatalf("New: %v", err)
		return
	}
	tr.randN = func(int64) int64 { return 0 } // open times exactly as doubled
	defer tr.Close()
	m := &breakerModel{windowCalls: b.WindowCalls, minCalls: b.MinCalls, halfOpenCalls: b.HalfOpenCalls,
		consecutive: b.ConsecutiveFailures, failureRate: b.FailureRate, slowRate: b.SlowCallRate,
		openFor: b.OpenFor, maxOpenFor: b.MaxOpenFor, learned: b.SlowCall == 0, window: b.Window}
	bl := layerOf[*breakerLayer](t, tr, breakerURL)
	// The hold in force: the learned third attempt's timeout, which the
	// learned bounds give (read when the call is judged), capped at the
	// attempt timeout.
	hold := func() time.Duration { return min(bl.e.learned.failingFor(), modelAttempt) }
	call := func(op modelOp, wait bool) (sent bool, refused bool, err error) {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, breakerURL, nil)
		req.Header.Set("X-Op", string(op))
		if wait {
			req.Header.Set("X-Wait", "1")
		}
		before := base.sent()
		resp, err := tr.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
		}
		return base.sent() > before, errors.Is(err, ErrBreakerOpen), err
	}
	var history []string
	fail := func(format string, args ...any) {
		from := max(0, len(history)-30)
		f.Fatalf("%s\nafter the steps (last %d of %d):\n  %s", fmt.Sprintf(format, args...), len(history)-from, len(history), strings.Join(history[from:], "\n  "))
	}
	for i, s := range steps {
		history = append(history, s.String())
		if s.update != nil {
			if err := tr.Update(cfg(*s.update)); err != nil {
				fail("Update: %v", err)
				return
			}
			m.minCalls, m.failureRate, m.slowRate, m.consecutive = s.update.MinCalls, s.update.FailureRate, s.update.SlowCallRate, s.update.ConsecutiveFailures
			continue
		}
		time.Sleep(s.gap)
		synctest.Wait() // the open time's timer runs
		if s.op == 0 {
			continue
		}
		if s.batch > 1 && m.state == modelClosed && m.window == 0 {
			if !runModelBatch(base, s, call) {
				fail("step %d: a batch sent while closed had a call refused", i)
				return
			}
			// Every call of the batch was admitted closed; once one trips
			// the breaker the others belong to a closed period that is
			// over, and count for nothing.
			now := time.Now()
			for range s.batch {
				if m.state != modelClosed {
					break
				}
				m.outcome(s.op, now, hold())
			}
		} else {
			for range s.batch {
				start := time.Now()
				want := m.admits(start)
				sent, refused, err := call(s.op, false)
				switch {
				case want && !sent:
					fail("step %d (%c at %v): refused (%v), the model sends it", i, s.op, start, err)
					return
				case !want && (sent || !refused):
					fail("step %d (%c at %v): sent %v, error %v; the model refuses it", i, s.op, start, sent, err)
					return
				}
				if sent && m.outcome(s.op, time.Now(), hold()) && hostBreaker(t, tr).TotalTrips > uint64(m.total) {
					m.trip(time.Now()) // within the time window's tolerance
				}
			}
		}
		bs := hostBreaker(t, tr)
		if bs.TotalTrips != uint64(m.total) || bs.Trips != m.trips {
			fail("step %d: %d trips in a row, %d in all; the model %d and %d", i, bs.Trips, bs.TotalTrips, m.trips, m.total)
			return
		}
	}
}

// runModelBatch sends s.batch calls of s.op at once, all of them in the
// host before any answers, and reports whether none was refused.
func runModelBatch(base *modelBase, s modelStep, call func(modelOp, bool) (bool, bool, error)) bool {
	base.mu.Lock()
	base.release = make(chan struct{})
	base.mu.Unlock()
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok := true
	for range s.batch {
		wg.Go(func() {
			if _, refused, _ := call(s.op, true); refused {
				mu.Lock()
				ok = false
				mu.Unlock()
			}
		})
	}
	synctest.Wait() // all of them in the host
	base.mu.Lock()
	close(base.release)
	base.mu.Unlock()
	wg.Wait()
	return ok
}
