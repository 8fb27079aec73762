package sdktest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bulwark-http/bulwark"
)

// memServer is a RoundTripper that serves each request with an
// http.Handler in the caller's goroutine, as a server on the other end of
// a connection would: the request's body is read whole first, its header
// keys arrive canonical, and a handler that is still working when the
// request's context ends (a hung connection, a slow first byte) has its
// answer dropped and the caller gets the context's error.
type memServer struct{ h http.Handler }

func (m memServer) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		b, err := io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return nil, err
		}
		body = b
	}
	ctx := req.Context()
	sreq := req.Clone(ctx)
	sreq.Header = http.Header{}
	for k, v := range req.Header {
		sreq.Header[http.CanonicalHeaderKey(k)] = append([]string(nil), v...)
	}
	sreq.Body = io.NopCloser(bytes.NewReader(body))
	sreq.ContentLength = int64(len(body))
	if len(body) > 0 || req.Method == http.MethodPut || req.Method == http.MethodPost {
		// As the wire carries it, and a server reads it.
		sreq.Header.Set("Content-Length", strconv.Itoa(len(body)))
	}
	sreq.RequestURI = req.URL.RequestURI()
	if sreq.Host == "" {
		sreq.Host = req.URL.Host
	}
	sreq.RemoteAddr = "127.0.0.1:1"
	rec := httptest.NewRecorder()
	m.h.ServeHTTP(rec, sreq)
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("memServer: %w", context.Cause(ctx))
	}
	resp := rec.Result()
	resp.Request = req
	return resp, nil
}

// fault is what the fault injector does to one request.
type fault struct {
	status int      // answer this status instead of serving (0: serve)
	header []string // name, value pairs on that answer
	// text, when set, is that answer's body, plain text (a proxy's);
	// otherwise a JSON error as an API server writes one.
	text  string
	delay time.Duration
	hang  bool // never answer: wait for the request's context
}

// hit is one request the server received.
type hit struct {
	at     time.Time
	call   string // the call it belongs to (the SDK's invocation id, or the test's)
	method string
	path   string
	sigErr error // the SigV4 check's verdict, when checked
	header http.Header
}

// injector stands in front of a handler: it records every request,
// checks it (when check is set), and applies the fault that plan gives.
type injector struct {
	next   http.Handler
	start  time.Time
	callOf func(*http.Request) string
	check  func(*http.Request, []byte) error
	plan   func(since time.Duration, r *http.Request) fault

	mu   sync.Mutex
	hits []hit
}

func (j *injector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	h := hit{at: time.Now(), call: j.callOf(r), method: r.Method, path: r.URL.Path, header: r.Header.Clone()}
	if j.check != nil {
		h.sigErr = j.check(r, body)
	}
	j.mu.Lock()
	j.hits = append(j.hits, h)
	j.mu.Unlock()
	var f fault
	if j.plan != nil {
		f = j.plan(time.Since(j.start), r)
	}
	if f.hang {
		<-r.Context().Done()
		return
	}
	if f.delay > 0 {
		select {
		case <-time.After(f.delay):
		case <-r.Context().Done():
			return
		}
	}
	if f.status != 0 {
		for i := 0; i+1 < len(f.header); i += 2 {
			w.Header().Set(f.header[i], f.header[i+1])
		}
		if f.text != "" {
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(f.status)
			_, _ = io.WriteString(w, f.text)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(f.status)
		_, _ = io.WriteString(w, `{"error":{"message":"injected","type":"server_error"}}`)
		return
	}
	j.next.ServeHTTP(w, r)
}

func (j *injector) all() []hit {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]hit(nil), j.hits...)
}

// perCall counts the requests the server received for each call.
func (j *injector) perCall() map[string]int {
	n := map[string]int{}
	for _, h := range j.all() {
		n[h.call]++
	}
	return n
}

// through returns a client over base: plain, or through a zero-config
// bulwark Transport (and that Transport, to be closed).
func through(t *testing.T, base http.RoundTripper, withBulwark bool) (*http.Client, *bulwark.Transport) {
	t.Helper()
	if !withBulwark {
		return &http.Client{Transport: base}, nil
	}
	tr, err := bulwark.New(bulwark.Config{Base: base})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return &http.Client{Transport: tr}, tr
}

// The blip every SDK test drives: healthy, then every request answered
// 503 for blipFor, then healthy again until runFor.
const (
	blipAt  = 2 * time.Second
	blipFor = 2 * time.Second
	runFor  = 8 * time.Second
)

// inBlip is the injector's plan during the blip: 503.
func inBlip(since time.Duration) bool { return since >= blipAt && since < blipAt+blipFor }

// callResult is one call as the caller saw it.
type callResult struct {
	id    string
	start time.Duration
	err   error
}

// blipRun is what a blip run measured.
type blipRun struct {
	// attemptsInBlip is the requests the server received per call, for
	// the calls started during the blip.
	attemptsInBlip float64
	callsInBlip    int
	// okAfter is the share of the calls started from 1 s after the blip
	// that succeeded, of afterCalls.
	okAfter    float64
	afterCalls int
	// mostPerCall is the most requests the server received for one call.
	mostPerCall int
}

