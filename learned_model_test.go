package bulwark_test

// The learned bounds' contract (see Timeout.Attempt, and the README's
// table) against a reference model: the host's healthy p99.9 over the
// last one to two periods of five minutes, read at the 200th success and
// every 32nd after, moving by at most ×2 per five minutes; the attempt
// timeout 3 × it (at least 50 ms, doubled per retry, at most 10 s), the
// slow-call threshold 2 × it (at least 50 ms, at most half the
// attempt timeout's ceiling: 5 s). rapid draws
// steady traffic at rates from 0.1 to 1,000 a second around a level that
// shifts, slow spikes that time out, failures, overlapping bursts, clock
// jumps and Updates; after each step the Transport's Snapshot and the
// model must agree.
//
// The tolerance: the Transport reads a quantile from a histogram of 16
// buckets per doubling, as the upper end of the sample's bucket, so its
// baseline lies between the model's (exact) and 1/16 above it; the
// bounds are then exactly the contract's functions of its baseline, and
// an attempt whose latency falls in that 1/16 band above the model's
// timeout may or may not time out. Samples are never thinned here (a
// period holds fewer than 2,000: past that the Transport keeps one in
// eight at random, which no model can follow call by call).

import (
	"math"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bulwark-http/bulwark"
	"pgregory.net/rapid"
)

// The contract's figures.
const (
	lmMinSamples = 200
	lmEvery      = 32
	lmPeriod     = 5 * time.Minute
	lmPlenty     = 2000
	lmFloor      = 50 * time.Millisecond
	lmCeiling    = 10 * time.Second // the attempt timeout's ceiling (Timeout.Attempt)
	lmBand       = 17.0 / 16        // the histogram's tolerance
	lmCalls      = 320              // the most calls of one run (-rapid.checks for more runs)
)

// learnModel is the contract, written out over the exact samples.
type learnModel struct {
	epoch     time.Time
	started   bool
	rotateAt  time.Duration
	cur, prev []time.Duration
	since     int     // samples ever
	base      float64 // ns; 0: not learned
	baseAt    time.Duration
	n         int // samples in the window at the last reading
	moves     int // readings that changed a learned baseline
}

func (m *learnModel) record(d time.Duration, now time.Time) {
	pos := now.Sub(m.epoch)
	if pos >= m.rotateAt {
		// A new period; the one before it stays in the window unless it
		// ended more than a period ago.
		m.prev = m.cur
		if pos >= m.rotateAt+lmPeriod {
			m.prev = nil
		}
		m.cur, m.rotateAt = nil, pos+lmPeriod
	}
	m.cur = append(m.cur, d)
	m.since++
	if m.since%lmEvery == 0 || m.base == 0 && len(m.cur)+len(m.prev) >= lmMinSamples {
		m.read(pos)
	}
}

// read takes the window's p99.9 and moves the baseline toward it.
func (m *learnModel) read(pos time.Duration) {
	all := slices.Concat(m.cur, m.prev)
	m.n = len(all)
	if len(all) < lmMinSamples {
		return // too few: the baseline keeps its last word
	}
	slices.Sort(all)
	q := float64(all[int(math.Ceil(0.999*float64(len(all))))-1])
	if m.base == 0 {
		m.base, m.baseAt = q, pos
		return
	}
	f := math.Exp2(float64(min(pos-m.baseAt, 20*lmPeriod)) / float64(lmPeriod))
	b := min(max(q, m.base/f), m.base*f)
	if b != m.base {
		m.moves++
	}
	m.base, m.baseAt = b, pos
}

// timeout is attempt n's learned timeout from a baseline b (ns).
func lmTimeout(b float64, n int) time.Duration {
	d := max(time.Duration(3*b), lmFloor)
	for i := 1; i < n && d < lmCeiling; i++ {
		d *= 2
	}
	return min(d, lmCeiling)
}

// timeout is the model's attempt n timeout: set is Timeout.Attempt (0:
// learned).
func (m *learnModel) timeout(n int, set time.Duration) time.Duration {
	switch {
	case set > 0:
		return set
	case m.base == 0:
		return lmCeiling
	}
	return lmTimeout(m.base, n)
}

