// Real faults on real sockets: Toxiproxy runs in-process between bulwark
// and an httptest upstream on 127.0.0.1 and breaks the TCP stream the way
// networks do. Each test asserts the outcome the design promises, counts
// what reached the upstream, and checks at the end that the upstream has no
// connection left open once the client's idle ones are closed: a response
// body bulwark forgot to drain and close would keep its connection busy and
// fail that check.
//
// This is a module of its own so that Toxiproxy and what it pulls in stay
// out of the library's go.mod; it sees bulwark only through its exported
// API, as a caller would.
package integration_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/bulwark-http/bulwark"
)

// upReq is what the upstream saw of one request.
type upReq struct {
	method, body, key, attempt string
}

// countedUpstream is an httptest server that records every request and
// counts the connections it accepted and those still open.
type countedUpstream struct {
	srv            *httptest.Server
	accepted, open atomic.Int64
	mu             sync.Mutex
	reqs           []upReq
}

func newCountedUpstream(t *testing.T, h http.HandlerFunc) *countedUpstream {
	t.Helper()
	u := &countedUpstream{}
	u.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.reqs = append(u.reqs, upReq{r.Method, string(b), r.Header.Get(bulwark.IdempotencyKeyHeader), r.Header.Get(bulwark.AttemptHeader)})
		u.mu.Unlock()
		h(w, r)
	}))
	u.srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			u.accepted.Add(1)
			u.open.Add(1)
		case http.StateClosed, http.StateHijacked:
			u.open.Add(-1)
		}
	}
	u.srv.Start()
	t.Cleanup(u.srv.Close)
	return u
}

func (u *countedUpstream) seen() []upReq {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]upReq(nil), u.reqs...)
}

// faultRig is bulwark → toxiproxy → upstream.
type faultRig struct {
	up    *countedUpstream
	proxy *toxiproxy.Proxy
	base  *http.Transport
	dials atomic.Int64 // connections the client opened to the proxy
	tr    *bulwark.Transport
	url   string
	host  string
}

// faultPolicy retries fast, trips the breaker after a few failures, and
// keeps every timeout far above what a healthy loopback call takes.
func faultPolicy() bulwark.Policy {
	return bulwark.Policy{
		Timeout: bulwark.Timeout{Total: 10 * time.Second, Attempt: 5 * time.Second},
		Retry:   bulwark.Retry{MaxAttempts: 3, Base: time.Millisecond, Cap: 2 * time.Millisecond},
		Breaker: bulwark.Breaker{MinCalls: 3, FailureRate: 0.5, Window: 10 * time.Second, OpenFor: time.Minute, SlowCall: 5 * time.Second},
	}
}

func newFaultRig(t *testing.T, h http.HandlerFunc, p bulwark.Policy) *faultRig {
	t.Helper()
	up := newCountedUpstream(t, h)
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	proxy := toxiproxy.NewProxy(srv, "bulwark", "127.0.0.1:0", up.srv.Listener.Addr().String())
	if err := proxy.Start(); err != nil {
		t.Fatal(err)
	}
	// Stop closes every proxied connection and waits for the accept loop;
	// the link goroutines then end on their own, which goleak waits for.
	t.Cleanup(proxy.Stop)
	r := &faultRig{up: up, proxy: proxy, url: "http://" + proxy.Listen, host: proxy.Listen}
	var d net.Dialer
	r.base = &http.Transport{
		MaxIdleConnsPerHost: 8,
		// Counts every connection that reached the proxy. The dial ignores
		// cancellation (the Transport cancels dials it no longer needs when
		// idle connections are closed): a connect cancelled after the
		// handshake would reach the proxy, and so the upstream, uncounted.
		// A loopback connect cannot hang; the timeout is a backstop.
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			c, err := d.DialContext(ctx, network, addr)
			if err == nil {
				r.dials.Add(1)
			}
			return c, err
		},
	}
	r.tr = newTransport(t, bulwark.Config{Base: r.base, Default: p})
	t.Cleanup(func() {
		// Every body has been closed by now: idle connections are all the
		// client should hold, and closing them must leave the upstream
		// with none.
		if msg := r.quiesce(); msg != "" {
			t.Errorf("%s: a response body left open keeps its connection busy", msg)
		}
	})
	return r
}

