package bulwark_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/bulwark-http/bulwark/bulwarktest"
)

// The zero Config is a drop-in for http.DefaultClient.
func TestNewClientZeroConfig(t *testing.T) {
	u := bulwarktest.NewUpstream(map[string]bulwarktest.Script{"/orders": {{Body: "created"}}})
	srv := u.Start(t)
	c, err := bulwark.NewClient(bulwark.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseIdleConnections()
	resp, err := c.Post(srv.URL+"/orders", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "created" {
		t.Errorf("got %d %q, want 200 \"created\"", resp.StatusCode, b)
	}
	r := u.Requests()
	if len(r) != 1 || r[0].Method != "POST" || r[0].Body != "x" || r[0].Attempt != 1 {
		t.Errorf("upstream saw %+v, want one POST /orders with body x, attempt 1", r)
	}
}

// TestNilHeaderNoPanic: a request with a nil Header gets an error, as from
// net/http's Transport, on every path (a priority in its context, a
// route, hedging, a fallback), never a panic.
func TestNilHeaderNoPanic(t *testing.T) {
	base := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) { return seamAnswer(req, 0, 200) }}
	for _, cfg := range []bulwark.Config{
		{Base: base},
		{Base: base, Routes: map[string]bulwark.Policy{"GET /a": {}}},
		{Base: base, Default: bulwark.Policy{Hedge: bulwark.Hedge{Delay: 1}, Retry: bulwark.Retry{KeyPOST: true},
			Fallback: bulwark.Fallback{Constant: &bulwark.ConstantResponse{StatusCode: 200}}}},
	} {
		tr := seamNew(t, cfg)
		for _, method := range []string{"GET", "POST"} {
			u, _ := url.Parse("http://api.test/a")
			req := (&http.Request{Method: method, URL: u}).WithContext(bulwark.WithPriority(t.Context(), bulwark.PriorityCritical))
			resp, err := tr.RoundTrip(req)
			if resp != nil || !errors.Is(err, bulwark.ErrInvalidRequest) {
				t.Fatalf("%s with a nil Header: %v, %v; want ErrInvalidRequest", method, resp, err)
			}
		}
	}
	if base.sent() != 0 {
		t.Fatalf("sent %d requests with a nil Header", base.sent())
	}
}

// The package defaults under a capacity drop and a healthy burst, with
// Config{Base: host} and nothing else set, in a synctest
// bubble where the host's cores are timers: simulated seconds run in
// fractions of one, and the figures hold on a loaded machine.

// coreHost is a host of cores that each serve one request in service, with
// a FIFO queue in front of them: a request that finds every core busy
// waits its turn, or until its caller gives up. cores can change while it
// runs, and so can service (under mu); a core taken away finishes the
// request it has.
type coreHost struct {
	mu      sync.Mutex
	service time.Duration
	cores   int
	busy    int
	queue   []chan struct{} // the waiters, in arrival order
}

func (h *coreHost) setCores(n int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cores = n
	for h.busy < h.cores && len(h.queue) > 0 {
		h.busy++
		close(h.queue[0])
		h.queue = h.queue[1:]
	}
}

// release frees a core: to the first waiter, unless cores were taken away.
func (h *coreHost) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.busy <= h.cores && len(h.queue) > 0 {
		close(h.queue[0])
		h.queue = h.queue[1:]
		return
	}
	h.busy--
}

