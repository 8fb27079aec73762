package bulwark

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// newBulkheadTransport builds a Transport over base whose Default policy has
// bulkhead bh.
func newBulkheadTransport(t testing.TB, base http.RoundTripper, bh Bulkhead) *Transport {
	t.Helper()
	tr, err := New(Config{Base: base, Default: Policy{Bulkhead: bh}})
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func bhSend(t testing.TB, ctx context.Context, rt http.RoundTripper, url string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return rt.RoundTrip(req)
}

func TestBulkheadFullRejectsAtOnce(t *testing.T) {
	base := &stubBase{}
	tr := newBulkheadTransport(t, base, Bulkhead{MaxConcurrent: 40})
	var held []*http.Response
	for i := 0; i < 40; i++ {
		resp, err := bhSend(t, t.Context(), tr, "http://tax.test/rate")
		if err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
		held = append(held, resp) // bodies left open: the 40 slow calls
	}
	wantStats(t, tr, "tax.test:80", 40, 0)

	// Call 41: refused without being sent, its body closed.
	var bs bodies
	req := newContractRequest(t, t.Context(), "http://tax.test/rate", contractRequest{method: http.MethodPost, body: "x"}, &bs)
	_, _, err := checkContract(t, tr, req, &bs)
	if !errors.Is(err, ErrBulkheadFull) {
		t.Fatalf("call 41: err = %v, want ErrBulkheadFull", err)
	}
	var fe *BulkheadFullError
	if !errors.As(err, &fe) || fe.Host != "tax.test:80" {
		t.Fatalf("call 41: err = %#v, want *BulkheadFullError for tax.test:80", err)
	}
	if n := base.calls.Load(); n != 40 {
		t.Fatalf("base saw %d calls, want 40: the refused one must not be sent", n)
	}

	// Another host, and another port of the same host, have slots of their own.
	for _, u := range []string{"http://inventory.test/", "http://tax.test:8080/"} {
		resp, err := bhSend(t, t.Context(), tr, u)
		if err != nil {
			t.Fatalf("%s while tax.test is full: %v", u, err)
		}
		resp.Body.Close()
	}
	wantStats(t, tr, "inventory.test:80", 0, 0)

	for _, r := range held {
		r.Body.Close()
	}
	wantStats(t, tr, "tax.test:80", 0, 0)
	resp, err := bhSend(t, t.Context(), tr, "http://tax.test/rate")
	if err != nil {
		t.Fatalf("after the bodies closed: %v", err)
	}
	resp.Body.Close()
}

func TestBulkheadReleaseAtEOFAndClose(t *testing.T) {
	tr := newBulkheadTransport(t, &stubBase{}, Bulkhead{MaxConcurrent: 1})
	resp, err := bhSend(t, t.Context(), tr, "http://a.test/")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bhSend(t, t.Context(), tr, "http://a.test/"); !errors.Is(err, ErrBulkheadFull) {
		t.Fatalf("second call while the body is open: err = %v, want ErrBulkheadFull", err)
	}
	if _, err := io.ReadAll(resp.Body); err != nil {
		t.Fatal(err)
	}
	wantStats(t, tr, "a.test:80", 0, 0) // EOF released it, before Close
	resp.Body.Close()
	wantStats(t, tr, "a.test:80", 0, 0) // and Close did not release it twice

	// Exactly one slot exists still: one admitted, the next refused.
	resp, err = bhSend(t, t.Context(), tr, "http://a.test/")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bhSend(t, t.Context(), tr, "http://a.test/"); !errors.Is(err, ErrBulkheadFull) {
		t.Fatalf("err = %v, want ErrBulkheadFull: a double release would have made room", err)
	}
	resp.Body.Close()
	wantStats(t, tr, "a.test:80", 0, 0)
}

func TestBulkheadReleaseOnError(t *testing.T) {
	// In a bubble: the retries of the failed calls wait no real time.
	synctest.Test(t, func(t *testing.T) {
		tr := newBulkheadTransport(t, &stubBase{err: errStub}, Bulkhead{MaxConcurrent: 1})
		for i := 0; i < 3; i++ {
			if _, err := bhSend(t, t.Context(), tr, "http://a.test/"); !errors.Is(err, errStub) {
				t.Fatalf("call %d: err = %v, want the base's error", i+1, err)
			}
		}
		wantStats(t, tr, "a.test:80", 0, 0)
	})
}

// slowBody yields one chunk per value sent on feed, then EOF once feed is
// closed.
type slowBody struct{ feed chan []byte }

func (b *slowBody) Read(p []byte) (int, error) {
	chunk, ok := <-b.feed
	if !ok {
		return 0, io.EOF
	}
	return copy(p, chunk), nil
}

func (b *slowBody) Close() error { return nil }

type slowBodyBase struct{ body *slowBody }

func (s *slowBodyBase) RoundTrip(req *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, Header: http.Header{}, Body: s.body, ContentLength: -1, Request: req}, nil
}

func TestBulkheadSlowBodyHoldsSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sb := &slowBody{feed: make(chan []byte)}
		tr := newBulkheadTransport(t, &slowBodyBase{body: sb}, Bulkhead{MaxConcurrent: 1})
		resp, err := bhSend(t, t.Context(), tr, "http://slow.test/")
		if err != nil {
			t.Fatal(err)
		}
		var got bytes.Buffer
		done := make(chan error)
		go func() {
			_, err := io.Copy(&got, resp.Body)
			done <- err
		}()
		for _, chunk := range []string{"he", "ll", "o"} {
			sb.feed <- []byte(chunk)
			synctest.Wait()
			// The response arrived long ago, but its body is still being
			// read: the connection is busy, so the slot stays taken.
			wantStats(t, tr, "slow.test:80", 1, 0)
		}
		close(sb.feed)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		wantStats(t, tr, "slow.test:80", 0, 0)
		resp.Body.Close()
		if got.String() != "hello" {
			t.Fatalf("body = %q, want hello", got.String())
		}
	})
}

func TestBulkheadReleaseOnCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newBulkheadTransport(t, &stubBase{block: true}, Bulkhead{MaxConcurrent: 1, MaxQueue: 1})
		ctx1, cancel1 := context.WithCancel(t.Context())
		ctx2, cancel2 := context.WithCancel(t.Context())
		errs := make(chan error, 2)
		go func() { _, err := bhSend(t, ctx1, tr, "http://a.test/"); errs <- err }()
		synctest.Wait()
		go func() { _, err := bhSend(t, ctx2, tr, "http://a.test/"); errs <- err }()
		synctest.Wait()
		wantStats(t, tr, "a.test:80", 1, 1)

		// The queued caller gives up: it leaves the queue at once.
		cancel2()
		if err := <-errs; !errors.Is(err, context.Canceled) {
			t.Fatalf("queued caller: err = %v, want context.Canceled", err)
		}
		wantStats(t, tr, "a.test:80", 1, 0)

		// The caller in flight gives up: its slot comes back.
		cancel1()
		if err := <-errs; !errors.Is(err, context.Canceled) {
			t.Fatalf("in-flight caller: err = %v, want context.Canceled", err)
		}
		wantStats(t, tr, "a.test:80", 0, 0)
	})
}

func TestBulkheadQueueFIFO(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newBulkheadTransport(t, &stubBase{}, Bulkhead{MaxConcurrent: 1, MaxQueue: 3, MaxWait: time.Second})
		first, err := bhSend(t, t.Context(), tr, "http://q.test/")
		if err != nil {
			t.Fatal(err)
		}
		var (
			mu    sync.Mutex
			order []int
			wg    sync.WaitGroup
		)
		for i := 1; i <= 3; i++ {
			wg.Go(func() {
				resp, err := bhSend(t, t.Context(), tr, "http://q.test/")
				if err != nil {
					t.Errorf("waiter %d: %v", i, err)
					return
				}
				mu.Lock()
				order = append(order, i)
				mu.Unlock()
				resp.Body.Close() // hands the slot to the next waiter
			})
			synctest.Wait() // waiter i is queued before i+1 arrives
		}
		wantStats(t, tr, "q.test:80", 1, 3)
		start := time.Now()
		if _, err := bhSend(t, t.Context(), tr, "http://q.test/"); !errors.Is(err, ErrBulkheadFull) {
			t.Fatalf("with the queue full: err = %v, want ErrBulkheadFull", err)
		}
		if d := time.Since(start); d != 0 {
			t.Fatalf("refusal with a full queue waited %v", d)
		}
		first.Body.Close()
		wg.Wait()
		if len(order) != 3 || order[0] != 1 || order[1] != 2 || order[2] != 3 {
			t.Fatalf("admission order = %v, want [1 2 3]", order)
		}
		wantStats(t, tr, "q.test:80", 0, 0)
	})
}

func TestBulkheadQueueTimeout(t *testing.T) {
	tests := []struct {
		name     string
		bh       Bulkhead
		timeout  Timeout
		ctxAfter time.Duration // a context deadline, if non-zero
		want     time.Duration // how long the waiter waits before it is refused
	}{
		{"MaxWait", Bulkhead{MaxConcurrent: 1, MaxQueue: 1, MaxWait: 100 * time.Millisecond}, Timeout{}, 0, 100 * time.Millisecond},
		{"Total", Bulkhead{MaxConcurrent: 1, MaxQueue: 1}, Timeout{Total: time.Second}, 0, time.Second - minSendTime},
		{"context deadline", Bulkhead{MaxConcurrent: 1, MaxQueue: 1, MaxWait: time.Hour}, Timeout{}, 200 * time.Millisecond, 200*time.Millisecond - minSendTime},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr, err := New(Config{Base: &stubBase{}, Default: Policy{Bulkhead: tt.bh, Timeout: tt.timeout}})
				if err != nil {
					t.Fatal(err)
				}
				held, err := bhSend(t, t.Context(), tr, "http://q.test/")
				if err != nil {
					t.Fatal(err)
				}
				ctx := t.Context()
				if tt.ctxAfter > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tt.ctxAfter)
					defer cancel()
				}
				start := time.Now()
				_, err = bhSend(t, ctx, tr, "http://q.test/")
				if !errors.Is(err, ErrBulkheadFull) {
					t.Fatalf("err = %v, want ErrBulkheadFull", err)
				}
				if d := time.Since(start); d != tt.want {
					t.Fatalf("waited %v, want %v", d, tt.want)
				}
				wantStats(t, tr, "q.test:80", 1, 0)
				held.Body.Close()
				wantStats(t, tr, "q.test:80", 0, 0)
			})
		})
	}
}

// countingBase records how many requests are inside it (from the base's
// entry to the end of the response body) and the most at once, so a test
// can check the bulkhead never lets more through than it has slots. A
// request with an X-Block header waits for its context to end.
type countingBase struct {
	active, peak atomic.Int64
}

func (c *countingBase) enter() {
	n := c.active.Add(1)
	for {
		p := c.peak.Load()
		if n <= p || c.peak.CompareAndSwap(p, n) {
			return
		}
	}
}

