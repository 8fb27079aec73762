package bulwark

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// FuzzDeadlineHeaders feeds arbitrary values to every incoming deadline
// header: the handler never panics, never fails the request, and any
// deadline it sets is positive and no later than its cap.
func FuzzDeadlineHeaders(f *testing.F) {
	for _, s := range []string{"1500", "0", "-1", "+5", "1e3", " 42 ", "99999999999999999999", "2S", "250m", "99999999H", "0n", "5s", "1", "", "١٢٣"} {
		f.Add(s)
	}
	const max = 5 * time.Second
	f.Fuzz(func(t *testing.T, v string) {
		if d, ok := parseMillis(v); ok && d <= 0 {
			t.Fatalf("parseMillis(%q) = %v, true; want a positive duration", v, d)
		}
		if d, ok := ParseGRPCTimeout(v); ok && d <= 0 {
			t.Fatalf("ParseGRPCTimeout(%q) = %v, true; want a positive duration", v, d)
		}
		var set bool
		var left time.Duration
		h := DeadlineHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var dl time.Time
			dl, set = r.Context().Deadline()
			left = time.Until(dl)
		}), DeadlineOptions{Max: max})
		req := httptest.NewRequest("GET", "/", nil)
		req.Header[DefaultDeadlineHeader] = []string{v}
		req.Header[grpcTimeoutHeader] = []string{v}
		req.Header[envoyTimeoutHeader] = []string{v}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			t.Fatalf("header %q: status %d, want 200", v, rec.Code)
		}
		if set && (left > max || left <= -time.Second) {
			t.Fatalf("header %q: deadline %v away, want within the %v cap", v, left, max)
		}
	})
}

// FuzzNewConfig builds configs from arbitrary numbers and strings: New
// returns a Transport or an error, never panics, and a Transport it returns
// serves a request.
func FuzzNewConfig(f *testing.F) {
	f.Add(int64(0), int64(0), "", "tax.internal", int64(0), int64(0), 0, int64(0))
	f.Add(int64(-1), int64(5), "X Bad", "http://x/", int64(1), int64(2), -3, int64(-9))
	f.Add(int64(time.Second), int64(2*time.Second), "x-deadline", "[::1]:0", int64(3), int64(1), 1<<20, int64(time.Hour))
	f.Fuzz(func(t *testing.T, total, attempt int64, header, key string, upTotal, upAttempt int64, maxHosts int, idle int64) {
		cfg := Config{
			Base:    &stubBase{},
			Default: Policy{Timeout: Timeout{Total: time.Duration(total), Attempt: time.Duration(attempt), Header: header}},
			Upstreams: map[string]Policy{
				key: {Timeout: Timeout{Total: time.Duration(upTotal), Attempt: time.Duration(upAttempt)}},
			},
			MaxHosts: maxHosts % 4096,
			HostIdle: time.Duration(idle),
		}
		tr, err := New(cfg)
		if err != nil {
			if tr != nil {
				t.Fatalf("New returned a Transport with error %v", err)
			}
			return
		}
		for _, u := range []string{"http://tax.internal/", "http://" + key + "/"} {
			req, err := http.NewRequest("GET", u, nil)
			if err != nil {
				continue // a key New accepts may still not make a URL on its own
			}
			if resp, err := tr.RoundTrip(req); err == nil {
				resp.Body.Close()
			}
		}
	})
}
