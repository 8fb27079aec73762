package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bulwark-http/bulwark"
)

// gate is a handler that records each request's path and then blocks until
// the test lets it go: one receive from release per request, or all at once
// when release is closed. A request with "X-Block: no" returns at once.
type gate struct {
	mu      sync.Mutex
	calls   []string
	release chan struct{}
}

func newGate() *gate { return &gate{release: make(chan struct{})} }

func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	g.calls = append(g.calls, r.URL.Path)
	g.mu.Unlock()
	if r.Header.Get("X-Block") != "no" {
		select {
		case <-g.release:
		case <-r.Context().Done():
		}
	}
	io.WriteString(w, "ok")
}

func (g *gate) called() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.calls)
}

// newReq builds a request; prio, if not empty, goes in PriorityHeader.
func newReq(method, path, prio string) *http.Request {
	r := httptest.NewRequest(method, path, nil)
	if prio != "" {
		r.Header.Set(bulwark.PriorityHeader, prio)
	}
	return r
}

func noBlock(r *http.Request) *http.Request {
	r.Header.Set("X-Block", "no")
	return r
}

// start serves r through h on a goroutine of its own; the channel yields
// the recorded response once ServeHTTP returns.
func start(h http.Handler, r *http.Request) <-chan *httptest.ResponseRecorder {
	ch := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		ch <- rec
	}()
	return ch
}

// serveNow serves r on the calling goroutine, for requests that must not
// block: refusals, and requests the gate lets through.
func serveNow(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec
}

// done returns the response if ServeHTTP has returned, nil otherwise.
func done(ch <-chan *httptest.ResponseRecorder) *httptest.ResponseRecorder {
	select {
	case rec := <-ch:
		return rec
	default:
		return nil
	}
}

func mustShedder(t testing.TB, next http.Handler, cfg ShedConfig) *Shedder {
	t.Helper()
	s, err := NewShedder(next, cfg)
	if err != nil {
		t.Fatalf("NewShedder(%+v) = %v", cfg, err)
	}
	return s
}

// checkShed fails unless rec is a Shedder refusal for the given reason.
func checkShed(t *testing.T, name string, rec *httptest.ResponseRecorder, why ShedReason) {
	t.Helper()
	if rec == nil {
		t.Fatalf("%s: still waiting, want a %s refusal", name, why)
	}
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("%s: status %d, want 503 (%s)", name, rec.Code, why)
	}
	h := rec.Result().Header
	if got := h.Get("Retry-After"); got != "1" {
		t.Errorf("%s: Retry-After = %q, want \"1\"", name, got)
	}
	if got := h.Get(bulwark.NoRetryHeader); got != "1" {
		t.Errorf("%s: %s = %q, want \"1\"", name, bulwark.NoRetryHeader, got)
	}
	if got := h.Get(ShedReasonHeader); got != why.String() {
		t.Errorf("%s: %s = %q, want %q", name, ShedReasonHeader, got, why)
	}
}

func checkOK(t *testing.T, name string, rec *httptest.ResponseRecorder) {
	t.Helper()
	if rec == nil {
		t.Fatalf("%s: still waiting, want 200", name)
	}
	if rec.Code != http.StatusOK || rec.Body.String() != "ok" {
		t.Fatalf("%s: %d %q, want 200 \"ok\"", name, rec.Code, rec.Body.String())
	}
}

// At twice capacity with the handler blocked, the excess gets 503,
// Retry-After and the marker, and the handler never sees it.
func TestShedderRefusesPastCapacity(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGate()
		s := mustShedder(t, g, ShedConfig{Workers: 2, Queue: 1, ReservedCritical: -1, MaxQueueWait: time.Hour})
		var chs []<-chan *httptest.ResponseRecorder
		for i := range 6 { // 2 × (2 workers + 1 queued)
			chs = append(chs, start(s, newReq("GET", fmt.Sprintf("/%d", i), "")))
			synctest.Wait()
		}
		for i := 0; i < 3; i++ {
			if rec := done(chs[i]); rec != nil {
				t.Fatalf("request %d answered %d, want it served or queued", i, rec.Code)
			}
		}
		for i := 3; i < 6; i++ {
			checkShed(t, fmt.Sprintf("request %d", i), done(chs[i]), ShedQueueFull)
		}
		if got, want := g.called(), []string{"/0", "/1"}; !slices.Equal(got, want) {
			t.Fatalf("handler called for %v, want %v", got, want)
		}
		st := s.Stats()
		if st.InFlight != 2 || st.Queued != 1 || st.Shed[ShedQueueFull][bulwark.PriorityNormal] != 3 || st.ShedTotal() != 3 {
			t.Fatalf("Stats() = %+v, want 2 in flight, 1 queued, 3 shed (queue full, normal)", st)
		}

		close(g.release)
		for i := 0; i < 3; i++ {
			checkOK(t, fmt.Sprintf("request %d", i), <-chs[i])
		}
		if st := s.Stats(); st.InFlight != 0 || st.Queued != 0 || st.Served[bulwark.PriorityNormal] != 3 {
			t.Fatalf("after release Stats() = %+v, want idle with 3 served", st)
		}
	})
}

