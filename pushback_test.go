package bulwark

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// TestPushback: a 503 with Retry-After from one host pauses every request
// to that host until then, without sending, and leaves other hosts alone.
func TestPushback(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &scriptBase{step: func(n int, req *http.Request) (*http.Response, error) {
			if req.URL.Host == "a.test" && n == 1 {
				return response(req, 503, "Retry-After", "10"), nil
			}
			return response(req, 200), nil
		}}
		// MaxAttempts 1 isolates the pause from the first call's own retry.
		tr, clk, _ := newTestTransport(t, base, Policy{Retry: Retry{MaxAttempts: 1}})
		get := func(url, method string) (int, error) {
			t.Helper()
			var bs bodies
			req := newContractRequest(t, t.Context(), url, contractRequest{method: method, body: "p", replayable: true}, &bs)
			status, _, err := checkContract(t, tr, req, &bs)
			return status, err
		}
		if st, err := get("http://a.test/1", "GET"); st != 503 || err != nil {
			t.Fatalf("first call: %d, %v; want the 503", st, err)
		}
		start := clk.now()
		clk.advance(9 * time.Second)
		for _, m := range []string{"GET", "POST", "PUT"} {
			_, err := get("http://a.test/2", m)
			var pe *PushbackError
			if !errors.As(err, &pe) || !errors.Is(err, ErrPushback) {
				t.Fatalf("%s during the pause: err = %v, want a *PushbackError", m, err)
			}
			if pe.Host != "a.test:80" || !pe.Until.Equal(start.Add(10*time.Second)) {
				t.Errorf("PushbackError = %+v, want host a.test:80 until %v", pe, start.Add(10*time.Second))
			}
			if !strings.Contains(err.Error(), "a.test:80") {
				t.Errorf("error %q does not name the host", err)
			}
		}
		if got := base.calls(); got != 1 {
			t.Errorf("sent %d requests during the pause, want none", got-1)
		}
		if st, err := get("http://b.test/1", "GET"); st != 200 || err != nil {
			t.Errorf("other host during the pause: %d, %v; want 200", st, err)
		}
		clk.advance(time.Second)
		if st, err := get("http://a.test/3", "GET"); st != 200 || err != nil {
			t.Errorf("after the pause: %d, %v; want 200", st, err)
		}
	})
}

func TestPushbackCappedAndOff(t *testing.T) {
	for _, tc := range []struct {
		name   string
		policy Retry
		paused []time.Duration // offsets after the 503 that must be refused
		open   time.Duration   // first offset that must go through
	}{
		{"capped", Retry{MaxAttempts: 1, MaxRetryAfter: 5 * time.Second}, []time.Duration{0, 4 * time.Second}, 5 * time.Second},
		{"off", Retry{MaxAttempts: 1, NoPushback: true}, nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &scriptBase{step: func(n int, req *http.Request) (*http.Response, error) {
					if n == 1 {
						return response(req, 429, "Retry-After", "3600"), nil
					}
					return response(req, 200), nil
				}}
				tr, clk, _ := newTestTransport(t, base, Policy{Retry: tc.policy})
				do := func() error {
					resp, err := tr.RoundTrip(testRequest(t, t.Context(), "GET", "http://a.test/", noBody, ""))
					if err == nil {
						resp.Body.Close()
					}
					return err
				}
				do()
				start := clk.now()
				for _, off := range tc.paused {
					clk.advance(start.Add(off).Sub(clk.now()))
					if err := do(); !errors.Is(err, ErrPushback) {
						t.Errorf("at +%v: err = %v, want ErrPushback", off, err)
					}
				}
				clk.advance(start.Add(tc.open).Sub(clk.now()))
				if err := do(); err != nil {
					t.Errorf("at +%v: err = %v, want the request sent", tc.open, err)
				}
			})
		})
	}
}

