package bulwark_test

// Scenarios for the learned defaults (issue 28), each with Config{} and
// nothing else set but a scripted base RoundTripper, in a synctest bubble
// where a host's latency is a time.Sleep: simulated minutes run in
// seconds, and the figures hold on a loaded machine.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bulwark-http/bulwark"
)

// simHost is a scripted host: each attempt waits lat(now) (forever when it
// returns a negative duration, a hung host) or until the attempt's context
// ends, and answers 200.
type simHost struct {
	mu  sync.Mutex
	rng *rand.Rand
	lat func(now time.Time, rng *rand.Rand) time.Duration

	attempts atomic.Int64 // attempts that reached the host
	cut      atomic.Int64 // of them, ended by bulwark's own timeout
}

func newSimHost(lat func(time.Time, *rand.Rand) time.Duration) *simHost {
	return &simHost{rng: rand.New(rand.NewPCG(28, 1)), lat: lat}
}

func (h *simHost) RoundTrip(req *http.Request) (*http.Response, error) {
	h.attempts.Add(1)
	h.mu.Lock()
	d := h.lat(time.Now(), h.rng)
	h.mu.Unlock()
	var wait <-chan time.Time
	if d >= 0 {
		tm := time.NewTimer(d)
		defer tm.Stop()
		wait = tm.C
	}
	select {
	case <-wait:
		return &http.Response{StatusCode: 200, Body: http.NoBody, Header: http.Header{}, Request: req}, nil
	case <-req.Context().Done():
		if err := context.Cause(req.Context()); errors.Is(err, bulwark.ErrAttemptTimeout) || errors.Is(err, bulwark.ErrTotalTimeout) {
			h.cut.Add(1)
		}
		return nil, context.Cause(req.Context())
	}
}

// lognormal draws a latency with median p50 whose p99.9 is p999.
func lognormal(rng *rand.Rand, p50, p999 time.Duration) time.Duration {
	sigma := math.Log(float64(p999)/float64(p50)) / 3.0902 // z of 0.999
	return time.Duration(float64(p50) * math.Exp(sigma*rng.NormFloat64()))
}

// callResult is one call's outcome as the caller saw it.
type callResult struct {
	at   time.Time
	took time.Duration
	err  error
}

// drive sends GETs to the host at rate per second for dur, each on its own
// goroutine (an open loop: a slow host does not slow the arrivals), and
// returns their results in the order they were sent.
func drive(t *testing.T, c *http.Client, rate int, dur time.Duration) []callResult {
	t.Helper()
	n := int(dur.Seconds() * float64(rate))
	every := time.Second / time.Duration(rate)
	out := make([]callResult, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			start := time.Now()
			resp, err := c.Get("http://sim.test/")
			if err == nil {
				resp.Body.Close()
			}
			out[i] = callResult{at: start, took: time.Since(start), err: err}
		})
		time.Sleep(every)
	}
	wg.Wait()
	return out
}

// learnedOf is the host's learned values in the transport's Snapshot.
func learnedOf(t *testing.T, tr *bulwark.Transport) bulwark.LearnedSnapshot {
	t.Helper()
	hs := tr.Snapshot().Host("sim.test:80")
	if len(hs) != 1 || hs[0].Learned == nil {
		t.Fatalf("no learned values in %+v", hs)
	}
	return *hs[0].Learned
}

func newSim(t *testing.T, h *simHost) (*bulwark.Transport, *http.Client) {
	t.Helper()
	tr, err := bulwark.New(bulwark.Config{Base: h})
	if err != nil {
		t.Fatal(err)
	}
	return tr, &http.Client{Transport: tr}
}