// quiesce closes the client's idle connections and waits until every
// connection the client opened has reached the upstream and been closed
// there. It returns "" then, or what is still open after a bounded wait.
// Toxiproxy opens one upstream connection per client connection it
// accepts, and the upstream records a request before that request's
// connection can close; so once both counts agree and none is open, no
// request is left crossing the proxy. It polls because its condition spans
// the client's pool, the proxy and the upstream, and a connection dialled
// late joins the pool only after its dial returns.
func (r *faultRig) quiesce() string {
	deadline := time.Now().Add(5 * time.Second)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		r.base.CloseIdleConnections()
		d, a, o := r.dials.Load(), r.up.accepted.Load(), r.up.open.Load()
		if a == d && o == 0 {
			return ""
		}
		if time.Now().After(deadline) {
			return fmt.Sprintf("after 5s the client had opened %d connection(s), the upstream accepted %d and has %d open", d, a, o)
		}
		<-tick.C
	}
}

// settle is quiesce for a test that then counts what reached the upstream:
// past it the count is final, so an upper bound on it means something.
func (r *faultRig) settle(t *testing.T) []upReq {
	t.Helper()
	if msg := r.quiesce(); msg != "" {
		t.Fatal(msg)
	}
	return r.up.seen()
}

// toxic adds a toxic given as Toxiproxy's JSON.
func (r *faultRig) toxic(t *testing.T, js string) {
	t.Helper()
	if _, err := r.proxy.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
		t.Fatalf("toxic %s: %v", js, err)
	}
}

// call sends one request and reads the whole response; the returned error
// is RoundTrip's, readErr the body's.
func (r *faultRig) call(t *testing.T, method, body string, replayable bool, key string) (status int, got []byte, hdr http.Header, err, readErr error) {
	t.Helper()
	var bs bodies
	req, rerr := http.NewRequestWithContext(t.Context(), method, r.url+"/x", nil)
	if rerr != nil {
		t.Fatal(rerr)
	}
	if body != "" {
		req.Body = bs.make(body)
		req.ContentLength = int64(len(body))
		if replayable {
			req.GetBody = func() (io.ReadCloser, error) { return bs.make(body), nil }
		}
	}
	if key != "" {
		req.Header.Set(bulwark.IdempotencyKeyHeader, key)
	}
	snap := snapshot(req)
	resp, err := r.tr.RoundTrip(req)
	if d := snap.diff(req); d != "" {
		t.Errorf("caller's request modified: %s", d)
	}
	if (resp == nil) == (err == nil) {
		t.Fatalf("RoundTrip = %v, %v: want exactly one", resp, err)
	}
	if resp != nil {
		got, readErr = io.ReadAll(resp.Body)
		resp.Body.Close()
		status, hdr = resp.StatusCode, resp.Header
	}
	if !bs.allClosed() {
		t.Errorf("%s: a request body was left open", method)
	}
	return status, got, hdr, err, readErr
}

func (r *faultRig) wantBreaker(t *testing.T, want bulwark.CircuitState) {
	t.Helper()
	hosts := r.tr.Snapshot().Host(r.host)
	if len(hosts) != 1 || hosts[0].Breaker == nil || hosts[0].Breaker.State != want {
		t.Errorf("Snapshot().Host(%s) = %+v; want one host whose breaker is %v", r.host, hosts, want)
	}
}

func (r *faultRig) wantBulkheadEmpty(t *testing.T) {
	t.Helper()
	for _, h := range r.tr.Snapshot().Host(r.host) {
		if b := h.Bulkhead; b != nil && (b.InFlight != 0 || b.Queued != 0) {
			t.Errorf("bulkhead holds %d slot(s), %d queued after every call finished", b.InFlight, b.Queued)
		}
	}
}

