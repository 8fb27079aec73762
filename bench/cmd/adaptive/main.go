// Command adaptive runs issue 18's scenarios on 127.0.0.1 and prints a
// Markdown section (### headings and tables, for bench/cmd/report -adaptive):
//
//   - healthy: a 200 ms upstream at 400 Poisson arrivals a second, through
//     bulwark's default bulkhead and a fixed 100-slot one: calls refused;
//   - drop: an upstream of C "cores" of 20 ms (the rest wait in its own
//     FIFO), C going 40 → 10 → 40, 1,200 calls a second open-loop with a
//     250 ms deadline, through plain, fixed bulkheads of 40 and 10,
//     bulwark's adaptive limit, bulwark with zero config (package
//     defaults: issue 28) and failsafe-go's adaptivelimiter;
//   - throttle: a backend that accepts at most X a second and answers the
//     rest 503 at once, offered 5 X, through plain, bulwark's SRE throttle
//     (K = 2) and failsafe-go's adaptivethrottler.
//
// The phases are the (healthy 10 s a stack; drop 5 s / 10 s / 5 s;
// throttle 8 s); -scale shortens them, -only picks one part.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/failsafe-go/failsafe-go/adaptivelimiter"
	"github.com/failsafe-go/failsafe-go/adaptivethrottler"
	"github.com/failsafe-go/failsafe-go/failsafehttp"
)

var (
	only  = flag.String("only", "", "healthy, drop or throttle; empty: all")
	scale = flag.Float64("scale", 1, "multiplies every phase's duration")
)

func main() {
	flag.Parse()
	if *only == "" || *only == "healthy" {
		healthy()
	}
	if *only == "" || *only == "drop" {
		drop()
	}
	if *only == "" || *only == "throttle" {
		throttle()
	}
}

func dur(d time.Duration) time.Duration { return time.Duration(float64(d) * *scale) }

func transport() *http.Transport {
	return &http.Transport{
		DialContext:         (&net.Dialer{Timeout: time.Second}).DialContext,
		MaxIdleConns:        2000,
		MaxIdleConnsPerHost: 2000,
		IdleConnTimeout:     30 * time.Second,
	}
}

// off is a policy with every layer off; each scenario turns on the one it
// measures.
var off = bulwark.Policy{
	Timeout:  bulwark.Timeout{Disabled: true},
	Breaker:  bulwark.Breaker{Disabled: true},
	Bulkhead: bulwark.Bulkhead{Disabled: true},
	Retry:    bulwark.Retry{Disabled: true, NoPushback: true},
}

func mustBulwark(base http.RoundTripper, p bulwark.Policy) *bulwark.Transport {
	tr, err := bulwark.New(bulwark.Config{Base: base, Default: p})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	return tr
}

func do(rt http.RoundTripper, ctx context.Context, url string) (int, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

func healthy() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(200 * time.Millisecond)
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	d := dur(10 * time.Second)
	fmt.Printf("### Healthy upstream: 200 ms, 400 req/s Poisson, %v per stack\n\n", d)
	fmt.Println("| stack | calls | ErrBulkheadFull | other errors |")
	fmt.Println("|---|---|---|---|")
	for _, st := range []struct {
		name string
		b    bulwark.Bulkhead
	}{{"bulwark default (adaptive 100..1000)", bulwark.Bulkhead{}}, {"bulwark fixed 100 (the old default)", bulwark.Bulkhead{MaxConcurrent: 100}}} {
		base := transport()
		p := off
		p.Bulkhead = st.b
		tr := mustBulwark(base, p)
		rng := rand.New(rand.NewPCG(18, 1))
		var calls, full, other atomic.Int64
		var wg sync.WaitGroup
		next := time.Now()
		for end := time.Now().Add(d); time.Now().Before(end); {
			next = next.Add(time.Duration(rng.ExpFloat64() / 400 * float64(time.Second)))
			time.Sleep(time.Until(next))
			calls.Add(1)
			wg.Go(func() {
				_, err := do(tr, context.Background(), srv.URL)
				switch {
				case errors.Is(err, bulwark.ErrBulkheadFull):
					full.Add(1)
				case err != nil:
					other.Add(1)
				}
			})
		}
		wg.Wait()
		base.CloseIdleConnections()
		fmt.Printf("| %s | %d | %d (%.2f %%) | %d |\n", st.name, calls.Load(), full.Load(), 100*float64(full.Load())/float64(calls.Load()), other.Load())
	}
	fmt.Println()
}

// cores is the capacity-drop upstream: a FIFO of waiting requests served
// by a number of cores that can change.
type cores struct {
	tokens chan struct{}
}

func (c *cores) set(from, to int) {
	for ; from > to; from-- {
		<-c.tokens
	}
	for ; from < to; from++ {
		c.tokens <- struct{}{}
	}
}

type phaseStats struct {
	mu       sync.Mutex
	sent     int
	lat      []time.Duration
	rejected int
	timeouts int
	other    int
	limits   []int
}

