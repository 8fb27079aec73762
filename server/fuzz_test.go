package server

import (
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/bulwark-http/bulwark/internal/wire"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
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
		if d, ok := wire.ParseMillis(v); ok && d <= 0 {
			t.Fatalf("wire.ParseMillis(%q) = %v, true; want a positive duration", v, d)
		}
		if d, ok := wire.ParseGRPCTimeout(v); ok && d <= 0 {
			t.Fatalf("wire.ParseGRPCTimeout(%q) = %v, true; want a positive duration", v, d)
		}
		var set bool
		var left time.Duration
		h := DeadlineHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var dl time.Time
			dl, set = r.Context().Deadline()
			left = time.Until(dl)
		}), DeadlineOptions{Max: max})
		req := httptest.NewRequest("GET", "/", nil)
		req.Header[bulwark.DefaultDeadlineHeader] = []string{v}
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

// FuzzNewShedder builds Shedders from arbitrary numbers for every numeric
// field of ShedConfig: NewShedder returns a Shedder or a *ConfigError, never
// panics, and a Shedder it returns serves a request and refuses one with a
// Retry-After of whole seconds that bulwark's own client would obey.
func FuzzNewShedder(f *testing.F) {
	f.Add(0, 0, int64(0), 0.0, int64(0))
	f.Add(-1, -1, int64(-1), -1.0, int64(-1))
	f.Add(4, 2, int64(time.Second), 0.5, int64(1500*time.Millisecond))
	f.Add(1, 1<<40, int64(math.MaxInt64), 0.999999, int64(math.MaxInt64))
	f.Add(math.MaxInt, math.MinInt, int64(math.MinInt64), math.Inf(-1), int64(24*time.Hour))
	f.Fuzz(func(t *testing.T, workers, queue int, maxWait int64, reserved float64, retryAfter int64) {
		cfg := ShedConfig{Workers: workers, Queue: queue, MaxQueueWait: time.Duration(maxWait),
			ReservedCritical: reserved, RetryAfter: time.Duration(retryAfter),
			// Registrations last as long as the provider: none on the global one.
			MeterProvider: metricnoop.NewMeterProvider()}
		ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
		s, err := NewShedder(ok, cfg)
		if err != nil {
			var ce *bulwark.ConfigError
			if s != nil || !errors.As(err, &ce) || !errors.Is(err, bulwark.ErrInvalidConfig) || !strings.HasPrefix(err.Error(), "bulwark: ") {
				t.Fatalf("NewShedder(%+v) = %v, %v; want nil and a *ConfigError", cfg, s, err)
			}
			return
		}
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		if rec.Code != http.StatusNoContent {
			t.Fatalf("NewShedder(%+v): an idle Shedder answered %d, want the handler's 204", cfg, rec.Code)
		}
		rec = httptest.NewRecorder()
		s.refuse(rec, httptest.NewRequest("GET", "/", nil), bulwark.PriorityNormal, ShedQueueFull)
		v := rec.Result().Header["Retry-After"]
		// What the client obeys: one value of delta-seconds, digits only,
		// no longer than wire.MaxRetryAfter.
		n, err := strconv.ParseInt(strings.Join(v, ","), 10, 64)
		if len(v) != 1 || !wire.AllDigits(v[0]) || err != nil || n < 1 || time.Duration(n)*time.Second > wire.MaxRetryAfter {
			t.Fatalf("NewShedder(%+v): refusal's Retry-After %q, want whole seconds ≥ 1 that a bulwark client obeys", cfg, v)
		}
	})
}
