package redisfleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/redis/go-redis/v9"
)

// The sick pod: a fleet of pods built as the README's fleet example (zero
// Policy, a Fleet over Redis), one upstream on 127.0.0.1, each pod
// calling it about 20 times a second. In fleetSick a few pods' own network
// is broken (every dial they make is refused), and the healthy pods must
// go on being answered; in fleetDown the upstream itself refuses every
// pod, then comes back, and the fleet must stop soon and resume soon.

// fleetRun is what one run of a fleet measured.
type fleetRun struct {
	// answered and longest are, over the healthy pods, the share of calls
	// answered and the longest stretch between a call that failed and the
	// next one answered (or the run's end).
	answered float64
	longest  time.Duration
	// sent is the attempts the pods sent to the upstream (dials included)
	// until every pod refused, and resumed how long after the upstream
	// came back every pod was answered again.
	sent    int64
	resumed time.Duration
}

func (r fleetRun) String() string {
	if r.sent > 0 {
		return fmt.Sprintf("%d attempts sent before every pod refused; every pod answered again %v after the recovery",
			r.sent, r.resumed.Round(time.Millisecond))
	}
	return fmt.Sprintf("healthy pods answered %.1f %%, longest refusal stretch %v", 100*r.answered, r.longest.Round(time.Millisecond))
}

// callEvery is the pause between one pod's calls: about 20 a second.
const callEvery = 50 * time.Millisecond

// podCalls is one pod's calls: when each was made and whether it was
// answered.
type podCalls struct {
	mu  sync.Mutex
	at  []time.Time
	ok  []bool
	err error // the last failure, for the log
}

func (p *podCalls) add(at time.Time, ok bool, err error) {
	p.mu.Lock()
	p.at, p.ok = append(p.at, at), append(p.ok, ok)
	if err != nil {
		p.err = err
	}
	p.mu.Unlock()
}

// stats is the share answered and the longest stretch from a failed call
// to the next answered one (or end).
func (p *podCalls) stats(end time.Time) (answered float64, longest time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	// Calls are recorded when they end: order them by when they began.
	idx := make([]int, len(p.at))
	for i := range idx {
		idx[i] = i
	}
	sortByTime(idx, p.at)
	n, ok := 0, 0
	var from time.Time
	for _, i := range idx {
		n++
		if p.ok[i] {
			ok++
			if !from.IsZero() {
				longest = max(longest, p.at[i].Sub(from))
				from = time.Time{}
			}
		} else if from.IsZero() {
			from = p.at[i]
		}
	}
	if !from.IsZero() {
		longest = max(longest, end.Sub(from))
	}
	if n == 0 {
		return 0, longest
	}
	return float64(ok) / float64(n), longest
}

func sortByTime(idx []int, at []time.Time) {
	for i := 1; i < len(idx); i++ {
		for j := i; j > 0 && at[idx[j]].Before(at[idx[j-1]]); j-- {
			idx[j], idx[j-1] = idx[j-1], idx[j]
		}
	}
}

// countingBase counts the attempts a pod sends (a refused dial is one).
type countingBase struct {
	rt   http.RoundTripper
	sent *atomic.Int64
}

func (b countingBase) RoundTrip(req *http.Request) (*http.Response, error) {
	b.sent.Add(1)
	return b.rt.RoundTrip(req)
}

// closedAddr is a 127.0.0.1 address nothing listens on: a dial to it is
// refused.
func closedAddr(t testing.TB) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := l.Addr().String()
	l.Close()
	return a
}

// fleetPods builds n pods over the Redis clients newClient makes (one
// each), with prefix; the first sick of them dial a closed port whatever
// the request's host. Every pod's attempts count in sent.
func fleetPods(t *testing.T, newClient func() redis.UniversalClient, prefix string, n, sick int, sent *atomic.Int64) []*bulwark.Transport {
	t.Helper()
	dead := closedAddr(t)
	pods := make([]*bulwark.Transport, n)
	for i := range pods {
		f, err := New(newClient(), Options{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		base := http.DefaultTransport.(*http.Transport).Clone()
		if i < sick {
			var d net.Dialer
			base.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
				return d.DialContext(ctx, network, dead)
			}
		}
		t.Cleanup(base.CloseIdleConnections)
		pods[i] = newTransport(t, bulwark.Config{Fleet: f, Base: countingBase{base, sent}})
	}
	eventually(t, "every pod subscribed", func() bool {
		for _, p := range pods {
			if !connected(p) {
				return false
			}
		}
		return true
	})
	return pods
}

// drive has every pod call url every callEvery, each call in its own
// goroutine, until stop is closed; it returns each pod's calls once all
// have ended.
func drive(pods []*bulwark.Transport, url string, stop <-chan struct{}) func() []*podCalls {
	calls := make([]*podCalls, len(pods))
	var wg sync.WaitGroup
	for i, p := range pods {
		calls[i] = &podCalls{}
		wg.Go(func() {
			tk := time.NewTicker(callEvery)
			defer tk.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tk.C:
				}
				wg.Go(func() {
					at := time.Now()
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
					resp, err := p.RoundTrip(req)
					ok := err == nil && resp.StatusCode == 200
					if err == nil {
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						if !ok {
							err = errors.New(resp.Status)
						}
					}
					calls[i].add(at, ok, err)
				})
			}
		})
	}
	return func() []*podCalls {
		wg.Wait()
		return calls
	}
}