func (b blipRun) String() string {
	return fmt.Sprintf("%.3f attempts/call over %d calls started in the blip; %.1f %% of %d calls from 1 s after it succeeded; at most %d requests for one call",
		b.attemptsInBlip, b.callsInBlip, 100*b.okAfter, b.afterCalls, b.mostPerCall)
}

// runBlip drives workers callers, each calling do in a loop with a pause
// of think between calls, for runFor on the bubble's clock, and measures
// the blip.
func runBlip(j *injector, workers int, think time.Duration, do func(ctx context.Context, id string) error) blipRun {
	var mu sync.Mutex
	var results []callResult
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := 0; ; i++ {
				since := time.Since(j.start)
				if since >= runFor {
					return
				}
				id := fmt.Sprintf("w%d-%d", w, i)
				err := do(context.Background(), id)
				mu.Lock()
				results = append(results, callResult{id: id, start: since, err: err})
				mu.Unlock()
				time.Sleep(think)
			}
		})
	}
	wg.Wait()
	per := j.perCall()
	var b blipRun
	for _, n := range per {
		b.mostPerCall = max(b.mostPerCall, n)
	}
	attempts, ok := 0, 0
	for _, r := range results {
		switch {
		case inBlip(r.start):
			b.callsInBlip++
			attempts += per[r.id]
		case r.start >= blipAt+blipFor+time.Second:
			b.afterCalls++
			if r.err == nil {
				ok++
			}
		}
	}
	b.attemptsInBlip = float64(attempts) / float64(b.callsInBlip)
	b.okAfter = float64(ok) / float64(b.afterCalls)
	return b
}

// gaps lists, for each call with more than one request, the time between
// its requests.
func gaps(hits []hit) []time.Duration {
	by := map[string][]time.Time{}
	for _, h := range hits {
		by[h.call] = append(by[h.call], h.at)
	}
	var out []time.Duration
	for _, ts := range by {
		sort.Slice(ts, func(a, b int) bool { return ts[a].Before(ts[b]) })
		for i := 1; i < len(ts); i++ {
			out = append(out, ts[i].Sub(ts[i-1]))
		}
	}
	return out
}

// callHeader is the header by which a test names the call a request
// belongs to, added through each SDK's own per-call options.
const callHeader = "X-Test-Call"

// headerOf returns a function that names a request's call by header k.
func headerOf(k string) func(*http.Request) string {
	return func(r *http.Request) string { return strings.TrimSpace(r.Header.Get(k)) }
}

// firstTry answers each call's first request (among those match accepts,
// all when it is nil) with first, and every other request with rest,
// noting when it answered first.
type firstTry struct {
	first, rest fault
	match       func(*http.Request) bool

	mu   sync.Mutex
	seen map[string]bool
	at   []time.Time
}

func (f *firstTry) plan(_ time.Duration, r *http.Request) fault {
	f.mu.Lock()
	defer f.mu.Unlock()
	call := r.Header.Get(callHeader)
	if f.seen[call] || f.match != nil && !f.match(r) {
		return f.rest
	}
	if f.seen == nil {
		f.seen = map[string]bool{}
	}
	f.seen[call] = true
	f.at = append(f.at, time.Now())
	return f.first
}

// sooner counts the requests that reached the server less than d after
// one of f's first answers.
func (f *firstTry) sooner(hits []hit, d time.Duration) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, h := range hits {
		for _, at := range f.at {
			if gap := h.at.Sub(at); gap > 0 && gap < d {
				n++
				break
			}
		}
	}
	return n
}

// compareBlip runs a blip with the SDK alone and through bulwark (run
// says what it measured, in a bubble of its own), and checks the figures
// against the SDK's alone: at most 0.05 more requests per call begun in
// the blip, and at least 99 % of the calls from 1 s after it succeeding.
func compareBlip(t *testing.T, run func(t *testing.T, withBulwark bool) blipRun) {
	var alone, with blipRun
	for _, withBulwark := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			r := run(t, withBulwark)
			t.Logf("bulwark %v: %s", withBulwark, r)
			if withBulwark {
				with = r
			} else {
				alone = r
			}
		})
	}
	if with.attemptsInBlip > alone.attemptsInBlip+0.05 {
		t.Errorf("during the blip: %.3f requests per call with bulwark, %.3f with the SDK alone: want at most +0.05", with.attemptsInBlip, alone.attemptsInBlip)
	}
	if with.okAfter < 0.99 {
		t.Errorf("with bulwark, from 1 s after the blip: %s; want ≥ 99 %% succeeding", with)
	}
	// Each of the three SDKs sends a call at most three times (AWS's
	// standard retryer, Stainless's and stripe-go's two retries).
	if with.mostPerCall > sdkMaxAttempts {
		t.Errorf("with bulwark a call reached the server %d times; the SDK alone sends one at most %d", with.mostPerCall, sdkMaxAttempts)
	}
}

// sdkMaxAttempts is the most times each SDK under test sends one call,
// by its defaults.
const sdkMaxAttempts = 3

// blip503 is the plan of every blip test: 503, with body text when it is
// set (a proxy's), during the blip.
func blip503(text string) func(time.Duration, *http.Request) fault {
	return func(since time.Duration, _ *http.Request) fault {
		if inBlip(since) {
			return fault{status: http.StatusServiceUnavailable, text: text}
		}
		return fault{}
	}
}