func (c *countingBase) RoundTrip(req *http.Request) (*http.Response, error) {
	c.enter()
	if req.Header.Get("X-Block") != "" {
		<-req.Context().Done()
		c.active.Add(-1)
		return nil, req.Context().Err()
	}
	return &http.Response{StatusCode: 200, Header: http.Header{}, Body: &countedBody{c: c, r: bytes.NewReader([]byte("hello"))}, Request: req}, nil
}

// countedBody leaves its base at EOF or Close, whichever comes first; both
// happen before the bulkhead's release, which runs after them.
type countedBody struct {
	c    *countingBase
	r    io.Reader
	done atomic.Bool
}

func (b *countedBody) leave() {
	if b.done.CompareAndSwap(false, true) {
		b.c.active.Add(-1)
	}
}

func (b *countedBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil {
		b.leave()
	}
	return n, err
}

func (b *countedBody) Close() error {
	b.leave()
	return nil
}

func TestBulkheadNoLeak(t *testing.T) {
	// Both implementations: the lock-free counter (no queue) and the queue.
	for _, queue := range []int{0, 8} {
		t.Run("MaxQueue="+strconv.Itoa(queue), func(t *testing.T) { testBulkheadNoLeak(t, queue) })
	}
}

func testBulkheadNoLeak(t *testing.T, queue int) {
	const (
		workers = 16
		each    = 625 // 10,000 requests in all
		slots   = 8
	)
	base := &countingBase{}
	tr := newBulkheadTransport(t, base, Bulkhead{MaxConcurrent: slots, MaxQueue: queue, MaxWait: 2 * time.Millisecond})
	var (
		wg       sync.WaitGroup
		outcomes [3]atomic.Int64 // ok, full, cancelled
	)
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(1, uint64(w)))
			for range each {
				ctx, cancel := context.WithCancel(t.Context())
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://leak.test/", nil)
				mode := rng.IntN(6)
				var canceller sync.WaitGroup
				switch mode {
				case 2: // cancelled before it is sent
					cancel()
				case 3: // cancelled while in flight or queued, from elsewhere
					req.Header.Set("X-Block", "1")
					canceller.Go(cancel)
				}
				resp, err := tr.RoundTrip(req)
				switch {
				case err == nil:
					outcomes[0].Add(1)
					switch mode {
					case 0: // read to EOF, then close
						_, _ = io.ReadAll(resp.Body)
					case 4: // cancelled with the body unread
						cancel()
					case 5: // partly read
						_, _ = resp.Body.Read(make([]byte, 2))
					}
					resp.Body.Close()
				case errors.Is(err, ErrBulkheadFull):
					outcomes[1].Add(1)
				case errors.Is(err, context.Canceled):
					outcomes[2].Add(1)
				default:
					t.Errorf("mode %d: unexpected error %v", mode, err)
				}
				canceller.Wait()
				cancel()
			}
		})
	}
	wg.Wait()
	wantStats(t, tr, "leak.test:80", 0, 0)
	if p := base.peak.Load(); p > slots {
		t.Fatalf("%d requests were inside the base at once; the bulkhead has %d slots", p, slots)
	}
	if a := base.active.Load(); a != 0 {
		t.Fatalf("%d requests still inside the base", a)
	}
	t.Logf("ok %d, full %d, cancelled %d, peak %d", outcomes[0].Load(), outcomes[1].Load(), outcomes[2].Load(), base.peak.Load())
}

func TestBulkheadRateLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &stubBase{}
		tr := newBulkheadTransport(t, base, Bulkhead{Rate: 10, Burst: 1})
		call := func(within time.Duration) (time.Duration, error) {
			ctx, cancel := context.WithTimeout(t.Context(), within)
			defer cancel()
			start := time.Now()
			resp, err := bhSend(t, ctx, tr, "http://rl.test/")
			if err == nil {
				resp.Body.Close()
			}
			return time.Since(start), err
		}
		steps := []struct {
			within  time.Duration
			wait    time.Duration
			limited bool
		}{
			{time.Second, 0, false},                      // the burst token
			{time.Second, 100 * time.Millisecond, false}, // waits its turn, in time
			{50 * time.Millisecond, 0, true},             // its turn is 100 ms away: too late
			{time.Second, 100 * time.Millisecond, false}, // the refused one gave its token back
			{105 * time.Millisecond, 0, true},            // 100 ms wait + the minimum to send do not fit
		}
		for i, s := range steps {
			d, err := call(s.within)
			if s.limited {
				if !errors.Is(err, ErrRateLimited) || !errors.Is(err, ErrBulkheadFull) {
					t.Fatalf("step %d: err = %v, want ErrRateLimited and ErrBulkheadFull", i, err)
				}
				var re *RateLimitError
				if !errors.As(err, &re) || re.Host != "rl.test:80" {
					t.Fatalf("step %d: err = %#v, want *RateLimitError for rl.test:80", i, err)
				}
			} else if err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			if d != s.wait {
				t.Fatalf("step %d (deadline %v): waited %v, want %v", i, s.within, d, s.wait)
			}
		}
		if n := base.calls.Load(); n != 3 {
			t.Fatalf("base saw %d calls, want 3", n)
		}

		// The rate-limit refusal keeps the contract: body closed, request untouched.
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
		defer cancel()
		var bs bodies
		req := newContractRequest(t, ctx, "http://rl.test/", contractRequest{method: http.MethodPut, body: "x", replayable: true}, &bs)
		if _, _, err := checkContract(t, tr, req, &bs); !errors.Is(err, ErrRateLimited) {
			t.Fatalf("err = %v, want ErrRateLimited", err)
		}

		// A caller that gives up while waiting for its turn leaves at once.
		ctx, cancel = context.WithCancel(t.Context())
		errc := make(chan error)
		go func() { _, err := bhSend(t, ctx, tr, "http://rl.test/"); errc <- err }()
		synctest.Wait()
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled while waiting for a token: err = %v", err)
		}
		wantStats(t, tr, "rl.test:80", 0, 0)
	})
}

