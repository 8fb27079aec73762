// Command protect runs the protection scenarios against every stack on
// 127.0.0.1 and prints one JSON object per stack: a sick upstream that turns
// slow, POSTs against a 503-answering server, and a blip of 503s. Every
// phase is bounded in time; the whole run takes well under a minute.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bulwark-http/bulwark/bench"
)

// scenario is the configuration every stack gets here (where it has the
// feature): timeouts set from the healthy latency (4 ms), a breaker that
// can decide within the few seconds a scenario lasts.
var scenario = bench.Params{
	Total: time.Second, Attempt: 100 * time.Millisecond,
	MaxAttempts: 3, RetryBase: 20 * time.Millisecond, RetryCap: 200 * time.Millisecond,
	FailureRate: 0.5, SlowCall: 50 * time.Millisecond, MinCalls: 20,
	Window: 2 * time.Second, OpenFor: time.Second, HalfOpenCalls: 5,
	BulkheadCapacity: 4,
}

// Result is one stack's figures.
type Result struct {
	Stack        string  `json:"stack"`
	SickReceived int64   `json:"sick_received"` // requests the sick upstream got while slow
	SickOffered  int64   `json:"sick_offered"`  // calls the service made to it meanwhile
	FastSuccess  float64 `json:"fast_success"`  // share of unrelated fast requests served in time
	DupPOST      float64 `json:"dup_post"`      // POSTs the server received per call
	BlipLoad     float64 `json:"blip_load"`     // upstream arrivals during the blip ÷ calls offered
	RecoveryMS   float64 `json:"recovery_ms"`   // blip end → success rate back ≥ 90 % for good
	RecoveredOK  bool    `json:"recovered"`     // false: never back within the run
}

func main() {
	stacks := []string{"bare", "failsafe-go", "retryablehttp", "gobreaker", "bulwark"}
	enc := json.NewEncoder(os.Stdout)
	for _, name := range stacks {
		r := Result{Stack: name}
		sick(name, &r)
		dupPOST(name, &r)
		blip(name, &r)
		if err := enc.Encode(r); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}

// build returns a fresh stack of that name over a fresh base.
func build(name string) (http.RoundTripper, func()) {
	base := http.DefaultTransport.(*http.Transport).Clone()
	base.MaxIdleConnsPerHost = 64
	stacks, err := bench.Peers(scenario, base)
	if err != nil {
		panic(err)
	}
	for _, s := range stacks {
		if s.Name == name {
			return s.RT, base.CloseIdleConnections
		}
	}
	panic("no stack " + name)
}

func call(rt http.RoundTripper, method, url string, deadline time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	var body io.Reader
	if method == http.MethodPost {
		body = strings.NewReader(`{"order":1}`)
	}
	req, _ := http.NewRequestWithContext(ctx, method, url, body)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return false
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// sick: a service with 8 workers and a queue of 32 serves 400 requests a
// second; half call the upstream, half are unrelated 2 ms jobs. After
// 0.5 s the upstream turns from 4 ms to 1 s for 2.5 s. A request succeeds
// if it is answered within 250 ms of arriving.
func sick(name string, r *Result) {
	var slow atomic.Bool
	var received atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		d := 4 * time.Millisecond
		if slow.Load() {
			received.Add(1)
			d = time.Second
		}
		select {
		case <-time.After(d):
		case <-req.Context().Done():
		}
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	rt, closeIdle := build(name)
	defer closeIdle()

	type job struct {
		at   time.Time
		sick bool
	}
	const patience = 250 * time.Millisecond
	queue := make(chan job, 32)
	var fastOK, fastAll, offered atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for j := range queue {
				inSick := slow.Load()
				if j.sick {
					if inSick {
						offered.Add(1)
					}
					call(rt, http.MethodGet, srv.URL, patience-time.Since(j.at))
					continue
				}
				if time.Since(j.at) < patience {
					time.Sleep(2 * time.Millisecond)
					if inSick && time.Since(j.at) <= patience {
						fastOK.Add(1)
					}
				}
			}
		})
	}
	start := time.Now()
	tick := time.NewTicker(10 * time.Millisecond)
	for now := range tick.C {
		el := now.Sub(start)
		if el > 3*time.Second {
			break
		}
		slow.Store(el >= 500*time.Millisecond)
		for i := range 4 {
			j := job{at: time.Now(), sick: i%2 == 0}
			if !j.sick && slow.Load() {
				fastAll.Add(1)
			}
			select {
			case queue <- j:
			default: // queue full: the request is refused
			}
		}
	}
	tick.Stop()
	slow.Store(false)
	close(queue)
	wg.Wait()
	r.SickReceived, r.SickOffered = received.Load(), offered.Load()
	if n := fastAll.Load(); n > 0 {
		r.FastSuccess = float64(fastOK.Load()) / float64(n)
	}
}

// dupPOST: ten concurrent POSTs without an Idempotency-Key to a server
// that answers 503 to everything.
func dupPOST(name string, r *Result) {
	var received atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		received.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	rt, closeIdle := build(name)
	defer closeIdle()
	const calls = 10
	var wg sync.WaitGroup
	for range calls {
		wg.Go(func() { call(rt, http.MethodPost, srv.URL, 2*time.Second) })
	}
	wg.Wait()
	r.DupPOST = float64(received.Load()) / calls
}

// blip: 200 GETs a second, open loop; from 0.5 s to 2 s the upstream
// answers 503 at once; the run goes on 2 s after.
func blip(name string, r *Result) {
	const (
		blipFrom = 500 * time.Millisecond
		blipTo   = 2 * time.Second
		runFor   = 4 * time.Second
		bucket   = 50 * time.Millisecond
	)
	start := time.Now()
	var during atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		el := time.Since(start)
		if el >= blipFrom && el < blipTo {
			during.Add(1)
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		time.Sleep(2 * time.Millisecond)
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	rt, closeIdle := build(name)
	defer closeIdle()

	nb := int(runFor / bucket)
	var mu sync.Mutex
	ok, all := make([]int, nb), make([]int, nb)
	var offered int64
	var wg sync.WaitGroup
	start = time.Now()
	tick := time.NewTicker(10 * time.Millisecond)
	for now := range tick.C {
		el := now.Sub(start)
		if el >= runFor {
			break
		}
		if el >= blipFrom && el < blipTo {
			offered += 2
		}
		b := int(el / bucket)
		for range 2 {
			wg.Go(func() {
				good := call(rt, http.MethodGet, srv.URL, time.Second)
				mu.Lock()
				all[b]++
				if good {
					ok[b]++
				}
				mu.Unlock()
			})
		}
	}
	tick.Stop()
	wg.Wait()
	if offered > 0 {
		r.BlipLoad = float64(during.Load()) / float64(offered)
	}
	// The first bucket after the blip from which every bucket is ≥ 90 %.
	first := int(blipTo / bucket)
	rec := -1
	for i := nb - 1; i >= first; i-- {
		if all[i] == 0 || float64(ok[i]) < 0.9*float64(all[i]) {
			break
		}
		rec = i
	}
	if rec >= 0 {
		r.RecoveredOK = true
		r.RecoveryMS = float64((time.Duration(rec)*bucket - blipTo).Milliseconds())
	}
}
