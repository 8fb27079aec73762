package bulwark

// Properties over random schedules of faults, methods, bodies, keys,
// cancellations and deadlines, checked with pgregory.net/rapid inside a
// testing/synctest bubble: time is virtual, so "returns by its deadline"
// is checked exactly, and a hanging upstream costs no real time.

import (
	"context"
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

// Outcomes the scripted upstream can give one attempt.
const (
	outOK = iota
	out503
	out429
	outReset
	outHang
	numOutcomes
)

// propCall is one drawn call.
type propCall struct {
	method   string
	body     bodyKind
	key      string
	cancel   time.Duration // zero: never cancelled
	deadline time.Duration // zero: no caller deadline
	script   []int         // outcome per attempt; the last repeats
}

// propBase answers each call's attempts from its script, keyed by X-Call,
// and records what every attempt carried.
type propBase struct {
	mu      sync.Mutex
	scripts map[string][]int
	got     map[string][]sent
}

func (b *propBase) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		body, _ = io.ReadAll(req.Body)
		req.Body.Close()
	}
	id := req.Header.Get("X-Call")
	b.mu.Lock()
	n := len(b.got[id])
	b.got[id] = append(b.got[id], sent{body: string(body), key: req.Header.Get(IdempotencyKeyHeader)})
	sc := b.scripts[id]
	b.mu.Unlock()
	switch sc[min(n, len(sc)-1)] {
	case out503:
		return response(req, 503), nil
	case out429:
		return response(req, 429, "Retry-After", "1"), nil
	case outReset:
		return nil, errReset
	case outHang:
		<-req.Context().Done()
		return nil, req.Context().Err()
	}
	return response(req, 200), nil
}

// propFailure keeps the first failure seen inside a synctest bubble, where
// rapid's T cannot be used (rapid asks for the test's deadline, which a
// bubble refuses): the property reports it once the bubble is over, so
// rapid can still shrink the schedule.
type propFailure struct {
	mu  sync.Mutex
	msg string
}

func (f *propFailure) Fatalf(format string, args ...any) {
	f.mu.Lock()
	if f.msg == "" {
		f.msg = fmt.Sprintf(format, args...)
	}
	f.mu.Unlock()
}

func (f *propFailure) report(rt *rapid.T) {
	if f.msg != "" {
		rt.Fatal(f.msg)
	}
}

func drawPropCall(t *rapid.T, i int) propCall {
	c := propCall{
		method: rapid.SampledFrom([]string{"GET", "POST", "PUT", "DELETE"}).Draw(t, "method"),
		body:   bodyKind(rapid.IntRange(0, 2).Draw(t, "body")),
		script: rapid.SliceOfN(rapid.IntRange(0, numOutcomes-1), 1, 4).Draw(t, "script"),
	}
	if rapid.Bool().Draw(t, "keyed") {
		c.key = fmt.Sprintf("key-%d", i)
	}
	if rapid.Bool().Draw(t, "cancels") {
		c.cancel = time.Duration(rapid.IntRange(1, 400).Draw(t, "cancelMs")) * time.Millisecond
	}
	if rapid.Bool().Draw(t, "deadlined") {
		c.deadline = time.Duration(rapid.IntRange(1, 800).Draw(t, "deadlineMs")) * time.Millisecond
	}
	return c
}

func drawPropPolicy(t *rapid.T) Policy {
	total := time.Duration(rapid.IntRange(20, 1000).Draw(t, "totalMs")) * time.Millisecond
	return Policy{
		Timeout: Timeout{Total: total, Attempt: time.Duration(rapid.Int64Range(int64(10*time.Millisecond), int64(total)).Draw(t, "attempt"))},
		Retry: Retry{
			MaxAttempts:   rapid.IntRange(1, 4).Draw(t, "maxAttempts"),
			Base:          time.Duration(rapid.IntRange(1, 50).Draw(t, "baseMs")) * time.Millisecond,
			Cap:           100 * time.Millisecond,
			MaxRetryAfter: time.Duration(rapid.IntRange(1, 300).Draw(t, "maxRAms")) * time.Millisecond,
			Jitter:        Jitter(rapid.IntRange(1, 4).Draw(t, "jitter")),
		},
		Bulkhead: Bulkhead{
			MaxConcurrent: rapid.IntRange(1, 4).Draw(t, "maxConcurrent"),
			MaxQueue:      rapid.IntRange(0, 2).Draw(t, "maxQueue"),
		},
		Breaker: Breaker{
			MinCalls:      rapid.IntRange(1, 5).Draw(t, "minCalls"),
			HalfOpenCalls: rapid.IntRange(1, 3).Draw(t, "halfOpen"),
			OpenFor:       time.Duration(rapid.IntRange(10, 200).Draw(t, "openForMs")) * time.Millisecond,
			Window:        time.Second,
		},
	}
}