func TestBulkheadContract(t *testing.T) {
	runContract(t, func(base http.RoundTripper) http.RoundTripper {
		// The bulkhead alone, over the attempt layers below it.
		return mustNew(t, Config{Base: base, Default: only(Policy{Bulkhead: Bulkhead{MaxConcurrent: 4, MaxQueue: 4, MaxWait: time.Second}}, "bulkhead")})
	})
	t.Run("full", func(t *testing.T) {
		tr := newBulkheadTransport(t, &stubBase{}, Bulkhead{MaxConcurrent: 1})
		held, err := bhSend(t, t.Context(), tr, "http://contract.test/")
		if err != nil {
			t.Fatal(err)
		}
		defer held.Body.Close()
		for _, cr := range contractRequests {
			var bs bodies
			req := newContractRequest(t, t.Context(), "http://contract.test/x?q=1", cr, &bs)
			if _, _, err := checkContract(t, tr, req, &bs); !errors.Is(err, ErrBulkheadFull) {
				t.Errorf("%s: err = %v, want ErrBulkheadFull", cr.name, err)
			}
		}
	})
}

func TestBulkheadConfig(t *testing.T) {
	bad := []struct {
		bh    Bulkhead
		field string
	}{
		{Bulkhead{MaxConcurrent: -1}, "Bulkhead.MaxConcurrent"},
		{Bulkhead{MaxQueue: -1}, "Bulkhead.MaxQueue"},
		{Bulkhead{MaxWait: -time.Second}, "Bulkhead.MaxWait"},
		{Bulkhead{Rate: -1}, "Bulkhead.Rate"},
		{Bulkhead{Burst: -1}, "Bulkhead.Burst"},
	}
	for _, b := range bad {
		_, err := New(Config{Upstreams: map[string]Policy{"x.test": {Bulkhead: b.bh}}})
		var ce *ConfigError
		if !errors.Is(err, ErrInvalidConfig) || !errors.As(err, &ce) || ce.Field != b.field || ce.Upstream != "x.test" {
			t.Errorf("New with %+v: err = %v, want a ConfigError for %s in x.test", b.bh, err, b.field)
		}
	}

	tr, err := New(Config{
		Base:    &stubBase{},
		Default: Policy{Bulkhead: Bulkhead{MaxQueue: 2}},
		Upstreams: map[string]Policy{
			"tax.test":  {Bulkhead: Bulkhead{MaxConcurrent: 40}},
			"recs.test": {Bulkhead: Bulkhead{Disabled: true}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []string{"http://tax.test/", "http://recs.test/", "http://other.test/"} {
		resp, err := bhSend(t, t.Context(), tr, u)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	got := map[string]HostSnapshot{}
	for _, h := range tr.Snapshot().Hosts {
		got[h.Host] = h
	}
	if h := got["tax.test:80"]; h.Bulkhead == nil || h.Bulkhead.MaxConcurrent != 40 || h.Bulkhead.MaxQueue != 2 || h.Upstream != "tax.test" || h.Scheme != "http" {
		t.Errorf("tax.test: %+v (bulkhead %+v), want MaxConcurrent 40 and MaxQueue 2 inherited", h, h.Bulkhead)
	}
	if h := got["other.test:80"]; h.Bulkhead == nil || !h.Bulkhead.Adaptive || h.Bulkhead.MaxConcurrent != defaultAdaptiveMax || h.Upstream != "default" {
		t.Errorf("other.test: %+v (bulkhead %+v), want the default adaptive limit up to %d", h, h.Bulkhead, defaultAdaptiveMax)
	}
	if h, ok := got["recs.test:80"]; !ok || h.Bulkhead != nil {
		t.Errorf("recs.test: %+v (seen %v), want a bulkhead-less host: it is disabled", h, ok)
	}
	if _, _, ok := bulkheadStats(tr, "recs.test:80"); ok {
		t.Errorf("BulkheadStats(recs.test:80) ok although disabled")
	}
	if _, _, ok := bulkheadStats(tr, "TAX.test:80"); !ok {
		t.Errorf("BulkheadStats is case-sensitive")
	}
	if _, _, ok := bulkheadStats(tr, "never.test:80"); ok {
		t.Errorf("BulkheadStats(never.test:80) ok for a host never seen")
	}
}

// BenchmarkBulkhead measures the layer over wrappedBenchBase (bare is wrappedBenchBase
// alone), then the whole stack with the bulkhead off and on.
func BenchmarkBulkhead(b *testing.B) {
	// The bulkhead alone, built by the real builder; below it only what
	// every instance stack has (the base adapter and the attempt span).
	layer := func(bh Bulkhead) layerRT {
		tr := mustNew(b, Config{Base: wrappedBenchBase{}, Default: only(Policy{Bulkhead: bh}, "bulkhead")})
		return layerRT{layerOf[*bulkheadLayer](b, tr, "http://bench.test/")}
	}
	req, _ := http.NewRequest(http.MethodGet, "http://bench.test/", nil)
	run := func(b *testing.B, rt http.RoundTripper, wantErr bool) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				resp, err := rt.RoundTrip(req)
				if (err != nil) != wantErr {
					b.Fatalf("err = %v", err)
				}
				if resp != nil {
					resp.Body.Close()
				}
			}
		})
	}
	rejecting := func(b *testing.B, rt http.RoundTripper) {
		held, err := rt.RoundTrip(req)
		if err != nil {
			b.Fatal(err)
		}
		defer held.Body.Close()
		run(b, rt, true)
	}
	b.Run("bare", func(b *testing.B) { run(b, wrappedBenchBase{}, false) })
	b.Run("admitted", func(b *testing.B) { run(b, layer(Bulkhead{MaxConcurrent: 1 << 20}), false) })
	b.Run("admitted-queue", func(b *testing.B) {
		run(b, layer(Bulkhead{MaxConcurrent: 1 << 20, MaxQueue: 1}), false)
	})
	// slot is the bulkhead's own cost, without a base: take and give back.
	b.Run("slot", func(b *testing.B) {
		rt := layer(Bulkhead{MaxConcurrent: 1 << 20}).s.(*bulkheadLayer)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := rt.acquire(req, call{}); err != nil {
					b.Fatal(err)
				}
				rt.release()
			}
		})
	})
	b.Run("rejected", func(b *testing.B) { rejecting(b, layer(Bulkhead{MaxConcurrent: 1})) })
	b.Run("rejected-queue", func(b *testing.B) {
		// The queue is full too: a waiter holds the one place in it.
		rt := layer(Bulkhead{MaxConcurrent: 1, MaxQueue: 1})
		held, err := rt.RoundTrip(req)
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			if resp, err := rt.RoundTrip(req.WithContext(ctx)); err == nil {
				resp.Body.Close()
			}
		}()
		for i := 0; ; i++ {
			if _, q := rt.s.(*bulkheadLayer).stats(); q == 1 {
				break
			}
			if i == 5000 {
				b.Fatal("the waiter never queued")
			}
			time.Sleep(time.Millisecond)
		}
		run(b, rt, true)
		cancel()
		<-done
		held.Body.Close()
	})

	stack := func(bh Bulkhead) *Transport {
		t, err := New(Config{Base: wrappedBenchBase{}, Default: Policy{Bulkhead: bh}})
		if err != nil {
			b.Fatal(err)
		}
		return t
	}
	b.Run("stack-off", func(b *testing.B) { run(b, stack(Bulkhead{Disabled: true}), false) })
	b.Run("stack-on", func(b *testing.B) { run(b, stack(Bulkhead{MaxConcurrent: 1 << 20}), false) })
	b.Run("stack-rejected", func(b *testing.B) { rejecting(b, stack(Bulkhead{MaxConcurrent: 1})) })
	b.Run("stack-rejected-no-timeout", func(b *testing.B) {
		// Without the deadline layers: what they add to a refusal.
		t, err := New(Config{Base: wrappedBenchBase{}, Default: Policy{Bulkhead: Bulkhead{MaxConcurrent: 1}, Timeout: Timeout{Disabled: true}}})
		if err != nil {
			b.Fatal(err)
		}
		rejecting(b, t)
	})
}