// TestPushbackTerminalForRetry: a pause another request set is the answer,
// not a failure to retry around: the call fails at once, nothing sent, no
// sleep. A call that gets the 503 itself waits out the pause and retries.
func TestPushbackTerminalForRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &scriptBase{step: func(n int, req *http.Request) (*http.Response, error) {
			if n == 1 {
				return response(req, 503, "Retry-After", "10"), nil
			}
			return response(req, 200), nil
		}}
		tr, clk, waits := newTestTransport(t, base, Policy{})
		resp, err := tr.RoundTrip(testRequest(t, t.Context(), "GET", "http://a.test/", noBody, ""))
		if err != nil || resp.StatusCode != 200 || base.calls() != 2 || fmt.Sprint(*waits) != "[10s]" {
			t.Fatalf("got %v, %v after %d sends and waits %v; want 200 after 2 sends and a 10s wait", resp, err, base.calls(), *waits)
		}
		resp.Body.Close()

		// Another request's 503 paused the host: no retry, no wait.
		pb := layerOf[*pushbackLayer](t, tr, "http://a.test/")
		pb.pauseIn(&pb.paused, clk.now().Add(5*time.Second))
		*waits = nil
		_, err = tr.RoundTrip(testRequest(t, t.Context(), "GET", "http://a.test/", noBody, ""))
		var pe *PushbackError
		if !errors.As(err, &pe) || base.calls() != 2 || len(*waits) != 0 {
			t.Errorf("err = %v, sends %d, waits %v; want the *PushbackError at once", err, base.calls()-2, *waits)
		}
		var re *RetryError
		if errors.As(err, &re) {
			t.Errorf("err = %v: a single refused attempt should come back unwrapped", err)
		}
	})
}

// BenchmarkPushbackRejection: refusing during a pause allocates nothing.
func BenchmarkPushbackRejection(b *testing.B) {
	// Real time (a benchmark has no bubble): a pause of an hour outlasts
	// any -benchtime.
	base := &scriptBase{step: always(503, "Retry-After", "3600")}
	tr := mustNew(b, Config{Base: base, Default: only(Policy{Retry: Retry{MaxAttempts: 1, MaxRetryAfter: time.Hour}}, "pushback")})
	req := testRequest(b, b.Context(), "GET", "http://a.test/", noBody, "")
	resp, _ := tr.RoundTrip(req)
	resp.Body.Close()
	pb := layerOf[*pushbackLayer](b, tr, "http://a.test/")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := pb.roundTrip(req, call{start: time.Now()}); err == nil {
			b.Fatal("not refused")
		}
	}
}