func drop() {
	c := &cores{tokens: make(chan struct{}, 100)}
	c.set(0, 40)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The server's own FIFO: it does not notice callers that left.
		<-c.tokens
		time.Sleep(20 * time.Millisecond)
		c.tokens <- struct{}{}
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	phases := []struct {
		d     time.Duration
		cores int
	}{{dur(5 * time.Second), 40}, {dur(10 * time.Second), 10}, {dur(5 * time.Second), 40}}
	fmt.Printf("### Capacity drop: cores 40 → 10 → 40 for %v / %v / %v, 1,200 req/s, 250 ms deadline\n\n", phases[0].d, phases[1].d, phases[2].d)
	fmt.Println("| stack | phase | offered/s | ok/s | p50 | p99 | rejected/s | timeouts/s | limit at 1 s intervals |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	type stack struct {
		name  string
		rt    http.RoundTripper
		limit func() int
	}
	mk := func() []stack {
		var out []stack
		out = append(out, stack{"plain", transport(), nil})
		for _, n := range []int{40, 10} {
			p := off
			p.Bulkhead = bulwark.Bulkhead{MaxConcurrent: n}
			out = append(out, stack{fmt.Sprintf("bulwark fixed %d", n), mustBulwark(transport(), p), nil})
		}
		p := off
		p.Bulkhead = bulwark.Bulkhead{Adaptive: true, MinConcurrent: 1, MaxConcurrent: 100}
		bw := mustBulwark(transport(), p)
		out = append(out, stack{"bulwark adaptive 1..100", bw, func() int {
			for _, h := range bw.Snapshot().Hosts {
				if h.Bulkhead != nil {
					return h.Bulkhead.Limit
				}
			}
			return 0
		}})
		zero := mustBulwark(transport(), bulwark.Policy{}) // bulwark.Config{Base: …} and nothing else
		out = append(out, stack{"bulwark zero config", zero, func() int {
			for _, h := range zero.Snapshot().Hosts {
				if h.Bulkhead != nil {
					return h.Bulkhead.Limit
				}
			}
			return 0
		}})
		al := adaptivelimiter.NewBuilder[*http.Response]().WithLimits(1, 100, 20).Build()
		out = append(out, stack{"failsafe-go adaptivelimiter 1..100", failsafehttp.NewRoundTripper(transport(), al), func() int { return al.Limit() }})
		return out
	}
	var verdicts []string
	for _, st := range mk() {
		stats := make([]*phaseStats, len(phases))
		var wg sync.WaitGroup
		cur := 40
		for pi, ph := range phases {
			c.set(cur, ph.cores)
			cur = ph.cores
			ps := &phaseStats{}
			stats[pi] = ps
			tick := time.NewTicker(time.Second / 1200)
			sample := time.NewTicker(time.Second)
			for end := time.Now().Add(ph.d); time.Now().Before(end); {
				select {
				case <-sample.C:
					if st.limit != nil {
						ps.limits = append(ps.limits, st.limit())
					}
					continue
				case <-tick.C:
				}
				ps.sent++ // only this goroutine writes sent before wg.Wait
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(context.Background(), 250*time.Millisecond)
					defer cancel()
					start := time.Now()
					code, err := do(st.rt, ctx, srv.URL)
					lat := time.Since(start)
					ps.mu.Lock()
					defer ps.mu.Unlock()
					switch {
					case err == nil && code == 200:
						ps.lat = append(ps.lat, lat)
					case errors.Is(err, context.DeadlineExceeded):
						ps.timeouts++
					case errors.Is(err, bulwark.ErrBulkheadFull), errors.Is(err, bulwark.ErrBreakerOpen), errors.Is(err, adaptivelimiter.ErrExceeded):
						ps.rejected++
					default:
						ps.other++
					}
				})
			}
			tick.Stop()
			sample.Stop()
		}
		wg.Wait()
		c.set(cur, 40)
		for pi, ps := range stats {
			secs := phases[pi].d.Seconds()
			slices.Sort(ps.lat)
			q := func(f float64) time.Duration {
				if len(ps.lat) == 0 {
					return 0
				}
				return ps.lat[min(len(ps.lat)-1, int(f*float64(len(ps.lat))))].Round(time.Millisecond / 10)
			}
			lim := "-"
			if ps.limits != nil {
				lim = fmt.Sprint(ps.limits)
			}
			fmt.Printf("| %s | %d cores | %.0f | %.0f | %v | %v | %.0f | %.0f | %s |\n", st.name, phases[pi].cores, float64(ps.sent)/secs,
				float64(len(ps.lat))/secs, q(0.5), q(0.99), float64(ps.rejected)/secs, float64(ps.timeouts+ps.other)/secs, lim)
			if st.limit != nil {
				verdicts = append(verdicts, dropVerdict(st.name, phases[pi].cores, secs, ps, q(0.99)))
			}
		}
		// Let the server drain what the plain client left queued.
		time.Sleep(500 * time.Millisecond)
	}
	fmt.Println()
	fmt.Println("Targets, per phase, for the adaptive stacks: the limit within ±25 % of what the capacity needs from 2 s after each change " +
		"(10 cores: 10, so [7.5, 12.5]; 40 cores: the load needs 24 in flight and the cores serve 40 without a queue, so [18, 50]); " +
		"goodput ≥ 95 % of min(offered, capacity), with offered as the load generator managed it; p99 ≤ 40 ms (2 × the 20 ms service time).")
	fmt.Println()
	fmt.Println("| stack | phase | limit from 2 s | goodput | p99 |")
	fmt.Println("|---|---|---|---|---|")
	for _, v := range verdicts {
		fmt.Println(v)
	}
	fmt.Println()
}

