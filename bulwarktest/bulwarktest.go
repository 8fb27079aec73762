// Package bulwarktest helps test code that uses bulwark: a scripted
// upstream that answers each path from a script and records every request
// it receives, and a Recorder that collects what bulwark's hooks report, so
// that a test can assert how many attempts were made, which retries were
// scheduled, which hedges were sent, won or skipped, and which breaker
// transitions happened.
//
// An Upstream serves over a real socket (Start, an httptest server on
// 127.0.0.1) or in memory (Transport), for tests that run inside a
// testing/synctest bubble: fake time advances only when every goroutine of
// the bubble is blocked on something the bubble controls, and a socket is
// not such a thing, so a real server and fake time do not mix. In memory, a
// script's delays and a Retry-After's waits then take no real time.
//
//	u := bulwarktest.NewUpstream(map[string]bulwarktest.Script{
//		"/pay": {
//			{Status: 503, Header: http.Header{"Retry-After": {"1"}}, Times: 2},
//			{Status: 200, Body: "paid", Delay: 50 * time.Millisecond},
//		},
//	})
//	tr, _ := bulwark.New(bulwark.Config{Base: u.Transport()})
//
// The package is meant for tests; bulwark itself does not import it.
package bulwarktest

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/bulwark-http/bulwark"
)

// Step is one answer of a Script.
type Step struct {
	// Status is the response's status code. Zero means 200.
	Status int
	// Header is added to the response's header.
	Header http.Header
	// Body is the response body.
	Body string
	// Delay is how long the upstream waits before answering. The wait ends
	// early, with no answer, when the request's context ends (the client
	// gave up), as a real server's would.
	Delay time.Duration
	// Times is how many requests in a row the step answers. Zero means
	// one. The last step of a script answers every request after it.
	Times int
}

// Script is the answers an Upstream gives to one path, in order.
type Script []Step

// Request is what the Upstream received of one request.
type Request struct {
	Method string
	Path   string
	Host   string
	Header http.Header
	Body   string
	// Attempt is the request's bulwark.AttemptHeader (1 for the first
	// attempt, 2 for the first retry), zero when it had none.
	Attempt int
	// At is when the request arrived (time.Now: fake time in a bubble).
	At time.Time
	// InFlight is how many other requests to the same path the upstream
	// was still handling when this one arrived: a hedge, sent beside a
	// slow attempt of the same call, arrives with InFlight ≥ 1 (so does
	// any request of a concurrent caller).
	InFlight int
	// Canceled reports that the request's context ended while its step's
	// Delay ran, so the upstream never answered it: the caller gave up,
	// or bulwark cancelled a hedge's losing attempt. It is set when the
	// upstream stops handling the request; Requests read earlier may not
	// show it yet.
	Canceled bool
}

// Upstream is a scripted HTTP upstream. Each path plays its own Script,
// one step per request; a path with no script is answered 404. It records
// every request, scripted or not. It is safe for concurrent use.
type Upstream struct {
	mu       sync.Mutex
	scripts  map[string]*player
	reqs     []Request
	inFlight map[string]int // by path
}

type player struct {
	script Script
	step   int // the step answering next
	used   int // requests the step has answered
}

// next returns the step that answers the next request and moves on.
func (p *player) next() Step {
	s := p.script[p.step]
	p.used++
	times := max(s.Times, 1)
	if p.used >= times && p.step < len(p.script)-1 {
		p.step, p.used = p.step+1, 0
	}
	return s
}

// NewUpstream returns an Upstream playing scripts, keyed by request path
// ("/pay"; the path must match exactly, query aside).
func NewUpstream(scripts map[string]Script) *Upstream {
	u := &Upstream{scripts: make(map[string]*player), inFlight: make(map[string]int)}
	for path, s := range scripts {
		u.Handle(path, s)
	}
	return u
}

// Handle sets the script of path, from its first step; an empty script
// removes it.
func (u *Upstream) Handle(path string, s Script) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(s) == 0 {
		delete(u.scripts, path)
		return
	}
	u.scripts[path] = &player{script: append(Script(nil), s...)}
}

