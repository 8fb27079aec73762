package bulwarktest_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

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