// dropVerdict holds one phase of an adaptive stack to the targets.
func dropVerdict(name string, cores int, secs float64, ps *phaseStats, p99 time.Duration) string {
	lo, hi := 0.75*24, 1.25*40
	if cores == 10 {
		lo, hi = 7.5, 12.5
	}
	met := func(ok bool) string {
		if ok {
			return "met"
		}
		return "not met"
	}
	inBand := len(ps.limits) > 2
	for _, l := range ps.limits[min(2, len(ps.limits)):] {
		inBand = inBand && float64(l) >= lo && float64(l) <= hi
	}
	lims, band := "-", "phase too short to tell"
	if len(ps.limits) > 2 {
		lims, band = fmt.Sprint(ps.limits[2:]), met(inBand)
	}
	offered := float64(ps.sent) / secs
	want := 0.95 * min(offered, float64(cores)/0.020)
	ok := float64(len(ps.lat)) / secs
	return fmt.Sprintf("| %s | %d cores | %s in [%.1f, %.1f]: %s | %.0f/s, want ≥ %.0f: %s | %v: %s |", name, cores,
		lims, lo, hi, band, ok, want, met(ok >= want), p99, met(p99 <= 40*time.Millisecond))
}

// fsThrottler is failsafe-go's adaptivethrottler set as close to bulwark's
// throttle as its options go: 503, 429 and errors are failures (by
// default only errors are, so an upstream answering 503 is never
// throttled); a failure-rate threshold of 0.5, its form of K = 2 (it
// throttles above executions = successes ÷ 0.5); the same 2 s window; 10
// executions before it may reject; the maximum rejection rate left at its
// 0.9, which this scenario does not reach.
func fsThrottler() adaptivethrottler.AdaptiveThrottler[*http.Response] {
	return adaptivethrottler.NewBuilder[*http.Response]().
		HandleIf(func(r *http.Response, err error) bool {
			return err != nil || r != nil && (r.StatusCode == http.StatusServiceUnavailable || r.StatusCode == http.StatusTooManyRequests)
		}).
		WithFailureRateThreshold(0.5, 10, 2*time.Second).
		Build()
}

func throttle() {
	const x = 200 // accepted a second
	var accepted, received atomic.Int64
	var mu sync.Mutex
	tokens, last := float64(x)/10, time.Now()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		received.Add(1)
		mu.Lock()
		now := time.Now()
		tokens = min(float64(x)/10, tokens+now.Sub(last).Seconds()*x)
		last = now
		ok := tokens >= 1
		if ok {
			tokens--
		}
		mu.Unlock()
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		accepted.Add(1)
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	d := dur(8 * time.Second)
	warm := d / 4
	fmt.Printf("### Throttling: backend accepts %d req/s, offered %d req/s for %v (the first %v not counted)\n\n", x, 5*x, d, warm)
	fmt.Println("| stack | backend received/s | accepted/s | received ÷ accepted | local rejections/s |")
	fmt.Println("|---|---|---|---|---|")
	p := off
	p.Throttle = bulwark.Throttle{Enabled: true, Window: 2 * time.Second}
	for _, st := range []struct {
		name string
		rt   http.RoundTripper
	}{
		{"plain", transport()},
		{"bulwark throttle K=2 (2 s window)", mustBulwark(transport(), p)},
		{"failsafe-go adaptivethrottler (defaults)", failsafehttp.NewRoundTripper(transport(), adaptivethrottler.NewWithDefaults[*http.Response]())},
		{"failsafe-go adaptivethrottler (tuned: 503 a failure, threshold 0.5 over 2 s, ≥ 10 calls)", failsafehttp.NewRoundTripper(transport(), fsThrottler())},
	} {
		var local atomic.Int64
		var counting atomic.Bool
		var wg sync.WaitGroup
		tick := time.NewTicker(time.Second / (5 * x))
		start := time.Now()
		var r0, a0 int64
		for time.Since(start) < d {
			<-tick.C
			if !counting.Load() && time.Since(start) >= warm {
				counting.Store(true)
				r0, a0 = received.Load(), accepted.Load()
			}
			wg.Go(func() {
				_, err := do(st.rt, context.Background(), srv.URL)
				if err != nil && counting.Load() {
					local.Add(1)
				}
			})
		}
		tick.Stop()
		wg.Wait()
		secs := (d - warm).Seconds()
		rcv, acc := float64(received.Load()-r0), float64(accepted.Load()-a0)
		fmt.Printf("| %s | %.0f | %.0f | %.2f | %.0f |\n", st.name, rcv/secs, acc/secs, rcv/acc, float64(local.Load())/secs)
		time.Sleep(time.Second)
	}
	fmt.Println()
}
