package bulwark

// Hostile and broken input, end to end through the Transport: each case
// gets a clear outcome, and nothing is lost, buffered without bound, sent
// twice or leaked.

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
)

// TestHostileRedirectLoop: http.Client stops a redirect loop with an error
// after its ten hops; every hop is a bounded call of its own.
func TestHostileRedirectLoop(t *testing.T) {
	var hops atomic.Int64
	up := newCountedUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		hops.Add(1)
		http.Redirect(w, r, r.URL.Path, http.StatusFound)
	})
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	c := &http.Client{Transport: mustNew(t, Config{Base: base})}
	resp, err := c.Get(up.srv.URL + "/loop")
	if err == nil {
		resp.Body.Close()
		t.Fatal("a redirect loop succeeded")
	}
	if !strings.Contains(err.Error(), "redirects") || hops.Load() > 11 {
		t.Errorf("err = %v after %d hops; want the client's redirect limit", err, hops.Load())
	}
}
