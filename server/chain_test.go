package server

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bulwark-http/bulwark"
)

// memRoundTripper serves a request with a handler in memory, as a server
// over a network would: the handler's request has a context of its own,
// cancelled when the caller's is but carrying none of its values (a
// CallRecord of the caller's service must not leak into the callee's), and
// its own copy of the header.
type memRoundTripper struct{ h http.Handler }

func (m memRoundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		req.Body.Close()
	}
	if err := req.Context().Err(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := context.AfterFunc(req.Context(), cancel)
	defer stop()
	sreq := httptest.NewRequestWithContext(ctx, req.Method, req.URL.String(), nil)
	sreq.Header = req.Header.Clone()
	rec := httptest.NewRecorder()
	m.h.ServeHTTP(rec, sreq)
	resp := rec.Result()
	resp.Request = req
	return resp, nil
}

// chainFigures is what one run of the chain measured.
type chainFigures struct {
	offeredBlip, bottomBlip int // top calls started, bottom requests served, during the blip
	after, afterOK          int // top calls started in the 4 s after the blip, and answered 200
	late, lateOK            int // of those, the ones started from 1.5 s after the blip
}

func (f chainFigures) load() float64       { return float64(f.bottomBlip) / float64(f.offeredBlip) }
func (f chainFigures) afterShare() float64 { return float64(f.afterOK) / float64(f.after) }
func (f chainFigures) lateShare() float64  { return float64(f.lateOK) / float64(f.late) }

// The chain's timing: a healthy warm-up, the blip of instant 503s at the
// bottom, and the 4 s after it that the figures judge.
const (
	chainRate    = 200 // top calls a second
	chainWarm    = 5 * time.Second
	chainBlip    = 2 * time.Second
	chainAfter   = 4 * time.Second
	chainLate    = 1500 * time.Millisecond
	chainWork    = 5 * time.Millisecond // the bottom's time to answer
	chainHop     = time.Millisecond     // each middle service's own work
	chainPatient = 2 * time.Second      // the top caller's deadline
)

// runChain runs a chain of n tiers in a synctest bubble: a caller at the
// top offering chainRate calls a second through a bulwark client to the
// first of n services, each of which but the last calls the next through
// a bulwark client of its own; every service is wrapped in
// DeadlineHandler, the server half; every client has policy p. The last
// service, the bottom, answers 503 at once during the blip. A middle
// service answers 503 when its call below fails.
func runChain(t *testing.T, n int, p bulwark.Policy) chainFigures {
	var f chainFigures
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		blipFrom, blipTo := start.Add(chainWarm), start.Add(chainWarm+chainBlip)
		var bottomBlip atomic.Int64
		bottom := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(chainWork)
			if now := time.Now(); !now.Before(blipFrom) && now.Before(blipTo) {
				bottomBlip.Add(1)
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			io.WriteString(w, "ok")
		})
		newClient := func(next http.Handler) *bulwark.Transport {
			tr, err := bulwark.New(bulwark.Config{Base: memRoundTripper{DeadlineHandler(next, DeadlineOptions{})}, Default: p})
			if err != nil {
				t.Fatal(err)
			}
			return tr
		}
		var next http.Handler = bottom
		var clients []*bulwark.Transport
		for i := n - 1; i >= 1; i-- {
			tr, url := newClient(next), fmt.Sprintf("http://tier%d.test/", i+1)
			clients = append(clients, tr)
			next = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				time.Sleep(chainHop)
				req, _ := http.NewRequestWithContext(r.Context(), http.MethodGet, url, nil)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					w.WriteHeader(http.StatusServiceUnavailable)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					w.WriteHeader(http.StatusServiceUnavailable)
					return
				}
				io.WriteString(w, "ok")
			})
		}
		top := newClient(next)
		clients = append(clients, top)
		defer func() {
			// Which tier retried and which tripped, and the failures
			// passed up, counted apart.
			for _, c := range clients {
				for _, h := range c.Snapshot().Hosts {
					var retries int64
					var trips uint64
					if h.Budget != nil {
						retries = h.Budget.Retries
					}
					if h.Breaker != nil {
						trips = h.Breaker.TotalTrips
					}
					t.Logf("  calls to %s: retries in the last 10 s %d, breaker trips %d, answers passed up %d", h.Host, retries, trips, h.PassedUp)
				}
			}
		}()

		var (
			wg sync.WaitGroup
			mu sync.Mutex
		)
		end := blipTo.Add(chainAfter)
		tick := time.NewTicker(time.Second / chainRate)
		defer tick.Stop()
		for now := time.Now(); now.Before(end); now = <-tick.C {
			wg.Add(1)
			go func(at time.Time) {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), chainPatient)
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://tier1.test/", nil)
				resp, err := top.RoundTrip(req)
				ok := err == nil && resp.StatusCode == http.StatusOK
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				mu.Lock()
				defer mu.Unlock()
				switch {
				case at.Before(blipFrom):
				case at.Before(blipTo):
					f.offeredBlip++
				default:
					f.after++
					if ok {
						f.afterOK++
					}
					if !at.Before(blipTo.Add(chainLate)) {
						f.late++
						if ok {
							f.lateOK++
						}
					}
				}
			}(now)
		}
		wg.Wait()
		f.bottomBlip = int(bottomBlip.Load())
	})
	return f
}

// TestChainFailsAndRecoversAsOne is issue 30's measure: a chain of N
// tiers (N = 3 and 5) with bulwark clients at every tier and the server
// half at every service, 200 calls a second offered at the top, a 2 s
// blip of instant 503s at the bottom. With package defaults, and with
// every breaker off (retries alone): the bottom's load during the blip at
// most 1.3 × what the top offered; at least 99 % of top calls answered
// from 1.5 s after the blip ends, and 90 % over the 4 s after it.
func TestChainFailsAndRecoversAsOne(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    bulwark.Policy
	}{
		{"defaults", bulwark.Policy{}},
		{"breakers off", bulwark.Policy{Breaker: bulwark.Breaker{Disabled: true}}},
	} {
		for _, n := range []int{3, 5} {
			t.Run(fmt.Sprintf("%s/N=%d", tc.name, n), func(t *testing.T) {
				f := runChain(t, n, tc.p)
				t.Logf("N=%d %s: bottom load during the blip %.2f × offered (%d of %d); answered in the 4 s after %.1f %% (%d of %d), from 1.5 s after %.1f %% (%d of %d)",
					n, tc.name, f.load(), f.bottomBlip, f.offeredBlip, 100*f.afterShare(), f.afterOK, f.after, 100*f.lateShare(), f.lateOK, f.late)
				if f.offeredBlip < chainRate*int(chainBlip/time.Second)*9/10 {
					t.Fatalf("only %d top calls offered during the blip", f.offeredBlip)
				}
				if l := f.load(); l > 1.3 {
					t.Errorf("bottom load during the blip %.2f × offered, want ≤ 1.3", l)
				}
				if s := f.lateShare(); s < 0.99 {
					t.Errorf("answered from 1.5 s after the blip %.1f %%, want ≥ 99 %%", 100*s)
				}
				if s := f.afterShare(); s < 0.90 {
					t.Errorf("answered over the 4 s after the blip %.1f %%, want ≥ 90 %%", 100*s)
				}
			})
		}
	}
}