// TestLearnedHungHost: a host healthy for 60 s (p99.9 20 ms, 10 calls a
// second) then hung for 10 s. Once hung, no call waits longer than 1 s:
// its three attempts time out at the learned 60, 120 and 240 ms. Within 10
// calls of the hang a call is refused at once (took under 10 ms): 10
// timeouts in a row open the breaker (call 5, 6 or 7 in 40 runs). A call
// whose last retry the open breaker refused after its first attempts
// timed out does not count: counting it hid that, before a failed spaced
// probe made the next wait two spacings, 2 runs in 40 saw nothing refused
// at once until call 15 (every call of the first 1 s open time was a
// probe). After the host recovers, traffic resumes within the open time
// in force, the figure: 10 s of hang leave the breaker in its
// fourth trip in a row (8 s, less up to a fifth at random), whose spaced
// probes go every 640–800 ms and two spacings after one that failed, so
// the first success comes within 1.6 s plus the 100 ms between calls
// (measured 0–1.6 s over 40 runs). The check is the tighter 2 ×
// DefaultOpenFor.
func TestLearnedHungHost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var hungAt, recoveredAt atomic.Int64
		h := newSimHost(func(now time.Time, rng *rand.Rand) time.Duration {
			if at := hungAt.Load(); at != 0 && now.UnixNano() >= at && recoveredAt.Load() == 0 {
				return -1
			}
			return lognormal(rng, 5*time.Millisecond, 20*time.Millisecond)
		})
		tr, c := newSim(t, h)
		for _, r := range drive(t, c, 10, 60*time.Second) {
			if r.err != nil {
				t.Fatalf("healthy phase: %v", r.err)
			}
		}
		l := learnedOf(t, tr)
		t.Logf("learned after 60 s healthy: %+v", l)
		if l.AttemptFrom != bulwark.FromLearned || l.AttemptTimeout > 100*time.Millisecond {
			t.Fatalf("attempt timeout %v (%s), want learned, ≤ 100 ms", l.AttemptTimeout, l.AttemptFrom)
		}
		hungAt.Store(time.Now().UnixNano())
		res := drive(t, c, 10, 10*time.Second)
		var worst time.Duration
		firstFast := -1
		for i, r := range res {
			worst = max(worst, r.took)
			if r.err == nil {
				t.Fatalf("call %d of the hang succeeded", i)
			}
			// At once: a call whose earlier attempts waited out their
			// timeouts and whose retry the open breaker then refused is
			// not one that failed fast.
			if firstFast < 0 && errors.Is(r.err, bulwark.ErrBreakerOpen) && r.took < 10*time.Millisecond {
				firstFast = i
			}
		}
		t.Logf("hung: longest call %v; the first refused at once was call %d of %d", worst, firstFast, len(res))
		if worst > time.Second {
			t.Errorf("a call of the hung host took %v, want ≤ 1 s", worst)
		}
		if firstFast < 0 || firstFast > 10 {
			t.Errorf("the first call refused at once was call %d of the hang, want within 10", firstFast)
		}
		b := tr.Snapshot().Host("sim.test:80")[0].Breaker
		recovered := time.Now()
		recoveredAt.Store(recovered.UnixNano())
		var back time.Duration = -1
		for _, r := range drive(t, c, 10, 30*time.Second) {
			if r.err == nil {
				back = r.at.Sub(recovered)
				break
			}
		}
		t.Logf("recovered: the first call succeeded %v after the host did; the breaker was in trip %d in a row, open until %v after", back, b.Trips, b.OpenUntil.Sub(recovered))
		if inForce := bulwark.DefaultOpenFor << max(b.Trips-1, 0); back < 0 || back > min(inForce, 2*bulwark.DefaultOpenFor) {
			t.Errorf("first success %v after the recovery, want within the open time in force (%v) and ≤ %v", back, inForce, 2*bulwark.DefaultOpenFor)
		}
	})
}

