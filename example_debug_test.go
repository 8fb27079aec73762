package bulwark_test

import (
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"

	"github.com/bulwark-http/bulwark"
)

// DebugHandler mounted on the program's own mux, on an internal listener
// (here an httptest server on 127.0.0.1): never on a public one. The HTML
// page is at /debug/bulwark/, the JSON at /debug/bulwark/json.
func ExampleDebugHandler() {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "ok")
	}))
	defer upstream.Close()
	tr, err := bulwark.New(bulwark.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	if resp, err := client.Get(upstream.URL); err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}

	debug := bulwark.DebugHandler(tr)
	defer debug.(io.Closer).Close() // stops its sampler
	mux := http.NewServeMux()
	mux.Handle("/debug/bulwark/", debug) // behind your own authentication, if any
	admin := httptest.NewServer(mux)
	defer admin.Close()

	resp, err := http.Get(admin.URL + "/debug/bulwark/json")
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	var page bulwark.DebugPage
	if err := json.NewDecoder(resp.Body).Decode(&page); err != nil {
		log.Fatal(err)
	}
	for _, h := range page.Hosts {
		fmt.Println(h.Upstream, h.Breaker.State, h.Bulkhead.InFlight, "of", h.Bulkhead.MaxConcurrent)
	}
	// Output:
	// default closed 0 of 1000
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
