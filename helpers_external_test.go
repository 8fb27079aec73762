package bulwark_test

import (
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bulwark-http/bulwark"
	"pgregory.net/rapid"
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

type rtFunc func(*http.Request) (*http.Response, error)

func (f rtFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// refusedErr is what net/http returns for a connection the host refused.
func refusedErr() error {
	return &net.OpError{Op: "dial", Net: "tcp", Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}
}

// outcome is what the scripted host does with one attempt.
type outcome uint8

const (
	oOK   outcome = iota // 200 after the call's latency
	oSlow                // 200 after slowLatency
	o500                 // retryable statuses
	o502
	o503
	o504
	o408
	o429     // without Retry-After: no pause of the host
	o501     // not retryable: no retry changes it
	o400     // the request's fault
	oTimeout // no answer: waits for the attempt's context to end
	oReset   // a reset connection: transient
	oRefused // a refused connection: transient
	oNoHost  // no such host: permanent
	numOutcome
)

var outcomeNames = [...]string{"ok", "slow", "500", "502", "503", "504", "408", "429", "501", "400", "timeout", "reset", "refused", "nohost"}

func (o outcome) String() string { return outcomeNames[o] }

// status is o's status code; 0 for an outcome that is an error.
func (o outcome) status() int {
	return [...]int{200, 200, 500, 502, 503, 504, 408, 429, 501, 400, 0, 0, 0, 0}[o]
}

// slowLatency is how long a slow success takes.
const slowLatency = 40 * time.Millisecond

// scriptHost is an in-memory host: each call names its script in the
// X-Call header (registered with add), and attempt n of it does script[n]
// (the last repeats), answering (or failing) after the call's latency; a
// timeout never answers.
type scriptHost struct {
	mu       sync.Mutex
	scripts  map[string]hostScript
	attempts map[string]int
}

type hostScript struct {
	out []outcome
	lat time.Duration // an answer's latency; a slow one's is slowLatency
}

func newScriptHost() *scriptHost {
	return &scriptHost{scripts: map[string]hostScript{}, attempts: map[string]int{}}
}

func (h *scriptHost) add(id string, s hostScript) {
	h.mu.Lock()
	h.scripts[id] = s
	h.mu.Unlock()
}

// sent is how many attempts of call id reached the host.
func (h *scriptHost) sent(id string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.attempts[id]
}

func (h *scriptHost) RoundTrip(req *http.Request) (*http.Response, error) {
	id := req.Header.Get("X-Call")
	h.mu.Lock()
	s, ok := h.scripts[id]
	n := h.attempts[id]
	h.attempts[id] = n + 1
	h.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("scriptHost: no script for call %q", id)
	}
	o := s.out[min(n, len(s.out)-1)]
	lat := s.lat
	if o == oSlow {
		lat = slowLatency
	}
	if o == oTimeout {
		<-req.Context().Done()
		return nil, context.Cause(req.Context())
	}
	if lat > 0 {
		tm := time.NewTimer(lat)
		defer tm.Stop()
		select {
		case <-tm.C:
		case <-req.Context().Done():
			return nil, context.Cause(req.Context())
		}
	}
	switch o {
	case oReset:
		return nil, &net.OpError{Op: "read", Net: "tcp", Err: &os.SyscallError{Syscall: "read", Err: syscall.ECONNRESET}}
	case oRefused:
		return nil, refusedErr()
	case oNoHost:
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: req.URL.Hostname(), IsNotFound: true}}
	}
	return &http.Response{StatusCode: o.status(), Header: http.Header{}, Body: http.NoBody, Request: req}, nil
}

// disagreement is the panic a model test raises inside its bubble when
// the Transport and the model disagree; inBubble turns it into rapid's
// failure outside the bubble, where rapid's T may fail the test.
type disagreement struct{ msg string }

func disagree(format string, args ...any) {
	panic(disagreement{fmt.Sprintf(format, args...)})
}