// TestLearnedSlowdown: a host at 40 ms turns to 3 s. The breaker opens
// within 100 calls of the change: every attempt now passes the learned
// timeout (3 × the healthy p99.9).
func TestLearnedSlowdown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var slowAt atomic.Int64
		h := newSimHost(func(now time.Time, rng *rand.Rand) time.Duration {
			if at := slowAt.Load(); at != 0 && now.UnixNano() >= at {
				return 3 * time.Second
			}
			return 35*time.Millisecond + time.Duration(rng.Int64N(int64(10*time.Millisecond)))
		})
		tr, c := newSim(t, h)
		drive(t, c, 10, 60*time.Second)
		l := learnedOf(t, tr)
		t.Logf("learned after 60 s at 40 ms: %+v", l)
		slowAt.Store(time.Now().UnixNano())
		res := drive(t, c, 10, 20*time.Second)
		opened := -1
		var worst time.Duration
		for i, r := range res {
			worst = max(worst, r.took)
			if opened < 0 && errors.Is(r.err, bulwark.ErrBreakerOpen) {
				opened = i
			}
		}
		t.Logf("slow: the breaker refused first at call %d; longest call %v", opened, worst)
		if opened < 0 || opened > 100 {
			t.Errorf("breaker opened at call %d of the slowdown, want within 100", opened)
		}
	})
}

// TestLearnedHeavyTail: a healthy host with a heavy tail (lognormal, p50
// 5 ms, p99.9 100 ms) at 400 calls a second for 60 s: at most 0.1 % of
// attempts time out, and at least 99.99 % of calls succeed.
func TestLearnedHeavyTail(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSimHost(func(_ time.Time, rng *rand.Rand) time.Duration {
			return lognormal(rng, 5*time.Millisecond, 100*time.Millisecond)
		})
		tr, c := newSim(t, h)
		res := drive(t, c, 400, 60*time.Second)
		failed := 0
		for _, r := range res {
			if r.err != nil {
				failed++
			}
		}
		l := learnedOf(t, tr)
		cut, attempts := h.cut.Load(), h.attempts.Load()
		t.Logf("heavy tail: %d of %d attempts timed out, %d of %d calls failed; learned %+v", cut, attempts, failed, len(res), l)
		if l.AttemptFrom != bulwark.FromLearned {
			t.Errorf("attempt timeout %v from %s, want learned", l.AttemptTimeout, l.AttemptFrom)
		}
		if cut*1000 > attempts {
			t.Errorf("%d of %d attempts timed out, want ≤ 0.1 %%", cut, attempts)
		}
		if failed*10000 > len(res) {
			t.Errorf("%d of %d calls failed, want ≤ 0.01 %%", failed, len(res))
		}
	})
}

// TestLearnedSlowCreep: a host whose latency rises 10 % a minute for 30
// minutes (17× in all), after 2 minutes at p50 5 ms, p99.9 20 ms: the
// learned timeout follows, and at most 0.1 % of attempts time out.
func TestLearnedSlowCreep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		h := newSimHost(func(now time.Time, rng *rand.Rand) time.Duration {
			mins := max(now.Sub(start).Minutes()-2, 0)
			f := math.Pow(1.1, min(mins, 30))
			return time.Duration(f * float64(lognormal(rng, 5*time.Millisecond, 20*time.Millisecond)))
		})
		tr, c := newSim(t, h)
		before := time.Duration(0)
		res := drive(t, c, 10, 2*time.Minute)
		before = learnedOf(t, tr).AttemptTimeout
		res = append(res, drive(t, c, 10, 30*time.Minute)...)
		failed := 0
		for _, r := range res {
			if r.err != nil {
				failed++
			}
		}
		l := learnedOf(t, tr)
		cut, attempts := h.cut.Load(), h.attempts.Load()
		t.Logf("creep: %d of %d attempts timed out, %d calls failed; timeout %v → %v; learned %+v", cut, attempts, failed, before, l.AttemptTimeout, l)
		if cut*1000 > attempts {
			t.Errorf("%d of %d attempts timed out, want ≤ 0.1 %%", cut, attempts)
		}
	})
}

