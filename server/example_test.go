package server_test

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/bulwark-http/bulwark/server"
)

// DeadlineHandler turns the caller's time left back into a context deadline,
// so the deadline crosses every hop.
func ExampleDeadlineHandler() {
	handler := server.DeadlineHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		dl, ok := r.Context().Deadline()
		fmt.Println("deadline set:", ok, "within 250ms:", ok && time.Until(dl) <= 250*time.Millisecond)
	}), server.DeadlineOptions{Max: 5 * time.Second})

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

// A Shedder behind DeadlineHandler: one worker, no queue; a second request
// while the first is being served is refused at once.
func ExampleShedder() {
	inHandler, finish := make(chan struct{}), make(chan struct{})
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(inHandler)
		<-finish
		io.WriteString(w, "done\n")
	})
	s, err := server.NewShedder(slow, server.ShedConfig{Workers: 1, Queue: -1})
	if err != nil {
		fmt.Println(err)
		return
	}
	h := server.DeadlineHandler(s, server.DeadlineOptions{})

	first := make(chan string)
	go func() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		first <- rec.Body.String()
	}()
	<-inHandler

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	fmt.Println(rec.Code, "Retry-After:", rec.Header().Get("Retry-After"), bulwark.NoRetryHeader+":", rec.Header().Get(bulwark.NoRetryHeader))

	close(finish)
	fmt.Print(<-first)
	st := s.Stats()
	fmt.Println("served:", st.Served[bulwark.PriorityNormal], "shed:", st.Shed[server.ShedQueueFull][bulwark.PriorityNormal])
	// Output:
	// 503 Retry-After: 1 Bulwark-No-Retry: 1
	// done
	// served: 1 shed: 1
}

// ExampleShedStats reads every counter of a snapshot with exported names
// only: the arrays are sized by bulwark.NumPriorities and NumShedReasons,
// and ranging over those yields a bulwark.Priority and a ShedReason.
func ExampleShedStats() {
	s, err := server.NewShedder(http.NotFoundHandler(), server.ShedConfig{Workers: 1, Queue: -1})
	if err != nil {
		fmt.Println(err)
		return
	}
	s.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	st := s.Stats()
	var served [bulwark.NumPriorities]uint64 = st.Served
	for p := range bulwark.NumPriorities {
		var shed uint64
		for r := range server.NumShedReasons {
			shed += st.Shed[r][p]
		}
		fmt.Printf("%s: served %d, shed %d\n", p, served[p], shed)
	}
	// Output:
	// critical: served 0, shed 0
	// high: served 0, shed 0
	// normal: served 1, shed 0
	// low: served 0, shed 0
	// test: served 0, shed 0
}

// The README's "Server side" block as written: a service's mux behind a
// Shedder of 64 workers, behind DeadlineHandler, here served by an
// httptest server on 127.0.0.1 and called with 250 ms left.
func Example() {
	mux := http.NewServeMux()
	mux.HandleFunc("/rate", func(w http.ResponseWriter, r *http.Request) {
		dl, ok := r.Context().Deadline()
		fmt.Fprintln(w, "deadline set:", ok, "within 250ms:", ok && time.Until(dl) <= 250*time.Millisecond)
	})

	// README "Server side": begin
	shed, err := server.NewShedder(mux, server.ShedConfig{Workers: 64})
	if err != nil {
		log.Fatal(err)
	}
	handler := server.DeadlineHandler(shed, server.DeadlineOptions{Max: 5 * time.Second})
	// README "Server side": end

	srv := httptest.NewServer(handler) // http.ListenAndServe(addr, handler) in a service
	defer srv.Close()
	req, _ := http.NewRequest("GET", srv.URL+"/rate", nil)
	req.Header.Set(bulwark.DefaultDeadlineHeader, "250")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	io.Copy(os.Stdout, resp.Body)
	// Output:
	// deadline set: true within 250ms: true
}

// A chain of services, as the README's "A chain of services" describes
// it: gateway → checkout → tax, bulwark's package defaults at both
// clients, DeadlineHandler at checkout. Tax answers 503: checkout's client
// retries it (three attempts), and checkout's 503 goes up marked
// Bulwark-No-Retry: below, so the gateway's client does not retry it again
// (one call, not three times three at tax) and counts it as passed up, not
// against checkout's breaker.
func Example_chain() {
	var taxCalls, checkoutCalls atomic.Int32
	tax := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		taxCalls.Add(1)
		http.Error(w, "database on fire", http.StatusServiceUnavailable)
	}))
	defer tax.Close()

	// README "A chain of services": begin
	taxClient, err := bulwark.NewClient(bulwark.Config{})
	if err != nil {
		log.Fatal(err)
	}
	checkoutMux := http.NewServeMux()
	checkoutMux.HandleFunc("/checkout", func(w http.ResponseWriter, r *http.Request) {
		req, _ := http.NewRequestWithContext(r.Context(), "GET", tax.URL+"/rate", nil) // r's context carries the record
		resp, err := taxClient.Do(req)
		if err != nil {
			http.Error(w, "tax: "+err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			http.Error(w, "tax: "+resp.Status, http.StatusServiceUnavailable)
			return
		}
		io.Copy(w, resp.Body)
	})
	checkoutHandler := server.DeadlineHandler(checkoutMux, server.DeadlineOptions{}) // or server.PassUp(checkoutMux)
	// README "A chain of services": end
	defer taxClient.Transport.(*bulwark.Transport).Close()

	checkout := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		checkoutCalls.Add(1)
		checkoutHandler.ServeHTTP(w, r)
	}))
	defer checkout.Close()
	gateway, err := bulwark.New(bulwark.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer gateway.Close()

	resp, err := (&http.Client{Transport: gateway}).Get(checkout.URL + "/checkout")
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	fmt.Println("gateway got", resp.StatusCode, bulwark.NoRetryHeader+":", resp.Header.Get(bulwark.NoRetryHeader))
	fmt.Println("calls at checkout:", checkoutCalls.Load(), "at tax:", taxCalls.Load())
	h := gateway.Snapshot().Host(checkout.Listener.Addr().String())[0]
	fmt.Println("gateway counted checkout's answer: passed up", h.PassedUp, "breaker failures", h.Breaker.Failures)
	// Output:
	// gateway got 503 Bulwark-No-Retry: below
	// calls at checkout: 1 at tax: 3
	// gateway counted checkout's answer: passed up 1 breaker failures 0
}
