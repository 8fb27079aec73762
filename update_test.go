package bulwark

import (
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// countedPolicy is a breaker whose window holds every call of the test and
// never trips, with a bulkhead of limit: the breaker's Calls then count
// exactly the requests sent.
func countedPolicy(failureRate float64, limit int) Policy {
	p := only(Policy{}, "breaker", "bulkhead", "timeout")
	p.Breaker = Breaker{WindowCalls: maxWindowCalls, MinCalls: maxWindowCalls, FailureRate: failureRate}
	p.Bulkhead = Bulkhead{MaxConcurrent: limit}
	return p
}

// TestUpdateKeepsAndRebuilds: moving a breaker's thresholds keeps its
// window; changing its window's shape starts a new one; an invalid Config
// changes nothing.
func TestUpdateKeepsAndRebuilds(t *testing.T) {
	cfg := Config{Base: okBase{}, Default: countedPolicy(0.5, 10)}
	tr := mustNew(t, cfg)
	for range 7 {
		if _, err := sendOnce(t, tr, "GET", "http://a.test/"); err != nil {
			t.Fatal(err)
		}
	}
	calls := func() int64 { return tr.Snapshot().Host("a.test:80")[0].Breaker.Calls }

	cfg.Default.Breaker.FailureRate = 0.9
	if err := tr.Update(cfg); err != nil {
		t.Fatal(err)
	}
	if got := calls(); got != 7 {
		t.Errorf("after a threshold change the window holds %d calls, want the 7 before it", got)
	}
	b := layerOf[*breakerLayer](t, tr, "http://a.test/")
	if b.failRate != 0.9 {
		t.Errorf("failure rate after Update = %v, want 0.9", b.failRate)
	}

	bad := cfg
	bad.Default.Breaker.FailureRate = 2
	if err := tr.Update(bad); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Update(FailureRate 2) = %v, want a ConfigError", err)
	}
	if b := layerOf[*breakerLayer](t, tr, "http://a.test/"); b.failRate != 0.9 || tr.def.policy.Breaker.FailureRate != 0.9 {
		t.Errorf("a refused Update changed the policy: failure rate %v", b.failRate)
	}

	cfg.Default.Breaker.WindowCalls = 50
	cfg.Default.Breaker.MinCalls = 50
	if err := tr.Update(cfg); err != nil {
		t.Fatal(err)
	}
	if got := calls(); got != 0 {
		t.Errorf("after a window change the window holds %d calls, want a new, empty one", got)
	}
}

// gateBase holds each attempt until release is closed.
type gateBase struct {
	entered chan struct{}
	release chan struct{}
}

func (g *gateBase) RoundTrip(req *http.Request) (*http.Response, error) {
	g.entered <- struct{}{}
	<-g.release
	return response(req, http.StatusOK), nil
}