// inBubble runs f in a synctest bubble on rapid's behalf: f may draw with
// rt (rapid's actions and draws work in the bubble), and reports a
// disagreement with disagree. rapid's own panics (data exhausted while
// shrinking) pass through to it, so it shrinks as usual. f must leave no
// goroutine running: every call it starts it waits for.
func inBubble(t *testing.T, rt *rapid.T, f func()) {
	var saved any
	synctest.Test(t, func(*testing.T) {
		defer func() { saved = recover() }()
		f()
	})
	switch p := saved.(type) {
	case nil:
	case disagreement:
		rt.Fatal(p.msg)
	default:
		panic(p)
	}
}

// drawGap draws the time before a call: log-uniform from 1 ms to 10 s, so
// rates from 1,000 to 0.1 a second.
func drawGap(rt *rapid.T, label string) time.Duration {
	e := rapid.Float64Range(-3, 1).Draw(rt, label)
	return time.Duration(math.Pow(10, e) * float64(time.Second))
}

// The retry model: the contract's checks in its order, from the script.

// retryable is the contract's list of outcomes another try may change.
func (o outcome) retryable() bool {
	switch o {
	case o500, o502, o503, o504, o408, o429, oTimeout, oReset, oRefused:
		return true
	}
	return false
}

// modelRequest is one drawn request: its method and whether it carries an
// Idempotency-Key.
type modelRequest struct {
	method string
	keyed  bool
}

func (r modelRequest) replayable() bool {
	switch r.method {
	case http.MethodGet, http.MethodHead, http.MethodPut, http.MethodDelete, http.MethodOptions:
		return true
	}
	return r.keyed
}

// modelCall sends one call with a fresh id and returns what its caller got.
func modelCall(c *http.Client, id string, r modelRequest) (*http.Response, error) {
	req, _ := http.NewRequest(r.method, "http://model.test/"+id, nil)
	req.Header.Set("X-Call", id)
	if r.keyed {
		req.Header.Set(bulwark.IdempotencyKeyHeader, "k-"+id)
	}
	return c.Do(req)
}

// seamBase is a scripted upstream: answer decides attempt n's outcome (n
// from 1, in arrival order). It reads and closes each request body first,
// returning the body's error as net/http's Transport does.
type seamBase struct {
	answer func(n int, req *http.Request) (*http.Response, error)

	mu    sync.Mutex
	n     int
	hosts []string
	auth  []string
}

func (b *seamBase) RoundTrip(req *http.Request) (*http.Response, error) {
	b.mu.Lock()
	b.n++
	n := b.n
	b.hosts = append(b.hosts, req.URL.Host)
	b.auth = append(b.auth, req.Header.Get("Authorization"))
	b.mu.Unlock()
	if req.Body != nil {
		_, err := io.Copy(io.Discard, req.Body)
		req.Body.Close()
		if err != nil {
			return nil, err
		}
	}
	return b.answer(n, req)
}

func (b *seamBase) sent() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n
}

// seamAnswer is a response of code to req after d (or req's context's
// error, if it ends first), with header pairs kv.
func seamAnswer(req *http.Request, d time.Duration, code int, kv ...string) (*http.Response, error) {
	if d > 0 {
		tm := time.NewTimer(d)
		defer tm.Stop()
		select {
		case <-tm.C:
		case <-req.Context().Done():
			return nil, context.Cause(req.Context())
		}
	}
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return &http.Response{StatusCode: code, Header: h, Body: io.NopCloser(strings.NewReader(http.StatusText(code))), Request: req}, nil
}

func seamNew(t *testing.T, cfg bulwark.Config) *bulwark.Transport {
	t.Helper()
	tr, err := bulwark.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Close() })
	return tr
}

// seamSend sends method url (with header pairs kv) and returns the status,
// the body read whole and closed, or the error.
func seamSend(t *testing.T, tr http.RoundTripper, method, url string, kv ...string) (int, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(kv); i += 2 {
		req.Header.Set(kv[i], kv[i+1])
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// seamHost is host's snapshot ("host:port"), failing the test if it has none.
func seamHost(t *testing.T, tr *bulwark.Transport, host string) bulwark.HostSnapshot {
	t.Helper()
	hs := tr.Snapshot().Host(host)
	if len(hs) != 1 {
		t.Fatalf("Snapshot has %d entries for %s, want 1", len(hs), host)
	}
	return hs[0]
}

type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }
