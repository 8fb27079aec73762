package bulwark

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"io"
	"net/http"
	neturl "net/url"
	"strings"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"testing/synctest"
	"time"
)

// contentBase serves GETs from a map of path to body with status 200, or
// fails every call with code (or err) once sick is set.
type contentBase struct {
	pages  map[string]string
	header http.Header // added to every good answer
	sick   atomic.Int32
	err    error // when sick and set: a transport error instead of a status
	calls  atomic.Int64
}

func (c *contentBase) RoundTrip(req *http.Request) (*http.Response, error) {
	c.calls.Add(1)
	closeBody(req)
	code, body := 200, c.pages[req.URL.Path]
	if s := c.sick.Load(); s != 0 {
		if c.err != nil {
			return nil, c.err
		}
		code, body = int(s), "sick"
	}
	h := c.header.Clone()
	if h == nil {
		h = http.Header{}
	}
	return &http.Response{
		StatusCode: code, Status: http.StatusText(code), Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Body: io.NopCloser(strings.NewReader(body)), ContentLength: int64(len(body)), Request: req,
	}, nil
}

type result struct {
	code   int
	body   string
	header http.Header
	err    error
}

// get sends a GET through rt and reads the whole answer.
func get(t testing.TB, rt http.RoundTripper, url string, hdr ...string) result {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return result{err: err}
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return result{code: resp.StatusCode, body: string(b), header: resp.Header}
}

func TestStaleFallbackWhileOpen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const maxAge = 5 * time.Minute
		clk := newFakeClock()
		base := &contentBase{pages: map[string]string{"/rate": "7.25%"}, header: http.Header{"Age": {"3"}}}
		tr := mustNew(t, Config{Base: base, Default: Policy{
			// Open for longer than the test's MaxAge: the breaker reads the
			// bubble's clock too, and must not let probes through here.
			Breaker:  Breaker{MinCalls: 1, OpenFor: time.Hour},
			Fallback: Fallback{Stale: StaleCache{MaxAge: maxAge}},
		}})
		const url = "http://tax.test/rate"

		if r := get(t, tr, url); r.err != nil || r.body != "7.25%" || r.header.Get(FallbackHeader) != "" {
			t.Fatalf("healthy: %+v", r)
		}
		stored := clk.now() // the answer was received now: nothing waited
		if f := tr.Snapshot().Hosts[0].Fallback; f.StaleEntries != 1 || f.StaleBytes < int64(len(url)+len("7.25%")) || !f.StaleOldest.Equal(stored) {
			t.Errorf("Snapshot after one stored answer: %+v, want 1 entry of at least the URL and body, received %v", *f, stored)
		}
		base.sick.Store(503)
		clk.advance(time.Minute)
		// The 503 trips the breaker and is replaced by the stale answer.
		r := get(t, tr, url)
		if r.err != nil || r.code != 200 || r.body != "7.25%" || r.header.Get(FallbackHeader) != "stale" || r.header.Get("Age") != "63" {
			t.Fatalf("503 with a stale entry: %+v", r)
		}
		if s, _ := breakerState(tr, "tax.test:80"); s != CircuitOpen {
			t.Fatalf("breaker %v, want open", s)
		}
		calls := base.calls.Load()
		// The steps are the stored answer's age: the retry of the 503 above
		// waited its backoff on the same clock.
		steps := []struct {
			age       time.Duration
			wantStale bool
		}{
			{clk.now().Sub(stored), true},
			{maxAge - time.Second, true},
			{maxAge, true}, // exactly MaxAge old
			{maxAge + time.Nanosecond, false},
			{maxAge + time.Nanosecond, false}, // dropped, not served again
		}
		for _, st := range steps {
			clk.advance(stored.Add(st.age).Sub(clk.now()))
			r := get(t, tr, url)
			switch {
			case st.wantStale && (r.err != nil || r.body != "7.25%" || r.header.Get(FallbackHeader) != "stale"):
				t.Errorf("%v old: %+v, want the stale answer", st.age, r)
			case !st.wantStale && !errors.Is(r.err, ErrBreakerOpen):
				t.Errorf("%v old: %+v, want ErrBreakerOpen past MaxAge", st.age, r)
			}
		}
		if n := base.calls.Load(); n != calls {
			t.Errorf("%d requests reached the host while open", n-calls)
		}
		if f := tr.Snapshot().Hosts[0].Fallback; f.StaleEntries != 0 || f.StaleBytes != 0 || !f.StaleOldest.IsZero() || f.Served != 4 {
			t.Errorf("Snapshot after the entry was dropped: %+v, want it empty and 4 served", *f)
		}
		// A different URL has no entry.
		if r := get(t, tr, "http://tax.test/other"); !errors.Is(r.err, ErrBreakerOpen) {
			t.Errorf("uncached URL: %+v, want ErrBreakerOpen", r)
		}
	})
}