// TestUpdateInFlightFinishesOnOldStack: a request in flight during Update
// finishes through the stack it started in: it keeps its old bulkhead's
// slot, and its outcome lands in the breaker window the new stack shares.
func TestUpdateInFlightFinishesOnOldStack(t *testing.T) {
	g := &gateBase{entered: make(chan struct{}, 1), release: make(chan struct{})}
	cfg := Config{Base: g, Default: countedPolicy(0.5, 1)}
	tr := mustNew(t, cfg)
	done := make(chan error, 1)
	go func() {
		_, err := sendOnce(t, tr, "GET", "http://a.test/")
		done <- err
	}()
	<-g.entered
	oldBH := layerOf[*bulkheadLayer](t, tr, "http://a.test/")
	cfg.Default.Breaker.FailureRate = 0.7
	cfg.Default.Bulkhead.MaxConcurrent = 2 // a new bulkhead
	if err := tr.Update(cfg); err != nil {
		t.Fatal(err)
	}
	newBH := layerOf[*bulkheadLayer](t, tr, "http://a.test/")
	if newBH == oldBH || newBH.max != 2 {
		t.Fatalf("bulkhead after Update: same %v, max %d; want a new one of 2", newBH == oldBH, newBH.max)
	}
	if in, _ := oldBH.stats(); in != 1 {
		t.Errorf("the request in flight holds %d slots of its old bulkhead, want 1", in)
	}
	close(g.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if in, _ := oldBH.stats(); in != 0 {
		t.Errorf("the old bulkhead still has %d slots held after its request ended", in)
	}
	if got := tr.Snapshot().Host("a.test:80")[0].Breaker.Calls; got != 1 {
		t.Errorf("the shared breaker window holds %d calls, want the one that finished on the old stack", got)
	}
}

// TestUpdateUnderLoad: 200 goroutines send requests to four hosts while
// Update alternates between policies that keep the breakers (a threshold
// moves) and ones that rebuild the bulkheads, with invalid ones in between.
// At the end every host has one entry, its breaker window counts exactly
// the requests it was sent (none lost, none twice), and no slot is held.
// Run with -race; TestMain's goleak checks nothing was left running.
func TestUpdateUnderLoad(t *testing.T) {
	const (
		senders = 200
		each    = 40
		hosts   = 4
	)
	cfg := Config{Base: okBase{}, Default: countedPolicy(0.5, 1000)}
	tr := mustNew(t, cfg)
	var sent [hosts]atomic.Int64
	var failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range senders {
		wg.Go(func() {
			for i := range each {
				h := (g + i) % hosts
				if _, err := sendOnce(t, tr, "GET", fmt.Sprintf("http://h%d.test/", h)); err != nil {
					failed.Add(1)
					continue
				}
				sent[h].Add(1)
			}
		})
	}
	updates := 0
	updated := make(chan struct{})
	go func() {
		defer close(updated)
		deadline := time.Now().Add(time.Minute)
		for i := 0; time.Now().Before(deadline); i++ {
			select {
			case <-stop:
				return
			default:
			}
			c := cfg
			c.Default = countedPolicy(0.5+float64(i%4)/10, 1000+i%2)
			if i%5 == 4 {
				c.Default.Breaker.FailureRate = -1
				if err := tr.Update(c); err == nil {
					t.Error("Update took FailureRate -1")
				}
				continue
			}
			if err := tr.Update(c); err != nil {
				t.Errorf("Update: %v", err)
				return
			}
			updates++
		}
	}()
	wg.Wait()
	close(stop)
	<-updated
	if failed.Load() != 0 {
		t.Errorf("%d requests failed during Updates", failed.Load())
	}
	if updates < 2 {
		t.Errorf("only %d Updates ran during the load", updates)
	}
	s := tr.Snapshot()
	if len(s.Hosts) != hosts {
		t.Fatalf("%d host entries after the Updates, want %d", len(s.Hosts), hosts)
	}
	for _, h := range s.Hosts {
		var i int
		fmt.Sscanf(h.Host, "h%d.test:80", &i)
		if h.Breaker.Calls != sent[i].Load() {
			t.Errorf("%s: the breaker window holds %d calls, %d were sent", h.Host, h.Breaker.Calls, sent[i].Load())
		}
		if h.Bulkhead.InFlight != 0 || h.Bulkhead.Queued != 0 {
			t.Errorf("%s: bulkhead %+v after every request ended", h.Host, *h.Bulkhead)
		}
	}
	t.Logf("%d requests, %d Updates", senders*each, updates)
}

// TestUpdateDoesNotBlockRequests: while Update builds the new stacks,
// requests to every host go on through the old ones; they only ever wait
// for the swap, under the lock a new host's first request takes too.
func TestUpdateDoesNotBlockRequests(t *testing.T) {
	cfg := Config{Base: okBase{}, Default: countedPolicy(0.5, 10)}
	tr := mustNew(t, cfg)
	for h := range 4 {
		sendOnce(t, tr, "GET", fmt.Sprintf("http://h%d.test/", h))
	}
	building, release := make(chan struct{}), make(chan struct{})
	tr.updateBuilt = func() {
		close(building)
		<-release
	}
	cfg.Default.Breaker.FailureRate = 0.8
	done := make(chan error)
	go func() { done <- tr.Update(cfg) }()
	<-building
	for i := range 100 {
		if _, err := sendOnce(t, tr, "GET", fmt.Sprintf("http://h%d.test/", i%4)); err != nil {
			t.Fatal(err)
		}
	}
	// A new host meanwhile gets the new policy at once.
	sendOnce(t, tr, "GET", "http://new.test/")
	if b := layerOf[*breakerLayer](t, tr, "http://new.test/"); b.failRate != 0.8 {
		t.Errorf("a host added during Update has failure rate %v, want the new 0.8", b.failRate)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for h := range 4 {
		if b := layerOf[*breakerLayer](t, tr, fmt.Sprintf("http://h%d.test/", h)); b.failRate != 0.8 {
			t.Errorf("h%d: failure rate %v after Update, want 0.8", h, b.failRate)
		}
	}
}

// TestUpdateBalancer: a balanced upstream keeps its instances and their
// ejections across an Update that leaves Endpoints, Bulkhead and Timeout
// alone, and starts afresh when one of them changes.
func TestUpdateBalancer(t *testing.T) {
	// Instance 10.0.0.2:80 fails every call, so outlier detection ejects it.
	base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		if req.URL.Host == "10.0.0.2:80" {
			return response(req, http.StatusInternalServerError), nil
		}
		return response(req, http.StatusOK), nil
	})
	pool := Policy{Endpoints: Endpoints{Addrs: []string{"10.0.0.1:80", "10.0.0.2:80"}}}
	cfg := Config{Base: base, Default: only(Policy{}, "bulkhead"), Upstreams: map[string]Policy{"pool.test": pool}}
	tr := mustNew(t, cfg)
	for range 40 {
		sendOnce(t, tr, "GET", "http://pool.test/")
	}
	ejected := func() int {
		n := 0
		for _, e := range endpointStates(tr, "pool.test:80") {
			if e.Ejected {
				n++
			}
		}
		return n
	}
	if ejected() != 1 {
		t.Fatalf("setup: %d instances ejected, want 1", ejected())
	}
	pool.Retry.MaxAttempts = 2 // the balancer's shape is unchanged
	cfg.Upstreams = map[string]Policy{"pool.test": pool}
	if err := tr.Update(cfg); err != nil {
		t.Fatal(err)
	}
	if ejected() != 1 {
		t.Errorf("after an Update of Retry: %d instances ejected, want the 1 kept", ejected())
	}
	pool.Bulkhead.MaxConcurrent = 7
	cfg.Upstreams = map[string]Policy{"pool.test": pool}
	if err := tr.Update(cfg); err != nil {
		t.Fatal(err)
	}
	if ejected() != 0 {
		t.Errorf("after an Update of Bulkhead: %d instances ejected, want a new balancer with none", ejected())
	}
}

