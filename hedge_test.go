package bulwark

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// hedgeBase answers attempt n (from 1) after wait(n), or never (a negative
// wait: it returns when its request is cancelled, as a well-behaved server
// does), and records each attempt's host, Bulwark-Attempt and the cause
// its context ended with.
type hedgeBase struct {
	wait func(n int) time.Duration

	mu     sync.Mutex
	n      int
	hosts  []string
	nums   []string
	causes []error
	bodies []*closeFlag
}

func (b *hedgeBase) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		_, _ = io.Copy(io.Discard, req.Body)
		req.Body.Close()
	}
	b.mu.Lock()
	b.n++
	n := b.n
	b.hosts = append(b.hosts, req.URL.Host)
	b.nums = append(b.nums, req.Header.Get(AttemptHeader))
	b.causes = append(b.causes, nil)
	b.mu.Unlock()
	d := b.wait(n)
	var tm <-chan time.Time
	if d >= 0 {
		tm = time.After(d)
	}
	select {
	case <-tm:
	case <-req.Context().Done():
		b.mu.Lock()
		b.causes[n-1] = context.Cause(req.Context())
		b.mu.Unlock()
		return nil, context.Cause(req.Context())
	}
	body := &closeFlag{Reader: strings.NewReader("attempt " + req.Header.Get(AttemptHeader))}
	b.mu.Lock()
	b.bodies = append(b.bodies, body)
	b.mu.Unlock()
	return &http.Response{StatusCode: 200, Header: http.Header{}, Body: body, Request: req}, nil
}

func (b *hedgeBase) sent() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n
}

// slowFirst: the first attempt hangs, later ones answer in 5 ms.
func slowFirst(n int) time.Duration {
	if n == 1 {
		return -1
	}
	return 5 * time.Millisecond
}

func hedgePolicy(h Hedge, layers ...string) Policy {
	p := only(Policy{Hedge: h}, append([]string{"timeout", "retry"}, layers...)...)
	p.Retry.Backoff = noWait
	return p
}

func hedgeGet(t *testing.T, tr http.RoundTripper, ctx context.Context, method string) (string, time.Duration, error) {
	t.Helper()
	var body io.Reader
	if method == http.MethodPost {
		body = strings.NewReader("charge")
	}
	req, _ := http.NewRequestWithContext(ctx, method, "http://hedge.test/x", body)
	start := time.Now()
	resp, err := tr.RoundTrip(req)
	took := time.Since(start)
	if err != nil {
		return "", took, err
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return string(b), took, nil
}

func hedgeSnap(t *testing.T, tr *Transport) HedgeSnapshot {
	t.Helper()
	for _, h := range tr.Snapshot().Hosts {
		if h.Hedge != nil {
			return *h.Hedge
		}
	}
	t.Fatal("no HedgeSnapshot")
	return HedgeSnapshot{}
}

// TestHedgeFiresAfterDelay: a hedge is sent after the delay and no
// sooner, wins, carries its own attempt number, and the first attempt is
// cancelled with the loser's cause; a fast attempt is never hedged.
func TestHedgeFiresAfterDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &hedgeBase{wait: slowFirst}
		tr := mustNew(t, Config{Base: base, Default: hedgePolicy(Hedge{Delay: 10 * time.Millisecond})})
		got, took, err := hedgeGet(t, tr, t.Context(), http.MethodGet)
		if err != nil || got != "attempt 2" {
			t.Fatalf("got %q, %v", got, err)
		}
		if took != 15*time.Millisecond {
			t.Errorf("took %v, want the delay (10ms) + the hedge's 5ms", took)
		}
		synctest.Wait()
		if base.nums[0] != "1" || base.nums[1] != "2" {
			t.Errorf("Bulwark-Attempt = %v, want 1 then 2", base.nums)
		}
		if !errors.Is(base.causes[0], errHedgeLost) || classify(nil, base.causes[0]) != kindCanceled {
			t.Errorf("loser's cause = %v, want errHedgeLost, classified as a cancellation", base.causes[0])
		}
		if s := hedgeSnap(t, tr); s.Sent != 1 || s.Won != 1 {
			t.Errorf("snapshot = %+v, want 1 sent, 1 won", s)
		}

		fast := &hedgeBase{wait: func(int) time.Duration { return 9 * time.Millisecond }}
		tr = mustNew(t, Config{Base: fast, Default: hedgePolicy(Hedge{Delay: 10 * time.Millisecond})})
		for range 3 {
			if _, _, err := hedgeGet(t, tr, t.Context(), http.MethodGet); err != nil {
				t.Fatal(err)
			}
		}
		if fast.sent() != 3 {
			t.Errorf("%d attempts for 3 fast calls, want no hedge", fast.sent())
		}
	})
}

// TestHedgeLosersFreed: when both attempts answer, the later answer is
// drained and closed and every bulkhead slot is back once the winner's body
// is closed; the breaker counts the loser as neither failure nor slow.
func TestHedgeLosersFreed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &hedgeBase{wait: func(n int) time.Duration {
			if n == 1 {
				return 30 * time.Millisecond
			}
			return 5 * time.Millisecond
		}}
		p := hedgePolicy(Hedge{Delay: 10 * time.Millisecond}, "bulkhead", "breaker")
		p.Breaker.SlowCall = 20 * time.Millisecond
		tr := mustNew(t, Config{Base: base, Default: p})
		got, _, err := hedgeGet(t, tr, t.Context(), http.MethodGet)
		if err != nil || got != "attempt 2" {
			t.Fatalf("got %q, %v", got, err)
		}
		time.Sleep(50 * time.Millisecond)
		synctest.Wait()
		if base.causes[0] == nil {
			t.Error("the first attempt was not cancelled")
		}
		for i, b := range base.bodies {
			if !b.closed.Load() {
				t.Errorf("body %d not closed", i)
			}
		}
		if in, _, _ := bulkheadStats(tr, "hedge.test:80"); in != 0 {
			t.Errorf("%d bulkhead slots held after the call", in)
		}
		bs := tr.Snapshot().Hosts[0].Breaker
		if bs.Failures != 0 || bs.Slow != 0 {
			t.Errorf("breaker counted the loser: %+v", bs)
		}
	})
}

// TestHedgeNeverUnkeyedPOST: a POST without an Idempotency-Key is sent
// once, however slow.
func TestHedgeNeverUnkeyedPOST(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &hedgeBase{wait: func(int) time.Duration { return 50 * time.Millisecond }}
		tr := mustNew(t, Config{Base: base, Default: hedgePolicy(Hedge{Delay: 10 * time.Millisecond})})
		if _, _, err := hedgeGet(t, tr, t.Context(), http.MethodPost); err != nil {
			t.Fatal(err)
		}
		if base.sent() != 1 {
			t.Errorf("unkeyed POST sent %d times", base.sent())
		}
	})
}

// TestHedgeBudgetShared: hedges withdraw from the retry budget, so a
// budget spent by hedges refuses retries, and a spent budget skips hedges.
func TestHedgeBudgetShared(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var hang atomic.Bool
		base := &hedgeBase{}
		base.wait = func(n int) time.Duration {
			base.mu.Lock()
			first := base.nums[n-1] == "1"
			base.mu.Unlock()
			if first && hang.Load() {
				return -1 // the call's first attempt hangs
			}
			return 5 * time.Millisecond
		}
		p := hedgePolicy(Hedge{Delay: 10 * time.Millisecond})
		p.Retry.Budget = Budget{Ratio: 0.5, MinPerSecond: -1, Window: time.Minute}
		tr := mustNew(t, Config{Base: base, Default: p})
		for i := range 4 {
			// Two fast calls leave room for one retry (0.5 × 2); the first
			// slow call's hedge takes it, the second's finds none (1 > 0.5 × 3).
			hang.Store(i >= 2)
			if _, _, err := hedgeGet(t, tr, t.Context(), http.MethodGet); err != nil && !errors.Is(err, ErrAttemptTimeout) {
				t.Fatal(err)
			}
		}
		s := hedgeSnap(t, tr)
		if s.Sent != 1 || s.Skipped.Budget != 1 {
			t.Errorf("snapshot = %+v, want one hedge sent and one skipped for the budget", s)
		}
		// The second slow call's first attempt timed out and was retried:
		// that retry and the hedge are the budget's 2 (0.5 × 4 calls).
		if b := tr.Snapshot().Hosts[0].Budget; b.Retries != 2 || b.Calls != 4 || b.Remaining != 0 {
			t.Errorf("budget = %+v, want the hedge and the retry counted in one budget", b)
		}
	})
}

// TestHedgeNotIntoRefusal: no hedge while the breaker is open, the host is
// paused or the bulkhead is full; each is counted by reason.
func TestHedgeNotIntoRefusal(t *testing.T) {
	for _, tc := range []struct {
		name   string
		layers []string
		during func(tr *Transport)
		skips  func(HedgeSkips) uint64
		policy func(*Policy)
	}{
		{"breaker", []string{"breaker"}, func(tr *Transport) {
			_ = tr.ControlBreaker("hedge.test:80", BreakerForceOpen)
		}, func(s HedgeSkips) uint64 { return s.Breaker }, nil},
		{"pushback", []string{"pushback"}, func(tr *Transport) {
			pb := layerOf[*pushbackLayer](t, tr, "http://hedge.test/")
			pb.pauseIn(&pb.paused, time.Now().Add(time.Minute))
		}, func(s HedgeSkips) uint64 { return s.Pushback }, nil},
		{"bulkhead", []string{"bulkhead"}, nil, func(s HedgeSkips) uint64 { return s.Bulkhead }, nil},
		{"throttle", nil, func(tr *Transport) {
			// Ten refused requests in the window: the throttle refuses
			// with probability 10/11 now.
			th := layerOf[*throttleLayer](t, tr, "http://hedge.test/")
			th.record(time.Now().UnixNano(), 10, 0)
		}, func(s HedgeSkips) uint64 { return s.Throttle }, func(p *Policy) { p.Throttle.Enabled = true }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &hedgeBase{wait: func(int) time.Duration { return 30 * time.Millisecond }}
				p := hedgePolicy(Hedge{Delay: 10 * time.Millisecond}, tc.layers...)
				p.Bulkhead.MaxConcurrent = 1
				if tc.policy != nil {
					tc.policy(&p)
				}
				tr := mustNew(t, Config{Base: base, Default: p})
				done := make(chan error, 1)
				go func() {
					_, _, err := hedgeGet(t, tr, context.Background(), http.MethodGet)
					done <- err
				}()
				time.Sleep(time.Millisecond)
				if tc.during != nil {
					tc.during(tr)
				}
				if err := <-done; err != nil {
					t.Fatal(err)
				}
				if base.sent() != 1 {
					t.Errorf("%d attempts, want no hedge", base.sent())
				}
				if s := hedgeSnap(t, tr); tc.skips(s.Skipped) != 1 || s.Sent != 0 {
					t.Errorf("snapshot = %+v", s)
				}
			})
		})
	}
}

// TestHedgeOtherInstance: with Endpoints, the hedge goes to the instance
// the first attempt did not.
func TestHedgeOtherInstance(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for range 5 {
			base := &hedgeBase{wait: slowFirst}
			p := hedgePolicy(Hedge{Delay: 10 * time.Millisecond})
			p.Endpoints = Endpoints{Addrs: []string{"10.0.0.1:80", "10.0.0.2:80"}}
			tr := mustNew(t, Config{Base: base, Upstreams: map[string]Policy{"hedge.test": p}})
			if _, _, err := hedgeGet(t, tr, t.Context(), http.MethodGet); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
			if len(base.hosts) != 2 || base.hosts[0] == base.hosts[1] {
				t.Fatalf("attempts went to %v, want two instances", base.hosts)
			}
		}
	})
}

// TestHedgeDeadlineAware: a hedge, and a retry, whose wait plus the host's
// median latency cannot fit before the deadline is not sent.
func TestHedgeDeadlineAware(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var slow atomic.Bool
		base := &hedgeBase{wait: func(int) time.Duration {
			if slow.Load() {
				return -1
			}
			return 20 * time.Millisecond
		}}
		p := hedgePolicy(Hedge{Quantile: 0.5, MinDelay: 5 * time.Millisecond})
		tr := mustNew(t, Config{Base: base, Default: p})
		for range 40 { // the median is learnt: 20 ms
			if _, _, err := hedgeGet(t, tr, t.Context(), http.MethodGet); err != nil {
				t.Fatal(err)
			}
		}
		slow.Store(true)
		before := base.sent()
		// 30 ms left: the hedge would start at ~20 ms with 20 ms to go.
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Millisecond)
		defer cancel()
		_, _, err := hedgeGet(t, tr, ctx, http.MethodGet)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want the caller's deadline", err)
		}
		if n := base.sent() - before; n != 1 {
			t.Errorf("%d attempts, want the hedge skipped", n)
		}
		if s := hedgeSnap(t, tr); s.Skipped.Deadline != 1 {
			t.Errorf("snapshot = %+v, want one skipped for the deadline", s)
		}
		// A retry after a 503 at 5 ms with 30 ms left and a 20 ms median
		// fits; with 22 ms left it does not.
		r := layerOf[*retryLayer](t, tr, "http://hedge.test/")
		req, _ := http.NewRequest(http.MethodGet, "http://hedge.test/x", nil)
		prev := time.Duration(0)
		resp := &http.Response{StatusCode: 503, Header: http.Header{}}
		now := time.Now()
		if d := r.decide(req, call{total: now.Add(30 * time.Millisecond)}, true, 1, judgeKind(nil, kindServerError, resp, nil), resp, nil, &prev); d.v != retryAgain {
			t.Errorf("30 ms left: verdict %v, want a retry", d.v)
		}
		if d := r.decide(req, call{total: now.Add(15 * time.Millisecond)}, true, 1, judgeKind(nil, kindServerError, resp, nil), resp, nil, &prev); d.v != giveUp {
			t.Errorf("15 ms left: verdict %v, want none (median 20 ms)", d.v)
		}
	})
}