func TestStaleCacheStoring(t *testing.T) {
	tests := []struct {
		name    string
		header  http.Header     // on the good response
		reqHdr  []string        // on both requests
		read    func(io.Reader) // how the caller reads the first answer
		want    bool
		lookHdr []string // on the failing request, when different
	}{
		{name: "read to EOF", want: true},
		{name: "read in one-byte steps", read: func(r io.Reader) { io.ReadAll(iotest.OneByteReader(r)) }, want: true},
		{name: "closed early", read: func(r io.Reader) { r.Read(make([]byte, 3)) }},
		{name: "not read", read: func(io.Reader) {}},
		{name: "no-store", header: http.Header{"Cache-Control": {"max-age=0, no-store"}}},
		{name: "private", header: http.Header{"Cache-Control": {"Private"}}},
		{name: "vary star", header: http.Header{"Vary": {"*"}}},
		{name: "authorization", reqHdr: []string{"Authorization", "Bearer x"}},
		{name: "cookie", reqHdr: []string{"Cookie", "a=b"}},
		{name: "vary match", header: http.Header{"Vary": {"Accept-Language"}}, reqHdr: []string{"Accept-Language", "fr"}, want: true},
		{name: "vary mismatch", header: http.Header{"Vary": {"accept-language"}}, reqHdr: []string{"Accept-Language", "fr"},
			lookHdr: []string{"Accept-Language", "de"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// In a bubble: the retries of the 502 wait no real time.
			synctest.Test(t, func(t *testing.T) {
				base := &contentBase{pages: map[string]string{"/p": "0123456789"}, header: tt.header}
				tr := mustNew(t, Config{Base: base, Default: Policy{
					Breaker: Breaker{Disabled: true}, Fallback: Fallback{Stale: StaleCache{MaxAge: time.Hour}},
				}})
				req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://s.test/p", nil)
				for i := 0; i+1 < len(tt.reqHdr); i += 2 {
					req.Header.Set(tt.reqHdr[i], tt.reqHdr[i+1])
				}
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				if tt.read != nil {
					tt.read(resp.Body)
				} else {
					io.ReadAll(resp.Body)
				}
				resp.Body.Close()
				base.sick.Store(502)
				look := tt.lookHdr
				if look == nil {
					look = tt.reqHdr
				}
				r := get(t, tr, "http://s.test/p", look...)
				if got := r.header.Get(FallbackHeader) == "stale"; got != tt.want {
					t.Errorf("served stale = %v, want %v (%+v)", got, tt.want, r)
				}
				if tt.want && r.body != "0123456789" {
					t.Errorf("stale body %q", r.body)
				}
				if !tt.want && (r.code != 502 || r.body != "sick") {
					t.Errorf("without an entry: %+v, want the original 502 intact", r)
				}
			})
		})
	}
}

func TestStaleCacheBounds(t *testing.T) {
	now := time.Now() // one instant: these are bounds of size, not of age
	c := newStaleCache((Fallback{Stale: StaleCache{MaxAge: time.Hour, MaxEntries: 3, MaxBytes: 100, MaxEntryBytes: 40}}).withDefaults().Stale)
	put := func(path string, n int) {
		c.store(&staleEntry{key: "http://b.test" + path, status: 200, body: bytes.Repeat([]byte("x"), n), received: now})
	}
	has := func(path string) bool {
		req, _ := http.NewRequest(http.MethodGet, "http://b.test"+path, nil)
		return c.serve(req, now) != nil
	}
	put("/a", 10)
	put("/b", 10)
	put("/c", 10)
	put("/d", 10) // four entries: /a goes
	if has("/a") || !has("/b") || !has("/d") {
		t.Errorf("entries cap: a=%v b=%v d=%v", has("/a"), has("/b"), has("/d"))
	}
	put("/e", 60) // 15+15+15+... bytes over 100: oldest go until it fits
	if c.bytes > 100 || len(c.entries) > 3 || !has("/e") || has("/b") {
		t.Errorf("bytes cap: %d bytes, %d entries, e=%v b=%v", c.bytes, len(c.entries), has("/e"), has("/b"))
	}
	put("/huge", 200) // larger than MaxBytes: not stored, nothing evicted for it
	if has("/huge") || !has("/e") {
		t.Errorf("oversized entry: huge=%v e=%v", has("/huge"), has("/e"))
	}
	put("/e", 5) // replacing keeps one entry per URL
	if n := len(c.entries); n != 2 || c.bytes != int64(2*len("http://b.test/e")+5+10) {
		t.Errorf("replace: %d entries, %d bytes", n, c.bytes)
	}

	// A body over MaxEntryBytes is not kept, whether its length is known
	// in advance or not. (In a bubble: the retries of the 500 wait no real
	// time.)
	synctest.Test(t, func(t *testing.T) {
		base := &contentBase{pages: map[string]string{"/big": strings.Repeat("y", 50)}}
		tr := mustNew(t, Config{Base: base, Default: Policy{Breaker: Breaker{Disabled: true},
			Fallback: Fallback{Stale: StaleCache{MaxAge: time.Hour, MaxEntryBytes: 40}}}})
		for _, known := range []bool{true, false} {
			base.sick.Store(0)
			rt := roundTripFunc(func(req *http.Request) (*http.Response, error) {
				resp, err := base.RoundTrip(req)
				if err == nil && !known {
					resp.ContentLength = -1
				}
				return resp, err
			})
			tr := mustNew(t, Config{Base: rt, Default: tr.def.policy})
			if r := get(t, tr, "http://s.test/big"); len(r.body) != 50 {
				t.Fatalf("big body read %d bytes", len(r.body))
			}
			base.sick.Store(500)
			if r := get(t, tr, "http://s.test/big"); r.code != 500 {
				t.Errorf("length known=%v: over MaxEntryBytes served %+v", known, r)
			}
		}
	})
}

func TestFallbackKinds(t *testing.T) {
	var gotCause error
	fn := func(req *http.Request, cause error) (*http.Response, error) {
		gotCause = cause
		switch req.URL.Path {
		case "/decline":
			return nil, nil
		case "/error":
			return nil, errors.New("fn: no answer")
		}
		return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader("from fn"))}, nil
	}
	constant := &ConstantResponse{Header: http.Header{"Content-Type": {"text/plain"}}, Body: []byte("default")}
	tests := []struct {
		name     string
		fb       Fallback
		method   string
		path     string
		sick     int32
		err      error
		wantBody string
		wantKind string // FallbackHeader value; empty: no fallback
		wantErr  bool
	}{
		{name: "constant on 503", fb: Fallback{Constant: constant}, sick: 503, wantBody: "default", wantKind: "constant"},
		{name: "constant on 429", fb: Fallback{Constant: constant}, sick: 429, wantBody: "default", wantKind: "constant"},
		{name: "constant on transport error", fb: Fallback{Constant: constant}, err: errStub, wantBody: "default", wantKind: "constant"},
		{name: "constant on attempt timeout", fb: Fallback{Constant: constant}, err: &timeoutError{limit: ErrAttemptTimeout, cause: errStub}, wantBody: "default", wantKind: "constant"},
		{name: "constant on bulkhead full", fb: Fallback{Constant: constant}, err: ErrBulkheadFull, wantBody: "default", wantKind: "constant"},
		{name: "not on 404", fb: Fallback{Constant: constant}, sick: 404, wantBody: "sick"},
		{name: "not on 501", fb: Fallback{Constant: constant}, sick: 501, wantBody: "sick"},
		{name: "not on success", fb: Fallback{Constant: constant}, wantBody: "page"},
		{name: "constant not for POST", fb: Fallback{Constant: constant}, method: http.MethodPost, sick: 503, wantBody: "sick"},
		{name: "constant HEAD", fb: Fallback{Constant: constant}, method: http.MethodHead, sick: 503, wantKind: "constant"},
		{name: "func first", fb: Fallback{Func: fn, Constant: constant}, sick: 503, wantBody: "from fn", wantKind: "func"},
		{name: "func for POST", fb: Fallback{Func: fn}, method: http.MethodPost, err: errStub, wantBody: "from fn", wantKind: "func"},
		{name: "func declines, constant answers", fb: Fallback{Func: fn, Constant: constant}, path: "/decline", sick: 503, wantBody: "default", wantKind: "constant"},
		{name: "func declines alone", fb: Fallback{Func: fn}, path: "/decline", sick: 503, wantBody: "sick"},
		{name: "func error", fb: Fallback{Func: fn}, path: "/error", sick: 503, wantErr: true},
		{name: "disabled", fb: Fallback{Constant: constant, Disabled: true}, sick: 503, wantBody: "sick"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// In a bubble: the retries of failed calls wait no real time.
			synctest.Test(t, func(t *testing.T) {
				gotCause = nil
				base := &contentBase{pages: map[string]string{"/": "page"}, err: tt.err}
				base.sick.Store(tt.sick)
				if tt.err != nil {
					base.sick.Store(1)
				}
				tr := mustNew(t, Config{Base: base, Default: Policy{Breaker: Breaker{Disabled: true}, Fallback: tt.fb}})
				method, path := tt.method, tt.path
				if method == "" {
					method = http.MethodGet
				}
				if path == "" {
					path = "/"
				}
				var bs bodies
				cr := contractRequest{method: method, body: "x"}
				if method == http.MethodGet || method == http.MethodHead {
					cr.body = ""
				}
				req := newContractRequest(t, t.Context(), "http://f.test"+path, cr, &bs)
				resp, err := tr.RoundTrip(req)
				if tt.wantErr {
					if err == nil {
						resp.Body.Close()
						t.Fatalf("got a response, want an error")
					}
					return
				}
				if err != nil {
					t.Fatalf("err = %v", err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if string(b) != tt.wantBody || resp.Header.Get(FallbackHeader) != tt.wantKind {
					t.Errorf("got %d %q kind %q, want %q kind %q", resp.StatusCode, b, resp.Header.Get(FallbackHeader), tt.wantBody, tt.wantKind)
				}
				if tt.wantKind == "func" && tt.sick == 503 {
					var se *UpstreamStatusError
					if !errors.As(gotCause, &se) || se.StatusCode != 503 || se.Host != "f.test:80" {
						t.Errorf("cause = %v, want an *UpstreamStatusError 503", gotCause)
					}
				}
				if tt.wantKind == "func" && tt.err != nil && !errors.Is(gotCause, tt.err) {
					t.Errorf("cause = %v, want %v", gotCause, tt.err)
				}
				if !bs.allClosed() {
					t.Error("request body left open")
				}
			})
		})
	}
}

