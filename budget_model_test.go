package bulwark_test

// The retry budget's contract (see Budget) against a reference model:
// gRPC's retry throttle, the ratio over a window of ten buckets, and the
// floor's token bucket, computed from the calls' outcomes and the clock.
// rapid draws calls, bursts of concurrent calls, failing runs, periodic
// patterns, rates from 0.1 to 1,000 a second, clock jumps and Updates (of MaxAttempts alone, which keeps the
// budget, or of the budget, which starts a new full one); the Transport
// and the model must agree on every retry sent or refused, and on the
// throttle's tokens and the window's counts after every step.
//
// Calls of a burst overlap but start a microsecond apart, and every
// latency and wait is whole milliseconds, so no two decisions fall on the
// same instant: the order the model judges them in is the order the
// Transport did. (Decisions at the same instant are judged in an order
// the contract does not promise.)

import (
	"errors"
	"math"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/bulwark-http/bulwark"
	"pgregory.net/rapid"
)

// budgetOutcomes are the outcomes the budget model draws from: every
// class the throttle tells apart (success, failure, ignored; retryable
// or not).
var budgetOutcomes = []outcome{oOK, oSlow, o503, o429, o408, o400, o501, oTimeout, oReset}

// health is the contract's word on o for the throttle: +1 a success
// (gives back Ratio of a token), -1 a failure (takes one), 0 ignored.
func (o outcome) health() int {
	switch o {
	case oOK, oSlow:
		return +1
	case o500, o502, o503, o504, o429, oTimeout, oReset, oRefused, oNoHost:
		return -1
	}
	return 0 // 408, 400, 501: the request's fault or a refusal to act
}

// budgetModel is the contract, written out: the throttle's tokens, the
// window's credits by bucket, and the floor's token bucket.
type budgetModel struct {
	ratio, minPerSec float64
	width            int64 // a bucket, in ns: Window / 10
	tokens           float64
	head             int64 // newest bucket number
	started          bool
	calls, retries   map[int64]int64 // by bucket number
	floor            float64         // the floor's tokens
	floorAt          time.Time
	floorMax         float64 // the most retries in the window the floor may fund
	refused          uint64  // retries refused
}

func newBudgetModel(b bulkBudget, now time.Time) *budgetModel {
	m := &budgetModel{ratio: b.ratio, minPerSec: b.minPerSec, width: int64(b.window / 10), tokens: 10,
		calls: map[int64]int64{}, retries: map[int64]int64{}, floorAt: now}
	if b.minPerSec > 0 {
		m.floor = math.Ceil(b.minPerSec)
		m.floorMax = b.minPerSec * b.window.Seconds()
	}
	return m
}

// bucket is the bucket now's credits go to: its own, or the newest seen
// if that is later (a call is counted at its start, when its first
// attempt ends).
func (m *budgetModel) bucket(now time.Time) int64 {
	n := now.UnixNano() / m.width
	if !m.started || n > m.head {
		m.head, m.started = n, true
	}
	return m.head
}

// sum is the window's calls and retries: the newest bucket and the nine
// before it.
func (m *budgetModel) sum(now time.Time) (calls, retries int64) {
	h := m.bucket(now)
	for b := h - 9; b <= h; b++ {
		calls += m.calls[b]
		retries += m.retries[b]
	}
	return calls, retries
}

// call counts a call started at start whose first attempt's outcome was o.
func (m *budgetModel) call(start time.Time, o outcome) {
	m.calls[m.bucket(start)]++
	switch o.health() {
	case -1:
		m.tokens = max(0, m.tokens-1)
	case +1:
		m.tokens = min(10, m.tokens+m.ratio)
	}
}

// withdraw is the contract's retry decision at now.
func (m *budgetModel) withdraw(now time.Time) bool {
	calls, retries := m.sum(now)
	r := float64(retries + 1)
	ok := m.tokens > 5 && (r <= m.ratio*float64(calls) || m.minPerSec > 0 && r <= m.floorMax && m.takeFloor(now))
	if ok {
		m.retries[m.bucket(now)]++
	} else {
		m.refused++
	}
	return ok
}

// takeFloor takes a token from the floor's bucket: MinPerSecond a second,
// holding at most ⌈MinPerSecond⌉.
func (m *budgetModel) takeFloor(now time.Time) bool {
	f := m.floor
	if now.After(m.floorAt) {
		f = min(math.Ceil(m.minPerSec), f+now.Sub(m.floorAt).Seconds()*m.minPerSec)
	}
	if f < 1 {
		return false
	}
	m.floor, m.floorAt = f-1, now
	return true
}