// TestLearnedOverload: a host whose latency doubles for a minute because
// it queues: the learned timeout does not double with it (the baseline
// moves by at most ×2 per 5 minutes: ×1.15 in one).
func TestLearnedOverload(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var overAt atomic.Int64
		h := newSimHost(func(now time.Time, rng *rand.Rand) time.Duration {
			d := lognormal(rng, 20*time.Millisecond, 50*time.Millisecond)
			if at := overAt.Load(); at != 0 && now.UnixNano() >= at {
				d *= 2
			}
			return d
		})
		tr, c := newSim(t, h)
		drive(t, c, 20, 10*time.Minute)
		before := learnedOf(t, tr)
		overAt.Store(time.Now().UnixNano())
		drive(t, c, 20, time.Minute)
		after := learnedOf(t, tr)
		t.Logf("overload: healthy p99.9 %v → %v; attempt timeout %v → %v", before.HealthyP999, after.HealthyP999, before.AttemptTimeout, after.AttemptTimeout)
		if after.AttemptTimeout*100 > before.AttemptTimeout*120 {
			t.Errorf("a minute of doubled latency moved the timeout %v → %v, want ≤ ×1.2", before.AttemptTimeout, after.AttemptTimeout)
		}
	})
}

// TestLearnedNotFromIgnored: what the classifier ignores teaches nothing.
// A host that answers every call with a 404 (a wrong request, ignored),
// and calls their callers cancel before the answer, leave the host at the
// cold start: the static default, never a learned zero.
func TestLearnedNotFromIgnored(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, err := bulwark.New(bulwark.Config{Base: rtFunc(func(req *http.Request) (*http.Response, error) {
			tm := time.NewTimer(time.Millisecond)
			defer tm.Stop()
			select {
			case <-tm.C:
				return &http.Response{StatusCode: 404, Body: http.NoBody, Header: http.Header{}, Request: req}, nil
			case <-req.Context().Done():
				return nil, context.Cause(req.Context())
			}
		})})
		if err != nil {
			t.Fatal(err)
		}
		c := &http.Client{Transport: tr}
		for i := range 1000 {
			ctx, cancel := context.WithCancel(t.Context())
			if i%2 == 0 {
				cancel() // the caller gives up before the host answers
			}
			req, _ := http.NewRequestWithContext(ctx, "GET", "http://sim.test/", nil)
			if resp, err := c.Do(req); err == nil {
				resp.Body.Close()
			}
			cancel()
		}
		l := learnedOf(t, tr)
		if l.Samples != 0 || l.AttemptFrom != bulwark.FromColdStart || l.AttemptTimeout != 10*time.Second || l.SlowCallFrom != bulwark.FromColdStart {
			t.Errorf("after only ignored outcomes: %+v, want no samples and the cold start", l)
		}
	})
}

// TestLearnedSetIsObeyed: a set Timeout.Attempt and Breaker.SlowCall are
// obeyed as set, however fast the host.
func TestLearnedSetIsObeyed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSimHost(func(_ time.Time, rng *rand.Rand) time.Duration {
			return lognormal(rng, time.Millisecond, 5*time.Millisecond)
		})
		tr, err := bulwark.New(bulwark.Config{Base: h, Default: bulwark.Policy{
			Timeout: bulwark.Timeout{Attempt: 2 * time.Second},
			Breaker: bulwark.Breaker{SlowCall: time.Second},
		}})
		if err != nil {
			t.Fatal(err)
		}
		drive(t, &http.Client{Transport: tr}, 10, time.Minute)
		l := learnedOf(t, tr)
		if l.AttemptTimeout != 2*time.Second || l.AttemptFrom != bulwark.FromSet || l.SlowCall != time.Second || l.SlowCallFrom != bulwark.FromSet {
			t.Errorf("set bounds: %+v, want 2s and 1s, set", l)
		}
		if l.Baseline <= 0 {
			t.Errorf("nothing learned for the snapshot: %+v", l)
		}
	})
}