func TestFallbackNotOnCallerCancel(t *testing.T) {
	var asked atomic.Int32
	fn := func(*http.Request, error) (*http.Response, error) {
		asked.Add(1)
		return &http.Response{StatusCode: 200}, nil
	}
	for _, block := range []bool{false, true} {
		base := &stubBase{block: block, status: 503}
		tr := mustNew(t, Config{Base: base, Default: Policy{Fallback: Fallback{Func: fn, Constant: &ConstantResponse{}}}})
		ctx, cancel := context.WithCancel(t.Context())
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://c.test/", nil)
		if block {
			go cancel()
		} else {
			cancel()
		}
		resp, err := tr.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
		}
		if !errors.Is(err, context.Canceled) {
			t.Errorf("block=%v: err = %v, want context.Canceled", block, err)
		}
	}
	// The fallback layer alone, with the caller's context ended after a
	// 503: the base answers, then the caller gives up.
	ctx, cancel := context.WithCancel(t.Context())
	f := mustNew(t, Config{Base: roundTripFunc(func(req *http.Request) (*http.Response, error) {
		resp, err := (&stubBase{status: 503}).RoundTrip(req)
		cancel()
		return resp, err
	}), Default: only(Policy{Fallback: Fallback{Func: fn}})})
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://c.test/", nil)
	if resp, err := f.RoundTrip(req); err != nil || resp.StatusCode != 503 {
		t.Errorf("cancelled caller: %v, %v; want the 503 as it was", resp, err)
	} else {
		resp.Body.Close()
	}
	if n := asked.Load(); n != 0 {
		t.Errorf("fallback asked %d times for a caller that gave up", n)
	}
}