func TestHedgeConfig(t *testing.T) {
	for _, tc := range []struct {
		h     Hedge
		field string
	}{
		{Hedge{Delay: -time.Millisecond}, "Hedge.Delay"},
		{Hedge{Quantile: 1}, "Hedge.Quantile"},
		{Hedge{Quantile: -0.5}, "Hedge.Quantile"},
		{Hedge{Delay: time.Millisecond, MaxHedges: 4}, "Hedge.MaxHedges"},
		{Hedge{Delay: time.Millisecond, Quantile: 0.9}, "Hedge.Quantile"},
		{Hedge{Quantile: 0.9, MinDelay: -1}, "Hedge.MinDelay"},
		{Hedge{Disabled: true, Enabled: true}, "Hedge.Enabled"},
	} {
		_, err := New(Config{Default: Policy{Hedge: tc.h}})
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != tc.field {
			t.Errorf("%+v: err = %v, want a ConfigError on %s", tc.h, err, tc.field)
		}
	}
	if _, err := New(Config{Default: Policy{Hedge: Hedge{Delay: time.Millisecond}, Timeout: Timeout{Disabled: true}}}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("hedging without Timeout: err = %v", err)
	}
}

// TestHedgeContract: the RoundTripper contract holds with hedging on, a
// hedge sent at once on every call.
func TestHedgeContract(t *testing.T) {
	p := Policy{Hedge: Hedge{Delay: time.Nanosecond, MaxHedges: 2}, Retry: Retry{Backoff: noWait, KeyPOST: true, BufferBody: 64}}
	p.Breaker.Disabled = true
	mustNew(t, Config{Default: p})
	runContract(t, func(base http.RoundTripper) http.RoundTripper {
		tr, _ := New(Config{Base: base, Default: p})
		return tr
	})
}

// TestHedgeObserved: the hedge's attempt span says it is a hedge, and the
// bulwark.hedges counter counts it sent and won.
func TestHedgeObserved(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newOtelKit(t)
		cfg := k.config(&hedgeBase{wait: slowFirst})
		cfg.Default.Hedge = Hedge{Delay: 10 * time.Millisecond}
		tr := mustNew(t, cfg)
		ctx, caller := k.caller(t.Context())
		if _, _, err := hedgeGet(t, tr, ctx, http.MethodGet); err != nil {
			t.Fatal(err)
		}
		caller.End()
		synctest.Wait()
		var hedges int
		for _, s := range spansNamed(k.sr, "GET") {
			if v, ok := attr(s, keyHedge); ok && v.AsString() == "hedge" {
				hedges++
			}
		}
		if hedges != 1 {
			t.Errorf("%d attempt spans marked as a hedge, want 1", hedges)
		}
		rm := k.collect(t)
		if n := counter(t, rm, "bulwark.hedges", keyUpstream.String("default"), keyHedge.String("sent")); n != 1 {
			t.Errorf("hedges sent = %d, want 1", n)
		}
		if n := counter(t, rm, "bulwark.hedges", keyUpstream.String("default"), keyHedge.String("won")); n != 1 {
			t.Errorf("hedges won = %d, want 1", n)
		}
	})
}

// TestHedgePanicReachesCaller: a base that panics under a hedge, on the
// timer's goroutine, does not take the process down: the caller panics
// with the value once the round is over, and no slot is left held.
func TestHedgePanicReachesCaller(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var n atomic.Int32
		base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if n.Add(1) == 2 {
				panic("hedge boom")
			}
			<-req.Context().Done()
			return nil, context.Cause(req.Context())
		})
		tr := mustNew(t, Config{Base: base, Default: hedgePolicy(Hedge{Delay: 10 * time.Millisecond}, "bulkhead")})
		var got any
		func() {
			defer func() { got = recover() }()
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://h.test/", nil)
			tr.RoundTrip(req)
		}()
		if got != "hedge boom" {
			t.Fatalf("recovered %v, want the hedge's panic", got)
		}
		synctest.Wait()
		if f, q, ok := bulkheadStats(tr, "h.test:80"); !ok || f != 0 || q != 0 {
			t.Errorf("bulkhead holds %d, queues %d after the panic; want none", f, q)
		}
	})
}
