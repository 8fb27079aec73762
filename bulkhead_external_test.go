package bulwark_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bulwark-http/bulwark"
)

// TestCancelledCallFreesItsSlot: a caller that cancels its request's
// context after the headers and never closes the body (net/http's
// Transport frees the connection on that cancel) holds no bulkhead slot
// once the cancel is done: 1,000 such calls leave the adaptive bulkhead
// empty, and the calls after them are sent. A caller that closes the body
// after its cancel gives its slot back once, not twice.
func TestCancelledCallFreesItsSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := rtFunc(func(req *http.Request) (*http.Response, error) {
			time.Sleep(5 * time.Millisecond)
			return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok")), Request: req}, nil
		})
		tr, err := bulwark.New(bulwark.Config{Base: base})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		inFlight := func() int {
			hs := tr.Snapshot().Host("slot.test:80")
			if len(hs) != 1 || hs[0].Bulkhead == nil {
				t.Fatalf("no bulkhead for slot.test: %+v", hs)
			}
			return hs[0].Bulkhead.InFlight
		}
		send := func(ctx context.Context) (*http.Response, error) {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://slot.test/x", nil)
			if err != nil {
				t.Fatal(err)
			}
			return tr.RoundTrip(req)
		}
		var kept []*http.Response
		for i := range 1000 {
			ctx, cancel := context.WithCancel(t.Context())
			resp, err := send(ctx)
			if err != nil {
				t.Fatalf("call %d: %v", i, err)
			}
			cancel() // the body is never closed
			kept = append(kept, resp)
			time.Sleep(10 * time.Millisecond)
		}
		synctest.Wait()
		if n := inFlight(); n != 0 {
			t.Errorf("after 1,000 calls cancelled with their bodies open: %d in flight, want 0", n)
		}
		for i := range 10 {
			resp, err := send(t.Context())
			if errors.Is(err, bulwark.ErrBulkheadFull) {
				t.Fatalf("well-behaved call %d after them: %v", i, err)
			}
			if err == nil {
				resp.Body.Close()
			}
		}
		// Closing the bodies now gives nothing back a second time.
		for _, resp := range kept {
			resp.Body.Close()
		}
		ctx, cancel := context.WithCancel(t.Context())
		resp, err := send(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n := inFlight(); n != 1 {
			t.Errorf("a call holding its body: %d in flight, want 1", n)
		}
		cancel()
		synctest.Wait()
		resp.Body.Close()
		if n := inFlight(); n != 0 {
			t.Errorf("after its cancel and its close: %d in flight, want 0", n)
		}
	})
}