// plausible reports whether attempt i of latency lat timing out (or not)
// is what the contract allows under the model's baseline b (ns; 0: none)
// and a set Attempt (0: learned), within the tolerance. A latency equal
// to the timeout is a tie either way.
func plausible(lat time.Duration, timedOut bool, i int, b float64, set time.Duration) bool {
	switch {
	case set > 0:
		return lat == set || timedOut == (lat > set)
	case b == 0:
		return lat == lmCeiling || timedOut == (lat > lmCeiling)
	case timedOut:
		return float64(lat) >= float64(lmTimeout(b, i))*(1-1e-6)
	}
	return float64(lat) <= float64(lmTimeout(b, i))*lmBand*(1+1e-6)
}

// learnedPolicy: the default timeouts (learned, or Attempt set), retries
// with a fixed 1 ms wait and no budget, and a breaker in shadow mode (it
// learns its slow-call threshold but refuses nothing); no bulkhead, so an
// attempt's latency is the host's.
func learnedPolicy(attempt time.Duration) bulwark.Policy {
	return bulwark.Policy{
		Timeout:  bulwark.Timeout{Attempt: attempt},
		Breaker:  bulwark.Breaker{Shadow: true},
		Bulkhead: bulwark.Bulkhead{Disabled: true},
		Retry:    bulwark.Retry{Base: time.Millisecond, Cap: time.Millisecond, Jitter: bulwark.JitterNone, Budget: bulwark.Budget{Disabled: true}},
	}
}

// lmCall is one call: its latency, whether the host fails it, and what
// the Transport did (attempts, success, when it ended).
type lmCall struct {
	id       string
	lat      time.Duration
	fail     bool
	start    time.Time
	attempts int
	ok       bool
	end      time.Time
}