// TestUpdateKeepsThrottleCounts: an Update that leaves Throttle alone
// keeps its counts; one that changes it starts them afresh.
func TestUpdateKeepsThrottleCounts(t *testing.T) {
	cfg := Config{Base: &statusBase{codes: []int{503}}, Default: only(Policy{Throttle: Throttle{Enabled: true}})}
	tr := mustNew(t, cfg)
	tr.randN = func(n int64) int64 { return n - 1 }
	for range 5 {
		sendOnce(t, tr, http.MethodGet, "http://th.test/")
	}
	reqs := func() int64 { return tr.Snapshot().Host("th.test:80")[0].Throttle.Requests }
	cfg.Default.Breaker.FailureRate = 0.9 // another layer's change
	if err := tr.Update(cfg); err != nil {
		t.Fatal(err)
	}
	if got := reqs(); got != 5 {
		t.Errorf("after an unrelated Update: %d requests counted, want the 5 before it", got)
	}
	cfg.Default.Throttle.K = 3
	if err := tr.Update(cfg); err != nil {
		t.Fatal(err)
	}
	if got := reqs(); got != 0 {
		t.Errorf("after a Throttle change: %d requests counted, want 0", got)
	}
}

// TestUpdateKeepsByShape: each stateful layer keeps its state across an
// Update that leaves its own policy alone, and starts empty after one that
// changes it, on a host's stack and on a route's alike (Update's rule, as
// each layer's keepFrom applies it).
func TestUpdateKeepsByShape(t *testing.T) {
	for _, tt := range []struct {
		name  string
		set   func(*Policy)               // the layer on
		state func(s RouteSnapshot) int64 // what it kept, read from a route's or host's snapshot
		shape func(*Policy)               // a change to the layer's own policy
	}{
		{"retry budget", func(p *Policy) {}, func(s RouteSnapshot) int64 { return s.Budget.Calls },
			func(p *Policy) { p.Retry.Budget.Ratio = 0.3 }},
		{"breaker", func(p *Policy) {}, func(s RouteSnapshot) int64 { return s.Breaker.Calls },
			func(p *Policy) { p.Breaker.WindowCalls = 50; p.Breaker.MinCalls = 50 }},
	} {
		for _, routed := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/routed=%v", tt.name, routed), func(t *testing.T) {
				cfg := Config{Base: okBase{}}
				tt.set(&cfg.Default)
				if routed {
					cfg.Routes = map[string]Policy{"/r/": {}}
				}
				tr := mustNew(t, cfg)
				for range 3 {
					if _, err := sendOnce(t, tr, "GET", "http://a.test/r/x"); err != nil {
						t.Fatal(err)
					}
				}
				state := func() int64 {
					h := tr.Snapshot().Host("a.test:80")[0]
					if routed {
						return tt.state(h.Routes[0])
					}
					return tt.state(RouteSnapshot{Breaker: h.Breaker, Budget: h.Budget})
				}
				cfg.Default.Timeout.Total = 7 * time.Second // another layer's policy
				if err := tr.Update(cfg); err != nil {
					t.Fatal(err)
				}
				if got := state(); got != 3 {
					t.Errorf("after an Update of another layer: %d calls, want the 3 before it", got)
				}
				tt.shape(&cfg.Default)
				if err := tr.Update(cfg); err != nil {
					t.Fatal(err)
				}
				if got := state(); got != 0 {
					t.Errorf("after an Update of its own policy: %d calls, want 0 (a new, empty one)", got)
				}
			})
		}
	}
}

