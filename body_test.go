package bulwark

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
)

type countEnd struct{ n int }

func (c *countEnd) bodyEnd() { c.n++ }

type rwc struct {
	io.Reader
	wrote strings.Builder
}

func (r *rwc) Write(p []byte) (int, error) { return r.wrote.Write(p) }
func (r *rwc) Close() error                { return nil }

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("connection cut mid-body") }
func (errReader) Close() error             { return nil }

func TestBodyEndRunsOnce(t *testing.T) {
	for _, tt := range []struct {
		name string
		body io.ReadCloser
		use  func(io.ReadCloser)
	}{
		{"eof then close", io.NopCloser(strings.NewReader("abc")), func(b io.ReadCloser) { io.ReadAll(b); b.Close(); b.Close() }},
		{"close only", io.NopCloser(strings.NewReader("abc")), func(b io.ReadCloser) { b.Close() }},
		{"read error", errReader{}, func(b io.ReadCloser) { io.ReadAll(b); b.Close() }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var a, b countEnd
			resp := &http.Response{StatusCode: 200, Body: tt.body}
			onBodyEnd(resp, &a)
			onBodyEnd(resp, &b) // joins the same wrapper
			if _, ok := resp.Body.(*body); !ok {
				t.Fatalf("Body is %T, want the shared wrapper", resp.Body)
			}
			tt.use(resp.Body)
			if a.n != 1 || b.n != 1 {
				t.Errorf("body-end work ran %d and %d times, want once each", a.n, b.n)
			}
		})
	}
}

func TestBodyEndManyLayers(t *testing.T) {
	ends := make([]countEnd, maxEnders+2)
	resp := &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader("x"))}
	for i := range ends {
		onBodyEnd(resp, &ends[i])
	}
	resp.Body.Close()
	for i, e := range ends {
		if e.n != 1 {
			t.Errorf("ender %d ran %d times, want 1", i, e.n)
		}
	}
}

func TestBodyEndNoBody(t *testing.T) {
	for _, b := range []io.ReadCloser{nil, http.NoBody} {
		var e countEnd
		onBodyEnd(&http.Response{StatusCode: 204, Body: b}, &e)
		if e.n != 1 {
			t.Errorf("Body %v: body-end work ran %d times at once, want 1", b, e.n)
		}
	}
}

func TestBodyKeepsWriterFor101(t *testing.T) {
	conn := &rwc{Reader: strings.NewReader("")}
	resp := &http.Response{StatusCode: http.StatusSwitchingProtocols, Body: conn}
	var e countEnd
	onBodyEnd(resp, &e)
	w, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		t.Fatalf("101 body is %T, lost io.Writer", resp.Body)
	}
	io.WriteString(w, "ping")
	if conn.wrote.String() != "ping" {
		t.Errorf("write reached %q, want ping", conn.wrote.String())
	}
	onBodyEnd(resp, &e) // joins the rw wrapper
	w.Close()
	if e.n != 2 {
		t.Errorf("body-end work ran %d times, want 2", e.n)
	}
}

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

// blockingClose is a host's body whose Close signals closing and returns
// only once release is closed.
type blockingClose struct {
	closing, release chan struct{}
}

func (b *blockingClose) Read([]byte) (int, error) { return 0, io.EOF }

func (b *blockingClose) Close() error {
	close(b.closing)
	<-b.release
	return nil
}

type atomicEnd struct{ n atomic.Int32 }

func (c *atomicEnd) bodyEnd() { c.n.Add(1) }

// TestBodyCancelDuringClose: a caller that cancels its context while its
// own Close is still closing the host's body leaves the work (a bulkhead
// slot, an instance's count in flight) to that Close, which runs it once
// the host's body is closed: the cancel does not give a slot back while
// the host still holds the body.
func TestBodyCancelDuringClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		host := &blockingClose{closing: make(chan struct{}), release: make(chan struct{})}
		resp := &http.Response{Body: host}
		var end atomicEnd
		onBodyEnd(resp, &end)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		watchBody(ctx, resp)
		go resp.Body.Close()
		<-host.closing
		cancel()
		synctest.Wait()
		early := end.n.Load()
		close(host.release)
		synctest.Wait()
		if n := end.n.Load(); early != 0 || n != 1 {
			t.Fatalf("work ran %d times while the host's body was still closing and %d in all; want 0, then 1", early, n)
		}
	})
}
