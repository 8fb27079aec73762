package bulwark

// The RoundTripper contract every layer keeps, as one reusable check.
// A layer's tests call runContract with a function that builds the layer
// over a given base, and checkContract for each rejection path of their own.

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// trackedBody is a request body that records whether it was closed.
type trackedBody struct {
	r      io.Reader
	closed atomic.Int32
}

func (b *trackedBody) Read(p []byte) (int, error) { return b.r.Read(p) }
func (b *trackedBody) Close() error {
	b.closed.Add(1)
	return nil
}

// bodies tracks every body a request hands out, the first and those
// GetBody makes for replays, so a test can insist all of them are closed.
type bodies struct {
	mu  sync.Mutex
	all []*trackedBody
}

func (bs *bodies) make(s string) *trackedBody {
	b := &trackedBody{r: strings.NewReader(s)}
	bs.mu.Lock()
	bs.all = append(bs.all, b)
	bs.mu.Unlock()
	return b
}

func (bs *bodies) allClosed() bool {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	for _, b := range bs.all {
		if b.closed.Load() == 0 {
			return false
		}
	}
	return true
}

// contractRequest is one kind of request the contract is checked with.
type contractRequest struct {
	name   string
	method string
	body   string
	// replayable gives the request a GetBody.
	replayable bool
}

var contractRequests = []contractRequest{
	{name: "GET", method: http.MethodGet},
	{name: "POST replayable", method: http.MethodPost, body: "payload", replayable: true},
	{name: "POST one-shot", method: http.MethodPost, body: "payload"},
	{name: "PUT replayable", method: http.MethodPut, body: "payload", replayable: true},
}

// newContractRequest builds a request to url with a tracked body.
func newContractRequest(t testing.TB, ctx context.Context, url string, cr contractRequest, bs *bodies) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, cr.method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Contract", "1")
	if cr.body != "" {
		req.Body = bs.make(cr.body)
		req.ContentLength = int64(len(cr.body))
		if cr.replayable {
			body := cr.body
			req.GetBody = func() (io.ReadCloser, error) { return bs.make(body), nil }
		}
	}
	return req
}

// requestSnapshot is what the contract says a RoundTripper must leave as it
// found it.
type requestSnapshot struct {
	method, url   string
	header        http.Header
	body          io.ReadCloser
	hasGetBody    bool
	contentLength int64
	ctx           context.Context
	host          string
}

func snapshot(req *http.Request) requestSnapshot {
	return requestSnapshot{
		method: req.Method, url: req.URL.String(), header: req.Header.Clone(),
		body: req.Body, hasGetBody: req.GetBody != nil, contentLength: req.ContentLength,
		ctx: req.Context(), host: req.Host,
	}
}

func (s requestSnapshot) diff(req *http.Request) string {
	switch {
	case req.Method != s.method:
		return "Method changed to " + req.Method
	case req.URL.String() != s.url:
		return "URL changed to " + req.URL.String()
	case !reflect.DeepEqual(req.Header, s.header):
		return "Header changed"
	case req.Body != s.body:
		return "Body replaced"
	case (req.GetBody != nil) != s.hasGetBody:
		return "GetBody changed"
	case req.ContentLength != s.contentLength:
		return "ContentLength changed"
	case req.Context() != s.ctx:
		return "context replaced"
	case req.Host != s.host:
		return "Host changed"
	}
	return ""
}

// checkContract sends req through rt and checks the RoundTripper contract:
// the request is unchanged, every body it handed out was closed, the result
// is a response or an error but never both nor neither, and a response's
// body can be read and closed after RoundTrip returns. It returns the
// response body read (or the error) for the caller's own assertions. It
// reports with t.Errorf and returns early where it cannot go on, never
// t.Fatal, so it may run on any goroutine.
func checkContract(t testing.TB, rt http.RoundTripper, req *http.Request, bs *bodies) (status int, respBody string, err error) {
	t.Helper()
	snap := snapshot(req)
	resp, err := rt.RoundTrip(req)
	if d := snap.diff(req); d != "" {
		t.Errorf("%s %s: caller's request modified: %s", req.Method, req.URL, d)
	}
	switch {
	case resp == nil && err == nil:
		t.Errorf("%s %s: RoundTrip returned (nil, nil)", req.Method, req.URL)
		return 0, "", nil
	case resp != nil && err != nil:
		t.Errorf("%s %s: RoundTrip returned a response with error %v", req.Method, req.URL, err)
		resp.Body.Close()
	}
	if resp != nil {
		if resp.Body == nil {
			t.Errorf("%s %s: response with nil Body", req.Method, req.URL)
			return resp.StatusCode, "", err
		}
		b, rerr := io.ReadAll(resp.Body)
		if rerr != nil {
			t.Errorf("%s %s: reading body after RoundTrip: %v", req.Method, req.URL, rerr)
		}
		if cerr := resp.Body.Close(); cerr != nil {
			t.Errorf("%s %s: closing body: %v", req.Method, req.URL, cerr)
		}
		status, respBody = resp.StatusCode, string(b)
	}
	if bs != nil && !bs.allClosed() {
		t.Errorf("%s %s: a request body was left open (err=%v)", req.Method, req.URL, err)
	}
	return status, respBody, err
}

