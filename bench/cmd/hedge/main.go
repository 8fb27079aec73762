// Command hedge measures hedged requests on 127.0.0.1: a "long tail"
// upstream (1 % of attempts take 1 s, drawn per attempt, the rest about
// 5 ms) and a "sick" one (every attempt 200 ms), each offered an open-loop
// arrival rate (400 calls a second by default) through each stack: a plain
// client, bulwark retrying only, bulwark hedging, failsafe-go's hedgepolicy
// and cristalhq/hedgedhttp. The handlers return as soon as their request
// is cancelled, so a cancelled hedge costs the upstream nothing more.
//
// It prints one JSON line per stack and scenario (-json) or a Markdown
// table: p50, p99 and p99.9 of the call latency, and upstream requests ÷
// calls (the load). Arrivals are scheduled, not paced by answers, so a
// slow stack cannot slow its own offered load down.
//
//	go run ./cmd/hedge                 # 10 s per stack and scenario
//	go run ./cmd/hedge -duration 20s   # the figures BENCHMARKS.md reports
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/bulwark-http/bulwark/bench"
	"github.com/cristalhq/hedgedhttp"
	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/budget"
	"github.com/failsafe-go/failsafe-go/failsafehttp"
	"github.com/failsafe-go/failsafe-go/hedgepolicy"
)

// Result is one stack's run of one scenario.
type Result struct {
	Scenario string  `json:"scenario"`
	Stack    string  `json:"stack"`
	Calls    int     `json:"calls"`
	Errors   int     `json:"errors"`
	Upstream int64   `json:"upstream"`
	Load     float64 `json:"load"`
	P50      float64 `json:"p50_ms"`
	P99      float64 `json:"p99_ms"`
	P999     float64 `json:"p999_ms"`
}

type upstream struct {
	slow     func() time.Duration // this attempt's latency
	requests atomic.Int64
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	u.requests.Add(1)
	tm := time.NewTimer(u.slow())
	defer tm.Stop()
	select {
	case <-tm.C:
		io.WriteString(w, "ok")
	case <-r.Context().Done():
	}
}

var scenarios = map[string]func() time.Duration{
	"long tail": func() time.Duration {
		if rand.IntN(100) == 0 {
			return time.Second
		}
		return 5 * time.Millisecond
	},
	"sick": func() time.Duration { return 200 * time.Millisecond },
}

// hedge is bulwark hedging's policy: bench.HedgePolicy unless flags say.
var hedge = bench.HedgePolicy

var verbose = new(bool)

type stack struct {
	name  string
	build func(base http.RoundTripper) (http.RoundTripper, error)
}

func failsafeRT(hp hedgepolicy.Builder[*http.Response], withBudget bool) func(http.RoundTripper) (http.RoundTripper, error) {
	return func(base http.RoundTripper) (http.RoundTripper, error) {
		if withBudget {
			hp = hp.WithBudget(budget.New())
		}
		return failsafehttp.NewRoundTripper(base, failsafe.Policy[*http.Response](hp.Build())), nil
	}
}

var stacks = []stack{
	{"plain", func(base http.RoundTripper) (http.RoundTripper, error) { return base, nil }},
	{"bulwark retries only", func(base http.RoundTripper) (http.RoundTripper, error) {
		return bulwark.New(bulwark.Config{Base: base})
	}},
	{"bulwark hedging", func(base http.RoundTripper) (http.RoundTripper, error) {
		return bulwark.New(bulwark.Config{Base: base, Default: bulwark.Policy{Hedge: hedge}})
	}},
	{"hedgedhttp 10 ms", func(base http.RoundTripper) (http.RoundTripper, error) {
		return hedgedhttp.NewRoundTripper(10*time.Millisecond, 2, base)
	}},
	{"failsafe-go 10 ms", func(base http.RoundTripper) (http.RoundTripper, error) {
		return failsafeRT(hedgepolicy.NewBuilderWithDelay[*http.Response](10*time.Millisecond), false)(base)
	}},
	{"failsafe-go p95", func(base http.RoundTripper) (http.RoundTripper, error) {
		return failsafeRT(hedgepolicy.NewBuilderWithDelayQuantile[*http.Response](0.95, 1000, 100), false)(base)
	}},
	{"failsafe-go 10 ms + budget", func(base http.RoundTripper) (http.RoundTripper, error) {
		return failsafeRT(hedgepolicy.NewBuilderWithDelay[*http.Response](10*time.Millisecond), true)(base)
	}},
	{"failsafe-go p95 + budget", func(base http.RoundTripper) (http.RoundTripper, error) {
		return failsafeRT(hedgepolicy.NewBuilderWithDelayQuantile[*http.Response](0.95, 1000, 100), true)(base)
	}},
}