// runSick runs n pods of which sick are sick for d against a healthy
// upstream, and measures the healthy ones.
func runSick(t *testing.T, newClient func() redis.UniversalClient, prefix string, n, sick int, d time.Duration) fleetRun {
	t.Helper()
	up := newUpstream(t, 200, nil)
	var sent atomic.Int64
	pods := fleetPods(t, newClient, prefix, n, sick, &sent)
	stop := make(chan struct{})
	wait := drive(pods, up.URL, stop)
	time.Sleep(d)
	close(stop)
	end := time.Now()
	calls := wait()
	var r fleetRun
	var okShare float64
	for i := sick; i < n; i++ {
		a, l := calls[i].stats(end)
		okShare += a
		r.longest = max(r.longest, l)
		if a < 1 {
			t.Logf("healthy pod %d: answered %.1f %%, longest stretch %v, last failure %v", i, 100*a, l.Round(time.Millisecond), calls[i].err)
		}
	}
	r.answered = okShare / float64(n-sick)
	for i := range sick {
		a, _ := calls[i].stats(end)
		t.Logf("sick pod %d: answered %.1f %% (%v)", i, 100*a, calls[i].err)
	}
	return r
}

// runDown runs n healthy pods against an upstream down for all of them
// for down (refusing every connection, or with refused false answering
// 503), then well: it measures the attempts sent until every pod refused
// by itself, and how long after the recovery every pod was answered
// again.
func runDown(t *testing.T, newClient func() redis.UniversalClient, prefix string, n int, down, after time.Duration, refused bool) fleetRun {
	t.Helper()
	var addr string
	var recover func()
	if refused {
		addr = closedAddr(t)
		recover = func() {
			l, err := net.Listen("tcp", addr)
			if err != nil {
				t.Fatalf("listening again on %s: %v", addr, err)
			}
			srv := &http.Server{Handler: http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), ReadHeaderTimeout: time.Second}
			go func() { _ = srv.Serve(l) }()
			t.Cleanup(func() { _ = srv.Close() })
		}
	} else {
		up := newUpstream(t, 503, nil)
		addr, recover = up.host(), func() { up.code.Store(200) }
	}
	var sent atomic.Int64
	pods := fleetPods(t, newClient, prefix, n, 0, &sent)
	stop := make(chan struct{})
	start := time.Now()
	wait := drive(pods, "http://"+addr+"/", stop)
	var r fleetRun
	// Every pod refusing: its breaker is open (a trip of its own or one
	// adopted), so it sends nothing but probes.
	for r.sent == 0 {
		all := true
		for _, p := range pods {
			if h := p.Snapshot().Host(addr); len(h) != 1 || h[0].Breaker.State != bulwark.CircuitOpen {
				all = false
			}
		}
		if all {
			r.sent = sent.Load()
		} else if time.Since(start) > down {
			t.Fatalf("not every pod refusing %v after the upstream went down (%d attempts sent)", down, sent.Load())
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(time.Until(start.Add(down)))
	recover()
	back := time.Now()
	time.Sleep(after)
	close(stop)
	calls := wait()
	for i, c := range calls {
		c.mu.Lock()
		first := time.Time{}
		for j, at := range c.at {
			if c.ok[j] && !at.Before(back) && (first.IsZero() || at.Before(first)) {
				first = at
			}
		}
		c.mu.Unlock()
		if first.IsZero() {
			r.resumed = max(r.resumed, after)
			t.Logf("pod %d: no call answered in the %v after the recovery (%v)", i, after, c.err)
			continue
		}
		r.resumed = max(r.resumed, first.Sub(back))
	}
	return r
}

// singleNode returns a newClient over one redis-server.
func singleNode(t *testing.T) func() redis.UniversalClient {
	s := startRedis(t)
	return func() redis.UniversalClient { return s.client(t) }
}

// TestSickPod: with 1 and with 2 of 8 pods unable to dial anything, the
// healthy pods are answered (≥ 99 % of their calls, no refusal stretch
// over 2 s); with the upstream down for every pod, the fleet stops within
// 1.2 × MinCalls attempts and resumes within 2 s of the recovery.
func TestSickPod(t *testing.T) {
	checkSickFleet(t, singleNode(t), 4*time.Second)
}

// checkSickFleet runs the three scenarios over the Redis newClient reaches.
func checkSickFleet(t *testing.T, newClient func() redis.UniversalClient, d time.Duration) {
	const pods = 8
	for sick := 1; sick <= 2; sick++ {
		r := runSick(t, newClient, fmt.Sprintf("sick%d:", sick), pods, sick, d)
		t.Logf("%d sick of %d, %v: %v", sick, pods, d, r)
		if r.answered < 0.99 || r.longest > 2*time.Second {
			t.Errorf("%d sick of %d: %v; want ≥ 99 %% answered and no stretch over 2 s", sick, pods, r)
		}
	}
	for _, refused := range []bool{true, false} {
		what := "down for all (refusing connections)"
		if !refused {
			what = "down for all (answering 503)"
		}
		r := runDown(t, newClient, fmt.Sprintf("down%v:", refused), pods, d/2, d/2, refused)
		t.Logf("%s: %v", what, r)
		// The attempts in flight when the fleet's sums cross the threshold
		// still go: under the race detector, which slows the pods and
		// their Redis clients alike, they are as many again (144-187 on
		// 503s with the code before the fleet's contracts as with it).
		limit := 1.2
		if raceOn {
			limit = 2.5
		}
		if max := int64(limit * bulwark.DefaultMinCalls); r.sent > max || r.resumed > 2*time.Second {
			t.Errorf("%s: %v; want at most %d attempts and resumed within 2 s", what, r, max)
		}
	}
}