// TestLearnedChangeLogged: the baseline's first learning, and each later
// move by more than 2×, is logged once through the reporter, with both
// values.
func TestLearnedChangeLogged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var slowAt atomic.Int64
		h := newSimHost(func(now time.Time, rng *rand.Rand) time.Duration {
			d := 10*time.Millisecond + time.Duration(rng.Int64N(int64(time.Millisecond)))
			if at := slowAt.Load(); at != 0 && now.UnixNano() >= at {
				d *= 3 // a host slower for good, within the retries' reach
			}
			return d
		})
		var buf syncBuffer
		tr, err := bulwark.New(bulwark.Config{Base: h, Logger: slog.New(slog.NewJSONHandler(&buf, nil))})
		if err != nil {
			t.Fatal(err)
		}
		c := &http.Client{Transport: tr}
		drive(t, c, 10, time.Minute)
		slowAt.Store(time.Now().UnixNano())
		drive(t, c, 10, time.Hour)
		var lines []map[string]any
		for _, ln := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(ln), &m) == nil && m["msg"] == "bulwark: learned latency changed" {
				lines = append(lines, m)
			}
		}
		t.Logf("log lines: %v; learned %+v", lines, learnedOf(t, tr))
		// Learned (from 0 to ≈ 11 ms), then ≈ 11 → ≈ 33 ms, past 2× once.
		if len(lines) != 2 || lines[0]["from"] != 0.0 || lines[1]["from"] != lines[0]["to"] || lines[1]["host"] != "sim.test:80" {
			t.Errorf("log lines %v, want the first learning then one line for the 3× move, with both values", lines)
		}
	})
}

// syncBuffer is a bytes.Buffer safe for the log lines of concurrent calls.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestDeadHostFailsFast: a host that refuses every connection, at 10
// calls a second. The breaker refuses within 10 calls, and no call takes
// longer than 300 ms: a refused connection is retried after at most
// 10 ms, and 10 refusals in a row open the breaker.
func TestDeadHostFailsFast(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var reached atomic.Int64
		tr, err := bulwark.New(bulwark.Config{Base: rtFunc(func(*http.Request) (*http.Response, error) {
			reached.Add(1)
			return nil, refusedErr()
		})})
		if err != nil {
			t.Fatal(err)
		}
		res := drive(t, &http.Client{Transport: tr}, 10, 5*time.Second)
		var worst time.Duration
		first := -1
		for i, r := range res {
			worst = max(worst, r.took)
			if first < 0 && errors.Is(r.err, bulwark.ErrBreakerOpen) {
				first = i
			}
		}
		t.Logf("dead host: refused at once from call %d; %d attempts reached it; longest call %v", first, reached.Load(), worst)
		if first < 0 || first > 10 {
			t.Errorf("the breaker refused first at call %d, want within 10", first)
		}
		if worst > 300*time.Millisecond {
			t.Errorf("a call took %v, want ≤ 300 ms", worst)
		}
	})
}

// TestQuietHostTwoFailures: two calls that fail at 3 a.m. on a quiet host
// (every attempt of each) do not trip its breaker.
func TestQuietHostTwoFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fail := atomic.Bool{}
		tr, err := bulwark.New(bulwark.Config{Base: rtFunc(func(req *http.Request) (*http.Response, error) {
			if fail.Load() {
				return &http.Response{StatusCode: 503, Body: http.NoBody, Header: http.Header{}, Request: req}, nil
			}
			return &http.Response{StatusCode: 200, Body: http.NoBody, Header: http.Header{}, Request: req}, nil
		})})
		if err != nil {
			t.Fatal(err)
		}
		c := &http.Client{Transport: tr}
		get := func() {
			if resp, err := c.Get("http://sim.test/"); err == nil {
				resp.Body.Close()
			}
		}
		for range 5 {
			get()
			time.Sleep(time.Minute)
		}
		fail.Store(true)
		get()
		time.Sleep(time.Minute)
		get()
		fail.Store(false)
		if st := tr.Snapshot().Host("sim.test:80")[0].Breaker.State; st != bulwark.CircuitClosed {
			t.Errorf("after two failed calls on a quiet host the breaker is %v, want closed", st)
		}
	})
}

