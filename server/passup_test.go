package server

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/bulwark-http/bulwark"
)

// failBelow is a handler that makes a bulwark call below, over a base that
// answers status with header, and answers code when the call did not
// answer 200.
func failBelow(t *testing.T, p bulwark.Policy, status int, header http.Header, code int) http.Handler {
	tr, err := bulwark.New(bulwark.Config{Default: p, Base: roundTrip(func(req *http.Request) (*http.Response, error) {
		rec := httptest.NewRecorder()
		for k, v := range header {
			rec.Header()[k] = v
		}
		rec.WriteHeader(status)
		return rec.Result(), nil
	})})
	if err != nil {
		t.Fatal(err)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, _ := http.NewRequestWithContext(r.Context(), http.MethodGet, "http://below.test/", nil)
		resp, err := tr.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				w.WriteHeader(http.StatusOK)
				return
			}
		}
		w.WriteHeader(code)
	})
}

type roundTrip func(*http.Request) (*http.Response, error)

func (f roundTrip) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestPassUpMarks: the server half marks a 5xx or 429 answer
// NoRetryFromBelow when a call below failed in a way the tier below dealt
// with, and nothing else: not a success, not a 4xx, not an answer after a
// failure below that nobody retried, not over the handler's own
// NoRetryHeader. DeadlineHandler and PassUp do the same, and nested they
// attach one record.
func TestPassUpMarks(t *testing.T) {
	noRetry := bulwark.Policy{Retry: bulwark.Retry{Disabled: true}, Breaker: bulwark.Breaker{Disabled: true}}
	for _, tc := range []struct {
		name   string
		p      bulwark.Policy
		status int
		header http.Header
		code   int
		want   string // NoRetryHeader on the answer
	}{
		{"a shed below, answered 503", noRetry, 503, http.Header{bulwark.NoRetryHeader: {"1"}}, 503, bulwark.NoRetryFromBelow},
		{"a shed below, answered 502", noRetry, 503, http.Header{bulwark.NoRetryHeader: {"1"}}, 502, bulwark.NoRetryFromBelow},
		{"a shed below, answered 429", noRetry, 503, http.Header{bulwark.NoRetryHeader: {"1"}}, 429, bulwark.NoRetryFromBelow},
		{"a shed below, answered 404", noRetry, 503, http.Header{bulwark.NoRetryHeader: {"1"}}, 404, ""},
		{"retried below and still failed", bulwark.Policy{Breaker: bulwark.Breaker{Disabled: true}}, 503, nil, 503, bulwark.NoRetryFromBelow},
		{"failed below once, nobody retried", noRetry, 503, nil, 503, ""},
		{"a success below", noRetry, 200, nil, 200, ""},
	} {
		for _, wrap := range []struct {
			name string
			f    func(http.Handler) http.Handler
		}{
			{"DeadlineHandler", func(h http.Handler) http.Handler { return DeadlineHandler(h, DeadlineOptions{}) }},
			{"PassUp", PassUp},
			{"nested", func(h http.Handler) http.Handler { return PassUp(DeadlineHandler(PassUp(h), DeadlineOptions{})) }},
		} {
			t.Run(tc.name+"/"+wrap.name, func(t *testing.T) {
				h := wrap.f(failBelow(t, tc.p, tc.status, tc.header, tc.code))
				rec := httptest.NewRecorder()
				r := httptest.NewRequest("GET", "/", nil)
				r.Header.Set(bulwark.DefaultDeadlineHeader, "1000")
				h.ServeHTTP(rec, r)
				if rec.Code != tc.code {
					t.Fatalf("answered %d, want %d", rec.Code, tc.code)
				}
				if got := rec.Header().Get(bulwark.NoRetryHeader); got != tc.want {
					t.Errorf("%s = %q, want %q", bulwark.NoRetryHeader, got, tc.want)
				}
			})
		}
	}
	t.Run("the handler's own header stays", func(t *testing.T) {
		inner := failBelow(t, noRetry, 503, http.Header{bulwark.NoRetryHeader: {"1"}}, 503)
		h := PassUp(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set(bulwark.NoRetryHeader, "mine")
			inner.ServeHTTP(w, r)
		}))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		if got := rec.Header().Values(bulwark.NoRetryHeader); len(got) != 1 || got[0] != "mine" {
			t.Errorf("%s = %q, want the handler's own", bulwark.NoRetryHeader, got)
		}
	})
	t.Run("flush and unwrap", func(t *testing.T) {
		h := PassUp(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if _, ok := w.(http.Flusher); !ok {
				t.Error("the writer is no http.Flusher")
			}
			if err := http.NewResponseController(w).Flush(); err != nil {
				t.Errorf("ResponseController.Flush: %v", err)
			}
		}))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		if !rec.Flushed {
			t.Error("not flushed through")
		}
	})
}

// BenchmarkPassUp is the incoming cost of the server half's record, paired
// in one run: DeadlineHandler with and without it, with the deadline
// header bulwark's client sends and without one, and PassUp against the
// bare handler. The handler reads its context's deadline, as one that
// calls below does.
func BenchmarkPassUp(b *testing.B) {
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = r.Context().Deadline()
		w.WriteHeader(http.StatusOK)
	})
	run := func(b *testing.B, h http.Handler, header bool) {
		w := &nopWriter{h: http.Header{}}
		r := httptest.NewRequestWithContext(context.Background(), "GET", "/", nil)
		if header {
			r.Header.Set(bulwark.DefaultDeadlineHeader, "1000")
		}
		b.ReportAllocs()
		for b.Loop() {
			h.ServeHTTP(w, r)
		}
	}
	plain := &deadlineHandler{next: handler, opts: DeadlineOptions{Max: DefaultMaxDeadline, Header: bulwark.DefaultDeadlineHeader}, noRecord: true}
	recorded := DeadlineHandler(handler, DeadlineOptions{})
	b.Run("deadline-header/no-record", func(b *testing.B) { run(b, plain, true) })
	b.Run("deadline-header/record", func(b *testing.B) { run(b, recorded, true) })
	// Without a header from a bulwark client there is no record: the
	// same work as before.
	b.Run("no-header/no-record", func(b *testing.B) { run(b, plain, false) })
	b.Run("no-header/record", func(b *testing.B) { run(b, recorded, false) })
	b.Run("bare", func(b *testing.B) { run(b, handler, false) })
	b.Run("PassUp", func(b *testing.B) { run(b, PassUp(handler), false) })
}