// TestUpdateFaultReachesTheHost: an Update that changes only Policy.Fault
// takes effect on the host's next call, routed or not, as it does for a
// new Transport built with the same Config.
func TestUpdateFaultReachesTheHost(t *testing.T) {
	for _, routed := range []bool{false, true} {
		t.Run(fmt.Sprintf("routed=%v", routed), func(t *testing.T) {
			cfg := Config{Base: okBase{}}
			cfg.Default.Retry.Disabled = true
			cfg.Default.Breaker.Disabled = true
			if routed {
				cfg.Routes = map[string]Policy{"/r/": {}}
			}
			tr := mustNew(t, cfg)
			status := func() int {
				code, err := sendOnce(t, tr, "GET", "http://a.test/r/x")
				if err != nil {
					t.Fatal(err)
				}
				return code
			}
			if got := status(); got != 200 {
				t.Fatalf("before the Update: %d, want 200", got)
			}
			cfg.Default.Fault = Fault{AbortStatus: 503, AbortRate: 1}
			if err := tr.Update(cfg); err != nil {
				t.Fatal(err)
			}
			if got := status(); got != 503 {
				t.Errorf("after an Update that turns a fault on: %d, want the injected 503", got)
			}
			cfg.Default.Fault = Fault{}
			if err := tr.Update(cfg); err != nil {
				t.Fatal(err)
			}
			if got := status(); got != 200 {
				t.Errorf("after an Update that turns it off again: %d, want 200", got)
			}
		})
	}
}

// TestUpdatePushbackSurvivesANewUpstreamKey: a pause the host asked for
// (Retry-After) holds across an Update that moves the host to an upstream
// key of its own, which otherwise starts its state anew.
func TestUpdatePushbackSurvivesANewUpstreamKey(t *testing.T) {
	var sent atomic.Int64
	base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		sent.Add(1)
		h := http.Header{"Retry-After": []string{"5"}}
		return &http.Response{StatusCode: 503, Header: h, Body: http.NoBody, Request: req}, nil
	})
	cfg := Config{Base: base}
	cfg.Default.Retry.Disabled = true
	cfg.Default.Breaker.Disabled = true
	tr := mustNew(t, cfg)
	if _, err := sendOnce(t, tr, "GET", "http://a.test/"); err != nil {
		t.Fatal(err)
	}
	cfg.Upstreams = map[string]Policy{"a.test": {}}
	if err := tr.Update(cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := sendOnce(t, tr, "GET", "http://a.test/"); !errors.Is(err, ErrPushback) {
		t.Errorf("after the Update: err = %v, want ErrPushback (the host's 5 s pause)", err)
	}
	if n := sent.Load(); n != 1 {
		t.Errorf("%d requests reached the host, want 1", n)
	}
}

// TestUpdateLowersMaxHostsToTheCap: an Update that lowers MaxHosts below
// the hosts in use keeps as many as the new cap, the least recently used
// dropped first.
func TestUpdateLowersMaxHostsToTheCap(t *testing.T) {
	cfg := Config{Base: okBase{}}
	tr := mustNew(t, cfg)
	for i := range 6 {
		if _, err := sendOnce(t, tr, "GET", fmt.Sprintf("http://h%d.test/", i)); err != nil {
			t.Fatal(err)
		}
	}
	for _, max := range []int{5, 4, 3, 2} {
		cfg.MaxHosts = max
		if err := tr.Update(cfg); err != nil {
			t.Fatal(err)
		}
		if got := len(tr.Snapshot().Hosts); got != max {
			t.Errorf("MaxHosts %d by Update: %d hosts kept, want %d", max, got, max)
		}
	}
}