// TestPropertyCalls: over random schedules, (1) a request that is not safe
// to replay reaches the upstream at most once; (2) every replay carries the
// caller's body byte for byte and its idempotency key; (3) the caller's
// request is never modified; (4) every call returns by the soonest of its
// deadline, its cancellation and Timeout.Total, exactly, on the virtual
// clock; (5) once every call is over, no bulkhead slot is held, nobody is
// queued and no half-open probe is outstanding.
func TestPropertyCalls(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		p := drawPropPolicy(rt)
		calls := make([]propCall, rapid.IntRange(1, 8).Draw(rt, "calls"))
		base := &propBase{scripts: map[string][]int{}, got: map[string][]sent{}}
		for i := range calls {
			calls[i] = drawPropCall(rt, i)
			base.scripts[fmt.Sprint(i)] = calls[i].script
		}
		var f propFailure
		defer f.report(rt)
		synctest.Test(t, func(t *testing.T) {
			rt := &f
			tr, err := New(Config{Base: base, Default: p})
			if err != nil {
				rt.Fatalf("%v", err)
				return
			}
			var wg sync.WaitGroup
			for i, c := range calls {
				wg.Go(func() { runPropCall(rt, tr, p, i, c, base) })
			}
			wg.Wait()
			// Bodies are closed; let any goroutine a layer started finish.
			synctest.Wait()
			for _, h := range tr.Snapshot().Hosts {
				for _, st := range h.bulkheads() {
					if st.InFlight != 0 || st.Queued != 0 {
						rt.Fatalf("bulkhead %s: %d in flight, %d queued after all calls", h.Host, st.InFlight, st.Queued)
					}
				}
			}
			tr.mu.RLock()
			for _, hs := range tr.hosts {
				for _, p := range hs.parts {
					if b, ok := p.(*breakerStage); ok && b.state().State == CircuitHalfOpen {
						c := b.cb.Counts()
						if out := int64(c.Requests) - int64(c.TotalSuccesses+c.TotalFailures+c.TotalExclusions); out != 0 {
							rt.Fatalf("half-open breaker has %d probes outstanding after all calls", out)
						}
					}
				}
			}
			tr.mu.RUnlock()
		})
	})
}

func runPropCall(rt *propFailure, tr *Transport, p Policy, i int, c propCall, base *propBase) {
	const body = "the caller's body, byte for byte: \x00\xff"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	limit := p.Timeout.Total
	if c.deadline > 0 {
		var dcancel context.CancelFunc
		ctx, dcancel = context.WithTimeout(ctx, c.deadline)
		defer dcancel()
		limit = min(limit, c.deadline)
	}
	if c.cancel > 0 {
		tm := time.AfterFunc(c.cancel, cancel)
		defer tm.Stop()
		limit = min(limit, c.cancel)
	}
	req, err := http.NewRequestWithContext(ctx, c.method, fmt.Sprintf("http://prop%d.test/", i%2), nil)
	if err != nil {
		rt.Fatalf("%v", err)
		return
	}
	req.Header.Set("X-Call", fmt.Sprint(i))
	if c.key != "" {
		req.Header.Set(IdempotencyKeyHeader, c.key)
	}
	switch c.body {
	case replayableBody:
		req.Body = io.NopCloser(strings.NewReader(body))
		req.ContentLength = int64(len(body))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(body)), nil }
	case oneShotBody:
		req.Body = io.NopCloser(strings.NewReader(body))
	}
	snap := snapshot(req)
	start := time.Now()
	resp, err := tr.RoundTrip(req)
	if resp != nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	took := time.Since(start)
	if (resp == nil) == (err == nil) {
		rt.Fatalf("call %d: RoundTrip = %v, %v", i, resp, err)
	}
	if d := snap.diff(req); d != "" {
		rt.Fatalf("call %d: caller's request modified: %s", i, d)
	}
	if took > limit {
		rt.Fatalf("call %d returned after %v, past its limit %v (err %v)", i, took, limit, err)
	}
	base.mu.Lock()
	got := base.got[fmt.Sprint(i)]
	base.mu.Unlock()
	replayable := (idempotentMethod(c.method) || c.key != "") && c.body != oneShotBody
	if !replayable && len(got) > 1 {
		rt.Fatalf("call %d (%s, body %d, key %q) is not replayable but was sent %d times", i, c.method, c.body, c.key, len(got))
	}
	for n, s := range got {
		if c.body != noBody && s.body != body {
			rt.Fatalf("call %d attempt %d carried body %q", i, n+1, s.body)
		}
		if s.key != c.key {
			rt.Fatalf("call %d attempt %d carried key %q, want %q", i, n+1, s.key, c.key)
		}
	}
}
