package bulwark_test

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
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

// DeadlineHandler turns the caller's time left back into a context deadline,
// so the deadline crosses every hop.
func ExampleDeadlineHandler() {
	handler := bulwark.DeadlineHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		dl, ok := r.Context().Deadline()
		fmt.Println("deadline set:", ok, "within 250ms:", ok && time.Until(dl) <= 250*time.Millisecond)
	}), bulwark.DeadlineOptions{Max: 5 * time.Second})

	req := httptest.NewRequest("GET", "/rate", nil)
	req.Header.Set("Grpc-Timeout", "250m") // or Bulwark-Timeout-Ms, or Envoy's header
	handler.ServeHTTP(httptest.NewRecorder(), req)

	req = httptest.NewRequest("GET", "/rate", nil)
	req.Header.Set(bulwark.DefaultDeadlineHeader, "not-a-number") // ignored, never a 500
	handler.ServeHTTP(httptest.NewRecorder(), req)
	// Output:
	// deadline set: true within 250ms: true
	// deadline set: false within 250ms: false
}