// Critical requests keep succeeding on the reserve while GETs and POSTs are
// shed, and a non-critical waiter is never given a reserved worker.
func TestShedderCriticalKeepsSucceeding(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGate()
		// 4 workers, 25 % reserved: one worker only critical requests use.
		s := mustShedder(t, g, ShedConfig{Workers: 4, Queue: -1, ReservedCritical: 0.25})
		var busy []<-chan *httptest.ResponseRecorder
		for i := range 3 {
			busy = append(busy, start(s, newReq("GET", fmt.Sprintf("/busy%d", i), "")))
		}
		synctest.Wait()
		for i := range 5 {
			checkShed(t, "GET", serveNow(s, newReq("GET", "/get", "")), ShedQueueFull)
			checkShed(t, "POST", serveNow(s, newReq("POST", "/post", "")), ShedQueueFull)
			checkOK(t, fmt.Sprintf("critical %d", i), serveNow(s, noBlock(newReq("POST", "/charge", "critical"))))
		}
		st := s.Stats()
		if st.Served[bulwark.PriorityCritical] != 5 || st.Shed[ShedQueueFull][bulwark.PriorityNormal] != 5 || st.Shed[ShedQueueFull][bulwark.PriorityHigh] != 5 {
			t.Fatalf("Stats() = %+v, want 5 critical served, 5 GETs and 5 POSTs shed", st)
		}
		close(g.release)
		for _, ch := range busy {
			checkOK(t, "busy", <-ch)
		}
	})

	synctest.Test(t, func(t *testing.T) {
		g := newGate()
		s := mustShedder(t, g, ShedConfig{Workers: 2, Queue: 2, ReservedCritical: 0.5, MaxQueueWait: time.Hour})
		a := start(s, newReq("GET", "/a", ""))
		synctest.Wait()
		b := start(s, newReq("GET", "/b", "")) // the shared worker is taken: queued
		synctest.Wait()
		c := start(s, newReq("GET", "/c", "critical")) // the reserve
		synctest.Wait()
		if got, want := g.called(), []string{"/a", "/c"}; !slices.Equal(got, want) {
			t.Fatalf("handler called for %v, want %v", got, want)
		}
		// Whichever of a and c returns, one worker is busy: the other
		// priorities run only while more than the reserve is free.
		g.release <- struct{}{}
		synctest.Wait()
		if got := g.called(); len(got) != 2 || done(b) != nil {
			t.Fatalf("GET waiter given the critical reserve: calls %v", got)
		}
		g.release <- struct{}{}
		synctest.Wait()
		if got := g.called(); len(got) != 3 || got[2] != "/b" {
			t.Fatalf("handler called for %v, want /b third", got)
		}
		close(g.release)
		for _, ch := range []<-chan *httptest.ResponseRecorder{a, b, c} {
			checkOK(t, "served", <-ch)
		}
	})
}

// A queued request whose propagated deadline (DeadlineHandler upstream)
// passes leaves the queue at once and is never handed to the handler.
func TestShedderDropsWaiterAtDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGate()
		s := mustShedder(t, g, ShedConfig{Workers: 1, Queue: 2, ReservedCritical: -1, MaxQueueWait: time.Hour})
		h := DeadlineHandler(s, DeadlineOptions{})
		first := start(h, newReq("GET", "/first", ""))
		synctest.Wait()
		r := newReq("GET", "/late", "")
		r.Header.Set(bulwark.DefaultDeadlineHeader, "50")
		t0 := time.Now()
		late := start(h, r)
		synctest.Wait()
		if st := s.Stats(); st.Queued != 1 {
			t.Fatalf("Stats().Queued = %d, want 1", st.Queued)
		}
		rec := <-late // every goroutine blocks: the bubble's clock moves on
		if waited := time.Since(t0); waited != 50*time.Millisecond {
			t.Errorf("waiter left after %v, want exactly its 50ms deadline", waited)
		}
		checkShed(t, "late", rec, ShedWaitedTooLong)
		g.release <- struct{}{}
		checkOK(t, "first", <-first)
		if got, want := g.called(), []string{"/first"}; !slices.Equal(got, want) {
			t.Fatalf("handler called for %v, want %v", got, want)
		}
		if st := s.Stats(); st.Queued != 0 || st.Shed[ShedWaitedTooLong][bulwark.PriorityNormal] != 1 {
			t.Fatalf("Stats() = %+v, want empty queue, 1 shed for waiting too long", st)
		}
	})
}

// Without a deadline, MaxQueueWait bounds the wait.
func TestShedderMaxQueueWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGate()
		s := mustShedder(t, g, ShedConfig{Workers: 1, Queue: 1, ReservedCritical: -1}) // DefaultMaxQueueWait
		first := start(s, newReq("GET", "/first", ""))
		synctest.Wait()
		t0 := time.Now()
		rec := <-start(s, newReq("GET", "/queued", ""))
		if waited := time.Since(t0); waited != DefaultMaxQueueWait {
			t.Errorf("waiter left after %v, want DefaultMaxQueueWait (%v)", waited, DefaultMaxQueueWait)
		}
		checkShed(t, "queued", rec, ShedWaitedTooLong)
		close(g.release)
		checkOK(t, "first", <-first)
		if got := g.called(); len(got) != 1 {
			t.Fatalf("handler called for %v, want only /first", got)
		}
	})
}