// TestSlowCallNotFromOwnQueue: a call that waited in bulwark's own
// bulkhead queue and was then answered fast is not a slow call: the
// breaker times the attempt from its sending.
func TestSlowCallNotFromOwnQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSimHost(func(time.Time, *rand.Rand) time.Duration { return 10 * time.Millisecond })
		tr, err := bulwark.New(bulwark.Config{Base: h, Default: bulwark.Policy{
			Bulkhead: bulwark.Bulkhead{MaxConcurrent: 1, MaxQueue: 50},
			Breaker:  bulwark.Breaker{SlowCall: 30 * time.Millisecond},
		}})
		if err != nil {
			t.Fatal(err)
		}
		c := &http.Client{Transport: tr}
		var wg sync.WaitGroup
		var waited atomic.Int64
		for range 20 {
			wg.Go(func() {
				start := time.Now()
				if resp, err := c.Get("http://sim.test/"); err == nil {
					resp.Body.Close()
				}
				if time.Since(start) > 30*time.Millisecond {
					waited.Add(1)
				}
			})
		}
		wg.Wait()
		b := tr.Snapshot().Host("sim.test:80")[0].Breaker
		if waited.Load() == 0 || b.Calls != 20 || b.Slow != 0 {
			t.Errorf("%d calls waited past SlowCall in the queue; breaker counted %d calls, %d slow; want 20 and none slow", waited.Load(), b.Calls, b.Slow)
		}
	})
}

// pool is a worker pool of a fixed size serving jobs from a bounded queue
// (a job that finds it full is dropped, as a server sheds): each job is one
// GET to the host. stuck is how many workers are inside a call at once,
// and peak the most seen after mark was set.
type pool struct {
	jobs        chan struct{}
	stuck, peak atomic.Int64
	marked      atomic.Bool
	dropped     atomic.Int64
}

func startPool(c *http.Client, size int, wg *sync.WaitGroup) *pool {
	p := &pool{jobs: make(chan struct{}, size)}
	for range size {
		wg.Go(func() {
			for range p.jobs {
				n := p.stuck.Add(1)
				if p.marked.Load() && n > p.peak.Load() {
					p.peak.Store(n)
				}
				if resp, err := c.Get("http://sim.test/"); err == nil {
					resp.Body.Close()
				}
				p.stuck.Add(-1)
			}
		})
	}
	return p
}

// feed offers jobs at rate a second for dur.
func (p *pool) feed(rate int, dur time.Duration) {
	every := time.Second / time.Duration(rate)
	for range int(dur.Seconds() * float64(rate)) {
		select {
		case p.jobs <- struct{}{}:
		default:
			p.dropped.Add(1)
		}
		time.Sleep(every)
	}
}