// ServeHTTP records r and answers it from its path's script.
func (u *Upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	attempt, _ := strconv.Atoi(r.Header.Get(bulwark.AttemptHeader))
	rec := Request{Method: r.Method, Path: r.URL.Path, Host: r.Host, Header: r.Header.Clone(),
		Body: string(body), Attempt: attempt, At: time.Now()}
	path := r.URL.Path
	u.mu.Lock()
	rec.InFlight = u.inFlight[path]
	u.inFlight[path]++
	idx := len(u.reqs)
	u.reqs = append(u.reqs, rec)
	p := u.scripts[path]
	var s Step
	if p != nil {
		s = p.next()
	}
	u.mu.Unlock()
	defer func() {
		u.mu.Lock()
		u.inFlight[path]--
		u.mu.Unlock()
	}()
	if p == nil {
		http.Error(w, "bulwarktest: no script for "+path, http.StatusNotFound)
		return
	}
	if s.Delay > 0 {
		t := time.NewTimer(s.Delay)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			u.mu.Lock()
			u.reqs[idx].Canceled = true
			u.mu.Unlock()
			return
		}
	}
	for k, vs := range s.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	status := s.Status
	if status == 0 {
		status = http.StatusOK
	}
	w.WriteHeader(status)
	io.WriteString(w, s.Body)
}

// Requests returns every request received so far, in order of arrival.
func (u *Upstream) Requests() []Request {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]Request(nil), u.reqs...)
}

// RequestsTo returns the requests received for path, in order.
func (u *Upstream) RequestsTo(path string) []Request {
	var out []Request
	for _, r := range u.Requests() {
		if r.Path == path {
			out = append(out, r)
		}
	}
	return out
}

// Attempts returns the attempt numbers (bulwark.AttemptHeader) of the
// requests received for path, in order: [1 2 3] for a call that was tried
// three times.
func (u *Upstream) Attempts(path string) []int {
	var out []int
	for _, r := range u.RequestsTo(path) {
		out = append(out, r.Attempt)
	}
	return out
}

// MaxInFlight returns the most requests to path the upstream handled at
// once so far: 2 for one call whose slow attempt got a hedge beside it.
func (u *Upstream) MaxInFlight(path string) int {
	n := 0
	for _, r := range u.RequestsTo(path) {
		n = max(n, r.InFlight+1)
	}
	return n
}

// Start serves u over a real socket: an httptest server listening on
// 127.0.0.1, closed when the test ends. Use its URL, and its Client or any
// Base. Not for synctest bubbles: use Transport there.
func (u *Upstream) Start(t testing.TB) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(u)
	t.Cleanup(srv.Close)
	return srv
}

// Transport returns an http.RoundTripper that serves requests from u in
// memory, without sockets, on the caller's goroutine: a Base for bulwark
// inside a testing/synctest bubble, where a script's delays take fake
// time. Every URL host reaches u. When the request's context ends during a
// step's Delay, RoundTrip returns the context's error, as a real transport
// would.
func (u *Upstream) Transport() http.RoundTripper { return memTransport{u} }

type memTransport struct{ u *Upstream }

func (m memTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		var err error
		body, err = io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("bulwarktest: reading the request body: %w", err)
		}
	}
	// What a server would see of the request: its own copy, with the Host
	// and RequestURI a server sets.
	in := req.Clone(req.Context())
	in.Body = io.NopCloser(bytes.NewReader(body))
	if in.Host == "" {
		in.Host = req.URL.Host
	}
	in.RequestURI = req.URL.RequestURI()
	rec := httptest.NewRecorder()
	m.u.ServeHTTP(rec, in)
	if err := req.Context().Err(); err != nil {
		return nil, fmt.Errorf("bulwarktest: %s %s: %w", req.Method, req.URL.Path, err)
	}
	resp := rec.Result()
	resp.Request = req
	return resp, nil
}
