package bench

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/bulwark-http/bulwark"
)

// TestStacks sends one request through every stack, floor included, over
// the stub and over ctxBase: each is built and answers, fast enough for
// make test.
func TestStacks(t *testing.T) {
	for _, base := range []http.RoundTripper{stubBase{}, ctxBase{}} {
		peers, err := Peers(Defaults, base)
		if err != nil {
			t.Fatal(err)
		}
		layers, err := BulwarkLayers(Defaults, base)
		if err != nil {
			t.Fatal(err)
		}
		stacks := append(peers, layers...)
		stacks = append(stacks, Stack{"floor", Floor(Defaults.Attempt, base)})
		for _, s := range stacks {
			req, _ := http.NewRequestWithContext(t.Context(), "GET", "http://stub.internal/x", nil)
			resp, err := s.RT.RoundTrip(req)
			if err != nil {
				t.Fatalf("%T %s: %v", base, s.Name, err)
			}
			if _, err := io.Copy(io.Discard, resp.Body); err != nil {
				t.Errorf("%T %s: body: %v", base, s.Name, err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("%T %s: status %d", base, s.Name, resp.StatusCode)
			}
		}
	}
}

// seenCtx is a base over ctxBase that keeps the request it was given.
type seenCtx struct{ got *http.Request }

func (s *seenCtx) RoundTrip(req *http.Request) (*http.Response, error) {
	s.got = req
	return ctxBase{}.RoundTrip(req)
}

// TestCtxBase: the derived context ends with the body (at EOF, or at Close
// without reading), a request whose context is done is refused with its
// cause, and a body whose request context ends fails.
func TestCtxBase(t *testing.T) {
	req, _ := http.NewRequestWithContext(t.Context(), "GET", "http://stub.internal/x", nil)
	resp, err := ctxBase{}.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	ctx := resp.Body.(*ctxBody).ctx
	if b, err := io.ReadAll(resp.Body); err != nil || string(b) != "ok" {
		t.Fatalf("body %q, %v", b, err)
	}
	if ctx.Err() == nil {
		t.Error("context not cancelled at EOF")
	}
	resp.Body.Close()

	resp, err = ctxBase{}.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	ctx = resp.Body.(*ctxBody).ctx
	resp.Body.Close()
	if ctx.Err() == nil {
		t.Error("context not cancelled at Close")
	}

	cause := errors.New("gone")
	parent, cancel := context.WithCancelCause(t.Context())
	resp, err = ctxBase{}.RoundTrip(req.WithContext(parent))
	if err != nil {
		t.Fatal(err)
	}
	cancel(cause)
	if _, err := resp.Body.Read(make([]byte, 8)); !errors.Is(err, cause) {
		t.Errorf("read after cancel: %v, want %v", err, cause)
	}
	resp.Body.Close()
	if _, err := (ctxBase{}).RoundTrip(req.WithContext(parent)); !errors.Is(err, cause) {
		t.Errorf("cancelled request: %v, want %v", err, cause)
	}
}

// TestFloor: the base gets a clone with the two headers under a context
// with the attempt deadline, the caller's request is untouched, and the
// context ends when the body does.
func TestFloor(t *testing.T) {
	base := &seenCtx{}
	rt := Floor(time.Second, base)
	req, _ := http.NewRequestWithContext(t.Context(), "GET", "http://stub.internal/x", nil)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	got := base.got
	if got == req || len(req.Header) != 0 {
		t.Error("caller's request changed")
	}
	ms, err := strconv.Atoi(got.Header.Get(bulwark.DefaultDeadlineHeader))
	if err != nil || ms <= 0 || ms > 1000 {
		t.Errorf("%s = %q", bulwark.DefaultDeadlineHeader, got.Header.Get(bulwark.DefaultDeadlineHeader))
	}
	if a := got.Header.Get(bulwark.AttemptHeader); a != "1" {
		t.Errorf("%s = %q", bulwark.AttemptHeader, a)
	}
	if _, ok := got.Context().Deadline(); !ok {
		t.Error("no deadline")
	}
	io.Copy(io.Discard, resp.Body)
	if got.Context().Err() == nil {
		t.Error("attempt context not cancelled at EOF")
	}
	resp.Body.Close()
}