// TestBulkheadHandOffRace releases the slot at the very instant the waiter's
// MaxWait runs out, many times, so that the hand-off and the give-up meet in
// both orders: either way the waiter gets one answer and no slot is lost or
// counted twice.
func TestBulkheadHandOffRace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const wait = 50 * time.Millisecond
		tr := newBulkheadTransport(t, &stubBase{}, Bulkhead{MaxConcurrent: 1, MaxQueue: 1, MaxWait: wait})
		var admitted, refused int
		for range 200 {
			held, err := bhSend(t, t.Context(), tr, "http://race.test/")
			if err != nil {
				t.Fatal(err)
			}
			errc := make(chan error)
			go func() {
				resp, err := bhSend(t, t.Context(), tr, "http://race.test/")
				if err == nil {
					resp.Body.Close()
				}
				errc <- err
			}()
			synctest.Wait()
			time.AfterFunc(wait, func() { held.Body.Close() })
			switch err := <-errc; {
			case err == nil:
				admitted++
			case errors.Is(err, ErrBulkheadFull):
				refused++
			default:
				t.Fatalf("err = %v", err)
			}
			synctest.Wait()
			wantStats(t, tr, "race.test:80", 0, 0)
		}
		t.Logf("admitted %d, refused %d", admitted, refused)
	})
}