func main() {
	duration := flag.Duration("duration", 10*time.Second, "how long each stack is offered load, per scenario")
	rate := flag.Int("rate", 400, "calls a second, open loop")
	only := flag.String("stacks", "", "comma-separated stack names to run (default: all)")
	scen := flag.String("scenario", "", `"long tail" or "sick" (default: both)`)
	asJSON := flag.Bool("json", false, "print JSON lines instead of a Markdown table")
	flag.BoolVar(verbose, "v", false, "print each bulwark stack's Snapshot and first error")
	flag.Float64Var(&hedge.Quantile, "quantile", hedge.Quantile, "bulwark hedging's Hedge.Quantile (0: Hedge.Delay)")
	flag.DurationVar(&hedge.MinDelay, "min-delay", hedge.MinDelay, "bulwark hedging's Hedge.MinDelay")
	flag.DurationVar(&hedge.Delay, "delay", hedge.Delay, "bulwark hedging's Hedge.Delay")
	flag.Parse()

	var results []Result
	for _, name := range []string{"long tail", "sick"} {
		if *scen != "" && *scen != name {
			continue
		}
		for _, s := range stacks {
			if *only != "" && !slices.Contains(strings.Split(*only, ","), s.name) {
				continue
			}
			r, err := run(name, s, *rate, *duration)
			if err != nil {
				fmt.Fprintln(os.Stderr, "hedge:", s.name, err)
				os.Exit(1)
			}
			fmt.Fprintf(os.Stderr, "%s / %s: p50 %.1f p99 %.1f p99.9 %.1f ms, load %.3f, %d errors\n",
				r.Scenario, r.Stack, r.P50, r.P99, r.P999, r.Load, r.Errors)
			results = append(results, r)
		}
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		for _, r := range results {
			enc.Encode(r)
		}
		return
	}
	fmt.Print(Table(results, *rate, *duration))
}

// Table renders results as Markdown: one row per stack, both scenarios.
func Table(rs []Result, rate int, d time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Open loop, %d calls/s for %v per stack and scenario on 127.0.0.1 (`cd bench && go run ./cmd/hedge -duration %v`).\n\n", rate, d, d)
	b.WriteString("| stack | long tail p50 | p99 | p99.9 | long tail load | sick p50 | sick p99.9 | sick load |\n|---|---|---|---|---|---|---|---|\n")
	by := map[string]map[string]Result{}
	var order []string
	for _, r := range rs {
		if by[r.Stack] == nil {
			by[r.Stack] = map[string]Result{}
			order = append(order, r.Stack)
		}
		by[r.Stack][r.Scenario] = r
	}
	for _, s := range order {
		lt, sk := by[s]["long tail"], by[s]["sick"]
		fmt.Fprintf(&b, "| %s | %.1f ms | %.1f ms | %.1f ms | %.3f | %.0f ms | %.0f ms | %.3f |\n",
			s, lt.P50, lt.P99, lt.P999, lt.Load, sk.P50, sk.P999, sk.Load)
	}
	return b.String()
}

func run(scenario string, s stack, rate int, d time.Duration) (Result, error) {
	u := &upstream{slow: scenarios[scenario]}
	srv := httptest.NewUnstartedServer(u)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return Result{}, err
	}
	srv.Listener = l
	srv.Start()
	defer srv.Close()
	base := &http.Transport{
		MaxIdleConns: 2000, MaxIdleConnsPerHost: 2000, IdleConnTimeout: 30 * time.Second,
		DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
	}
	defer base.CloseIdleConnections()
	rt, err := s.build(base)
	if err != nil {
		return Result{}, err
	}
	if t, ok := rt.(*bulwark.Transport); ok {
		defer t.CloseIdleConnections()
	}
	n := int(d.Seconds() * float64(rate))
	lat := make([]time.Duration, n)
	var errs atomic.Int64
	var firstErr atomic.Pointer[error]
	var wg sync.WaitGroup
	interval := time.Second / time.Duration(rate)
	start := time.Now()
	for i := range n {
		if w := time.Until(start.Add(time.Duration(i) * interval)); w > 0 {
			time.Sleep(w)
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/x", nil)
			t0 := time.Now()
			resp, err := rt.RoundTrip(req)
			if err == nil {
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err == nil && resp.StatusCode != 200 {
					err = fmt.Errorf("status %d", resp.StatusCode)
				}
			}
			lat[i] = time.Since(t0)
			if err != nil {
				errs.Add(1)
				firstErr.CompareAndSwap(nil, &err)
			}
		})
	}
	wg.Wait()
	if t, ok := rt.(*bulwark.Transport); ok && *verbose {
		for _, h := range t.Snapshot().Hosts {
			fmt.Fprintf(os.Stderr, "  %s: hedge %+v budget %+v breaker %+v\n", h.Host, h.Hedge, h.Budget, h.Breaker)
		}
	}
	if e := firstErr.Load(); e != nil && *verbose {
		fmt.Fprintln(os.Stderr, "  first error:", *e)
	}
	slices.Sort(lat)
	q := func(p float64) float64 {
		return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))].Microseconds()) / 1000
	}
	return Result{
		Scenario: scenario, Stack: s.name, Calls: n, Errors: int(errs.Load()),
		Upstream: u.requests.Load(), Load: float64(u.requests.Load()) / float64(n),
		P50: q(0.5), P99: q(0.99), P999: q(0.999),
	}, nil
}