func TestFallbackValidate(t *testing.T) {
	tests := []struct {
		fb    Fallback
		field string
	}{
		{Fallback{Stale: StaleCache{MaxAge: -1}}, "Fallback.Stale.MaxAge"},
		{Fallback{Stale: StaleCache{MaxAge: time.Second, MaxEntries: -1}}, "Fallback.Stale.MaxEntries"},
		{Fallback{Stale: StaleCache{MaxAge: time.Second, MaxBytes: -1}}, "Fallback.Stale.MaxBytes"},
		{Fallback{Stale: StaleCache{MaxAge: time.Second, MaxEntryBytes: -1}}, "Fallback.Stale.MaxEntryBytes"},
		{Fallback{Stale: StaleCache{MaxAge: time.Second, MaxBytes: 10, MaxEntryBytes: 11}}, "Fallback.Stale.MaxEntryBytes"},
		{Fallback{Constant: &ConstantResponse{StatusCode: 99}}, "Fallback.Constant.StatusCode"},
	}
	for _, tt := range tests {
		_, err := New(Config{Default: Policy{Fallback: tt.fb}})
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != tt.field {
			t.Errorf("New(%+v) = %v, want a ConfigError for %s", tt.fb, err, tt.field)
		}
	}
	// Small MaxBytes caps the default MaxEntryBytes rather than failing.
	if _, err := New(Config{Default: Policy{Fallback: Fallback{Stale: StaleCache{MaxAge: time.Second, MaxBytes: 1000}}}}); err != nil {
		t.Errorf("MaxBytes under the default entry cap: %v", err)
	}
	if (Fallback{}).enabled() || (Fallback{Constant: &ConstantResponse{}, Disabled: true}).enabled() {
		t.Error("zero or disabled Fallback enabled")
	}
	// The constant is copied: changing it after New changes nothing. (In a
	// bubble: the retries of the 503 wait no real time.)
	synctest.Test(t, func(t *testing.T) {
		c := &ConstantResponse{Body: []byte("one")}
		tr := mustNew(t, Config{Base: &stubBase{status: 503}, Default: Policy{Fallback: Fallback{Constant: c}}})
		r := get(t, tr, "http://k.test/")
		c.Body[0] = 'X'
		if r2 := get(t, tr, "http://k.test/"); r.body != "one" || r2.body != "one" {
			t.Errorf("constant bodies %q then %q, want \"one\"", r.body, r2.body)
		}
	})
}

func TestFallbackContract(t *testing.T) {
	fb := Fallback{Stale: StaleCache{MaxAge: time.Minute}, Constant: &ConstantResponse{Body: []byte("hello")},
		Func: func(req *http.Request, _ error) (*http.Response, error) {
			if req.Method == http.MethodGet {
				return nil, nil
			}
			return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader("hello"))}, nil
		}}
	t.Run("layer", func(t *testing.T) {
		runContract(t, func(base http.RoundTripper) http.RoundTripper {
			return mustNew(t, Config{Base: base, Default: only(Policy{Fallback: fb})})
		})
	})
	t.Run("stack", func(t *testing.T) {
		runContract(t, func(base http.RoundTripper) http.RoundTripper {
			return mustNew(t, Config{Base: base, Default: Policy{Fallback: fb, Breaker: Breaker{MinCalls: 1}}})
		})
	})
	// Tripped, then forced open: a tripped breaker alone lets a spaced
	// probe through once its time comes, and a bubble's clock jumps to it
	// whenever every goroutine waits (2 runs in 100 sent one).
	t.Run("open breaker", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			tr := mustNew(t, Config{Base: &stubBase{status: 503}, Default: Policy{Breaker: Breaker{MinCalls: 1}}})
			get(t, tr, "http://contract.test/")
			if err := tr.ControlBreaker("contract.test:80", BreakerForceOpen); err != nil {
				t.Fatal(err)
			}
			for _, cr := range contractRequests {
				var bs bodies
				_, _, err := checkContract(t, tr, newContractRequest(t, t.Context(), "http://contract.test/x", cr, &bs), &bs)
				if !errors.Is(err, ErrBreakerOpen) {
					t.Errorf("%s: err = %v, want ErrBreakerOpen", cr.name, err)
				}
			}
		})
	})
}