// TestBulkheadBaseBreaksContract (issue 16): a base that panics, or breaks
// the RoundTripper contract, must not cost the bulkhead a slot. Each case
// runs the package defaults (every layer in the stack) with one slot: the
// broken call is seen by the caller as it should be, no slot is held after
// it, and the next call gets the slot rather than ErrBulkheadFull.
func TestBulkheadBaseBreaksContract(t *testing.T) {
	const url = "http://broken.test/"
	// after checks the slot came back: none held, and the next call (the
	// base now healthy) is admitted.
	after := func(t *testing.T, tr *Transport, healthy *atomic.Bool) {
		t.Helper()
		wantStats(t, tr, "broken.test:80", 0, 0)
		healthy.Store(true)
		resp, err := bhSend(t, t.Context(), tr, url)
		if err != nil {
			t.Fatalf("next call: %v, want it admitted (ErrBulkheadFull means the slot leaked)", err)
		}
		resp.Body.Close()
		wantStats(t, tr, "broken.test:80", 0, 0)
	}
	// broken is a base that calls brk until healthy is set.
	broken := func(healthy *atomic.Bool, brk func(req *http.Request) (*http.Response, error)) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if healthy.Load() {
				return (&stubBase{}).RoundTrip(req)
			}
			return brk(req)
		})
	}
	newTransport := func(t *testing.T, base http.RoundTripper) *Transport {
		return mustNew(t, Config{Base: base, Default: Policy{Bulkhead: Bulkhead{MaxConcurrent: 1}}})
	}

	t.Run("panic", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			type boom struct{}
			var healthy atomic.Bool
			tr := newTransport(t, broken(&healthy, func(*http.Request) (*http.Response, error) { panic(boom{}) }))
			var got any
			func() {
				defer func() { got = recover() }()
				resp, err := bhSend(t, t.Context(), tr, url)
				t.Errorf("the base panicked, yet RoundTrip returned %v, %v", resp, err)
			}()
			if _, ok := got.(boom); !ok {
				t.Fatalf("recovered %v (%T), want the base's own panic value", got, got)
			}
			after(t, tr, &healthy)
		})
	})

	t.Run("nil response and nil error", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var healthy atomic.Bool
			var calls atomic.Int64
			tr := newTransport(t, broken(&healthy, func(*http.Request) (*http.Response, error) {
				calls.Add(1)
				return nil, nil
			}))
			resp, err := bhSend(t, t.Context(), tr, url)
			if resp != nil || err == nil {
				t.Fatalf("RoundTrip = %v, %v; want no response and an error", resp, err)
			}
			if msg := err.Error(); !strings.Contains(msg, "nil *Response") || !strings.Contains(msg, "nil error") {
				t.Errorf("err = %q, want one that says the base returned a nil response and a nil error", msg)
			}
			if n := calls.Load(); n != 1 {
				t.Errorf("base called %d times, want 1: a broken base is not worth a retry", n)
			}
			after(t, tr, &healthy)
		})
	})

	t.Run("response and error", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var healthy atomic.Bool
			var (
				mu     sync.Mutex
				bodies []*closeFlag
			)
			tr := newTransport(t, broken(&healthy, func(req *http.Request) (*http.Response, error) {
				b := &closeFlag{Reader: strings.NewReader("half an answer")}
				mu.Lock()
				bodies = append(bodies, b)
				mu.Unlock()
				resp := &http.Response{StatusCode: 200, Header: http.Header{}, Body: b, Request: req}
				return resp, errStub
			}))
			resp, err := bhSend(t, t.Context(), tr, url)
			if resp != nil || !errors.Is(err, errStub) {
				t.Fatalf("RoundTrip = %v, %v; want only the base's error", resp, err)
			}
			mu.Lock()
			if len(bodies) == 0 {
				t.Fatal("the base was never called")
			}
			for i, b := range bodies {
				if !b.closed.Load() {
					t.Errorf("attempt %d of %d: the response returned beside the error was not closed", i+1, len(bodies))
				}
			}
			mu.Unlock()
			after(t, tr, &healthy)
		})
	})
}

// TestAdaptiveBulkheadContract: the adaptive limit, with a queue, keeps
// the RoundTripper contract.
func TestAdaptiveBulkheadContract(t *testing.T) {
	runContract(t, func(base http.RoundTripper) http.RoundTripper {
		return mustNew(t, Config{Base: base, Default: only(Policy{Bulkhead: Bulkhead{Adaptive: true, MinConcurrent: 2, MaxConcurrent: 4, MaxQueue: 4, MaxWait: time.Second}}, "bulkhead")})
	})
}

// poisson sends Poisson arrivals at rate a second for d through rt, each
// call in its own goroutine, reading and closing every body, and returns
// the calls and the ErrBulkheadFull refusals. Call it inside a bubble.
func poisson(t *testing.T, rt http.RoundTripper, url string, rate float64, d time.Duration, seed uint64) (calls, full int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	var nFull atomic.Int64
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		time.Sleep(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
		calls++
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
			resp, err := rt.RoundTrip(req)
			if errors.Is(err, ErrBulkheadFull) {
				nFull.Add(1)
			}
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
	return calls, int(nFull.Load())
}

// TestDefaultBulkheadHealthyUpstream is the scenario that made the fixed
// 100-slot default refuse a healthy upstream: every answer in 200 ms, 400
// Poisson arrivals a second (80 in flight on average). The package default
// (an adaptive limit) refuses none; the old fixed 100 is run beside it and
// its refusals logged.
func TestDefaultBulkheadHealthyUpstream(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    Bulkhead
		want func(full int) bool
	}{
		{"default", Bulkhead{}, func(full int) bool { return full == 0 }},
		{"fixed 100", Bulkhead{MaxConcurrent: 100}, func(int) bool { return true }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				// The 200 ms are injected at the attempt, under the
				// bulkhead: each call holds its slot for them.
				tr := mustNew(t, Config{Base: okBase{}, Default: Policy{Bulkhead: tc.b,
					Fault: Fault{Delay: 200 * time.Millisecond, DelayRate: 1}}})
				calls, full := poisson(t, tr, "http://healthy.test/", 400, 30*time.Second, 18)
				t.Logf("%s: %d calls, %d ErrBulkheadFull (%.2f %%)", tc.name, calls, full, 100*float64(full)/float64(calls))
				if !tc.want(full) {
					t.Errorf("%s: %d of %d calls refused with ErrBulkheadFull, want none", tc.name, full, calls)
				}
				tr.CloseIdleConnections()
			})
		})
	}
}

// coresBase is an upstream with a number of cores: each request holds one
// for service, the rest wait in the server's own FIFO (a channel's waiters
// are served in order). cores can change while it runs.
type coresBase struct {
	service time.Duration
	tokens  chan struct{} // one per core
}