// TestPushbackByShedPriority: a Shedder's refusal names the priority it
// refused, and its Retry-After pauses that priority and less important
// ones only, each refused priority until its own time; a 503 without the
// name pauses the whole host. Steps on one timeline of the fake clock.
func TestPushbackByShedPriority(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var prios []string // PriorityHeader of each request that reached the base
		base := &scriptBase{step: func(_ int, req *http.Request) (*http.Response, error) {
			prios = append(prios, req.Header.Get(PriorityHeader))
			// "/shed/<priority>/<seconds>" is a Shedder's refusal, "/plain/<seconds>" anyone's.
			switch parts := strings.Split(req.URL.Path, "/"); parts[1] {
			case "shed":
				return response(req, 503, "Retry-After", parts[3], ShedPriorityHeader, parts[2], NoRetryHeader, "1"), nil
			case "plain":
				return response(req, 503, "Retry-After", parts[2]), nil
			}
			return response(req, 200), nil
		}}
		tr, clk, _ := newTestTransport(t, base, Policy{Retry: Retry{MaxAttempts: 1}})
		t0 := clk.now()
		at := func(d time.Duration) time.Time { return t0.Add(d) }
		// how sets a request's priority: by header, WithPriority or method.
		type how int
		const (
			byHeader how = iota
			byContext
			byMethod
		)
		steps := []struct {
			at    time.Duration
			path  string
			how   how
			prio  Priority // for header and context; method: GET is normal, POST high
			until time.Time
		}{
			{0, "/shed/low/10", byHeader, PriorityLow, time.Time{}}, // the refusal itself goes through
			{0, "/", byHeader, PriorityLow, at(10 * time.Second)},
			{0, "/", byContext, PriorityTest, at(10 * time.Second)},
			{0, "/", byHeader, PriorityNormal, time.Time{}},
			{0, "/", byContext, PriorityHigh, time.Time{}},
			{0, "/", byHeader, PriorityCritical, time.Time{}},
			{2 * time.Second, "/shed/HIGH/3", byMethod, PriorityHigh, time.Time{}},
			{2 * time.Second, "/", byMethod, PriorityHigh, at(5 * time.Second)},
			{2 * time.Second, "/", byMethod, PriorityNormal, at(5 * time.Second)},
			{2 * time.Second, "/", byHeader, PriorityLow, at(10 * time.Second)}, // its own, longer pause
			{2 * time.Second, "/", byContext, PriorityCritical, time.Time{}},
			{5 * time.Second, "/", byMethod, PriorityHigh, time.Time{}},
			{5 * time.Second, "/", byHeader, PriorityNormal, time.Time{}},
			{5 * time.Second, "/", byHeader, PriorityTest, at(10 * time.Second)},
			{10 * time.Second, "/", byHeader, PriorityLow, time.Time{}},
			{10 * time.Second, "/shed/nonsense/4", byHeader, PriorityLow, time.Time{}}, // unreadable: the whole host
			{10 * time.Second, "/", byHeader, PriorityCritical, at(14 * time.Second)},
			{14 * time.Second, "/plain/5", byHeader, PriorityTest, time.Time{}},
			{14 * time.Second, "/", byHeader, PriorityCritical, at(19 * time.Second)},
			{14 * time.Second, "/", byContext, PriorityCritical, at(19 * time.Second)},
			{19 * time.Second, "/", byHeader, PriorityCritical, time.Time{}},
		}
		for i, st := range steps {
			clk.advance(at(st.at).Sub(clk.now()))
			ctx, m := t.Context(), http.MethodGet
			switch st.how {
			case byContext:
				ctx = WithPriority(ctx, st.prio)
			case byMethod:
				if st.prio == PriorityHigh {
					m = http.MethodPost
				}
			}
			req := testRequest(t, ctx, m, "http://a.test"+st.path, noBody, "")
			if st.how == byHeader {
				req.Header.Set(PriorityHeader, st.prio.String())
			}
			sentBefore := base.calls()
			resp, err := tr.RoundTrip(req)
			if err == nil {
				resp.Body.Close()
			}
			var pe *PushbackError
			switch {
			case st.until.IsZero() && err != nil:
				t.Errorf("step %d (+%v %s %v): %v, want it sent", i, st.at, st.path, st.prio, err)
			case !st.until.IsZero() && (!errors.As(err, &pe) || !pe.Until.Equal(st.until) || base.calls() != sentBefore):
				t.Errorf("step %d (+%v %s %v): %v, want a *PushbackError until +%v and nothing sent", i, st.at, st.path, st.prio, err, st.until.Sub(t0))
			}
		}
		// WithPriority's priority reached the upstream as PriorityHeader; a
		// method's default is not sent.
		want := []string{"low", "normal", "high", "critical", "", "critical", "", "normal", "low", "low", "test", "critical"}
		if !slices.Equal(prios, want) {
			t.Errorf("PriorityHeader sent %q, want %q", prios, want)
		}
	})
}

