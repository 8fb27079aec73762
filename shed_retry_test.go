package bulwark

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

func TestIsRetry(t *testing.T) {
	for _, tc := range []struct {
		h    http.Header
		want bool
	}{
		{http.Header{}, false},
		{http.Header{AttemptHeader: {"1"}}, false},
		{http.Header{AttemptHeader: {"2"}}, true},
		{http.Header{"Grpc-Previous-Rpc-Attempts": {"0"}}, false},
		{http.Header{"Grpc-Previous-Rpc-Attempts": {"1"}}, true},
		{http.Header{"X-Envoy-Attempt-Count": {"1"}}, false},
		{http.Header{"X-Envoy-Attempt-Count": {" 3 "}}, true},
		{http.Header{AttemptHeader: {"-2"}}, false},
		{http.Header{AttemptHeader: {"2", "3"}}, false},
		{http.Header{AttemptHeader: {"99999999999999999999999"}}, false},
		{http.Header{AttemptHeader: {"two"}}, false},
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
					req.Header[AttemptHeader] = []string{"2"}
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

// TestShedAdaptiveWorkers: a handler with 20 "cores" of 20 ms each (the
// rest wait inside it) drops to 5 and back, under 600 requests a second,
// on virtual time; an adaptive Shedder's worker count comes down near 5
// and back up.
func TestShedAdaptiveWorkers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cores := newCoresBase(20*time.Millisecond, 20)
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			resp, err := cores.RoundTrip(r)
			if err == nil {
				resp.Body.Close()
			}
		})
		s, err := NewShedder(h, ShedConfig{Workers: 64, Adaptive: true, Queue: 8, ReservedCritical: -1})
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
	if _, err := NewShedder(http.NotFoundHandler(), ShedConfig{Workers: 4, Adaptive: true, MinWorkers: 5}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("MinWorkers > Workers: %v, want ErrInvalidConfig", err)
	}
}