func (h *coreHost) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	h.mu.Lock()
	if h.busy < h.cores {
		h.busy++
		h.mu.Unlock()
	} else {
		ready := make(chan struct{})
		h.queue = append(h.queue, ready)
		h.mu.Unlock()
		select {
		case <-ready:
		case <-ctx.Done():
			h.mu.Lock()
			if i := slices.Index(h.queue, ready); i >= 0 {
				h.queue = slices.Delete(h.queue, i, i+1)
				h.mu.Unlock()
				return nil, context.Cause(ctx)
			}
			h.mu.Unlock()
			h.release() // granted while giving up
			return nil, context.Cause(ctx)
		}
	}
	// The core serves the request whether or not its caller still waits.
	h.mu.Lock()
	service := h.service
	h.mu.Unlock()
	done := make(chan struct{})
	time.AfterFunc(service, func() { h.release(); close(done) })
	select {
	case <-done:
		return &http.Response{StatusCode: 200, Body: http.NoBody, Header: http.Header{}, Request: req}, nil
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// phaseResult is what the callers saw of the calls sent in one phase.
type phaseResult struct {
	sent, ok, refused, open int
	p50, p99                time.Duration // of the calls that succeeded
}

// openLoop sends GETs at rate a second for dur, each on its own goroutine
// with its own deadline, and returns what they saw once all have ended.
func openLoop(c *http.Client, url string, rate int, dur, deadline time.Duration) phaseResult {
	n := int(dur.Seconds() * float64(rate))
	every := time.Second / time.Duration(rate)
	took := make([]time.Duration, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			start := time.Now()
			resp, err := c.Do(req)
			if err == nil {
				resp.Body.Close()
			}
			took[i], errs[i] = time.Since(start), err
		})
		time.Sleep(every)
	}
	wg.Wait()
	r := phaseResult{sent: n}
	var ok []time.Duration
	for i, err := range errs {
		switch {
		case err == nil:
			ok = append(ok, took[i])
		case errors.Is(err, bulwark.ErrBulkheadFull):
			r.refused++
		case errors.Is(err, bulwark.ErrBreakerOpen):
			r.open++
		}
	}
	r.ok = len(ok)
	if len(ok) > 0 {
		slices.Sort(ok)
		r.p50, r.p99 = ok[len(ok)/2], ok[len(ok)*99/100]
	}
	return r
}

// TestCapacityDropDefaults: a host of 40 cores at 20 ms loses three
// quarters of them for 4 s and gets them back, under 1,200 calls a second
// with 250 ms deadlines, and package defaults. In each phase the callers
// get at least 95 % of what the host can serve (2,000 a second with 40
// cores, more than is offered; 500 with 10), and in the drop the calls
// that succeed do so without waiting in the host's queue (p99 ≤ 50 ms).
func TestCapacityDropDefaults(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			rate     = 1200
			service  = 20 * time.Millisecond
			deadline = 250 * time.Millisecond
			phase    = 4 * time.Second
		)
		h := &coreHost{service: service, cores: 40}
		tr, err := bulwark.New(bulwark.Config{Base: h})
		if err != nil {
			t.Fatal(err)
		}
		c := &http.Client{Transport: tr}
		limit := func() int {
			hs := tr.Snapshot().Host("cap.test:80")
			if len(hs) != 1 || hs[0].Bulkhead == nil {
				t.Fatalf("no bulkhead for cap.test: %+v", hs)
			}
			return hs[0].Bulkhead.Limit
		}
		var res [3]phaseResult
		var limits [3]int
		for i, cores := range []int{40, 10, 40} {
			h.setCores(cores)
			// Each phase's calls are sent on their own; the next
			// phase starts when the host changes, not when the
			// stragglers end, so run the sender concurrently.
			done := make(chan phaseResult)
			go func() { done <- openLoop(c, "http://cap.test/", rate, phase, deadline) }()
			time.Sleep(phase)
			limits[i] = limit()
			res[i] = <-done
		}
		secs := phase.Seconds()
		for i, cores := range []int{40, 10, 40} {
			r := res[i]
			capacity := min(float64(rate), float64(cores)*float64(time.Second/service))
			okps := float64(r.ok) / secs
			t.Logf("%d cores: %.0f ok/s of %.0f served (%d sent, %d refused, %d breaker open), p50 %v p99 %v; limit at the end %d",
				cores, okps, capacity, r.sent, r.refused, r.open, r.p50, r.p99, limits[i])
			if okps < 0.95*capacity {
				t.Errorf("%d cores: %.0f ok/s, want ≥ 95 %% of %.0f", cores, okps, capacity)
			}
		}
		if p99 := res[1].p99; p99 > 50*time.Millisecond {
			t.Errorf("drop phase p99 %v, want ≤ 50ms", p99)
		}
	})
}

