package bulwark_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"time"

	"github.com/bulwark-http/bulwark"
)

// NewClient is a drop-in for http.DefaultClient, with a policy per upstream.
func ExampleNewClient() {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "rate=0.0725")
	}))
	defer upstream.Close()

	client, err := bulwark.NewClient(bulwark.Config{
		Default: bulwark.Policy{Timeout: bulwark.Timeout{Total: 2 * time.Second}},
		Upstreams: map[string]bulwark.Policy{
			// Keyed by host or host:port; zero fields inherit from Default.
			upstream.Listener.Addr().String(): {Timeout: bulwark.Timeout{Attempt: 500 * time.Millisecond}},
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer client.CloseIdleConnections()

	resp, err := client.Get(upstream.URL + "/rate")
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, string(b))

	// The client's Transport is the *bulwark.Transport to watch and steer.
	tr := client.Transport.(*bulwark.Transport)
	hosts := tr.Snapshot().Host(upstream.Listener.Addr().String())
	fmt.Println("entries:", len(hosts), "calls:", hosts[0].Calls.Calls)

	// A bad value is an error from New, naming the upstream and the field.
	_, err = bulwark.NewClient(bulwark.Config{Upstreams: map[string]bulwark.Policy{
		"tax.internal": {Timeout: bulwark.Timeout{Total: time.Second, Attempt: 2 * time.Second}},
	}})
	fmt.Println(err)
	// Output:
	// 200 rate=0.0725
	// entries: 1 calls: 1
	// bulwark: upstream "tax.internal": Timeout.Attempt = 2s: must not exceed Timeout.Total (1s)
}

// A policy per upstream, every layer on: a slow tax service's call (the
// outage Nygard's Release It! opens with), with
// a timeout near its healthy p99.9, a breaker that trips on slowness, a
// 40-slot bulkhead, budgeted retries, and the last good rate when all else
// fails. The code between the markers is the README's Quick start as
// written; around it, the test sends "tax.internal" to a server on
// 127.0.0.1 and puts the globals it sets back.
func Example_taxPolicy() {
	var sick atomic.Bool
	tax := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if sick.Load() {
			http.Error(w, "database on fire", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, "rate=0.0725")
	}))
	defer tax.Close()
	defer func(tr http.RoundTripper, c *http.Client) { http.DefaultTransport, http.DefaultClient = tr, c }(http.DefaultTransport, http.DefaultClient)
	http.DefaultTransport = loopback(tax.Listener.Addr().String()) // bulwark.New's Base is a clone of it

	// README Quick start: begin
	tr, err := bulwark.New(bulwark.Config{
		Upstreams: map[string]bulwark.Policy{
			"tax.internal": { // "host" or "host:port"; zero fields inherit from Config.Default
				Timeout:  bulwark.Timeout{Total: time.Second, Attempt: 150 * time.Millisecond},
				Breaker:  bulwark.Breaker{SlowCall: 100 * time.Millisecond, SlowCallRate: 0.5, MinCalls: 20},
				Bulkhead: bulwark.Bulkhead{MaxConcurrent: 40},
				Retry:    bulwark.Retry{MaxAttempts: 2, Base: 10 * time.Millisecond},
				Fallback: bulwark.Fallback{Stale: bulwark.StaleCache{MaxAge: 6 * time.Hour}},
			},
		},
	})
	if err != nil {
		log.Fatal(err) // a bad value is an error naming the upstream and field, never a panic
	}
	client := &http.Client{Transport: tr} // what bulwark.NewClient(cfg) returns
	http.DefaultClient = client
	// README Quick start: end
	defer tr.Close()

	get := func() {
		resp, err := http.Get("http://tax.internal/rate?jurisdiction=CA")
		if err != nil {
			fmt.Println("error:", err)
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		fmt.Printf("%d %s (fallback: %q)\n", resp.StatusCode, b, resp.Header.Get(bulwark.FallbackHeader))
	}
	get() // healthy: cached as the last good answer
	sick.Store(true)
	get() // retried once, then answered from the stale cache
	h := tr.Snapshot().Host("tax.internal:80")[0]
	fmt.Println("calls:", h.Calls.Calls, "attempt timeout:", h.Learned.AttemptTimeout, h.Learned.AttemptFrom)
	// Output:
	// 200 rate=0.0725 (fallback: "")
	// 200 rate=0.0725 (fallback: "stale")
	// calls: 2 attempt timeout: 150ms set
}