func newCoresBase(service time.Duration, cores int) *coresBase {
	b := &coresBase{service: service, tokens: make(chan struct{}, 100)}
	for range cores {
		b.tokens <- struct{}{}
	}
	return b
}

// setCores takes cores away (waiting for them to come free) or adds them.
func (b *coresBase) remove(n int) {
	for range n {
		<-b.tokens
	}
}

func (b *coresBase) add(n int) {
	for range n {
		b.tokens <- struct{}{}
	}
}

func (b *coresBase) RoundTrip(req *http.Request) (*http.Response, error) {
	select {
	case <-b.tokens:
	case <-req.Context().Done():
		return nil, req.Context().Err()
	}
	time.Sleep(b.service)
	b.tokens <- struct{}{}
	return &http.Response{StatusCode: 200, Header: http.Header{}, Request: req,
		Body: io.NopCloser(strings.NewReader("ok"))}, nil
}

// TestAdaptiveBulkheadFollowsCapacity is the capacity drop, scaled down:
// an upstream of 20 cores of 20 ms goes to 5 and back, under 600 calls a
// second with 250 ms deadlines. The adaptive limit comes down near what 5
// cores serve and goes back up, on virtual time.
func TestAdaptiveBulkheadFollowsCapacity(t *testing.T) {
	for _, queue := range []int{0, 4} {
		t.Run(fmt.Sprintf("queue %d", queue), func(t *testing.T) { testAdaptiveCapacity(t, queue) })
	}
}

func testAdaptiveCapacity(t *testing.T, queue int) {
	synctest.Test(t, func(t *testing.T) {
		base := newCoresBase(20*time.Millisecond, 20)
		tr := mustNew(t, Config{Base: base, Default: only(Policy{Bulkhead: Bulkhead{Adaptive: true, MinConcurrent: 1, MaxConcurrent: 100, MaxQueue: queue}}, "bulkhead")})
		const url = "http://cores.test/"
		limitNow := func() int {
			h := tr.Snapshot().Host("cores.test:80")
			if len(h) != 1 || h[0].Bulkhead == nil {
				t.Fatalf("no bulkhead for cores.test: %+v", h)
			}
			return h[0].Bulkhead.Limit
		}
		var wg sync.WaitGroup
		var ok, failed atomic.Int64
		send := func(d time.Duration) {
			tick := time.NewTicker(time.Second / 600)
			defer tick.Stop()
			end := time.Now().Add(d)
			for time.Now().Before(end) {
				<-tick.C
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(t.Context(), 250*time.Millisecond)
					defer cancel()
					req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
					resp, err := tr.RoundTrip(req)
					if err != nil {
						failed.Add(1)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					ok.Add(1)
				})
			}
		}
		send(3 * time.Second)
		high := limitNow()
		base.remove(15)
		send(3 * time.Second)
		drop := limitNow()
		okDrop := ok.Load()
		send(3 * time.Second)
		low := limitNow()
		okDrop = ok.Load() - okDrop
		base.add(15)
		send(3 * time.Second)
		restored := limitNow()
		wg.Wait()
		t.Logf("limit: high %d, 3 s into the drop %d, 6 s %d, 3 s after the restore %d; ok during the drop's last 3 s %d", high, drop, low, restored, okDrop)
		// 5 cores at 20 ms need 5 in flight: the limit lies within ±25 %
		// of it.
		if drop < 4 || drop > 6 || low < 4 || low > 6 {
			t.Errorf("limit during the drop: %d then %d, want in [3.75, 6.25]", drop, low)
		}
		// 600 a second at 20 ms need 12 in flight, and 20 cores serve 20
		// without a queue: [0.75 × 12, 1.25 × 20].
		if restored < 9 || restored > 25 {
			t.Errorf("limit 3 s after the restore: %d, want in [9, 25]", restored)
		}
		// 5 cores serve 250 a second: 3 s of them, less 10 %.
		if okDrop < 675 {
			t.Errorf("ok calls during the drop's last 3 s: %d, want ≥ 675", okDrop)
		}
		tr.CloseIdleConnections()
	})
}

// holdBase holds each attempt for the duration in its "d" query parameter
// (bubble time), counting the attempts it holds at once.
type holdBase struct {
	mu        sync.Mutex
	now, peak int
}

func (b *holdBase) RoundTrip(req *http.Request) (*http.Response, error) {
	d, _ := time.ParseDuration(req.URL.Query().Get("d"))
	b.mu.Lock()
	b.now++
	b.peak = max(b.peak, b.now)
	b.mu.Unlock()
	time.Sleep(d)
	b.mu.Lock()
	b.now--
	b.mu.Unlock()
	return response(req, http.StatusOK), nil
}

