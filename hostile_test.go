package bulwark

// Hostile and broken input, end to end through the Transport: each case
// gets a clear outcome, and nothing is lost, buffered without bound, sent
// twice or leaked.

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
)

// halfBody errors after some bytes, as a connection cut mid-body does.
type halfBody struct{ n int }

func (b *halfBody) Read(p []byte) (int, error) {
	if b.n <= 0 {
		return 0, errors.New("connection cut mid-body")
	}
	n := min(len(p), b.n)
	b.n -= n
	return n, nil
}
func (b *halfBody) Close() error { return nil }

// TestHostileBodyErrorsHalfway: the caller gets the response and the read
// error; the call is not retried (it already succeeded as far as the
// stack can know) and the bulkhead slot comes back.
func TestHostileBodyErrorsHalfway(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &scriptBase{step: func(_ int, req *http.Request) (*http.Response, error) {
			resp := response(req, 200)
			resp.Body, resp.ContentLength = &halfBody{n: 100}, 1000
			return resp, nil
		}}
		tr, _, _ := newTestTransport(t, base, Policy{})
		resp, err := tr.RoundTrip(testRequest(t, t.Context(), "GET", "http://api.test/", noBody, ""))
		if err != nil {
			t.Fatal(err)
		}
		got, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		if len(got) != 100 || rerr == nil {
			t.Errorf("read %d bytes, error %v; want 100 and the cut", len(got), rerr)
		}
		if base.calls() != 1 {
			t.Errorf("sent %d times, want 1", base.calls())
		}
		wantStats(t, tr, "api.test:80", 0, 0)
	})
}

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
