package server

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bulwark-http/bulwark"
)

func TestDeadlineHandler(t *testing.T) {
	tests := []struct {
		name      string
		header    http.Header
		want      time.Duration // 0: no deadline set
		malformed []string
	}{
		{"none", http.Header{}, 0, nil},
		{"ours", http.Header{"Bulwark-Timeout-Ms": {"1500"}}, 1500 * time.Millisecond, nil},
		{"grpc seconds", http.Header{"Grpc-Timeout": {"2S"}}, 2 * time.Second, nil},
		{"grpc millis", http.Header{"Grpc-Timeout": {"250m"}}, 250 * time.Millisecond, nil},
		{"grpc hours capped", http.Header{"Grpc-Timeout": {"99999999H"}}, 5 * time.Second, nil},
		{"envoy", http.Header{"X-Envoy-Expected-Rq-Timeout-Ms": {"700"}}, 700 * time.Millisecond, nil},
		{"smallest wins", http.Header{"Bulwark-Timeout-Ms": {"3000"}, "Grpc-Timeout": {"900m"}, "X-Envoy-Expected-Rq-Timeout-Ms": {"1200"}}, 900 * time.Millisecond, nil},
		{"capped", http.Header{"Bulwark-Timeout-Ms": {"1000000000000"}}, 5 * time.Second, nil},
		{"beyond int64 capped", http.Header{"Bulwark-Timeout-Ms": {"99999999999999999999999"}}, 5 * time.Second, nil},
		{"zero ignored", http.Header{"Bulwark-Timeout-Ms": {"0"}}, 0, []string{"Bulwark-Timeout-Ms"}},
		{"negative ignored", http.Header{"Bulwark-Timeout-Ms": {"-5"}}, 0, []string{"Bulwark-Timeout-Ms"}},
		{"plus sign ignored", http.Header{"Bulwark-Timeout-Ms": {"+5"}}, 0, []string{"Bulwark-Timeout-Ms"}},
		{"garbage ignored", http.Header{"Bulwark-Timeout-Ms": {"soon"}}, 0, []string{"Bulwark-Timeout-Ms"}},
		{"two values ignored", http.Header{"Bulwark-Timeout-Ms": {"100", "200"}}, 0, []string{"Bulwark-Timeout-Ms"}},
		{"grpc bad unit", http.Header{"Grpc-Timeout": {"5s"}}, 0, []string{"Grpc-Timeout"}},
		{"grpc too many digits", http.Header{"Grpc-Timeout": {"123456789m"}}, 0, []string{"Grpc-Timeout"}},
		{"grpc zero", http.Header{"Grpc-Timeout": {"0S"}}, 0, []string{"Grpc-Timeout"}},
		{"bad one, good other", http.Header{"Bulwark-Timeout-Ms": {"x"}, "X-Envoy-Expected-Rq-Timeout-Ms": {"400"}}, 400 * time.Millisecond, []string{"Bulwark-Timeout-Ms"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var got time.Duration
				var malformed []string
				h := DeadlineHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					if d, ok := r.Context().Deadline(); ok {
						got = time.Until(d)
					}
					w.WriteHeader(http.StatusNoContent)
				}), DeadlineOptions{Max: 5 * time.Second, OnMalformed: func(name string) { malformed = append(malformed, name) }})
				req := httptest.NewRequest("GET", "/", nil)
				req.Header = tt.header
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != http.StatusNoContent {
					t.Errorf("status = %d, want 204: a bad header must never fail the request", rec.Code)
				}
				if got != tt.want {
					t.Errorf("deadline = %v, want %v", got, tt.want)
				}
				if strings.Join(malformed, ",") != strings.Join(tt.malformed, ",") {
					t.Errorf("malformed = %v, want %v", malformed, tt.malformed)
				}
			})
		})
	}
}

// End to end on loopback: the client's time left becomes the server's
// context deadline.
func TestDeadlineCrossesAHop(t *testing.T) {
	var left time.Duration
	srv := httptest.NewServer(DeadlineHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if d, ok := r.Context().Deadline(); ok {
			left = time.Until(d)
		}
	}), DeadlineOptions{}))
	defer srv.Close()
	client, err := bulwark.NewClient(bulwark.Config{Default: bulwark.Policy{Timeout: bulwark.Timeout{Total: 2 * time.Second, Attempt: time.Second}}})
	if err != nil {
		t.Fatal(err)
	}
	defer client.CloseIdleConnections()
	resp, err := client.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	// Loose on purpose: only that a deadline arrived and is no more than the
	// attempt timeout; how much of it the hop used depends on the machine.
	if left <= 0 || left > time.Second {
		t.Errorf("server's deadline was %v away, want within (0, 1s]", left)
	}
}

// TestHostileDeadlineHeader: DeadlineHandler serves every request; a bad
// header sets no deadline and is reported, an absurd one is capped.
func TestHostileDeadlineHeader(t *testing.T) {
	const max = 2 * time.Second
	for _, v := range []string{"0", "-5", "1000000000000", "12abc", "NaN", "1e3"} {
		for _, name := range []string{bulwark.DefaultDeadlineHeader, envoyTimeoutHeader, grpcTimeoutHeader} {
			var malformed []string
			var left time.Duration
			var has bool
			h := DeadlineHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				var dl time.Time
				dl, has = r.Context().Deadline()
				left = time.Until(dl)
			}), DeadlineOptions{Max: max, OnMalformed: func(h string) { malformed = append(malformed, h) }})
			req := httptest.NewRequest("GET", "/", nil)
			req.Header[name] = []string{v}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != 200 {
				t.Errorf("%s: %q: status %d, want 200", name, v, rec.Code)
			}
			switch {
			case v == "1000000000000" && name != grpcTimeoutHeader:
				if !has || left > max {
					t.Errorf("%s: %q: deadline %v (set %v); want capped at %v", name, v, left, has, max)
				}
			case has:
				t.Errorf("%s: %q: deadline %v set from a bad header", name, v, left)
			case len(malformed) != 1:
				t.Errorf("%s: %q: OnMalformed called %d times, want 1", name, v, len(malformed))
			}
		}
	}
}