// TestHealthyBurstDefaults: after 3 s of steady load at the host's baseline
// latency (4 callers at 20 ms), a burst of 250 at once on a host with room
// for all of them: package defaults refuse none.
func TestHealthyBurstDefaults(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := &coreHost{service: 20 * time.Millisecond, cores: 400}
		tr, err := bulwark.New(bulwark.Config{Base: h})
		if err != nil {
			t.Fatal(err)
		}
		c := &http.Client{Transport: tr}
		get := func() error {
			resp, err := c.Get("http://cap.test/")
			if err == nil {
				resp.Body.Close()
			}
			return err
		}
		var wg sync.WaitGroup
		end := time.Now().Add(3 * time.Second)
		for range 4 {
			wg.Go(func() {
				for time.Now().Before(end) {
					if err := get(); err != nil {
						t.Errorf("steady call: %v", err)
						return
					}
				}
			})
		}
		wg.Wait()
		before := tr.Snapshot().Host("cap.test:80")[0].Bulkhead.Limit
		errs := make([]error, 250)
		for i := range errs {
			wg.Go(func() { errs[i] = get() })
		}
		wg.Wait()
		failed := 0
		for _, err := range errs {
			if err != nil {
				failed++
				if failed == 1 {
					t.Logf("first failure: %v", err)
				}
			}
		}
		t.Logf("burst of %d after steady 4: limit before %d, %d failed", len(errs), before, failed)
		if failed > 0 {
			t.Errorf("%d of %d burst calls failed, want none", failed, len(errs))
		}
	})
}

// TestSlowerHostDefaults: a host with room for everything (1,000 cores)
// turns from 20 ms to 40 ms under 1,200 calls a second, and the load stops
// and comes back: its latency is its own, not a queue, so package defaults
// refuse nothing.
func TestSlowerHostDefaults(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := &coreHost{service: 20 * time.Millisecond, cores: 1000}
		tr, err := bulwark.New(bulwark.Config{Base: h})
		if err != nil {
			t.Fatal(err)
		}
		c := &http.Client{Transport: tr}
		go func() {
			time.Sleep(1500 * time.Millisecond)
			h.mu.Lock()
			h.service = 40 * time.Millisecond
			h.mu.Unlock()
		}()
		for i := range 2 {
			r := openLoop(c, "http://cap.test/", 1200, 3*time.Second, 250*time.Millisecond)
			t.Logf("run %d: %d ok of %d, %d refused, %d breaker open, p99 %v", i, r.ok, r.sent, r.refused, r.open, r.p99)
			if r.ok != r.sent {
				t.Errorf("run %d: %d of %d calls failed, want none", i, r.sent-r.ok, r.sent)
			}
		}
	})
}

// TestHealthyBurstTenfold: after 3 s of steady load at the host's baseline
// latency (n callers at 20 ms, on a host with room for 20 n), a burst of
// 10 n at once: package defaults refuse none, whatever n.
func TestHealthyBurstTenfold(t *testing.T) {
	for _, n := range []int{1, 10, 40, 100} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := &coreHost{service: 20 * time.Millisecond, cores: 20 * n}
				tr, err := bulwark.New(bulwark.Config{Base: h})
				if err != nil {
					t.Fatal(err)
				}
				c := &http.Client{Transport: tr}
				get := func() error {
					resp, err := c.Get("http://cap.test/")
					if err == nil {
						resp.Body.Close()
					}
					return err
				}
				var wg sync.WaitGroup
				var steadyFailed atomic.Int64
				end := time.Now().Add(3 * time.Second)
				for range n {
					wg.Go(func() {
						for time.Now().Before(end) {
							if get() != nil {
								steadyFailed.Add(1)
							}
						}
					})
				}
				wg.Wait()
				before := tr.Snapshot().Host("cap.test:80")[0].Bulkhead.Limit
				var failed atomic.Int64
				for range 10 * n {
					wg.Go(func() {
						if get() != nil {
							failed.Add(1)
						}
					})
				}
				wg.Wait()
				t.Logf("steady %d, burst %d: limit before %d, %d steady and %d burst calls failed", n, 10*n, before, steadyFailed.Load(), failed.Load())
				if steadyFailed.Load() > 0 || failed.Load() > 0 {
					t.Errorf("%d steady and %d of %d burst calls failed, want none", steadyFailed.Load(), failed.Load(), 10*n)
				}
			})
		})
	}
}