// stubBase is a base RoundTripper that answers like http.Transport would,
// without a network: it reads and closes the request body, then responds.
type stubBase struct {
	status int
	err    error
	// block waits for the request context to end before answering.
	block bool
	calls atomic.Int64
}

func (s *stubBase) RoundTrip(req *http.Request) (*http.Response, error) {
	s.calls.Add(1)
	if req.Body != nil {
		_, _ = io.Copy(io.Discard, req.Body)
		req.Body.Close()
	}
	if s.block {
		<-req.Context().Done()
		return nil, req.Context().Err()
	}
	if s.err != nil {
		return nil, s.err
	}
	status := s.status
	if status == 0 {
		status = http.StatusOK
	}
	return &http.Response{
		StatusCode: status, Status: http.StatusText(status), Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{}, Body: io.NopCloser(bytes.NewReader([]byte("hello"))), ContentLength: 5, Request: req,
	}, nil
}

var errStub = errors.New("stub: connection refused")

// runContract checks build's RoundTripper over a set of bases (success,
// error, 503, a base that only returns when the context ends, with a
// cancelled context) with every kind of contract request, then hammers one
// instance from several goroutines for the race detector. build runs on the
// goroutine of runContract's caller, never in a subtest, so it may stop
// the test with t.Fatal (as mustNew does) on the t it closes over.
func runContract(t *testing.T, build func(base http.RoundTripper) http.RoundTripper) {
	t.Helper()
	bases := []struct {
		name   string
		base   func() *stubBase
		cancel bool
	}{
		{"ok", func() *stubBase { return &stubBase{} }, false},
		{"error", func() *stubBase { return &stubBase{err: errStub} }, false},
		{"503", func() *stubBase { return &stubBase{status: 503} }, false},
		{"cancelled", func() *stubBase { return &stubBase{block: true} }, true},
	}
	// Every RoundTripper is built here, before the subtests that use it.
	type contractCase struct {
		name   string
		cr     contractRequest
		cancel bool
		rt     http.RoundTripper
	}
	var cases []contractCase
	for _, b := range bases {
		for _, cr := range contractRequests {
			cases = append(cases, contractCase{b.name + "/" + cr.name, cr, b.cancel, build(b.base())})
		}
	}
	concurrent := build(&stubBase{})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			if c.cancel {
				cancel()
			}
			var bs bodies
			req := newContractRequest(t, ctx, "http://contract.test/x?q=1", c.cr, &bs)
			status, got, err := checkContract(t, c.rt, req, &bs)
			if err == nil && got != "hello" {
				t.Errorf("body = %q (status %d), want %q", got, status, "hello")
			}
			if c.cancel && !errors.Is(err, context.Canceled) {
				t.Errorf("cancelled context: err = %v, want one wrapping context.Canceled", err)
			}
		})
	}
	t.Run("concurrent", func(t *testing.T) {
		rt := concurrent
		// The requests are built here, where newContractRequest may stop the
		// test; the workers only report, and each stops at the first
		// failure any of them saw.
		// (contractCall, not call: that is the layers' call state.)
		type contractCall struct {
			req *http.Request
			bs  *bodies
		}
		var calls [8][50]contractCall
		for g := range calls {
			for i := range calls[g] {
				bs := new(bodies)
				cr := contractRequests[i%len(contractRequests)]
				calls[g][i] = contractCall{newContractRequest(t, t.Context(), "http://contract.test/c", cr, bs), bs}
			}
		}
		var wg sync.WaitGroup
		for g := range calls {
			wg.Go(func() {
				for _, c := range calls[g] {
					if t.Failed() {
						return
					}
					checkContract(t, rt, c.req, c.bs)
				}
			})
		}
		wg.Wait()
	})
}
