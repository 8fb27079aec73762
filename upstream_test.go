package bulwark

import (
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// countedUpstream is an httptest server that counts its open connections,
// so a test can check that a call left none behind. (The fault tests in
// faults/ have a fuller one that also records each request.)
type countedUpstream struct {
	srv  *httptest.Server
	open atomic.Int64
}

func newCountedUpstream(t *testing.T, h http.HandlerFunc) *countedUpstream {
	t.Helper()
	u := &countedUpstream{}
	u.srv = httptest.NewUnstartedServer(h)
	u.srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			u.open.Add(1)
		case http.StateClosed, http.StateHijacked:
			u.open.Add(-1)
		}
	}
	u.srv.Start()
	t.Cleanup(u.srv.Close)
	return u
}
