package bulwark

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	in := func(d time.Duration) time.Time { return now.Add(d) }
	tests := []struct {
		v    []string
		want time.Duration
		res  retryAfterResult
	}{
		{nil, 0, retryAfterAbsent},
		{[]string{"0"}, 0, retryAfterValid},
		{[]string{"5"}, 5 * time.Second, retryAfterValid},
		{[]string{" 7\t"}, 7 * time.Second, retryAfterValid},
		{[]string{"86400"}, 24 * time.Hour, retryAfterValid},
		{[]string{"86401"}, 0, retryAfterIgnored},                // absurd
		{[]string{"99999999999999999999"}, 0, retryAfterIgnored}, // absurd, would overflow
		{[]string{"-1"}, 0, retryAfterIgnored},
		{[]string{"+5"}, 0, retryAfterIgnored},
		{[]string{"1.5"}, 0, retryAfterIgnored},
		{[]string{""}, 0, retryAfterIgnored},
		{[]string{"soon"}, 0, retryAfterIgnored},
		{[]string{"5", "6"}, 0, retryAfterIgnored},
		{[]string{in(90 * time.Second).Format(http.TimeFormat)}, 90 * time.Second, retryAfterValid},         // IMF-fixdate
		{[]string{in(90 * time.Second).Format(time.RFC850)}, 90 * time.Second, retryAfterValid},             // obsolete RFC 850
		{[]string{in(90 * time.Second).Format(time.ANSIC)}, 90 * time.Second, retryAfterValid},              // asctime
		{[]string{in(-time.Hour).Format(http.TimeFormat)}, 0, retryAfterValid},                              // past: now
		{[]string{time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC).Format(http.TimeFormat)}, 0, retryAfterValid}, // far past: now
		{[]string{in(48 * time.Hour).Format(http.TimeFormat)}, 0, retryAfterIgnored},                        // absurd
		{[]string{"Sun, 31 Feb 2026 25:61:00 GMT"}, 0, retryAfterIgnored},
	}
	for _, tt := range tests {
		got, res := parseRetryAfter(tt.v, now)
		if got != tt.want || res != tt.res {
			t.Errorf("parseRetryAfter(%q) = %v, %d; want %v, %d", tt.v, got, res, tt.want, tt.res)
		}
	}
}

func FuzzParseRetryAfter(f *testing.F) {
	for _, s := range []string{"5", "-1", "Sun, 01 Mar 2026 12:00:05 GMT", "999999999", "", " 1 "} {
		f.Add(s)
	}
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, s string) {
		d, res := parseRetryAfter([]string{s}, now)
		if d < 0 || d > maxRetryAfterHeader || (res != retryAfterValid && d != 0) {
			t.Fatalf("parseRetryAfter(%q) = %v, %d", s, d, res)
		}
	})
}

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
		layerOf[*pushbackStage](t, tr, "http://a.test/").pause(clk.now().Add(5 * time.Second))
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
	pb := layerOf[*pushbackStage](b, tr, "http://a.test/")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := pb.roundTrip(req, call{start: time.Now()}); err == nil {
			b.Fatal("not refused")
		}
	}
}
