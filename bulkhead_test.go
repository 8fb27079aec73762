package bulwark

import (
	"bytes"
	"context"
	"errors"
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

func wantStats(t testing.TB, tr *Transport, host string, inFlight, queued int) {
	t.Helper()
	f, q, ok := bulkheadStats(tr, host)
	if !ok || f != inFlight || q != queued {
		t.Fatalf("BulkheadStats(%q) = %d, %d, %v; want %d, %d, true", host, f, q, ok, inFlight, queued)
	}
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

// wrappedBenchBase answers at once with a fresh response, as cheaply as a base
// can. It puts the shared body wrapper on, as the attempt-deadline layer
// below the bulkhead does in the real stack, so that the admitted path's
// cost over it is the bulkhead's alone.
type wrappedBenchBase struct{}

type noopEnder struct{}

func (noopEnder) bodyEnd() {}

var benchBody = io.NopCloser(bytes.NewReader(nil))

func (wrappedBenchBase) RoundTrip(req *http.Request) (*http.Response, error) {
	resp := &http.Response{StatusCode: 200, Body: benchBody, Request: req}
	onBodyEnd(resp, noopEnder{})
	return resp, nil
}

// BenchmarkBulkhead measures the layer over wrappedBenchBase (bare is wrappedBenchBase
// alone), then the whole stack with the bulkhead off and on.
func BenchmarkBulkhead(b *testing.B) {
	// The bulkhead alone, built by the real builder; below it only what
	// every instance stack has (the base adapter and the attempt span).
	layer := func(bh Bulkhead) stageRT {
		tr := mustNew(b, Config{Base: wrappedBenchBase{}, Default: only(Policy{Bulkhead: bh}, "bulkhead")})
		return stageRT{layerOf[*bulkheadStage](b, tr, "http://bench.test/")}
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
		rt := layer(Bulkhead{MaxConcurrent: 1 << 20}).s.(*bulkheadStage)
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
			if _, q := rt.s.(*bulkheadStage).stats(); q == 1 {
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

// closeTracker is a response body that records being closed.
type closeTracker struct {
	io.Reader
	closed atomic.Bool
}

func (b *closeTracker) Close() error {
	b.closed.Store(true)
	return nil
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
				bodies []*closeTracker
			)
			tr := newTransport(t, broken(&healthy, func(req *http.Request) (*http.Response, error) {
				b := &closeTracker{Reader: strings.NewReader("half an answer")}
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