// bulkBudget is a drawn Budget.
type bulkBudget struct {
	ratio, minPerSec float64
	window           time.Duration
}

func drawBudget(rt *rapid.T) bulkBudget {
	return bulkBudget{
		ratio:     rapid.SampledFrom([]float64{0.1, 0.2, 0.5, 1}).Draw(rt, "ratio"),
		minPerSec: rapid.SampledFrom([]float64{-1, 0.5, 1, 10}).Draw(rt, "minPerSecond"),
		window:    rapid.SampledFrom([]time.Duration{time.Second, 10 * time.Second}).Draw(rt, "window"),
	}
}

// budgetPolicy: retries with a fixed 1 ms wait (no jitter), a 50 ms
// attempt timeout, and the drawn budget; no breaker or bulkhead.
func budgetPolicy(maxAttempts int, b bulkBudget) bulwark.Policy {
	return bulwark.Policy{
		Timeout:  bulwark.Timeout{Attempt: 50 * time.Millisecond},
		Breaker:  bulwark.Breaker{Disabled: true},
		Bulkhead: bulwark.Bulkhead{Disabled: true},
		Retry: bulwark.Retry{MaxAttempts: maxAttempts, Base: time.Millisecond, Cap: time.Millisecond, Jitter: bulwark.JitterNone,
			Budget: bulwark.Budget{Ratio: b.ratio, Window: b.window, MinPerSecond: b.minPerSec}},
	}
}

// budgetCall is one call of the model: its script, latency and start,
// and what the model says of it.
type budgetCall struct {
	id       string
	script   []outcome
	lat      time.Duration
	start    time.Time
	attempts int  // model
	refused  bool // model: a retry was due and the budget refused it
	resp     *http.Response
	err      error
}

func (c *budgetCall) out(n int) outcome { return c.script[min(n-1, len(c.script)-1)] }

// took is how long attempt n takes.
func (c *budgetCall) took(n int) time.Duration {
	if c.out(n) == oTimeout {
		return 50 * time.Millisecond
	}
	if c.out(n) == oSlow {
		return slowLatency
	}
	return c.lat
}

// run plays calls through the model in the order of their decisions.
func (m *budgetModel) run(calls []*budgetCall, max int) {
	type ev struct {
		at time.Time
		c  *budgetCall
		n  int // the attempt that ends
	}
	var evs []ev
	for _, c := range calls {
		evs = append(evs, ev{c.start.Add(c.took(1)), c, 1})
	}
	for len(evs) > 0 {
		sort.Slice(evs, func(i, j int) bool { return evs[i].at.Before(evs[j].at) })
		e := evs[0]
		evs = evs[1:]
		c, o := e.c, e.c.out(e.n)
		if e.n == 1 {
			m.call(c.start, o)
		}
		c.attempts = e.n
		if !o.retryable() || e.n >= max {
			continue
		}
		if !m.withdraw(e.at) {
			c.refused = true
			continue
		}
		next := e.at.Add(time.Millisecond) // the fixed wait
		evs = append(evs, ev{next.Add(c.took(e.n + 1)), c, e.n + 1})
	}
}