// TestLearnedSlowdownWorkerPool: a pool of 40 workers whose jobs each call
// a host at 40 ms, at 10, 20 and 40 jobs a second, and the host turns to
// 3 s. Through a plain client the slow calls hold most of the pool (31 in
// flight at 10 jobs a second); with package defaults no more than 10
// workers are ever stuck on the slow host: 6, 7 and 10 at the three rates
// (the simulation is seeded, so every run gives these). The learned
// timeout cuts each attempt at 3 × the healthy p99.9 (138 ms); the fifth
// failed call takes the retry throttle to half, and from then on no
// attempt that timed out is retried; ten unanswered attempts in a row open
// the breaker once the run has lasted the third attempt's timeout
// (553 ms). At a given rate the stuck workers are about rate × 138 ms
// plus the first five calls in their retries, so the bound holds up to
// about 40 jobs a second; past that the attempt timeout itself keeps more
// than 10 in flight.
//
// Before the throttle held the floor's retries too, the peak was 12–15 at
// 20 jobs a second and 15–16 at 40: the floor funded retries of attempts
// that timed out until the breaker tripped, 0.70–0.74 s after the change.
func TestLearnedSlowdownWorkerPool(t *testing.T) {
	for _, tc := range []struct {
		name  string
		plain bool
		rate  int
	}{{"plain", true, 10}, {"defaults", false, 10}, {"defaults", false, 20}, {"defaults", false, 40}} {
		rate := tc.rate
		t.Run(fmt.Sprintf("%s/%d", tc.name, rate), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var slowAt atomic.Int64
				h := newSimHost(func(now time.Time, rng *rand.Rand) time.Duration {
					if at := slowAt.Load(); at != 0 && now.UnixNano() >= at {
						return 3 * time.Second
					}
					return 35*time.Millisecond + time.Duration(rng.Int64N(int64(10*time.Millisecond)))
				})
				c := &http.Client{Transport: h}
				if !tc.plain {
					_, c = newSim(t, h)
				}
				var wg sync.WaitGroup
				p := startPool(c, 40, &wg)
				p.feed(rate, 60*time.Second)
				slowAt.Store(time.Now().UnixNano())
				p.marked.Store(true)
				p.feed(rate, 30*time.Second)
				close(p.jobs)
				wg.Wait()
				t.Logf("%s: at most %d of 40 workers in a call to the slow host at once; %d jobs dropped for a full pool", tc.name, p.peak.Load(), p.dropped.Load())
				switch {
				case tc.plain && p.peak.Load() < 25:
					t.Errorf("plain: at most %d workers stuck, want most of the pool (≥ 25): the scenario no longer drains a pool", p.peak.Load())
				case !tc.plain && p.peak.Load() > 10:
					t.Errorf("defaults: %d workers stuck on the slow host at once, want ≤ 10", p.peak.Load())
				}
			})
		})
	}
}

// TestLearnedHungFromStart: a host that never answers, from its first
// call, teaches nothing: after two minutes at 10 calls a second its
// learned values are the cold start's, the static defaults, never a
// learned zero.
func TestLearnedHungFromStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newSimHost(func(time.Time, *rand.Rand) time.Duration { return -1 })
		tr, c := newSim(t, h)
		drive(t, c, 10, 2*time.Minute)
		l := learnedOf(t, tr)
		t.Logf("hung from the start: %+v; %d attempts reached it", l, h.attempts.Load())
		if l.Samples != 0 || l.Baseline != 0 || l.AttemptFrom != bulwark.FromColdStart || l.AttemptTimeout != 10*time.Second ||
			l.SlowCallFrom != bulwark.FromColdStart || l.SlowCall <= 0 {
			t.Errorf("a host that never answered: %+v, want no samples and the cold start's static bounds", l)
		}
	})
}

