package bulwarktest_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/bulwark-http/bulwark/bulwarktest"
)

// An upstream that fails twice, asking for an immediate retry, and then
// answers, served in memory: what bulwark sent, and the retries it made.
func Example() {
	u := bulwarktest.NewUpstream(map[string]bulwarktest.Script{
		"/rates": {
			{Status: 503, Header: http.Header{"Retry-After": {"0"}}, Times: 2},
			{Status: 200, Body: "1.08"},
		},
	})
	var rec bulwarktest.Recorder
	client, err := bulwark.NewClient(bulwark.Config{Base: u.Transport(), Default: rec.Hook(bulwark.Policy{})})
	if err != nil {
		panic(err)
	}
	resp, err := client.Get("http://fx.example/rates")
	if err != nil {
		panic(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(resp.StatusCode, string(b))
	fmt.Println("attempts:", u.Attempts("/rates"))
	for _, ev := range rec.Retries() {
		fmt.Println("retry", ev.Attempt, "after", ev.StatusCode)
	}
	// Output:
	// 200 1.08
	// attempts: [1 2 3]
	// retry 2 after 503
	// retry 3 after 503
}

// An Upstream is an http.Handler: over a real socket on 127.0.0.1 (in a
// test, Start does this and closes it at the end), it records what each
// request carried.
func ExampleUpstream_Requests() {
	u := bulwarktest.NewUpstream(map[string]bulwarktest.Script{
		"/orders": {{Status: 201, Body: "created"}},
	})
	srv := httptest.NewServer(u)
	defer srv.Close()

	resp, err := srv.Client().Post(srv.URL+"/orders", "text/plain", strings.NewReader("2 apples"))
	if err != nil {
		panic(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	r := u.Requests()[0]
	fmt.Println(resp.StatusCode, string(b))
	fmt.Println(r.Method, r.Path, r.Header.Get("Content-Type"), r.Body)
	// Output:
	// 201 created
	// POST /orders text/plain 2 apples
}

// A breaker that opens after failures, seen through the Recorder and the
// Transport's Snapshot.
func ExampleRecorder() {
	u := bulwarktest.NewUpstream(map[string]bulwarktest.Script{"/": {{Status: 500}}})
	var rec bulwarktest.Recorder
	tr, err := bulwark.New(bulwark.Config{Base: u.Transport(), Default: rec.Hook(bulwark.Policy{
		Retry:   bulwark.Retry{Disabled: true},
		Breaker: bulwark.Breaker{MinCalls: 3, FailureRate: 0.5},
	})})
	if err != nil {
		panic(err)
	}
	for range 3 {
		req, _ := http.NewRequest("GET", "http://inventory.example/", nil)
		if resp, err := tr.RoundTrip(req); err == nil {
			resp.Body.Close()
		}
	}
	for _, tr := range rec.Transitions() {
		fmt.Println(tr.Host, tr.From, "→", tr.To)
	}
	state, _ := bulwarktest.BreakerState(tr, "inventory.example:80")
	fmt.Println("now", state)
	// Output:
	// inventory.example:80 closed → open
	// now open
}

// A first attempt that never answers, and a hedge sent beside it after
// 10 ms: the hedge's answer is the caller's, and the first attempt is
// cancelled.
func ExampleHedges() {
	u := bulwarktest.NewUpstream(map[string]bulwarktest.Script{
		"/quote": {{Delay: time.Hour}, {Body: "fast"}},
	})
	tr, err := bulwark.New(bulwark.Config{Base: u.Transport(), Default: bulwark.Policy{
		Hedge: bulwark.Hedge{Delay: 10 * time.Millisecond},
	}})
	if err != nil {
		panic(err)
	}
	req, _ := http.NewRequest("GET", "http://fx.example/quote", nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		panic(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(resp.StatusCode, string(b))
	h, _ := bulwarktest.Hedges(tr, "fx.example:80")
	fmt.Println("hedges sent:", h.Sent, "won:", h.Won)
	for _, r := range u.RequestsTo("/quote") {
		fmt.Println("attempt", r.Attempt, "in flight beside it:", r.InFlight, "canceled:", r.Canceled)
	}
	// Output:
	// 200 fast
	// hedges sent: 1 won: 1
	// attempt 1 in flight beside it: 0 canceled: true
	// attempt 2 in flight beside it: 1 canceled: false
}

// A hedge that falls due while every bulkhead slot is held is not sent:
// HedgesSkipped counts it under "bulkhead". (The first attempt, holding
// the one slot, answers after a second; the hedge was due at 10 ms.)
func ExampleHedgesSkipped() {
	u := bulwarktest.NewUpstream(map[string]bulwarktest.Script{
		"/slow": {{Body: "late", Delay: time.Second}},
	})
	tr, err := bulwark.New(bulwark.Config{Base: u.Transport(), Default: bulwark.Policy{
		Hedge:    bulwark.Hedge{Delay: 10 * time.Millisecond},
		Bulkhead: bulwark.Bulkhead{MaxConcurrent: 1},
	}})
	if err != nil {
		panic(err)
	}
	req, _ := http.NewRequest("GET", "http://rates.example/slow", nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		panic(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Println(resp.StatusCode, string(b))
	fmt.Println("skipped:", bulwarktest.HedgesSkipped(tr, "rates.example:80"))
	fmt.Println("attempts:", u.Attempts("/slow"))
	// Output:
	// 200 late
	// skipped: map[bulkhead:1]
	// attempts: [1]
}