// TestHostileRetryAfter: a 503 with each broken Retry-After is retried on
// the backoff (the header ignored and counted), never slept on for what it
// claims, and never pauses the host.
func TestHostileRetryAfter(t *testing.T) {
	tests := []struct {
		name    string
		vals    []string
		ignored bool
	}{
		{"negative", []string{"-1"}, true},
		{"eleven digits", []string{"99999999999"}, true},
		{"date in 1900", []string{"Mon, 01 Jan 1900 00:00:00 GMT"}, false}, // past: retry now
		{"garbage", []string{"\x00soon™"}, true},
		{"two conflicting", []string{"1", "3600"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &scriptBase{step: func(_ int, req *http.Request) (*http.Response, error) {
					resp := response(req, 503)
					resp.Header["Retry-After"] = tt.vals
					return resp, nil
				}}
				tr, _, waits := newTestTransport(t, base, Policy{Retry: Retry{MaxAttempts: 2, Base: 10 * time.Millisecond, Cap: 10 * time.Millisecond}})
				resp, err := tr.RoundTrip(testRequest(t, t.Context(), "GET", "http://api.test/", noBody, ""))
				if err != nil {
					t.Fatalf("err = %v; want the last 503", err)
				}
				resp.Body.Close()
				if resp.StatusCode != 503 || base.calls() != 2 {
					t.Errorf("status %d after %d attempts; want 503 after 2", resp.StatusCode, base.calls())
				}
				for _, w := range *waits {
					if w > 10*time.Millisecond {
						t.Errorf("slept %v; want at most the 10ms backoff", w)
					}
				}
				if got := tr.Snapshot().RetryAfterIgnored > 0; got != tt.ignored {
					t.Errorf("RetryAfterIgnored > 0 = %v, want %v", got, tt.ignored)
				}
				// The host is not paused: the next call is sent.
				n := base.calls()
				if resp, err := tr.RoundTrip(testRequest(t, t.Context(), "GET", "http://api.test/", noBody, "")); err != nil {
					t.Errorf("next call: %v; want it sent", err)
				} else {
					resp.Body.Close()
				}
				if base.calls() == n {
					t.Error("a broken Retry-After paused the host")
				}
			})
		})
	}
}

// TestRateLimitPausesHost: a 200 saying the quota is spent until a reset
// pauses the host until then, capped like Retry-After; the pause ends on
// time.
func TestRateLimitPausesHost(t *testing.T) {
	for _, tc := range []struct {
		name  string
		h     http.Header
		pause time.Duration
	}{
		{"x-ratelimit", http.Header{"X-RateLimit-Remaining": {"0"}, "X-RateLimit-Reset": {"5"}}, 5 * time.Second},
		{"ietf", http.Header{"RateLimit": {`"default";r=0;t=3`}}, 3 * time.Second},
		{"capped", http.Header{"X-RateLimit-Remaining": {"0"}, "X-RateLimit-Reset": {"3600"}}, 10 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := http.Header{}
				for k, v := range tc.h {
					h[http.CanonicalHeaderKey(k)] = v
				}
				base := &statusBase{codes: []int{200}, header: h}
				tr := mustNew(t, Config{Base: base, Default: only(Policy{Retry: Retry{MaxRetryAfter: 10 * time.Second}}, "pushback")})
				if code, err := sendOnce(t, tr, http.MethodGet, "http://rl.test/"); err != nil || code != 200 {
					t.Fatalf("first: %d, %v", code, err)
				}
				start := time.Now()
				_, err := sendOnce(t, tr, http.MethodGet, "http://rl.test/")
				var pe *PushbackError
				if !errors.As(err, &pe) || pe.Until.Sub(start) != tc.pause {
					t.Fatalf("second: %v, want a pause of %v", err, tc.pause)
				}
				time.Sleep(tc.pause)
				if _, err := sendOnce(t, tr, http.MethodGet, "http://rl.test/"); err != nil {
					t.Errorf("after the reset: %v, want it sent", err)
				}
				if n := base.sent(); n != 2 {
					t.Errorf("base got %d, want 2", n)
				}
				if s := tr.Snapshot(); s.RetryAfterIgnored != 0 {
					t.Errorf("ignored %d, want 0", s.RetryAfterIgnored)
				}
			})
		})
	}
}
