package server_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
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