// TestStaleCacheStreams checks that the tee never reads ahead of the
// caller: each chunk reaches the caller while the upstream is still
// writing, and the whole is stored once the caller reaches EOF.
func TestStaleCacheStreams(t *testing.T) {
	// In a bubble: the retries of the final 503 wait no real time.
	synctest.Test(t, func(t *testing.T) {
		pr, pw := io.Pipe()
		var sick atomic.Bool
		base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if sick.Load() {
				return (&stubBase{status: 503}).RoundTrip(req)
			}
			return &http.Response{StatusCode: 200, Header: http.Header{}, Body: pr, ContentLength: -1, Request: req}, nil
		})
		tr := mustNew(t, Config{Base: base, Default: Policy{Breaker: Breaker{Disabled: true},
			Fallback: Fallback{Stale: StaleCache{MaxAge: time.Hour}}}})
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://stream.test/events", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 16)
		for _, chunk := range []string{"one,", "two,", "three"} {
			go pw.Write([]byte(chunk))
			n, err := io.ReadFull(resp.Body, buf[:len(chunk)])
			if err != nil || string(buf[:n]) != chunk {
				t.Fatalf("chunk %q: got %q, %v", chunk, buf[:n], err)
			}
		}
		pw.Close()
		if n, err := resp.Body.Read(buf); n != 0 || err != io.EOF {
			t.Fatalf("after the stream: %d, %v; want EOF", n, err)
		}
		resp.Body.Close()
		sick.Store(true)
		if r := get(t, tr, "http://stream.test/events"); r.body != "one,two,three" || r.header.Get(FallbackHeader) != "stale" {
			t.Errorf("stale stream: %+v", r)
		}
	})
}

// TestShareable is the stale cache's sharing rule, one row per rule and per
// exception to it (RFC 9111 §3, §3.5, §4.2.4, §5.2).
func TestShareable(t *testing.T) {
	const anyAge = -1 // fresh: no limit but MaxAge
	date := "Sun, 01 Mar 2026 12:00:00 GMT"
	tests := []struct {
		name   string
		method string      // empty: GET
		req    http.Header // on the request
		status int         // zero: 200
		resp   http.Header // on the response
		ok     bool
		fresh  time.Duration
	}{
		{name: "plain GET", ok: true, fresh: anyAge},
		{name: "POST", method: http.MethodPost},
		{name: "HEAD", method: http.MethodHead},
		{name: "404", status: 404},
		{name: "206", status: 206},
		{name: "204", status: 204, ok: true, fresh: anyAge},
		{name: "request Cookie", req: http.Header{"Cookie": {"a=b"}}},
		{name: "request Range", req: http.Header{"Range": {"bytes=0-1"}}},
		{name: "request no-store", req: http.Header{"Cache-Control": {"No-Store"}}},
		{name: "request no-cache", req: http.Header{"Cache-Control": {"max-age=0", "no-cache"}}},
		{name: "request max-age", req: http.Header{"Cache-Control": {"max-age=0"}}, ok: true, fresh: anyAge},
		{name: "no-store", resp: http.Header{"Cache-Control": {"max-age=60, no-store"}}},
		{name: "private", resp: http.Header{"Cache-Control": {"Private"}}},
		{name: "private with fields", resp: http.Header{"Cache-Control": {`private="X-User, X-Id", max-age=60`}}},
		{name: "no-cache", resp: http.Header{"Cache-Control": {"no-cache"}}},
		{name: "quoted public is not public", req: http.Header{"Authorization": {"Bearer x"}},
			resp: http.Header{"Cache-Control": {`ext="a, public, b"`}}},
		{name: "unknown directive", resp: http.Header{"Cache-Control": {"immutable, stale-if-error=60"}}, ok: true, fresh: anyAge},
		{name: "vary star", resp: http.Header{"Vary": {"Accept, *"}}},
		{name: "vary header", resp: http.Header{"Vary": {"Accept"}}, ok: true, fresh: anyAge},
		{name: "set-cookie", resp: http.Header{"Set-Cookie": {"session=alice"}}},
		{name: "set-cookie, max-age", resp: http.Header{"Set-Cookie": {"s=a"}, "Cache-Control": {"max-age=60"}}},
		{name: "set-cookie, public", resp: http.Header{"Set-Cookie": {"s=a"}, "Cache-Control": {"PUBLIC"}}, ok: true, fresh: anyAge},
		{name: "authorization", req: http.Header{"Authorization": {"Bearer x"}}},
		{name: "authorization, max-age", req: http.Header{"Authorization": {"Bearer x"}},
			resp: http.Header{"Cache-Control": {"max-age=60"}}},
		{name: "authorization, public", req: http.Header{"Authorization": {"Bearer x"}},
			resp: http.Header{"Cache-Control": {"public"}}, ok: true, fresh: anyAge},
		{name: "authorization, s-maxage", req: http.Header{"Authorization": {"Bearer x"}},
			resp: http.Header{"Cache-Control": {"s-maxage=30"}}, ok: true, fresh: 30 * time.Second},
		{name: "authorization, must-revalidate", req: http.Header{"Authorization": {"Bearer x"}},
			resp: http.Header{"Cache-Control": {"must-revalidate, max-age=20"}}, ok: true, fresh: 20 * time.Second},
		{name: "must-revalidate without a lifetime", resp: http.Header{"Cache-Control": {"must-revalidate"}}},
		{name: "must-revalidate, max-age=0", resp: http.Header{"Cache-Control": {"must-revalidate, max-age=0"}}},
		{name: "must-revalidate, bad max-age", resp: http.Header{"Cache-Control": {"must-revalidate, max-age=soon"}}},
		{name: "proxy-revalidate, quoted max-age", resp: http.Header{"Cache-Control": {`proxy-revalidate, max-age="15"`}},
			ok: true, fresh: 15 * time.Second},
		{name: "s-maxage over max-age", resp: http.Header{"Cache-Control": {"max-age=600, s-maxage=5"}}, ok: true, fresh: 5 * time.Second},
		{name: "first max-age counts", resp: http.Header{"Cache-Control": {"must-revalidate, max-age=7, max-age=9"}},
			ok: true, fresh: 7 * time.Second},
		{name: "huge s-maxage", resp: http.Header{"Cache-Control": {"s-maxage=99999999999999999999"}}, ok: true, fresh: 1 << 31 * time.Second},
		{name: "must-revalidate, Expires", resp: http.Header{"Cache-Control": {"must-revalidate"}, "Date": {date},
			"Expires": {"Sun, 01 Mar 2026 12:01:00 GMT"}}, ok: true, fresh: time.Minute},
		{name: "must-revalidate, Expires past", resp: http.Header{"Cache-Control": {"must-revalidate"}, "Date": {date},
			"Expires": {"Sun, 01 Mar 2026 11:00:00 GMT"}}},
		{name: "must-revalidate, Expires 0", resp: http.Header{"Cache-Control": {"must-revalidate"}, "Date": {date}, "Expires": {"0"}}},
	}
	for _, tt := range tests {
		method, status := cmp.Or(tt.method, http.MethodGet), cmp.Or(tt.status, 200)
		req, _ := http.NewRequest(method, "http://s.test/p", nil)
		if tt.req != nil {
			req.Header = tt.req
		}
		ok, fresh := shareable(req, status, tt.resp)
		if ok != tt.ok || (ok && fresh != tt.fresh) {
			t.Errorf("%s: shareable(%s %v, %d %v) = %v, %v; want %v, %v", tt.name, method, tt.req, status, tt.resp, ok, fresh, tt.ok, tt.fresh)
		}
	}
}

