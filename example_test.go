package bulwark_test

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
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

	// A bad value is an error from New, naming the upstream and the field.
	_, err = bulwark.NewClient(bulwark.Config{Upstreams: map[string]bulwark.Policy{
		"tax.internal": {Timeout: bulwark.Timeout{Total: time.Second, Attempt: 2 * time.Second}},
	}})
	fmt.Println(err)
	// Output:
	// 200 rate=0.0725
	// bulwark: upstream "tax.internal": Timeout.Attempt = 2s: must not exceed Timeout.Total (1s)
}

// A policy per upstream, every layer on: a slow tax service's call (the
// outage Nygard's Release It! opens with), with
// a timeout near its healthy p99.9, a breaker that trips on slowness, a
// 40-slot bulkhead, budgeted retries, and the last good rate when all else
// fails.
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

	client, err := bulwark.NewClient(bulwark.Config{
		Upstreams: map[string]bulwark.Policy{
			tax.Listener.Addr().String(): {
				Timeout:  bulwark.Timeout{Total: time.Second, Attempt: 150 * time.Millisecond},
				Breaker:  bulwark.Breaker{SlowCall: 100 * time.Millisecond, SlowCallRate: 0.5, MinCalls: 20},
				Bulkhead: bulwark.Bulkhead{MaxConcurrent: 40},
				Retry:    bulwark.Retry{MaxAttempts: 2, Base: 10 * time.Millisecond},
				Fallback: bulwark.Fallback{Stale: bulwark.StaleCache{MaxAge: 6 * time.Hour}},
			},
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer client.CloseIdleConnections()

	get := func() {
		resp, err := client.Get(tax.URL + "/rate?jurisdiction=CA")
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
	// Output:
	// 200 rate=0.0725 (fallback: "")
	// 200 rate=0.0725 (fallback: "stale")
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
