package server

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bulwark-http/bulwark"
)

func TestIsRetry(t *testing.T) {
	for _, tc := range []struct {
		h    http.Header
		want bool
	}{
		{http.Header{}, false},
		{http.Header{bulwark.AttemptHeader: {"1"}}, false},
		{http.Header{bulwark.AttemptHeader: {"2"}}, true},
		{http.Header{"Grpc-Previous-Rpc-Attempts": {"0"}}, false},
		{http.Header{"Grpc-Previous-Rpc-Attempts": {"1"}}, true},
		{http.Header{"X-Envoy-Attempt-Count": {"1"}}, false},
		{http.Header{"X-Envoy-Attempt-Count": {" 3 "}}, true},
		{http.Header{bulwark.AttemptHeader: {"-2"}}, false},
		{http.Header{bulwark.AttemptHeader: {"2", "3"}}, false},
		{http.Header{bulwark.AttemptHeader: {"99999999999999999999999"}}, false},
		{http.Header{bulwark.AttemptHeader: {"two"}}, false},
	} {
		if got := isRetry(tc.h); got != tc.want {
			t.Errorf("isRetry(%v) = %v, want %v", tc.h, got, tc.want)
		}
	}
}

// TestShedRetriesFirst offers a Shedder three times what it serves, half
// first attempts and half retries of the same priority, on virtual time:
// first attempts are served at a higher rate than retries.
func TestShedRetriesFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const service = 10 * time.Millisecond
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(service)
		})
		// 4 workers of 10 ms serve 400 a second; 1,200 are offered.
		s, err := NewShedder(h, ShedConfig{Workers: 4, Queue: 4, ReservedCritical: -1})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		const d = 5 * time.Second
		tick := time.NewTicker(time.Second / 1200)
		n := 0
		for end := time.Now().Add(d); time.Now().Before(end); n++ {
			<-tick.C
			retry := n%2 == 1
			wg.Go(func() {
				req := httptest.NewRequest(http.MethodGet, "/", nil)
				if retry {
					req.Header[bulwark.AttemptHeader] = []string{"2"}
				}
				s.ServeHTTP(httptest.NewRecorder(), req)
			})
		}
		tick.Stop()
		wg.Wait()
		st := s.Stats()
		var served uint64
		for _, v := range st.Served {
			served += v
		}
		first, retries := served-st.ServedRetries, st.ServedRetries
		t.Logf("offered %d/s (half retries): first attempts served %.0f/s, retries %.0f/s; shed %d (retries %d)",
			n/int(d.Seconds()), float64(first)/d.Seconds(), float64(retries)/d.Seconds(), st.ShedTotal(), st.ShedRetries)
		if first <= 2*retries {
			t.Errorf("first attempts served %d, retries %d: want first attempts well ahead", first, retries)
		}
		if st.ShedRetries <= st.ShedTotal()-st.ShedRetries {
			t.Errorf("shed: %d retries of %d, want retries the most shed", st.ShedRetries, st.ShedTotal())
		}
	})
}

// cores is a handler with a number of cores: each request holds one for
// service, the rest wait inside it, in order (a channel's waiters are
// served in order). cores can change while it runs.
type cores struct {
	service time.Duration
	tokens  chan struct{} // one per core
}

func newCores(service time.Duration, n int) *cores {
	c := &cores{service: service, tokens: make(chan struct{}, 100)}
	c.add(n)
	return c
}

// remove takes n cores away, waiting for them to come free.
func (c *cores) remove(n int) {
	for range n {
		<-c.tokens
	}
}

func (c *cores) add(n int) {
	for range n {
		c.tokens <- struct{}{}
	}
}

func (c *cores) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	select {
	case <-c.tokens:
	case <-r.Context().Done():
		return
	}
	time.Sleep(c.service)
	c.tokens <- struct{}{}
}

// TestShedAdaptiveWorkers: a handler with 20 "cores" of 20 ms each (the
// rest wait inside it) drops to 5 and back, under 600 requests a second,
// on virtual time; an adaptive Shedder's worker count comes down near 5
// and back up.
func TestShedAdaptiveWorkers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cores := newCores(20*time.Millisecond, 20)
		s, err := NewShedder(cores, ShedConfig{Workers: 64, Adaptive: true, Queue: 8, ReservedCritical: -1})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		send := func(d time.Duration) {
			tick := time.NewTicker(time.Second / 600)
			defer tick.Stop()
			for end := time.Now().Add(d); time.Now().Before(end); {
				<-tick.C
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(t.Context(), 250*time.Millisecond)
					defer cancel()
					s.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil).WithContext(ctx))
				})
			}
		}
		send(3 * time.Second)
		high := s.Stats().Workers
		cores.remove(15)
		send(3 * time.Second)
		drop := s.Stats().Workers
		cores.add(15)
		send(3 * time.Second)
		restored := s.Stats().Workers
		wg.Wait()
		t.Logf("workers: high %d, 3 s into the drop %d, 3 s after the restore %d", high, drop, restored)
		if drop < 3 || drop > 10 {
			t.Errorf("workers during the drop: %d, want in [3, 10]", drop)
		}
		if restored < 12 {
			t.Errorf("workers after the restore: %d, want ≥ 12", restored)
		}
	})
	if _, err := NewShedder(http.NotFoundHandler(), ShedConfig{Workers: 4, Adaptive: true, MinWorkers: 5}); !errors.Is(err, bulwark.ErrInvalidConfig) {
		t.Errorf("MinWorkers > Workers: %v, want ErrInvalidConfig", err)
	}
}