// TestStaleServedOnlyWhileFresh: a response that forbids being served
// stale is a fallback answer only within its freshness lifetime, counted
// from the upstream's Age.
func TestStaleServedOnlyWhileFresh(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := newFakeClock()
		base := &contentBase{pages: map[string]string{"/p": "page"},
			header: http.Header{"Cache-Control": {"public, must-revalidate, max-age=60"}, "Age": {"10"}}}
		tr := mustNew(t, Config{Base: base, Default: Policy{Breaker: Breaker{Disabled: true}, Retry: Retry{MaxAttempts: 1},
			Fallback: Fallback{Stale: StaleCache{MaxAge: time.Hour}}}})
		const url = "http://s.test/p"
		get(t, tr, url)
		base.sick.Store(503)
		for _, st := range []struct {
			advance time.Duration
			stale   bool
		}{
			{49 * time.Second, true}, // Age 59
			{time.Second, false},     // Age 60: stale
		} {
			clk.advance(st.advance)
			if r := get(t, tr, url); (r.header.Get(FallbackHeader) == "stale") != st.stale {
				t.Errorf("+%v: %+v, want stale %v", st.advance, r, st.stale)
			}
		}
		// Seen past its lifetime, the entry is dropped, not kept for later.
		u, _ := neturl.Parse(url)
		c := tr.lookup(u).rt.(*fallbackLayer).stale
		c.mu.Lock()
		n := len(c.entries)
		c.mu.Unlock()
		if n != 0 {
			t.Errorf("stale cache holds %d entries after the answer went stale, want 0", n)
		}
	})
}