// loopback is an *http.Transport that dials addr whatever the request's
// host, so that an Example can call the README's host names
// ("tax.internal", "api.example.com") and reach an httptest server.
func loopback(addr string) *http.Transport {
	var d net.Dialer
	return &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return d.DialContext(ctx, network, addr)
	}}
}

// Policy.Classify tells every layer what an answer means for this upstream:
// here a 404 is a failure another try may cure (an instance lost its
// index), so the retries, the breaker, the balancer and the fallback all
// treat it so.
func ExamplePolicy_classify() {
	var calls atomic.Int32
	search := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			http.NotFound(w, r) // the first instance lost its index
			return
		}
		fmt.Fprint(w, "3 results")
	}))
	defer search.Close()

	client, err := bulwark.NewClient(bulwark.Config{
		Upstreams: map[string]bulwark.Policy{
			search.Listener.Addr().String(): {
				Classify: func(resp *http.Response, err error) bulwark.Verdict {
					if resp != nil && resp.StatusCode == http.StatusNotFound {
						return bulwark.Verdict{Outcome: bulwark.OutcomeFailure, Retryable: true}
					}
					return bulwark.DefaultClassify(resp, err)
				},
				Retry: bulwark.Retry{Base: time.Millisecond},
			},
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer client.CloseIdleConnections()

	resp, err := client.Get(search.URL + "/search?q=bulwark")
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	fmt.Printf("%d %s after %d calls\n", resp.StatusCode, b, calls.Load())
	// Output:
	// 200 3 results after 2 calls
}

// Config.Routes keys policies by http.ServeMux patterns, as the README's
// "Routes, faults and tests" shows them: charges are never retried (a
// charge must not be made twice), rates are, with a shorter timeout.
func Example_routes() {
	var charges, rates atomic.Int32
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/v1/charges":
			charges.Add(1)
			http.Error(w, "busy", http.StatusServiceUnavailable)
		case rates.Add(1) == 1:
			http.Error(w, "busy", http.StatusServiceUnavailable)
		default:
			fmt.Fprint(w, "rate=0.0725")
		}
	}))
	defer api.Close()

	tr, err := bulwark.New(bulwark.Config{
		Base: loopback(api.Listener.Addr().String()),
		// README "Routes, faults and tests": begin
		Routes: map[string]bulwark.Policy{
			"POST api.example.com/v1/charges": {Retry: bulwark.Retry{Disabled: true}, Timeout: bulwark.Timeout{Attempt: 30 * time.Second}},
			"GET /v1/rates/{id}":              {Timeout: bulwark.Timeout{Attempt: 300 * time.Millisecond}},
		},
		// README "Routes, faults and tests": end
	})
	if err != nil {
		log.Fatal(err)
	}
	defer tr.Close()
	client := &http.Client{Transport: tr}

	req, _ := http.NewRequest("POST", "http://api.example.com/v1/charges", strings.NewReader("amount=100"))
	req.Header.Set("Idempotency-Key", "order-42") // safe to send twice, yet the route says no retries
	if resp, err := client.Do(req); err == nil {
		resp.Body.Close()
		fmt.Println("POST /v1/charges:", resp.StatusCode, "after", charges.Load(), "call")
	}
	if resp, err := client.Get("http://api.example.com/v1/rates/CA"); err == nil {
		resp.Body.Close()
		fmt.Println("GET /v1/rates/CA:", resp.StatusCode, "after", rates.Load(), "calls")
	}
	// Output:
	// POST /v1/charges: 503 after 1 call
	// GET /v1/rates/CA: 200 after 2 calls
}

// Update changes a running Transport's policies; an invalid Config is
// refused and the old one stays.
func ExampleTransport_Update() {
	cfg := bulwark.Config{Default: bulwark.Policy{Breaker: bulwark.Breaker{FailureRate: 0.5}}}
	tr, err := bulwark.New(cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer tr.CloseIdleConnections()

	// Tighten the breaker: its window and state carry over.
	cfg.Default.Breaker.FailureRate = 0.25
	fmt.Println(tr.Update(cfg))

	cfg.Default.Breaker.FailureRate = 2
	fmt.Println(tr.Update(cfg))
	// Output:
	// <nil>
	// bulwark: Default: Breaker.FailureRate = 2: must be in (0, 1]
}
