// Command quickstart replaces http.DefaultClient with a bulwark client and
// calls a server of its own on 127.0.0.1 whose handler reads the deadline
// bulwark propagated. It stops by itself.
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/bulwark-http/bulwark/server"
)

func main() {
	// The upstream: a handler behind server.DeadlineHandler, so the time the
	// client has left becomes this request's context deadline.
	upstream := httptest.NewServer(server.DeadlineHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		dl, ok := r.Context().Deadline()
		if !ok {
			fmt.Fprintln(w, "no deadline arrived")
			return
		}
		fmt.Fprintf(w, "upstream got %s=%s; its context has about %v left\n",
			bulwark.DefaultDeadlineHeader, r.Header.Get(bulwark.DefaultDeadlineHeader), time.Until(dl).Round(100*time.Millisecond))
	}), server.DeadlineOptions{}))
	defer upstream.Close()

	client, err := bulwark.NewClient(bulwark.Config{
		Default: bulwark.Policy{Timeout: bulwark.Timeout{Total: 2 * time.Second, Attempt: time.Second}},
	})
	if err != nil {
		log.Fatal(err)
	}
	http.DefaultClient = client

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, upstream.URL+"/rate", nil)
	if err != nil {
		log.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	fmt.Printf("status %d: %s", resp.StatusCode, b)
}