func TestLearnedModel(t *testing.T) {
	var runs, learned, moved int
	defer func() {
		// The model checks something only where a baseline was learned,
		// and moved after.
		t.Logf("%d runs: %d learned a baseline, %d moved it after", runs, learned, moved)
		if !t.Failed() && (learned == 0 || moved == 0) {
			t.Errorf("of %d runs %d learned a baseline and %d moved it: the draws miss the contract", runs, learned, moved)
		}
	}()
	rapid.Check(t, func(rt *rapid.T) {
		runs++
		inBubble(t, rt, func() {
			h := newScriptHost()
			var set time.Duration
			tr, err := bulwark.New(bulwark.Config{Base: h, Default: learnedPolicy(0)})
			if err != nil {
				disagree("New: %v", err)
			}
			defer tr.Close()
			c := &http.Client{Transport: tr}
			m := &learnModel{}
			defer func() {
				if m.base > 0 {
					learned++
				}
				if m.moves > 0 {
					moved++
				}
			}()
			level := time.Duration(rapid.Int64Range(int64(time.Millisecond), int64(300*time.Millisecond)).Draw(rt, "level"))
			n := 0
			newCall := func(lat time.Duration, fail bool) *lmCall {
				n++
				lc := &lmCall{id: strconv.Itoa(n), lat: lat, fail: fail}
				out := oOK
				if fail {
					out = o503
				}
				h.add(lc.id, hostScript{out: []outcome{out}, lat: lat})
				return lc
			}
			// begin is called before a step's calls: the host's state,
			// and its estimator, is made by its first call.
			begin := func() {
				if !m.started {
					m.started, m.epoch, m.rotateAt = true, time.Now(), lmPeriod
				}
			}
			send := func(lc *lmCall) {
				lc.start = time.Now()
				resp, err := modelCall(c, lc.id, modelRequest{method: http.MethodGet})
				lc.end, lc.attempts, lc.ok = time.Now(), h.sent(lc.id), err == nil && resp.StatusCode == 200
				if resp != nil {
					resp.Body.Close()
				}
			}
			// settle checks the calls' attempts against the model's
			// timeouts and then records their samples, in the order they
			// ended. A burst's attempts started under the baseline of its
			// start, or one that its own samples moved to.
			settle := func(calls []*lmCall) {
				slices.SortStableFunc(calls, func(a, b *lmCall) int { return a.end.Compare(b.end) })
				bases := []float64{m.base}
				for _, lc := range calls {
					switch {
					case lc.fail:
						if lc.ok || lc.attempts != 3 {
							disagree("call %s (a 503): ok %v after %d attempts, model a failure after 3", lc.id, lc.ok, lc.attempts)
						}
						continue
					case !lc.ok && lc.attempts != 3:
						disagree("call %s (%v): failed after %d attempts, model 3 timed out", lc.id, lc.lat, lc.attempts)
					}
					// Every attempt before the last timed out; the last
					// answered unless the call failed.
					for i := 1; i <= lc.attempts; i++ {
						timedOut := i < lc.attempts || !lc.ok
						if !slices.ContainsFunc(bases, func(b float64) bool { return plausible(lc.lat, timedOut, i, b, set) }) {
							disagree("call %s: attempt %d of latency %v timed out %v; model timeout %v (baseline %v, Attempt set %v)",
								lc.id, i, lc.lat, timedOut, m.timeout(i, set), time.Duration(m.base), set)
						}
					}
					if lc.ok {
						m.record(lc.lat, lc.end)
						bases = append(bases, m.base)
					}
				}
			}
			// compare checks the Snapshot's learned values against the
			// model's, after every step.
			compare := func() {
				if !m.started {
					return
				}
				ls := tr.Snapshot().Host("model.test:80")
				if len(ls) != 1 || ls[0].Learned == nil {
					disagree("no learned values in %+v", ls)
				}
				l := *ls[0].Learned
				b := float64(l.Baseline)
				switch {
				case l.Samples != int64(m.n):
					disagree("window held %d samples at its last reading, model %d (of %d ever)", l.Samples, m.n, m.since)
				case (m.base == 0) != (b == 0):
					disagree("baseline %v, model %v (%d samples in the window, %d ever)", l.Baseline, time.Duration(m.base), len(m.cur)+len(m.prev), m.since)
				case b < m.base*(1-1e-6) || b > m.base*lmBand*(1+1e-6):
					disagree("baseline %v, model %v: outside [model, model × 17/16]", l.Baseline, time.Duration(m.base))
				}
				wantTO, wantFrom := lmCeiling, bulwark.FromColdStart
				if b > 0 {
					wantTO, wantFrom = lmTimeout(b, 1), bulwark.FromLearned
				}
				if set > 0 {
					wantTO, wantFrom = set, bulwark.FromSet
				}
				if l.AttemptTimeout != wantTO || l.AttemptFrom != wantFrom {
					disagree("attempt timeout %v (%s), model %v (%s) from baseline %v", l.AttemptTimeout, l.AttemptFrom, wantTO, wantFrom, l.Baseline)
				}
				// At most half the attempt timeout's ceiling (Timeout.Attempt,
				// set or the default).
				slowCeil := lmCeiling / 2
				if set > 0 {
					slowCeil = set / 2
				}
				wantSlow, slowFrom := slowCeil, bulwark.FromColdStart
				if b > 0 {
					wantSlow, slowFrom = min(max(time.Duration(2*b), lmFloor), slowCeil), bulwark.FromLearned
				}
				if l.SlowCall != wantSlow || l.SlowCallFrom != slowFrom {
					disagree("slow-call threshold %v (%s), model %v (%s) from baseline %v", l.SlowCall, l.SlowCallFrom, wantSlow, slowFrom, l.Baseline)
				}
			}
			// room is how many more samples the current period may take
			// without being thinned.
			// Each run sends at most lmCalls calls, to stay bounded.
			room := func() int {
				left := lmCalls - n
				if m.started && time.Since(m.epoch) >= m.rotateAt {
					return min(left, lmPlenty-1)
				}
				return min(left, lmPlenty-1-len(m.cur))
			}
			around := func(rt *rapid.T) time.Duration {
				return time.Duration(float64(level) * rapid.Float64Range(0.5, 1.5).Draw(rt, "jitter"))
			}
			rt.Repeat(map[string]func(*rapid.T){
				"steady": func(rt *rapid.T) {
					k := min(rapid.IntRange(1, 60).Draw(rt, "k"), room())
					gap := drawGap(rt, "gap")
					for range k {
						time.Sleep(gap)
						lc := newCall(around(rt), false)
						begin()
						send(lc)
						settle([]*lmCall{lc})
					}
				},
				"warm": func(rt *rapid.T) {
					// Enough calls for a baseline, fast.
					k := min(max(lmMinSamples-m.since, 0)+rapid.IntRange(0, 40).Draw(rt, "k"), room())
					for range k {
						time.Sleep(10 * time.Millisecond)
						lc := newCall(around(rt), false)
						begin()
						send(lc)
						settle([]*lmCall{lc})
					}
				},
				"shift": func(rt *rapid.T) {
					f := math.Pow(10, rapid.Float64Range(-1, 1).Draw(rt, "shift"))
					level = min(max(time.Duration(float64(level)*f), 100*time.Microsecond), 500*time.Millisecond)
				},
				"spike": func(rt *rapid.T) {
					// Slow calls: some time out, none is a sample then.
					k := min(rapid.IntRange(1, 5).Draw(rt, "k"), room())
					for range k {
						spike := float64(level) * rapid.Float64Range(2, 50).Draw(rt, "spike")
						lc := newCall(min(time.Duration(spike), 2*time.Second), false)
						begin()
						send(lc)
						settle([]*lmCall{lc})
					}
				},
				"fail": func(rt *rapid.T) {
					if room() < 1 {
						return
					}
					lc := newCall(around(rt), true)
					begin()
					send(lc)
					settle([]*lmCall{lc})
				},
				"burst": func(rt *rapid.T) {
					// Overlapping calls that end a microsecond apart, in
					// an order of their own.
					k := min(rapid.IntRange(2, 16).Draw(rt, "k"), room())
					calls := make([]*lmCall, k)
					for i := range calls {
						calls[i] = newCall(around(rt).Truncate(time.Millisecond)+time.Duration(i)*time.Microsecond, false)
					}
					begin()
					var wg sync.WaitGroup
					for _, lc := range calls {
						wg.Go(func() { send(lc) })
					}
					wg.Wait()
					settle(calls)
				},
				"jump": func(rt *rapid.T) {
					time.Sleep(time.Duration(rapid.Int64Range(int64(time.Second), int64(2*time.Hour)).Draw(rt, "jump")))
				},
				"": func(*rapid.T) { compare() },
				"update": func(rt *rapid.T) {
					// What was learned outlives an Update; a set Attempt is
					// obeyed as set, and samples are still taken.
					set = 0
					if rapid.Bool().Draw(rt, "setAttempt") {
						set = time.Duration(rapid.IntRange(100, 2000).Draw(rt, "attemptMs")) * time.Millisecond
					}
					if err := tr.Update(bulwark.Config{Base: h, Default: learnedPolicy(set)}); err != nil {
						disagree("Update: %v", err)
					}
				},
			})
		})
	})
}

// TestLearnedAt200: a host has a learned timeout with its 200th healthy
// attempt, as the contract says, and not before.
func TestLearnedAt200(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newScriptHost()
		tr, err := bulwark.New(bulwark.Config{Base: h})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		c := &http.Client{Transport: tr}
		for i := 1; i <= 200; i++ {
			id := strconv.Itoa(i)
			h.add(id, hostScript{out: []outcome{oOK}, lat: 20 * time.Millisecond})
			resp, err := modelCall(c, id, modelRequest{method: http.MethodGet})
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			l := tr.Snapshot().Host("model.test:80")[0].Learned
			if learned := l.AttemptFrom == bulwark.FromLearned; learned != (i >= 200) {
				t.Fatalf("after %d healthy attempts the attempt timeout is %v (%s), want learned from the 200th", i, l.AttemptTimeout, l.AttemptFrom)
			}
		}
	})
}
