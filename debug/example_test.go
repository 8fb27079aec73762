package debug_test

import (
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"

	"github.com/bulwark-http/bulwark"
	"github.com/bulwark-http/bulwark/debug"
)

// Handler mounted on the program's own mux, on an internal listener (here
// an httptest server on 127.0.0.1): never on a public one. The HTML page
// is at /debug/bulwark/, the JSON at /debug/bulwark/json; the JSON decodes
// into a debug.Page, whose Snapshot is the Transport's own.
func ExampleHandler() {
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

	// README "Seeing and steering it": begin
	h := debug.Handler(tr)
	defer h.(io.Closer).Close() // stops its sampler
	mux := http.NewServeMux()
	mux.Handle("/debug/bulwark/", h) // behind your own authentication, if any
	// README "Seeing and steering it": end
	admin := httptest.NewServer(mux)
	defer admin.Close()

	resp, err := http.Get(admin.URL + "/debug/bulwark/json")
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	var page debug.Page
	if err := json.NewDecoder(resp.Body).Decode(&page); err != nil {
		log.Fatal(err)
	}
	for _, h := range page.Snapshot.Hosts {
		fmt.Println(h.Upstream, h.Breaker.State, h.Bulkhead.InFlight, "of", h.Bulkhead.Limit)
	}
	// Output:
	// default closed 0 of 1000
}