// TestLearnedBreakerSettles: with a learned slow-call threshold, a rate
// rule trips only once it has held for the third attempt's learned
// timeout. A host at 20 ms, 1,000 calls a second, whose answers take
// 150 ms for a tenth of a second (a queue that is drained: every call in
// the breaker's last 100 slow or timed out) keeps its breaker closed; the
// same burst trips a breaker whose SlowCall is set (the control); and a
// host that stays at 150 ms trips the learned breaker within a second.
func TestLearnedBreakerSettles(t *testing.T) {
	for _, tc := range []struct {
		name      string
		slowCall  time.Duration
		burstTrip bool
	}{{"learned", 0, false}, {"set", 50 * time.Millisecond, true}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var slowFrom, slowTo atomic.Int64
				h := newSimHost(func(now time.Time, rng *rand.Rand) time.Duration {
					if n := now.UnixNano(); n >= slowFrom.Load() && n < slowTo.Load() {
						return 150 * time.Millisecond
					}
					return 18*time.Millisecond + time.Duration(rng.Int64N(int64(4*time.Millisecond)))
				})
				tr, err := bulwark.New(bulwark.Config{Base: h, Default: bulwark.Policy{Breaker: bulwark.Breaker{SlowCall: tc.slowCall}}})
				if err != nil {
					t.Fatal(err)
				}
				c := &http.Client{Transport: tr}
				drive(t, c, 1000, 20*time.Second)
				trips := func() uint64 { return tr.Snapshot().Host("sim.test:80")[0].Breaker.TotalTrips }
				if n := trips(); n != 0 {
					t.Fatalf("%d trips while healthy", n)
				}
				now := time.Now().UnixNano()
				slowFrom.Store(now)
				slowTo.Store(now + int64(100*time.Millisecond))
				drive(t, c, 1000, 3*time.Second)
				burst := trips()
				t.Logf("%s: %d trips after a 100 ms burst of 150 ms answers; learned %+v", tc.name, burst, learnedOf(t, tr))
				if tc.burstTrip != (burst > 0) {
					t.Fatalf("%s: %d trips after the burst, want tripped %v", tc.name, burst, tc.burstTrip)
				}
				if tc.burstTrip {
					return
				}
				now = time.Now().UnixNano()
				slowFrom.Store(now)
				slowTo.Store(now + int64(time.Hour))
				res := drive(t, c, 1000, 2*time.Second)
				first := -1
				for i, r := range res {
					if errors.Is(r.err, bulwark.ErrBreakerOpen) && r.took < time.Millisecond {
						first = i
						break
					}
				}
				t.Logf("%s: host slow for good: the first call refused at once was sent %v after the change", tc.name, time.Duration(first)*time.Millisecond)
				if first < 0 || first > 1000 {
					t.Errorf("%s: a host slow for good was first refused at once at call %d (1 ms apart), want within 1 s", tc.name, first)
				}
			})
		})
	}
}

// TestLearnedBreakerTripsOnErrors: a host that turns to answering only
// fast 503s is refused by its breaker with package defaults, whether its
// slow-call threshold was learned first or not. With a learned threshold
// the failure rate must hold for the hold before it trips (see
// TestLearnedBreakerSettles); a count window that dipped below MinCalls as
// its oldest bucket rolled out once ended that hold every time, and the
// breaker of a learned host never tripped at all (100 of 100 calls in its
// window failed, 2,000 calls in a row). Now it is refused after 92 failed
// calls from a cold start (the window's 100 attempts: the retry throttle
// lets only the first four calls retry) and after 42 following 300
// healthy ones (the 50th failed attempt: 503s are the host's answers, which
// trip at once, held for no hold); every run gives these (synctest).
func TestLearnedBreakerTripsOnErrors(t *testing.T) {
	for _, warm := range []int{0, 300} {
		t.Run("warm"+strconv.Itoa(warm), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var sick atomic.Bool
				base := rtFunc(func(req *http.Request) (*http.Response, error) {
					time.Sleep(2 * time.Millisecond)
					code := 200
					if sick.Load() {
						code = 503
					}
					return &http.Response{StatusCode: code, Body: http.NoBody, Header: http.Header{}, Request: req}, nil
				})
				tr, err := bulwark.New(bulwark.Config{Base: base})
				if err != nil {
					t.Fatal(err)
				}
				defer tr.Close()
				c := &http.Client{Transport: tr}
				get := func() error {
					resp, err := c.Get("http://sim.test/")
					if err == nil {
						resp.Body.Close()
					}
					return err
				}
				for range warm {
					if err := get(); err != nil {
						t.Fatal(err)
					}
					time.Sleep(5 * time.Millisecond)
				}
				sick.Store(true)
				start := time.Now()
				for i := range 2000 {
					if errors.Is(get(), bulwark.ErrBreakerOpen) {
						t.Logf("warm %d: refused after %d failed calls, %v after the host turned", warm, i, time.Since(start))
						if i > 100 {
							t.Errorf("refused after %d failed calls; want at most 100 (MinCalls)", i)
						}
						return
					}
					time.Sleep(5 * time.Millisecond)
				}
				t.Fatalf("warm %d: never refused in 2,000 calls to a host answering only 503s; breaker %+v", warm, tr.Snapshot().Host("sim.test:80")[0].Breaker)
			})
		})
	}
}