// A MaxQueueWait as long as a Duration goes is no overflow: the waiter
// waits for a worker (or its deadline), and is then served.
func TestShedderHugeMaxQueueWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGate()
		s := mustShedder(t, g, ShedConfig{Workers: 1, Queue: 1, ReservedCritical: -1, MaxQueueWait: math.MaxInt64})
		first := start(s, newReq("GET", "/first", ""))
		synctest.Wait()
		queued := start(s, newReq("GET", "/queued", ""))
		time.Sleep(1000 * time.Hour) // synctest's clock: no real wait
		synctest.Wait()
		if rec := done(queued); rec != nil {
			t.Fatalf("queued request answered %d after 1000h, want it still waiting", rec.Code)
		}
		close(g.release)
		checkOK(t, "first", <-first)
		checkOK(t, "queued", <-queued)

		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		g2 := newGate()
		s = mustShedder(t, g2, ShedConfig{Workers: 1, Queue: 1, ReservedCritical: -1, MaxQueueWait: math.MaxInt64})
		first = start(s, newReq("GET", "/first", ""))
		synctest.Wait()
		t0 := time.Now()
		checkShed(t, "deadline", <-start(s, newReq("GET", "/late", "").WithContext(ctx)), ShedWaitedTooLong)
		if waited := time.Since(t0); waited != time.Minute {
			t.Errorf("waiter with a 1m deadline left after %v", waited)
		}
		close(g2.release)
		checkOK(t, "first", <-first)
	})
}

// The queue-time check at hand-over reads the injected clock: a waiter
// whose patience passed while no timer has fired yet is dropped, and the
// freed worker goes to the next waiter instead.
func TestShedderNeverServesExpiredWaiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGate()
		s := mustShedder(t, g, ShedConfig{Workers: 1, Queue: 3, ReservedCritical: -1, MaxQueueWait: time.Hour})
		var clock atomic.Int64 // offset added to the bubble's time
		s.now = func() time.Time { return time.Now().Add(time.Duration(clock.Load())) }

		first := start(s, newReq("GET", "/first", ""))
		synctest.Wait()
		stale := start(s, newReq("GET", "/stale", "")) // patience: now + 1h
		synctest.Wait()
		clock.Store(int64(2 * time.Hour))
		fresh := start(s, newReq("GET", "/fresh", "")) // patience: now + 2h + 1h
		synctest.Wait()
		// By the injected clock this deadline has passed: refused on arrival.
		ctx, cancel := context.WithTimeout(t.Context(), time.Hour)
		defer cancel()
		checkShed(t, "past deadline", serveNow(s, newReq("GET", "/past", "").WithContext(ctx)), ShedWaitedTooLong)

		g.release <- struct{}{} // first returns; stale is dropped, fresh served
		synctest.Wait()
		checkOK(t, "first", done(first))
		checkShed(t, "stale", done(stale), ShedWaitedTooLong)
		g.release <- struct{}{}
		checkOK(t, "fresh", <-fresh)
		if got, want := g.called(), []string{"/first", "/fresh"}; !slices.Equal(got, want) {
			t.Fatalf("handler called for %v, want %v", got, want)
		}
	})
}

// Freed workers go to the most important waiter, FIFO within a priority.
func TestShedderQueueOrderByTier(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGate()
		s := mustShedder(t, g, ShedConfig{Workers: 1, Queue: 6, ReservedCritical: -1, MaxQueueWait: time.Hour})
		arrivals := []*http.Request{
			newReq("GET", "/busy", ""),
			newReq("GET", "/test", "test"),
			newReq("GET", "/get1", ""),
			newReq("GET", "/low", "LOW"),
			newReq("POST", "/post", ""),
			newReq("GET", "/get2", ""),
			newReq("POST", "/crit", "critical"),
		}
		var chs []<-chan *httptest.ResponseRecorder
		for _, r := range arrivals {
			chs = append(chs, start(s, r))
			synctest.Wait() // fixes the arrival order
		}
		if st := s.Stats(); st.Queued != 6 {
			t.Fatalf("Stats().Queued = %d, want 6", st.Queued)
		}
		for range arrivals {
			g.release <- struct{}{}
			synctest.Wait()
		}
		want := []string{"/busy", "/crit", "/post", "/get1", "/get2", "/low", "/test"}
		if got := g.called(); !slices.Equal(got, want) {
			t.Fatalf("handler order %v, want %v", got, want)
		}
		for i, ch := range chs {
			checkOK(t, arrivals[i].URL.Path, <-ch)
		}
	})
}

