package bulwark_test

// What black-box reviews found at the seams of net/http, go-retryablehttp
// and bulwark, over real sockets on 127.0.0.1 (the seam table, in
// seams_test.go, has the rest).

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

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