func TestBudgetModel(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		inBubble(t, rt, func() {
			h := newScriptHost()
			max, b := rapid.IntRange(2, 3).Draw(rt, "maxAttempts"), drawBudget(rt)
			tr, err := bulwark.New(bulwark.Config{Base: h, Default: budgetPolicy(max, b)})
			if err != nil {
				disagree("New: %v", err)
			}
			defer tr.Close()
			c := &http.Client{Transport: tr}
			m := newBudgetModel(b, time.Now())
			n := 0
			newCall := func(rt *rapid.T, start time.Time) *budgetCall {
				n++
				bc := &budgetCall{id: strconv.Itoa(n), start: start,
					script: rapid.SliceOfN(rapid.SampledFrom(budgetOutcomes), 1, 3).Draw(rt, "script"),
					lat:    time.Duration(rapid.IntRange(0, 20).Draw(rt, "latMs")) * time.Millisecond}
				h.add(bc.id, hostScript{out: bc.script, lat: bc.lat})
				return bc
			}
			send := func(bc *budgetCall) {
				bc.resp, bc.err = modelCall(c, bc.id, modelRequest{method: http.MethodGet})
				if bc.resp != nil {
					bc.resp.Body.Close()
				}
			}
			check := func(calls []*budgetCall) {
				m.run(calls, max)
				for _, bc := range calls {
					got := h.sent(bc.id)
					// A refused retry shows in the error only when the
					// last attempt's outcome was one: a response is
					// returned as it came (the Budget's count below).
					var re *bulwark.RetryError
					refused := errors.As(bc.err, &re) && re.Budget
					if got != bc.attempts || refused != (bc.refused && bc.err != nil) {
						disagree("call %s (script %v, lat %v, started %v): %d attempts, budget refused %v; model %d, %v (tokens %.2f)",
							bc.id, bc.script, bc.lat, bc.start.Format("15:04:05.000000"), got, refused, bc.attempts, bc.refused, m.tokens)
					}
				}
				now := time.Now()
				s := tr.Snapshot().Host("model.test:80")
				if len(s) != 1 || s[0].Budget == nil {
					disagree("no budget in the snapshot: %+v", s)
				}
				bs := s[0].Budget
				calls2, retries := m.sum(now)
				if math.Abs(bs.ThrottleTokens-m.tokens) > 1e-9 || bs.Throttled != (m.tokens <= 5) || bs.Calls != calls2 || bs.Retries != retries || bs.Refused != m.refused {
					disagree("budget %+v; model tokens %.3f, calls %d, retries %d, refused %d", *bs, m.tokens, calls2, retries, m.refused)
				}
			}
			rt.Repeat(map[string]func(*rapid.T){
				"call": func(rt *rapid.T) {
					time.Sleep(drawGap(rt, "gap").Truncate(time.Millisecond))
					bc := newCall(rt, time.Now())
					send(bc)
					check([]*budgetCall{bc})
				},
				"burst": func(rt *rapid.T) {
					k := rapid.IntRange(2, 8).Draw(rt, "k")
					start := time.Now()
					calls := make([]*budgetCall, k)
					for i := range calls {
						calls[i] = newCall(rt, start.Add(time.Duration(i)*time.Microsecond))
					}
					var wg sync.WaitGroup
					for i, bc := range calls {
						wg.Go(func() {
							time.Sleep(time.Duration(i) * time.Microsecond)
							send(bc)
						})
					}
					wg.Wait()
					check(calls)
				},
				"failing run": func(rt *rapid.T) {
					// A run of failing calls at a steady rate: the throttle's
					// hold, from a healthy or a spent baseline.
					k := rapid.IntRange(3, 12).Draw(rt, "k")
					gap := drawGap(rt, "gap").Truncate(time.Millisecond)
					for range k {
						time.Sleep(gap)
						n++
						bc := &budgetCall{id: strconv.Itoa(n), start: time.Now(), script: []outcome{o503}}
						h.add(bc.id, hostScript{out: bc.script})
						send(bc)
						check([]*budgetCall{bc})
					}
				},
				"pattern": func(rt *rapid.T) {
					// A periodic pattern of first-attempt outcomes (a
					// round robin over instances some of which are sick),
					// repeated at a steady rate.
					period := rapid.SliceOfN(rapid.SampledFrom([]outcome{oOK, o503, oTimeout, o429}), 2, 5).Draw(rt, "period")
					k := rapid.IntRange(len(period), 40).Draw(rt, "k")
					gap := drawGap(rt, "gap").Truncate(time.Millisecond)
					for i := range k {
						time.Sleep(gap)
						n++
						bc := &budgetCall{id: strconv.Itoa(n), start: time.Now(), script: []outcome{period[i%len(period)], oOK}}
						h.add(bc.id, hostScript{out: bc.script})
						send(bc)
						check([]*budgetCall{bc})
					}
				},
				"jump": func(rt *rapid.T) {
					time.Sleep(time.Duration(rapid.Int64Range(int64(time.Second), int64(2*time.Hour)).Draw(rt, "jump")).Truncate(time.Millisecond))
				},
				"update": func(rt *rapid.T) {
					max = rapid.IntRange(2, 3).Draw(rt, "maxAttempts")
					if rapid.Bool().Draw(rt, "newBudget") {
						if nb := drawBudget(rt); nb != b {
							// A changed Budget is a new, full one (Update).
							b, m = nb, newBudgetModel(nb, time.Now())
						}
					}
					if err := tr.Update(bulwark.Config{Base: h, Default: budgetPolicy(max, b)}); err != nil {
						disagree("Update: %v", err)
					}
				},
			})
		})
	})
}