// A full queue gives a more important arrival the place of its least
// important, newest waiter; an arrival with nothing less important behind
// it is refused.
func TestShedderDisplacesLowerTier(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGate()
		s := mustShedder(t, g, ShedConfig{Workers: 1, Queue: 2, ReservedCritical: -1, MaxQueueWait: time.Hour})
		busy := start(s, newReq("GET", "/busy", ""))
		synctest.Wait()
		get1 := start(s, newReq("GET", "/get1", ""))
		synctest.Wait()
		get2 := start(s, newReq("GET", "/get2", ""))
		synctest.Wait()
		post := start(s, newReq("POST", "/post", ""))
		synctest.Wait()
		checkShed(t, "get2", done(get2), ShedDisplaced)
		checkShed(t, "test", serveNow(s, newReq("GET", "/t", "test")), ShedQueueFull)
		checkShed(t, "get3", serveNow(s, newReq("GET", "/get3", "")), ShedQueueFull)
		st := s.Stats()
		if st.Shed[ShedDisplaced][bulwark.PriorityNormal] != 1 || st.Shed[ShedQueueFull][bulwark.PriorityTest] != 1 || st.Shed[ShedQueueFull][bulwark.PriorityNormal] != 1 {
			t.Fatalf("Stats() = %+v", st)
		}
		close(g.release)
		for _, ch := range []<-chan *httptest.ResponseRecorder{busy, post, get1} {
			checkOK(t, "served", <-ch)
		}
		if got, want := g.called(), []string{"/busy", "/post", "/get1"}; !slices.Equal(got, want) {
			t.Fatalf("handler order %v, want %v", got, want)
		}
	})
}

// A waiter whose caller goes away leaves the queue at once, and its place
// is free for the next.
func TestShedderCanceledWaiterLeaves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGate()
		s := mustShedder(t, g, ShedConfig{Workers: 1, Queue: 1, ReservedCritical: -1, MaxQueueWait: time.Hour})
		busy := start(s, newReq("GET", "/busy", ""))
		synctest.Wait()
		ctx, cancel := context.WithCancel(t.Context())
		gone := start(s, newReq("GET", "/gone", "").WithContext(ctx))
		synctest.Wait()
		cancel()
		synctest.Wait()
		checkShed(t, "gone", done(gone), ShedCanceled)
		if st := s.Stats(); st.Queued != 0 || st.Shed[ShedCanceled][bulwark.PriorityNormal] != 1 {
			t.Fatalf("Stats() = %+v, want empty queue, 1 canceled", st)
		}
		next := start(s, newReq("GET", "/next", ""))
		synctest.Wait()
		if done(next) != nil {
			t.Fatal("/next refused; want it queued in the place /gone left")
		}
		// An arrival whose context has already ended is refused, not queued.
		checkShed(t, "dead", serveNow(s, newReq("GET", "/dead", "").WithContext(ctx)), ShedCanceled)
		close(g.release)
		checkOK(t, "busy", <-busy)
		checkOK(t, "next", <-next)
		if got, want := g.called(), []string{"/busy", "/next"}; !slices.Equal(got, want) {
			t.Fatalf("handler order %v, want %v", got, want)
		}
	})
}

// A worker handed over just as the waiter's caller goes away is given back,
// and the handler never sees the request: whichever of the two the waiter
// notices first, the outcome is the same.
func TestShedderGrantRacesCancel(t *testing.T) {
	for i := range 50 {
		synctest.Test(t, func(t *testing.T) {
			g := newGate()
			s := mustShedder(t, g, ShedConfig{Workers: 1, Queue: 1, ReservedCritical: -1, MaxQueueWait: time.Hour})
			busy := start(s, newReq("GET", "/busy", ""))
			synctest.Wait()
			ctx, cancel := context.WithCancel(t.Context())
			gone := start(s, newReq("GET", "/gone", "").WithContext(ctx))
			synctest.Wait()
			cancel()
			g.release <- struct{}{}
			checkShed(t, fmt.Sprintf("run %d: gone", i), <-gone, ShedCanceled)
			checkOK(t, "busy", <-busy)
			if got := g.called(); len(got) != 1 {
				t.Fatalf("run %d: handler called for %v, want only /busy", i, got)
			}
			if st := s.Stats(); st.InFlight != 0 || st.Queued != 0 {
				t.Fatalf("run %d: Stats() = %+v, want idle", i, st)
			}
		})
	}
}

// A panicking handler still gives its worker back.
func TestShedderPanicReleasesWorker(t *testing.T) {
	s := mustShedder(t, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		panic(http.ErrAbortHandler)
	}), ShedConfig{Workers: 1, Queue: -1})
	func() {
		defer func() { recover() }()
		s.ServeHTTP(httptest.NewRecorder(), newReq("GET", "/", ""))
	}()
	if st := s.Stats(); st.InFlight != 0 || st.Served[bulwark.PriorityNormal] != 1 {
		t.Fatalf("Stats() = %+v, want 0 in flight after the panic", st)
	}
}

