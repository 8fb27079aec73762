package bulwark_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// noWait is a Backoff of no wait, for tests on a real server, which cannot
// run in a synctest bubble and would otherwise sleep.
func noWait(time.Duration, time.Duration, int, *http.Response) time.Duration { return 0 }

// countingServer answers code and counts the requests it got.
func countingServer(t *testing.T, code int) (*httptest.Server, *atomic.Int32) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(code)
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}