func newTransport(t *testing.T, cfg bulwark.Config) *bulwark.Transport {
	t.Helper()
	tr, err := bulwark.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

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

// requestSnapshot is what a RoundTripper must leave as it found it.
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

var bigBody = bytes.Repeat([]byte("0123456789abcdef"), 4096) // 64 KiB

func okHandler(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/octet-stream")
	_, _ = w.Write(bigBody)
}

func TestFaultLatencyJitter(t *testing.T) {
	r := newFaultRig(t, okHandler, faultPolicy())
	r.toxic(t, `{"type":"latency","stream":"downstream","attributes":{"latency":20,"jitter":10}}`)
	for _, m := range []string{"GET", "POST"} {
		st, got, _, err, rerr := r.call(t, m, "payload", false, "")
		if err != nil || rerr != nil || st != 200 || !bytes.Equal(got, bigBody) {
			t.Fatalf("%s through latency: status %d, %d bytes, err %v, read %v", m, st, len(got), err, rerr)
		}
	}
	if n := len(r.settle(t)); n != 2 {
		t.Errorf("upstream saw %d requests, want 2 (no retries of successes)", n)
	}
	r.wantBreaker(t, bulwark.CircuitClosed)
	r.wantBulkheadEmpty(t)

	// Latency past the attempt timeout: ours, retried for GET only.
	t.Run("past attempt timeout", func(t *testing.T) {
		p := faultPolicy()
		// Far below the 400 ms the toxic adds to each response, so every
		// attempt times out; far above what a request takes to reach the
		// upstream, so every attempt's request gets there first.
		p.Timeout.Attempt = 100 * time.Millisecond
		p.Breaker.Disabled = true
		r := newFaultRig(t, okHandler, p)
		r.toxic(t, `{"type":"latency","stream":"downstream","attributes":{"latency":400,"jitter":0}}`)
		_, _, _, err, _ := r.call(t, "GET", "", false, "")
		var re *bulwark.RetryError
		if !errors.Is(err, bulwark.ErrAttemptTimeout) || !errors.As(err, &re) || re.Attempts != 3 {
			t.Fatalf("GET err = %v; want ErrAttemptTimeout after 3 attempts", err)
		}
		before := len(r.settle(t))
		_, _, _, err, _ = r.call(t, "POST", "charge", false, "")
		var re2 *bulwark.RetryError
		if !errors.Is(err, bulwark.ErrAttemptTimeout) || errors.As(err, &re2) {
			t.Fatalf("POST err = %v; want a bare ErrAttemptTimeout (sent once)", err)
		}
		if n := len(r.settle(t)) - before; n != 1 {
			t.Errorf("POST without key reached the upstream %d times, want exactly 1", n)
		}
		if before > 3 {
			t.Errorf("GET reached the upstream %d times, want ≤ 3", before)
		}
		r.wantBulkheadEmpty(t)
	})
}

func TestFaultResetPeer(t *testing.T) {
	r := newFaultRig(t, okHandler, faultPolicy())
	// Each response is met by a TCP RST (linger 0) instead of its bytes.
	r.toxic(t, `{"type":"reset_peer","stream":"downstream","attributes":{"timeout":0}}`)

	_, _, _, err, _ := r.call(t, "POST", "charge", false, "")
	if err == nil || errors.Is(err, bulwark.ErrBreakerOpen) {
		t.Fatalf("POST err = %v; want the reset", err)
	}
	// The reset meets the upstream's answer, so the POST did reach it.
	if n := len(r.settle(t)); n != 1 {
		t.Errorf("POST without key reached the upstream %d times, want exactly 1", n)
	}

	_, _, _, err, _ = r.call(t, "POST", "charge-2", true, "key-1")
	var re *bulwark.RetryError
	if !errors.As(err, &re) || re.Attempts < 2 {
		t.Fatalf("keyed POST err = %v; want a RetryError after retries", err)
	}
	seen := r.settle(t)
	for _, s := range seen[min(1, len(seen)):] {
		if s.body != "charge-2" || s.key != "key-1" {
			t.Errorf("replay carried body %q key %q; want the original", s.body, s.key)
		}
	}
	// A reset can also kill an attempt before it reaches the upstream, so
	// the count is bounded, not exact.
	if len(seen) < 2 || len(seen) > 1+re.Attempts {
		t.Errorf("upstream saw %d requests, want 2..%d", len(seen), 1+re.Attempts)
	}

	// Four failed attempts ≥ MinCalls at 100 %: the breaker is open, and the
	// next call is refused without reaching the upstream.
	r.wantBreaker(t, bulwark.CircuitOpen)
	_, _, _, err, _ = r.call(t, "GET", "", false, "")
	if !errors.Is(err, bulwark.ErrBreakerOpen) {
		t.Fatalf("GET with the breaker open: err = %v", err)
	}
	if n := len(r.settle(t)) - len(seen); n != 0 {
		t.Errorf("an open breaker let %d request(s) reach the upstream", n)
	}
	r.wantBulkheadEmpty(t)

	t.Run("fallback", func(t *testing.T) {
		p := faultPolicy()
		p.Fallback.Constant = &bulwark.ConstantResponse{Body: []byte("cached rate")}
		r := newFaultRig(t, okHandler, p)
		r.toxic(t, `{"type":"reset_peer","stream":"downstream","attributes":{"timeout":0}}`)
		for i := 0; i < 3; i++ {
			st, got, hdr, err, _ := r.call(t, "GET", "", false, "")
			if err != nil || st != 200 || string(got) != "cached rate" || hdr.Get(bulwark.FallbackHeader) != "constant" {
				t.Fatalf("GET %d: %d %q %v %v; want the constant fallback", i, st, got, hdr, err)
			}
		}
		r.wantBreaker(t, bulwark.CircuitOpen)
		// A POST never gets a made-up 200.
		if _, _, _, err, _ := r.call(t, "POST", "x", false, ""); !errors.Is(err, bulwark.ErrBreakerOpen) {
			t.Errorf("POST err = %v; want ErrBreakerOpen, not a fallback", err)
		}
	})
}

func TestFaultBlackHole(t *testing.T) {
	p := faultPolicy()
	p.Timeout.Attempt = 40 * time.Millisecond
	r := newFaultRig(t, okHandler, p)
	// Requests vanish: nothing reaches the upstream, nothing comes back.
	r.toxic(t, `{"type":"timeout","stream":"upstream","attributes":{"timeout":0}}`)
	_, _, _, err, _ := r.call(t, "GET", "", false, "")
	var re *bulwark.RetryError
	if !errors.Is(err, bulwark.ErrAttemptTimeout) || !errors.As(err, &re) || re.Attempts != 3 {
		t.Fatalf("GET err = %v; want ErrAttemptTimeout after 3 attempts", err)
	}
	if n := len(r.settle(t)); n != 0 {
		t.Errorf("a black-holed request reached the upstream %d times", n)
	}
	r.wantBreaker(t, bulwark.CircuitOpen)
	r.wantBulkheadEmpty(t)

	t.Run("responses lost", func(t *testing.T) {
		p := faultPolicy()
		// Long enough that the POST's request surely reaches the upstream
		// before its attempt gives up waiting for the answer.
		p.Timeout.Attempt = 100 * time.Millisecond
		p.Fallback.Constant = &bulwark.ConstantResponse{Body: []byte("default")}
		r := newFaultRig(t, okHandler, p)
		// The request arrives and is served; its answer never comes back.
		// This is the ambiguous timeout: a POST must not be sent again.
		r.toxic(t, `{"type":"timeout","stream":"downstream","attributes":{"timeout":0}}`)
		_, _, _, err, _ := r.call(t, "POST", "charge", false, "")
		if !errors.Is(err, bulwark.ErrAttemptTimeout) {
			t.Fatalf("POST err = %v; want ErrAttemptTimeout and no fallback", err)
		}
		if n := len(r.settle(t)); n != 1 {
			t.Errorf("POST reached the upstream %d times, want exactly 1", n)
		}
		st, got, hdr, err, _ := r.call(t, "GET", "", false, "")
		if err != nil || st != 200 || string(got) != "default" || hdr.Get(bulwark.FallbackHeader) != "constant" {
			t.Errorf("GET: %d %q %v; want the constant fallback", st, got, err)
		}
		if n := len(r.settle(t)); n > 4 {
			t.Errorf("upstream saw %d requests, want ≤ 4", n)
		}
	})
}

func TestFaultSlicer(t *testing.T) {
	r := newFaultRig(t, okHandler, faultPolicy())
	// Responses trickle in slices of 1..16 bytes, 10 µs apart.
	r.toxic(t, `{"type":"slicer","stream":"downstream","attributes":{"average_size":512,"size_variation":500,"delay":10}}`)
	r.toxic(t, `{"name":"slicer_up","type":"slicer","stream":"upstream","attributes":{"average_size":8,"size_variation":7,"delay":10}}`)
	body := strings.Repeat("sliced request ", 200)
	st, got, _, err, rerr := r.call(t, "POST", body, false, "")
	if err != nil || rerr != nil || st != 200 || !bytes.Equal(got, bigBody) {
		t.Fatalf("POST through slicer: %d, %d bytes, %v, %v", st, len(got), err, rerr)
	}
	seen := r.settle(t)
	if len(seen) != 1 || seen[0].body != body {
		t.Fatalf("upstream saw %d requests (body intact: %v)", len(seen), len(seen) == 1 && seen[0].body == body)
	}
	r.wantBreaker(t, bulwark.CircuitClosed)
	r.wantBulkheadEmpty(t)
}

func TestFaultLimitData(t *testing.T) {
	r := newFaultRig(t, okHandler, faultPolicy())
	// The connection is cut 2 KB into the response: headers arrive, the
	// body stops mid-way.
	r.toxic(t, `{"type":"limit_data","stream":"downstream","attributes":{"bytes":2048}}`)
	st, got, _, err, rerr := r.call(t, "GET", "", false, "")
	if err != nil || st != 200 {
		t.Fatalf("GET: %d, %v; want the response whose body is cut", st, err)
	}
	if rerr == nil || len(got) >= len(bigBody) {
		t.Fatalf("read %d of %d bytes, read error %v; want a cut body and an error", len(got), len(bigBody), rerr)
	}
	// The verdict was taken at the headers: the body's cut is not retried
	// (the caller already has the response) and the slot is back.
	if n := len(r.settle(t)); n != 1 {
		t.Errorf("upstream saw %d requests, want 1", n)
	}
	r.wantBulkheadEmpty(t)
	r.wantBreaker(t, bulwark.CircuitClosed)
}

func TestFaultBandwidth(t *testing.T) {
	// 256 KB/s: the 64 KiB body takes about a quarter second, inside the
	// attempt timeout.
	r := newFaultRig(t, okHandler, faultPolicy())
	r.toxic(t, `{"type":"bandwidth","stream":"downstream","attributes":{"rate":256}}`)
	st, got, _, err, rerr := r.call(t, "GET", "", false, "")
	if err != nil || rerr != nil || st != 200 || !bytes.Equal(got, bigBody) {
		t.Fatalf("GET through 256 KB/s: %d, %d bytes, %v, %v", st, len(got), err, rerr)
	}

	t.Run("body outlives the attempt", func(t *testing.T) {
		p := faultPolicy()
		p.Timeout.Attempt = 50 * time.Millisecond
		r := newFaultRig(t, okHandler, p)
		// 16 KB/s: the body would take four seconds; the attempt timeout,
		// which covers reading the body, ends it.
		r.toxic(t, `{"type":"bandwidth","stream":"downstream","attributes":{"rate":16}}`)
		st, got, _, err, rerr := r.call(t, "GET", "", false, "")
		if err == nil && (st != 200 || rerr == nil || !errors.Is(rerr, context.DeadlineExceeded)) {
			t.Fatalf("GET: %d, %d bytes, read error %v; want the body cut by the attempt deadline", st, len(got), rerr)
		}
		if err != nil && !errors.Is(err, bulwark.ErrAttemptTimeout) {
			t.Fatalf("GET err = %v; want ErrAttemptTimeout if the headers were late too", err)
		}
		r.wantBulkheadEmpty(t)
	})
}