func TestNewShedderBadConfig(t *testing.T) {
	ok := http.NotFoundHandler()
	for _, tc := range []struct {
		name string
		next http.Handler
		cfg  ShedConfig
		want string
	}{
		{"nil handler", nil, ShedConfig{}, "nil handler"},
		{"negative workers", ok, ShedConfig{Workers: -1}, "ShedConfig.Workers = -1"},
		{"negative wait", ok, ShedConfig{MaxQueueWait: -time.Second}, "ShedConfig.MaxQueueWait = -1s"},
		{"reserve all", ok, ShedConfig{ReservedCritical: 1}, "ShedConfig.ReservedCritical = 1"},
		{"reserve more", ok, ShedConfig{ReservedCritical: 1.5}, "ShedConfig.ReservedCritical = 1.5"},
		{"reserve NaN", ok, ShedConfig{ReservedCritical: math.NaN()}, "ShedConfig.ReservedCritical = NaN"},
		{"negative retry-after", ok, ShedConfig{RetryAfter: -time.Second}, "ShedConfig.RetryAfter = -1s"},
		{"retry-after past a day", ok, ShedConfig{RetryAfter: 24*time.Hour + time.Second}, "ShedConfig.RetryAfter = 24h0m1s: must be at most 24h"},
		{"retry-after near MaxInt64", ok, ShedConfig{RetryAfter: math.MaxInt64 - time.Second/2}, "ShedConfig.RetryAfter = 2562047h47m16.354775807s: must be at most 24h"},
	} {
		s, err := NewShedder(tc.next, tc.cfg)
		if s != nil || err == nil || !errors.Is(err, bulwark.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: NewShedder = %v, %v; want nil and an ErrInvalidConfig containing %q", tc.name, s, err, tc.want)
		}
		var ce *bulwark.ConfigError
		if !errors.As(err, &ce) {
			t.Errorf("%s: %v is not a *ConfigError", tc.name, err)
		}
	}
}

func TestShedderDefaults(t *testing.T) {
	ok := http.NotFoundHandler()
	gmp := runtime.GOMAXPROCS(0)
	for _, tc := range []struct {
		cfg                    ShedConfig
		workers, shared, queue int
		wait                   time.Duration
		retryAfter             string
	}{
		{ShedConfig{}, 2 * gmp, 2*gmp - max(1, min(int(math.Ceil(0.2*float64(gmp))), 2*gmp-1)), max(1, gmp), DefaultMaxQueueWait, "1"},
		{ShedConfig{Workers: 10}, 10, 9, 5, DefaultMaxQueueWait, "1"},
		{ShedConfig{Workers: 1}, 1, 1, 1, DefaultMaxQueueWait, "1"}, // the reserve never takes the last worker
		{ShedConfig{Workers: 20, ReservedCritical: -1, Queue: -1}, 20, 20, 0, DefaultMaxQueueWait, "1"},
		{ShedConfig{Workers: 20, ReservedCritical: 0.26, Queue: 3, MaxQueueWait: time.Second, RetryAfter: 1500 * time.Millisecond}, 20, 14, 3, time.Second, "2"},
		{ShedConfig{Workers: 2, MaxQueueWait: math.MaxInt64, RetryAfter: 24 * time.Hour}, 2, 1, 1, math.MaxInt64, "86400"},
	} {
		s := mustShedder(t, ok, tc.cfg)
		if s.workers != tc.workers || s.shared != tc.shared || s.queueCap != tc.queue || s.maxWait != tc.wait || s.retryAfter[0] != tc.retryAfter {
			t.Errorf("NewShedder(%+v): workers %d shared %d queue %d wait %v retry-after %s; want %d %d %d %v %s",
				tc.cfg, s.workers, s.shared, s.queueCap, s.maxWait, s.retryAfter[0],
				tc.workers, tc.shared, tc.queue, tc.wait, tc.retryAfter)
		}
	}
}

func TestDefaultPriority(t *testing.T) {
	for _, tc := range []struct {
		method, header string
		want           bulwark.Priority
	}{
		{"GET", "", bulwark.PriorityNormal},
		{"HEAD", "", bulwark.PriorityNormal},
		{"OPTIONS", "", bulwark.PriorityNormal},
		{"POST", "", bulwark.PriorityHigh},
		{"PUT", "", bulwark.PriorityHigh},
		{"DELETE", "", bulwark.PriorityHigh},
		{"PATCH", "", bulwark.PriorityHigh},
		{"GET", "critical", bulwark.PriorityCritical},
		{"POST", "Critical", bulwark.PriorityCritical},
		{"POST", "test", bulwark.PriorityTest},
		{"GET", "low", bulwark.PriorityLow},
		{"GET", "HIGH", bulwark.PriorityHigh},
		{"POST", "normal", bulwark.PriorityNormal},
		{"GET", "urgent!!", bulwark.PriorityNormal}, // unknown: the method decides
	} {
		if got := DefaultPriority(newReq(tc.method, "/", tc.header)); got != tc.want {
			t.Errorf("DefaultPriority(%s, %s: %q) = %v, want %v", tc.method, bulwark.PriorityHeader, tc.header, got, tc.want)
		}
	}
	// After the header, the priority the client's WithPriority put in the
	// context: the reading the client's pushback shares.
	r := newReq("GET", "/", "")
	r = r.WithContext(bulwark.WithPriority(r.Context(), bulwark.PriorityLow))
	if got := DefaultPriority(r); got != bulwark.PriorityLow {
		t.Errorf("DefaultPriority(GET with WithPriority(low)) = %v, want low", got)
	}
	// A classifier's out-of-range answer counts as the least important.
	g := newGate()
	s := mustShedder(t, g, ShedConfig{Classify: func(*http.Request) bulwark.Priority { return 200 }})
	s.ServeHTTP(httptest.NewRecorder(), noBlock(newReq("GET", "/", "")))
	if st := s.Stats(); st.Served[bulwark.PriorityTest] != 1 {
		t.Fatalf("Stats().Served = %v, want the out-of-range priority counted as test", st.Served)
	}
	if got := bulwark.Priority(200).String(); got != "Priority(200)" {
		t.Errorf("Priority(200).String() = %q", got)
	}
}

// At twice capacity over loopback, with the handler held until every
// excess request has been answered: exactly the excess is refused, with
// 503 and the marker, and everything admitted or queued then succeeds.
func TestShedderLoopbackTwiceCapacity(t *testing.T) {
	const workers, queue = 4, 2
	g := newGate()
	s := mustShedder(t, g, ShedConfig{Workers: workers, Queue: queue, ReservedCritical: -1, MaxQueueWait: time.Hour})
	srv := httptest.NewServer(s)
	defer srv.Close()
	client := &http.Client{Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()

	type result struct {
		code             int
		retryAfter, mark string
		err              error
	}
	const offered = 2 * (workers + queue)
	results := make(chan result, offered)
	for i := range offered {
		go func() {
			resp, err := client.Get(fmt.Sprintf("%s/%d", srv.URL, i))
			if err != nil {
				results <- result{err: err}
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			results <- result{resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get(bulwark.NoRetryHeader), nil}
		}()
	}
	var once sync.Once
	release := func() { once.Do(func() { close(g.release) }) }
	defer release()
	deadline := time.After(30 * time.Second)
	recv := func() result {
		select {
		case r := <-results:
			return r
		case <-deadline:
			release()
			t.Fatal("loopback load test did not finish in 30s")
			return result{}
		}
	}
	// The handler holds every admitted request, so the first answers are
	// all refusals, and there are exactly offered-(workers+queue) of them.
	for i := 0; i < offered-(workers+queue); i++ {
		r := recv()
		if r.err != nil || r.code != http.StatusServiceUnavailable || r.retryAfter != "1" || r.mark != "1" {
			t.Fatalf("answer %d while the handler is held: %+v, want a 503 with Retry-After and %s", i, r, bulwark.NoRetryHeader)
		}
	}
	release()
	for i := 0; i < workers+queue; i++ {
		if r := recv(); r.err != nil || r.code != http.StatusOK {
			t.Fatalf("served request: %+v, want 200", r)
		}
	}
	st := s.Stats()
	if st.Served[bulwark.PriorityNormal] != workers+queue || st.ShedTotal() != offered-(workers+queue) {
		t.Fatalf("Stats() = %+v", st)
	}
}

// Every refusal names the priority it refused, the classifier's answer
// clamped as the Shedder counted it.
func TestShedderNamesRefusedPriority(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGate()
		var next atomic.Int32 // the priority the classifier answers
		s := mustShedder(t, g, ShedConfig{Workers: 1, Queue: -1,
			Classify: func(*http.Request) bulwark.Priority { return bulwark.Priority(next.Load()) }})
		first := start(s, newReq("GET", "/first", ""))
		synctest.Wait()
		for _, tc := range []struct {
			p    bulwark.Priority
			want string
		}{
			{bulwark.PriorityCritical, "critical"}, {bulwark.PriorityHigh, "high"}, {bulwark.PriorityNormal, "normal"},
			{bulwark.PriorityLow, "low"}, {bulwark.PriorityTest, "test"}, {200, "test"},
		} {
			next.Store(int32(tc.p))
			rec := serveNow(s, newReq("GET", "/", ""))
			checkShed(t, tc.p.String(), rec, ShedQueueFull)
			if got := rec.Result().Header.Get(bulwark.ShedPriorityHeader); got != tc.want {
				t.Errorf("refusal of %v: %s = %q, want %q", tc.p, bulwark.ShedPriorityHeader, got, tc.want)
			}
		}
		close(g.release)
		checkOK(t, "first", <-first)
	})
}

// A Shedder at three times its capacity, called over loopback by a bulwark
// client with package defaults: the flood of low-priority requests is shed,
// and the client's pushback must not turn that refusal into a local one for
// the critical requests the Shedder keeps its reserve for. A plain 503 with
// Retry-After from another server still pauses that host for everyone.
func TestShedderCriticalThroughBulwarkClient(t *testing.T) {
	const workers, queue = 4, 2 // one worker reserved for critical
	blocked := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(blocked) }) }
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/low") {
			select {
			case <-blocked:
			case <-r.Context().Done():
			}
		}
		io.WriteString(w, "ok")
	})
	// A Retry-After far longer than the test, so that the pause it starts
	// surely lasts while the critical requests go, however slow the machine.
	s := mustShedder(t, h, ShedConfig{Workers: workers, Queue: queue, MaxQueueWait: time.Hour, RetryAfter: 30 * time.Second})
	// A critical request's worker is given back after its response is
	// written, so the client may see the answer first: the test waits for
	// done before the next, lest a lingering worker send the next critical
	// request to the queue (where it would displace a low waiter).
	done := make(chan struct{}, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.ServeHTTP(w, r)
		if strings.HasPrefix(r.URL.Path, "/critical") {
			done <- struct{}{}
		}
	}))
	defer srv.Close()
	var plainSent atomic.Int32
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		plainSent.Add(1)
		w.Header().Set("Retry-After", "30")
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer plain.Close()
	defer release() // before the servers close: they wait for the held requests
	client, err := bulwark.NewClient(bulwark.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer client.CloseIdleConnections()

	type result struct {
		code int
		err  error
		tier string
	}
	// do sends a GET of priority prio: in PriorityHeader, or with
	// WithPriority when viaContext is set.
	do := func(url string, prio bulwark.Priority, viaContext bool) result {
		ctx := t.Context()
		if viaContext {
			ctx = bulwark.WithPriority(ctx, prio)
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if !viaContext {
			req.Header.Set(bulwark.PriorityHeader, prio.String())
		}
		resp, err := client.Do(req)
		if err != nil {
			return result{err: err}
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return result{code: resp.StatusCode, tier: resp.Header.Get(bulwark.ShedPriorityHeader)}
	}
	const offered = 3 * (workers + queue)
	const held = workers - 1 + queue // the low requests in the handler or queued
	results := make(chan result, offered)
	for i := range offered {
		go func() { results <- do(fmt.Sprintf("%s/low/%d", srv.URL, i), bulwark.PriorityLow, i%2 == 0) }()
	}
	deadline := time.After(60 * time.Second)
	recv := func() result {
		t.Helper()
		select {
		case r := <-results:
			return r
		case <-deadline:
			release()
			t.Fatal("no answer in 60s")
			return result{}
		}
	}
	// Every low request beyond those held is refused: by the Shedder (503)
	// or, once the client has seen a refusal, by the client's pushback.
	shed := 0
	for range offered - held {
		switch r := recv(); {
		case r.err == nil && r.code == http.StatusServiceUnavailable && r.tier == "low":
			shed++
		case errors.Is(r.err, bulwark.ErrPushback):
		default:
			t.Fatalf("low request past capacity: %+v, want a 503 naming the low tier, or ErrPushback", r)
		}
	}
	if shed == 0 {
		t.Fatal("no low request reached the Shedder's refusal")
	}
	// Critical requests, by header and by WithPriority (which the client
	// must send on for the Shedder to see it), reach the reserve.
	for i := range 6 {
		if r := do(fmt.Sprintf("%s/critical/%d", srv.URL, i), bulwark.PriorityCritical, i%2 == 0); r.err != nil || r.code != http.StatusOK {
			t.Fatalf("critical request %d during the overload: %d, %v; want 200", i, r.code, r.err)
		}
		select {
		case <-done:
		case <-deadline:
			t.Fatal("the Shedder did not finish a critical request in 60s")
		}
	}
	if st := s.Stats(); st.Served[bulwark.PriorityCritical] != 6 {
		t.Errorf("Shedder served %d critical requests, want 6", st.Served[bulwark.PriorityCritical])
	}
	// The low tier is still paused by the client: nothing more is sent.
	if r := do(srv.URL+"/low/again", bulwark.PriorityLow, false); !errors.Is(r.err, bulwark.ErrPushback) {
		t.Errorf("low request after the refusal: %+v, want ErrPushback", r)
	}
	// A plain 503 with Retry-After, without the tier, pauses its host for
	// every priority.
	if r := do(plain.URL+"/", bulwark.PriorityLow, false); r.err != nil || r.code != http.StatusServiceUnavailable {
		t.Fatalf("plain 503: %+v", r)
	}
	if r := do(plain.URL+"/", bulwark.PriorityCritical, true); !errors.Is(r.err, bulwark.ErrPushback) || plainSent.Load() != 1 {
		t.Errorf("critical request after a plain 503: %+v after %d sends, want ErrPushback and nothing sent", r, plainSent.Load())
	}
	release()
	for range held {
		if r := recv(); r.err != nil || r.code != http.StatusOK {
			t.Errorf("held low request: %+v, want 200", r)
		}
	}
}

// nopWriter is a ResponseWriter that keeps nothing, with a header map
// reused across requests, so a benchmark measures the Shedder alone.
type nopWriter struct{ h http.Header }

func (w *nopWriter) Header() http.Header         { return w.h }
func (w *nopWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *nopWriter) WriteHeader(int)             {}

// BenchmarkShedderAdmitted is the admitted path's cost: classify, take a
// worker, call the handler, give the worker back.
func BenchmarkShedderAdmitted(b *testing.B) {
	noop := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	s := mustShedder(b, noop, ShedConfig{Workers: 1 << 16})
	b.Run("serial", func(b *testing.B) {
		w, r := &nopWriter{h: http.Header{}}, newReq("GET", "/", "")
		b.ReportAllocs()
		for b.Loop() {
			s.ServeHTTP(w, r)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			w, r := &nopWriter{h: http.Header{}}, newReq("GET", "/", "")
			for pb.Next() {
				s.ServeHTTP(w, r)
			}
		})
	})
}

// BenchmarkShedderRejected is the refusal's cost while the only worker is
// held and there is no queue: classify, find no room, write the 503.
func BenchmarkShedderRejected(b *testing.B) {
	g := newGate()
	s := mustShedder(b, g, ShedConfig{Workers: 1, Queue: -1})
	held := start(s, newReq("GET", "/held", ""))
	for s.Stats().InFlight == 0 {
		runtime.Gosched()
	}
	w, r := &nopWriter{h: http.Header{}}, newReq("GET", "/", "")
	b.ReportAllocs()
	for b.Loop() {
		s.ServeHTTP(w, r)
	}
	b.StopTimer()
	close(g.release)
	<-held
}

// BenchmarkShedderLoopback offers open-loop load at twice capacity over
// loopback to a handler that takes 5 ms on each of 4 workers (capacity
// measured unloaded, nominally 800 req/s), and reports latency percentiles of the
// served and the refused requests against an unloaded run of the same
// handler. One op is one request, so run it with e.g. -benchtime 4000x.
func BenchmarkShedderLoopback(b *testing.B) {
	const workers, work = 4, 5 * time.Millisecond
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(work)
		io.WriteString(w, "ok")
	})
	s := mustShedder(b, handler, ShedConfig{Workers: workers, ReservedCritical: -1})
	srv := httptest.NewServer(s)
	defer srv.Close()
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}

	var (
		mu                        sync.Mutex
		unloaded, served, refused []time.Duration
	)
	get := func(unload bool) {
		t0 := time.Now()
		resp, err := client.Get(srv.URL)
		if err != nil {
			b.Error(err)
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		d := time.Since(t0)
		mu.Lock()
		switch {
		case unload:
			unloaded = append(unloaded, d)
		case resp.StatusCode == http.StatusOK:
			served = append(served, d)
		default:
			refused = append(refused, d)
		}
		mu.Unlock()
	}
	for range 100 {
		get(true)
	}

	// Capacity from the measured unloaded latency, not the nominal 5 ms:
	// sleeps overshoot on a loaded machine.
	p50 := slices.Clone(unloaded)
	slices.Sort(p50)
	capacity := float64(workers) / p50[len(p50)/2].Seconds()
	interval := time.Duration(float64(time.Second) / (2 * capacity))

	b.ResetTimer()
	t0 := time.Now()
	var wg sync.WaitGroup
	for i := range b.N {
		// Open loop: request i leaves at t0 + i·interval, or at once if
		// the sender is late, so the average rate holds whatever the
		// server does.
		if d := time.Until(t0.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d)
		}
		wg.Go(func() { get(false) })
	}
	offered := float64(b.N) / time.Since(t0).Seconds()
	wg.Wait()
	b.StopTimer()

	pct := func(ds []time.Duration, q float64) float64 {
		if len(ds) == 0 {
			return 0
		}
		slices.Sort(ds)
		return float64(ds[min(len(ds)-1, int(q*float64(len(ds))))]) / float64(time.Millisecond)
	}
	b.ReportMetric(capacity, "capacity-rps")
	b.ReportMetric(offered, "offered-rps")
	b.ReportMetric(pct(unloaded, 0.99), "unloaded-p99-ms")
	b.ReportMetric(pct(served, 0.50), "served-p50-ms")
	b.ReportMetric(pct(served, 0.99), "served-p99-ms")
	b.ReportMetric(pct(refused, 0.50), "shed-p50-ms")
	b.ReportMetric(pct(refused, 0.99), "shed-p99-ms")
	b.ReportMetric(100*float64(len(refused))/float64(max(1, len(served)+len(refused))), "shed-%")
}