// TestShadowBulkheadMatchesEnforcingTwin: bursts of concurrent calls, each
// held a scripted time; the shadow bulkhead's WouldReject equals the
// enforcing twin's refusals, and every shadow call is sent.
func TestShadowBulkheadMatchesEnforcingTwin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		for _, queue := range []int{0, 2} {
			p := only(Policy{}, "bulkhead")
			p.Bulkhead = Bulkhead{MaxConcurrent: 3, MaxQueue: queue, MaxWait: 15 * time.Millisecond}
			sp := p
			sp.Bulkhead.Shadow = true
			enforcing := mustNew(t, Config{Base: &holdBase{}, Default: p})
			shadowBase := &holdBase{}
			shadow := mustNew(t, Config{Base: shadowBase, Default: sp})
			var mu sync.Mutex
			refused, shadowErrs := 0, 0
			var wg sync.WaitGroup
			for i := range 120 {
				// Arrivals and holds on a 10 ms grid, queue timeouts at
				// 15 ms: a release never comes at the instant a wait
				// ends, and the releases at an arrival's instant are done
				// (synctest.Wait) before it, so both Transports see the
				// same order.
				n := 1 + (i*7)%5 // 1..5 calls at once
				hold := time.Duration(10*(1+(i*3)%4)) * time.Millisecond
				url := "http://api.test/?d=" + hold.String()
				for range n {
					wg.Go(func() {
						if _, err := sendOnce(t, enforcing, "GET", url); errors.Is(err, ErrBulkheadFull) {
							mu.Lock()
							refused++
							mu.Unlock()
						}
					})
					wg.Go(func() {
						if _, err := sendOnce(t, shadow, "GET", url); err != nil {
							mu.Lock()
							shadowErrs++
							mu.Unlock()
						}
					})
				}
				synctest.Wait()
				time.Sleep(10 * time.Millisecond)
				synctest.Wait()
			}
			wg.Wait()
			if refused == 0 {
				t.Fatalf("queue %d: the enforcing bulkhead refused nothing: the test proves nothing", queue)
			}
			b := shadow.Snapshot().Hosts[0].Bulkhead
			if shadowErrs != 0 || b.WouldReject != uint64(refused) || b.InFlight != 0 {
				t.Errorf("queue %d: shadow errors %d, WouldReject %d, in flight %d; the enforcing twin refused %d",
					queue, shadowErrs, b.WouldReject, b.InFlight, refused)
			}
			if shadowBase.peak <= 3 {
				t.Errorf("queue %d: the shadow bulkhead's base never held more than its limit (%d): it limited", queue, shadowBase.peak)
			}
		}
	})
}

// TestBulkheadRateFollowsPolicy: a host that advertises a quota below
// Bulkhead.Rate gets requests at its quota; one above it does not raise
// the rate past Rate; a later policy at or above Rate restores Rate. On
// virtual time, sequential requests are spaced 1/rate apart.
func TestBulkheadRateFollowsPolicy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &statusBase{codes: []int{200}}
		tr := mustNew(t, Config{Base: base, Default: only(Policy{Bulkhead: Bulkhead{MaxConcurrent: 10, Rate: 100, Burst: 1}}, "bulkhead")})
		const url = "http://quota.test/"
		setPolicy := func(v string) {
			base.mu.Lock()
			defer base.mu.Unlock()
			base.header = http.Header{"Ratelimit-Policy": {v}}
		}
		rateNow := func() float64 {
			h := tr.Snapshot().Host("quota.test:80")
			if len(h) != 1 || h[0].Bulkhead == nil {
				t.Fatalf("no bulkhead for quota.test: %+v", h)
			}
			return h[0].Bulkhead.Rate
		}
		// gap sends n requests one after another and returns the mean time
		// between them.
		gap := func(n int) time.Duration {
			start := time.Now()
			for i := range n {
				if _, err := sendOnce(t, tr, http.MethodGet, url); err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
			}
			return time.Since(start) / time.Duration(n)
		}
		for _, step := range []struct {
			policy string
			rate   float64
		}{
			{`"p";q=10;w=1`, 10},                 // below Rate: followed
			{`"p";q=1000;w=1`, 100},              // above: Rate, no more
			{`"p";q=300;w=60`, 5},                // below again
			{`"p";q=6000;w=60`, 100},             // at Rate: Rate again
			{`"p";q=0;w=60`, 100},                // ignored: unchanged
			{`"a";q=20;w=1, "b";q=100;w=10`, 10}, // the tightest
		} {
			setPolicy(step.policy)
			gap(1) // the response that carries the policy
			if r := rateNow(); r != step.rate {
				t.Errorf("policy %s: rate %v, want %v", step.policy, r, step.rate)
			}
			if g, want := gap(5), time.Duration(float64(time.Second)/step.rate); g < want*9/10 || g > want*11/10 {
				t.Errorf("policy %s: requests %v apart, want %v", step.policy, g, want)
			}
		}
		if n := tr.Snapshot().RetryAfterIgnored; n != 6 {
			t.Errorf("ignored %d, want 6 (the zero quota's responses)", n)
		}
	})
}

// TestBulkheadShadowKeepsTheRoutesLayers: a route's request that a shadow
// bulkhead would refuse goes on through the route's own layers below the
// bulkhead (here its Fault), not the host's.
func TestBulkheadShadowKeepsTheRoutesLayers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if req.URL.Path == "/hold" {
				<-release
			}
			return &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody, Request: req}, nil
		})
		cfg := Config{Base: base, Default: Policy{
			Bulkhead: Bulkhead{MaxConcurrent: 1, Shadow: true},
			Retry:    Retry{Disabled: true},
			Breaker:  Breaker{Disabled: true},
		}, Routes: map[string]Policy{"/r/": {Fault: Fault{AbortStatus: 418, AbortRate: 1}}}}
		tr := mustNew(t, cfg)
		done := make(chan struct{})
		go func() {
			defer close(done)
			get(t, tr, "http://a.test/hold")
		}()
		synctest.Wait() // the host's one slot is held
		code, err := sendOnce(t, tr, "GET", "http://a.test/r/x")
		if err != nil {
			t.Fatal(err)
		}
		if code != 418 {
			t.Errorf("a route's request past a full shadow bulkhead: %d, want the route's injected 418", code)
		}
		if w := tr.Snapshot().Hosts[0].Bulkhead.WouldReject; w != 1 {
			t.Errorf("WouldReject = %d, want 1", w)
		}
		close(release)
		<-done
	})
}