// TestShadowShedderMatchesEnforcingTwin: a Shedder in shadow mode counts
// in Shed what its enforcing twin refuses, and serves every request.
func TestShadowShedderMatchesEnforcingTwin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			d, _ := time.ParseDuration(r.URL.Query().Get("d"))
			time.Sleep(d)
		})
		cfg := ShedConfig{Workers: 3, Queue: 2, MaxQueueWait: 15 * time.Millisecond, ReservedCritical: -1}
		enforcing, err := NewShedder(h, cfg)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Shadow = true
		shadow, err := NewShedder(h, cfg)
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		refused, shadowRefused := 0, 0
		var wg sync.WaitGroup
		serve := func(s *Shedder, url string, count *int) {
			rec := httptest.NewRecorder()
			s.ServeHTTP(rec, httptest.NewRequest("GET", url, nil))
			if rec.Code == http.StatusServiceUnavailable {
				mu.Lock()
				*count++
				mu.Unlock()
			}
		}
		for i := range 120 {
			n := 1 + (i*7)%5
			url := "/?d=" + (time.Duration(10*(1+(i*3)%4)) * time.Millisecond).String()
			for range n {
				wg.Go(func() { serve(enforcing, url, &refused) })
				wg.Go(func() { serve(shadow, url, &shadowRefused) })
			}
			synctest.Wait()
			time.Sleep(10 * time.Millisecond)
			synctest.Wait()
		}
		wg.Wait()
		if refused == 0 {
			t.Fatal("the enforcing Shedder refused nothing: the test proves nothing")
		}
		if got := shadow.Stats().ShedTotal(); shadowRefused != 0 || got != uint64(refused) {
			t.Errorf("shadow Shedder: refused %d, would have refused %d; the enforcing twin refused %d", shadowRefused, got, refused)
		}
	})
}
