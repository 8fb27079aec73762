package bulwark

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// recordBase records the headers and context of each attempt it is sent.
type recordBase struct {
	mu      sync.Mutex
	headers []http.Header
	ctxs    []context.Context
	// hold, if set, is how long each attempt takes before answering 503.
	hold time.Duration
}

func (r *recordBase) RoundTrip(req *http.Request) (*http.Response, error) {
	r.mu.Lock()
	r.headers = append(r.headers, req.Header.Clone())
	r.ctxs = append(r.ctxs, req.Context())
	r.mu.Unlock()
	closeBody(req)
	if r.hold > 0 {
		select {
		case <-time.After(r.hold):
		case <-req.Context().Done():
			return nil, req.Context().Err()
		}
	}
	return &http.Response{StatusCode: 503, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("busy")), Request: req}, nil
}

// retryTwice is the policy of the deadline layers and the real retry layer
// alone, for two attempts with no wait between them, so that a test knows
// exactly when each attempt starts.
func retryTwice(to Timeout) Policy {
	return only(Policy{Timeout: to, Retry: Retry{MaxAttempts: 2, Backoff: noWait, Budget: Budget{Disabled: true}}},
		"timeout", "retry")
}

func headerMillis(t *testing.T, h http.Header, name string) int64 {
	t.Helper()
	v := h.Get(name)
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("%s = %q, want milliseconds", name, v)
	}
	return n
}

func TestDeadlineHeaderShrinksPerAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &recordBase{hold: 300 * time.Millisecond}
		rt := mustNew(t, Config{Base: base, Default: retryTwice(Timeout{Total: time.Second, Attempt: 800 * time.Millisecond})})
		req, _ := http.NewRequest("GET", "http://tax.internal/rate", nil)
		resp, err := rt.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if len(base.headers) != 2 {
			t.Fatalf("base saw %d attempts, want 2", len(base.headers))
		}
		// First attempt: Attempt (800 ms) is sooner than Total (1 s).
		// Second, 300 ms later: Total's 700 ms left is sooner than 800 ms.
		want := []int64{800 - 5, 700 - 5}
		for i, h := range base.headers {
			if got := headerMillis(t, h, DefaultDeadlineHeader); got != want[i] {
				t.Errorf("attempt %d: %s = %d, want %d", i+1, DefaultDeadlineHeader, got, want[i])
			}
			if got := h.Get(AttemptHeader); got != strconv.Itoa(i+1) {
				t.Errorf("attempt %d: %s = %q, want %d", i+1, AttemptHeader, got, i+1)
			}
		}
		if req.Header.Get(DefaultDeadlineHeader) != "" || req.Header.Get(AttemptHeader) != "" {
			t.Error("the caller's request got bulwark's headers")
		}
	})
}

func TestDeadlineHeaderFollowsCallerDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &recordBase{}
		tr, err := New(Config{Base: base, Default: Policy{Timeout: Timeout{Header: "X-Budget-Ms"}}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 250*time.Millisecond)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://tax.internal/rate", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := headerMillis(t, base.headers[0], "X-Budget-Ms"); got != 245 {
			t.Errorf("X-Budget-Ms = %d, want 245 (the caller's 250 ms less the margin)", got)
		}
		// The caller's deadline was the soonest: bulwark made no context of
		// its own, so the base saw the caller's.
		if d, _ := base.ctxs[0].Deadline(); !d.Equal(func() time.Time { d, _ := ctx.Deadline(); return d }()) {
			t.Errorf("attempt deadline %v, want the caller's", d)
		}
	})
}

func TestDeadlineTooShortFailsFast(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &stubBase{}
		tr, err := New(Config{Base: base})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 9*time.Millisecond)
		defer cancel()
		var bs bodies
		req := newContractRequest(t, ctx, "http://tax.internal/", contractRequests[1], &bs)
		_, _, err = checkContract(t, tr, req, &bs)
		if !errors.Is(err, ErrDeadlineTooShort) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("err = %v, want ErrDeadlineTooShort wrapping context.DeadlineExceeded", err)
		}
		if n := base.calls.Load(); n != 0 {
			t.Errorf("base called %d times, want 0", n)
		}
	})
}

func TestAttemptTimeoutIsOurs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, err := New(Config{Base: &stubBase{block: true}, Default: Policy{Timeout: Timeout{Attempt: 100 * time.Millisecond}, Retry: Retry{Disabled: true}}})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		req, _ := http.NewRequest("GET", "http://slow.internal/", nil)
		_, err = tr.RoundTrip(req)
		if !errors.Is(err, ErrAttemptTimeout) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("err = %v, want ErrAttemptTimeout", err)
		}
		if el := time.Since(start); el != 100*time.Millisecond {
			t.Errorf("attempt ended after %v, want 100ms", el)
		}

		// The caller's own deadline, sooner than Attempt, is not ours.
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		req, _ = http.NewRequestWithContext(ctx, "GET", "http://slow.internal/", nil)
		_, err = tr.RoundTrip(req)
		if errors.Is(err, ErrAttemptTimeout) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("caller's deadline: err = %v, want context.DeadlineExceeded and not ErrAttemptTimeout", err)
		}
	})
}

// The second attempt starts 400 ms in, with 200 ms of Total left, sooner
// than its Attempt: Total cuts it, and the error says so (ErrTotalTimeout,
// new with the redesign; it used to be ErrAttemptTimeout).
func TestTotalBoundsTheCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &recordBase{hold: 400 * time.Millisecond}
		rt := mustNew(t, Config{Base: base, Default: retryTwice(Timeout{Total: 600 * time.Millisecond, Attempt: 500 * time.Millisecond})})
		start := time.Now()
		req, _ := http.NewRequest("GET", "http://tax.internal/", nil)
		_, err := rt.RoundTrip(req)
		if !errors.Is(err, ErrTotalTimeout) || errors.Is(err, ErrAttemptTimeout) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("err = %v, want ErrTotalTimeout (not ErrAttemptTimeout), wrapping context.DeadlineExceeded", err)
		}
		if len(base.headers) != 2 {
			t.Errorf("base saw %d attempts, want 2", len(base.headers))
		}
		if el := time.Since(start); el != 600*time.Millisecond {
			t.Errorf("call took %v, want Total = 600ms", el)
		}
	})
}

// The context bulwark makes for an attempt lives until the caller is done
// with the body, not until RoundTrip returns.
func TestAttemptContextEndsWithBody(t *testing.T) {
	for _, end := range []string{"close", "eof"} {
		t.Run(end, func(t *testing.T) {
			base := &recordBase{}
			// Retries off: recordBase answers 503, which would be retried.
			tr, err := New(Config{Base: base, Default: Policy{Retry: Retry{Disabled: true}}})
			if err != nil {
				t.Fatal(err)
			}
			req, _ := http.NewRequest("GET", "http://tax.internal/", nil)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			actx := base.ctxs[0]
			if actx.Err() != nil {
				t.Fatal("attempt context ended when RoundTrip returned")
			}
			if end == "close" {
				resp.Body.Close()
			} else if _, err := io.ReadAll(resp.Body); err != nil {
				t.Fatal(err)
			}
			if !errors.Is(actx.Err(), context.Canceled) {
				t.Errorf("after %s, attempt context err = %v, want Canceled", end, actx.Err())
			}
			resp.Body.Close()
		})
	}
}

func TestDoneContextSendsNothing(t *testing.T) {
	base := &stubBase{}
	tr, err := New(Config{Base: base})
	if err != nil {
		t.Fatal(err)
	}
	cause := errors.New("caller gave up")
	ctx, cancel := context.WithCancelCause(t.Context())
	cancel(cause)
	var bs bodies
	req := newContractRequest(t, ctx, "http://tax.internal/", contractRequests[1], &bs)
	_, _, err = checkContract(t, tr, req, &bs)
	if !errors.Is(err, context.Canceled) || !errors.Is(err, cause) {
		t.Errorf("err = %v, want it to wrap context.Canceled and the cause", err)
	}
	if base.calls.Load() != 0 {
		t.Error("base was called for a done context")
	}
}

// In a bubble: recordBase answers 503, which the default stack retries.
func TestDisabledTimeoutSendsNoHeader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &recordBase{}
		tr, err := New(Config{Base: base, Default: Policy{Timeout: Timeout{Disabled: true}}})
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest("GET", "http://tax.internal/", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if len(base.headers) != DefaultMaxAttempts {
			t.Fatalf("base saw %d attempts, want %d", len(base.headers), DefaultMaxAttempts)
		}
		for i, h := range base.headers {
			for _, name := range []string{DefaultDeadlineHeader, AttemptHeader} {
				if v, ok := h[name]; ok {
					t.Errorf("attempt %d: Timeout disabled, yet %s = %q", i+1, name, v)
				}
			}
		}
		if _, ok := base.ctxs[0].Deadline(); ok {
			t.Error("Timeout disabled, yet the attempt had a deadline")
		}
	})
}

// The attempt's context carries the caller's deadline, or none, never
// bulwark's: bulwark's bound is enforced by its own timer and travels in
// the deadline header. (Changed on purpose by the redesign: the attempt
// context used to be a context.WithDeadline of bulwark's bound.)
func TestAttemptContextDeadlineIsTheCallers(t *testing.T) {
	for _, callerDeadline := range []bool{false, true} {
		t.Run(fmt.Sprintf("caller deadline %v", callerDeadline), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &recordBase{}
				tr := mustNew(t, Config{Base: base, Default: only(Policy{Timeout: Timeout{Attempt: 100 * time.Millisecond}}, "timeout")})
				ctx := t.Context()
				if callerDeadline {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, time.Hour)
					defer cancel()
				}
				req, _ := http.NewRequestWithContext(ctx, "GET", "http://tax.internal/", nil)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				want, wantOK := ctx.Deadline()
				if got, ok := base.ctxs[0].Deadline(); ok != wantOK || !got.Equal(want) {
					t.Errorf("attempt context Deadline() = %v, %v; want the caller's %v, %v", got, ok, want, wantOK)
				}
				if got := headerMillis(t, base.headers[0], DefaultDeadlineHeader); got != 100-5 {
					t.Errorf("%s = %d, want %d: Attempt's bound, less the margin", DefaultDeadlineHeader, got, 100-5)
				}
			})
		})
	}
}

func TestDeadlineLayersContract(t *testing.T) {
	for _, c := range []struct {
		name string
		to   Timeout
	}{
		{"defaults", Timeout{}},
		{"off", Timeout{Disabled: true}},
		{"total and attempt", Timeout{Total: time.Second, Attempt: 100 * time.Millisecond}},
		{"no deadline header", Timeout{Header: NoDeadlineHeader}},
		{"reads unbounded", Timeout{BodyIdle: -1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var layers []string
			if !c.to.Disabled {
				layers = append(layers, "timeout")
			}
			runContract(t, func(base http.RoundTripper) http.RoundTripper {
				return mustNew(t, Config{Base: base, Default: only(Policy{Timeout: c.to}, layers...)})
			})
		})
	}
}

// call.deadline is the sooner of the request context's deadline and
// Total's end. (The call state is now handed down by value, not found in
// the context, so there is no other Transport's state to leak into it.)
func TestCallDeadline(t *testing.T) {
	ctxEnd := time.Now().Add(time.Hour)
	withDeadline, cancel := context.WithDeadline(t.Context(), ctxEnd)
	defer cancel()
	for _, c := range []struct {
		name   string
		ctx    context.Context
		total  time.Time
		want   time.Time
		wantOK bool
	}{
		{"neither", t.Context(), time.Time{}, time.Time{}, false},
		{"context only", withDeadline, time.Time{}, ctxEnd, true},
		{"total only", t.Context(), ctxEnd.Add(-time.Minute), ctxEnd.Add(-time.Minute), true},
		{"total sooner", withDeadline, ctxEnd.Add(-time.Minute), ctxEnd.Add(-time.Minute), true},
		{"context sooner", withDeadline, ctxEnd.Add(time.Minute), ctxEnd, true},
	} {
		req, _ := http.NewRequestWithContext(c.ctx, "GET", "http://a.internal/", nil)
		got, ok := call{total: c.total}.deadline(req)
		if ok != c.wantOK || !got.Equal(c.want) {
			t.Errorf("%s: deadline() = %v, %v; want %v, %v", c.name, got, ok, c.want, c.wantOK)
		}
	}
}

// Through the real retry layer: every attempt carries less time than the
// one before, and its own attempt number.
func TestDeadlineHeaderShrinksAcrossRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &recordBase{hold: 50 * time.Millisecond} // always 503: retried
		tr, err := New(Config{Base: base, Default: Policy{
			Timeout: Timeout{Total: 2 * time.Second, Attempt: 2 * time.Second},
			Breaker: Breaker{Disabled: true},
		}})
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest("GET", "http://tax.internal/rate", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if len(base.headers) != DefaultMaxAttempts {
			t.Fatalf("upstream saw %d attempts, want %d", len(base.headers), DefaultMaxAttempts)
		}
		prev := int64(1 << 62)
		for i, h := range base.headers {
			ms := headerMillis(t, h, DefaultDeadlineHeader)
			if ms >= prev {
				t.Errorf("attempt %d: %s = %d, not less than the previous %d", i+1, DefaultDeadlineHeader, ms, prev)
			}
			prev = ms
			if got := h.Get(AttemptHeader); got != strconv.Itoa(i+1) {
				t.Errorf("attempt %d: %s = %q", i+1, AttemptHeader, got)
			}
		}
	})
}

// dripBase answers 200 with a body of n bytes, one every `every`, each
// read waiting on the attempt's context as a real connection would; after
// the n bytes the body ends, or, with stall, waits for the context to end.
// n < 0 means the body never ends. It records the attempt's context.
type dripBase struct {
	every time.Duration
	n     int
	stall bool

	mu   sync.Mutex
	ctxs []context.Context
}

func (d *dripBase) RoundTrip(req *http.Request) (*http.Response, error) {
	closeBody(req)
	d.mu.Lock()
	d.ctxs = append(d.ctxs, req.Context())
	d.mu.Unlock()
	return &http.Response{StatusCode: 200, Header: http.Header{}, Request: req,
		Body: &dripBody{ctx: req.Context(), every: d.every, left: d.n, stall: d.stall}}, nil
}

type dripBody struct {
	ctx   context.Context
	every time.Duration
	left  int
	stall bool
}

func (b *dripBody) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if b.left == 0 {
		if !b.stall {
			return 0, io.EOF
		}
		<-b.ctx.Done()
		return 0, b.ctx.Err()
	}
	tm := time.NewTimer(b.every)
	defer tm.Stop()
	select {
	case <-b.ctx.Done():
		return 0, b.ctx.Err()
	case <-tm.C:
		b.left--
		p[0] = '.'
		return 1, nil
	}
}

func (b *dripBody) Close() error { return nil }

// readAll reads resp's body to its end and closes it, returning what it
// read and the error that ended it (nil at EOF).
func readAll(resp *http.Response) ([]byte, error) {
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	return b, err
}

// A long, healthy body is read whole with the package defaults: Attempt
// (10 s) bounds the wait for headers only, and the default Total (30 s),
// not set explicitly, bounds the call only up to the final headers.
func TestDefaultsDoNotCutALongBody(t *testing.T) {
	for _, secs := range []int{15, 35} { // past attemptCeiling; past DefaultTotalTimeout too
		t.Run(fmt.Sprintf("%ds", secs), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &dripBase{every: time.Second, n: secs}
				tr := mustNew(t, Config{Base: base})
				req, _ := http.NewRequest("GET", "http://stream.internal/feed", nil)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				start := time.Now()
				b, err := readAll(resp)
				el := time.Since(start)
				if err != nil || len(b) != secs {
					t.Errorf("read %d bytes, err %v; want all %d and EOF", len(b), err, secs)
				}
				if want := time.Duration(secs) * time.Second; el != want {
					t.Errorf("body took %v, want %v", el, want)
				}
			})
		})
	}
}

// The bounds that apply to a body: BodyIdle for a read that waits too
// long and an explicit Total for the whole body are bulwark's, and say
// which; the caller's own deadline is the caller's.
func TestBodyBounds(t *testing.T) {
	for _, c := range []struct {
		name     string
		to       Timeout
		base     *dripBase
		callerIn time.Duration // the caller's own deadline; 0: none
		wantErr  error         // bulwark's bound; nil: the caller's deadline
		wantRead int
		wantTime time.Duration
	}{
		// Three bytes a second apart, then a stall: cut BodyIdle after the last.
		{"stall past BodyIdle", Timeout{Attempt: time.Second, BodyIdle: 2 * time.Second},
			&dripBase{every: time.Second, n: 3, stall: true}, 0, ErrAttemptTimeout, 3, 5 * time.Second},
		// A byte every 700 ms, under BodyIdle (1 s, from Attempt), never
		// ending: Total, set explicitly, cuts it at 5 s.
		{"explicit Total cuts a flowing body", Timeout{Total: 5 * time.Second, Attempt: time.Second},
			&dripBase{every: 700 * time.Millisecond, n: -1}, 0, ErrTotalTimeout, 7, 5 * time.Second},
		// The same flowing body, the package defaults and a caller's
		// deadline of 3 s.
		{"caller's deadline on a flowing body", Timeout{},
			&dripBase{every: 700 * time.Millisecond, n: -1}, 3 * time.Second, nil, 4, 3 * time.Second},
		// A stall shorter than BodyIdle, and the caller's deadline sooner.
		{"caller's deadline on a stalled body", Timeout{BodyIdle: 5 * time.Second},
			&dripBase{every: time.Second, n: 1, stall: true}, 3 * time.Second, nil, 1, 3 * time.Second},
		// A caller's deadline later than Total's: Total's cut is bulwark's.
		{"explicit Total before the caller's deadline", Timeout{Total: 5 * time.Second, Attempt: time.Second},
			&dripBase{every: 700 * time.Millisecond, n: -1}, time.Hour, ErrTotalTimeout, 7, 5 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr := mustNew(t, Config{Base: c.base, Default: Policy{Timeout: c.to}})
				ctx := t.Context()
				if c.callerIn > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, c.callerIn)
					defer cancel()
				}
				req, _ := http.NewRequestWithContext(ctx, "GET", "http://stream.internal/feed", nil)
				start := time.Now()
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				b, err := readAll(resp)
				if el := time.Since(start); len(b) != c.wantRead || el != c.wantTime {
					t.Errorf("read %d bytes in %v, want %d in %v", len(b), el, c.wantRead, c.wantTime)
				}
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("read error %v, want one matching context.DeadlineExceeded", err)
				}
				for _, bound := range []error{ErrAttemptTimeout, ErrTotalTimeout} {
					if got, want := errors.Is(err, bound), bound == c.wantErr; got != want {
						t.Errorf("read error %v: errors.Is(err, %v) = %v, want %v", err, bound, got, want)
					}
				}
				if actx := c.base.ctxs[0]; actx.Err() == nil {
					t.Error("the attempt's context outlived the failed body")
				}
			})
		})
	}
}

// Timeout.Header = NoDeadlineHeader sends no deadline header and no
// attempt number, retries or not, yet every bound still applies; an
// upstream may turn the header back on, and Timeout.Enabled turns back on
// the deadlines Default disabled.
func TestDeadlineHeaderOptOut(t *testing.T) {
	hasHeaders := func(h http.Header) (deadline, attempt bool) {
		_, deadline = h[DefaultDeadlineHeader]
		_, attempt = h[AttemptHeader]
		return deadline, attempt
	}
	t.Run("no headers, bounds apply", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			// Every attempt outlasts Attempt: each is cut and retried.
			base := &recordBase{hold: time.Hour}
			tr := mustNew(t, Config{Base: base, Default: Policy{
				Timeout: Timeout{Header: NoDeadlineHeader, Attempt: 100 * time.Millisecond},
				Breaker: Breaker{Disabled: true},
			}})
			req, _ := http.NewRequest("GET", "http://third.party/api", nil)
			_, err := tr.RoundTrip(req)
			if !errors.Is(err, ErrAttemptTimeout) {
				t.Errorf("err = %v, want ErrAttemptTimeout: the bound applies without the header", err)
			}
			if len(base.headers) != DefaultMaxAttempts {
				t.Fatalf("base saw %d attempts, want %d (retried)", len(base.headers), DefaultMaxAttempts)
			}
			for i, h := range base.headers {
				if d, a := hasHeaders(h); d || a {
					t.Errorf("attempt %d: %s sent %v, %s sent %v; want neither", i+1, DefaultDeadlineHeader, d, AttemptHeader, a)
				}
			}
		})
	})
	t.Run("an upstream turns the header back on", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			base := &recordBase{} // 503: retried once
			tr := mustNew(t, Config{Base: base,
				Default:   Policy{Timeout: Timeout{Header: NoDeadlineHeader}, Retry: Retry{MaxAttempts: 2}},
				Upstreams: map[string]Policy{"ours.internal": {Timeout: Timeout{Header: DefaultDeadlineHeader}}},
			})
			for _, c := range []struct {
				url  string
				want bool
			}{{"http://third.party/api", false}, {"http://ours.internal/api", true}} {
				base.headers = nil
				req, _ := http.NewRequest("GET", c.url, nil)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if len(base.headers) != 2 {
					t.Fatalf("%s: base saw %d attempts, want 2", c.url, len(base.headers))
				}
				for i, h := range base.headers {
					if d, a := hasHeaders(h); d != c.want || a != c.want {
						t.Errorf("%s attempt %d: %s sent %v, %s sent %v; want both %v", c.url, i+1, DefaultDeadlineHeader, d, AttemptHeader, a, c.want)
					}
					if c.want && h.Get(AttemptHeader) != strconv.Itoa(i+1) {
						t.Errorf("%s attempt %d: %s = %q", c.url, i+1, AttemptHeader, h.Get(AttemptHeader))
					}
				}
			}
		})
	})
	t.Run("Enabled turns the deadlines back on", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			base := &recordBase{hold: time.Hour}
			tr := mustNew(t, Config{Base: base,
				Default:   Policy{Timeout: Timeout{Disabled: true}, Retry: Retry{Disabled: true}},
				Upstreams: map[string]Policy{"ours.internal": {Timeout: Timeout{Enabled: true, Attempt: 100 * time.Millisecond}}},
			})
			for _, c := range []struct {
				url  string
				on   bool
				took time.Duration
			}{{"http://third.party/api", false, time.Second}, {"http://ours.internal/api", true, 100 * time.Millisecond}} {
				base.headers = nil
				// The caller's own deadline ends what bulwark does not.
				ctx, cancel := context.WithTimeout(t.Context(), time.Second)
				req, _ := http.NewRequestWithContext(ctx, "GET", c.url, nil)
				start := time.Now()
				_, err := tr.RoundTrip(req)
				el := time.Since(start)
				cancel()
				if errors.Is(err, ErrAttemptTimeout) != c.on || !errors.Is(err, context.DeadlineExceeded) || el != c.took {
					t.Errorf("%s: err = %v after %v; want ErrAttemptTimeout %v, after %v", c.url, err, el, c.on, c.took)
				}
				if d, _ := hasHeaders(base.headers[0]); d != c.on {
					t.Errorf("%s: %s sent %v, want %v", c.url, DefaultDeadlineHeader, d, c.on)
				}
			}
		})
	})
}

// A base that panics: the panic reaches the caller, and the attempt's
// context has ended by then (its timer with it), as have the attempt's
// span and its bulkhead slot.
func TestBasePanicEndsTheAttempt(t *testing.T) {
	for _, c := range []struct {
		name    string
		p       Policy
		abandon bool
	}{
		{"defaults", Policy{}, false},
		{"deadline layers alone", only(Policy{}, "timeout"), false},
		{"attempts in a goroutine", Policy{}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			k := newOtelKit(t)
			var actx context.Context
			base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
				actx = req.Context()
				panic("base exploded")
			})
			cfg := k.realConfig(base, c.p)
			cfg.BaseIgnoresContext = c.abandon
			tr := mustNew(t, cfg)
			req, _ := http.NewRequest("GET", "http://tax.internal/", nil)
			got := func() (v any) {
				defer func() { v = recover() }()
				resp, err := tr.RoundTrip(req)
				t.Errorf("RoundTrip returned %v, %v; want the base's panic", resp, err)
				return nil
			}()
			if got != "base exploded" {
				t.Errorf("recovered %v, want the base's panic", got)
			}
			if actx == nil {
				t.Fatal("the base was not called")
			}
			select {
			case <-actx.Done():
			default:
				t.Error("the attempt's context outlived the panic")
			}
			if n := len(spansNamed(k.sr, "GET")); n != 1 {
				t.Errorf("%d attempt spans ended, want 1", n)
			}
			if started, ended := len(k.sr.Started()), len(k.sr.Ended()); started != ended {
				t.Errorf("%d spans started, %d ended: every span must end with the panic", started, ended)
			}
			if inFlight, _, ok := bulkheadStats(tr, "tax.internal:80"); ok && inFlight != 0 {
				t.Errorf("%d bulkhead slots held after the panic, want 0", inFlight)
			}
		})
	}
}

// stubbornBase ignores its request's context: it holds every attempt for
// hold, then reads and closes the request body, and answers 200 with a
// body whose closes it counts.
type stubbornBase struct {
	hold     time.Duration
	sent     atomic.Int32
	returned atomic.Int32
	closed   atomic.Int32 // response bodies closed
	read     atomic.Int64 // request body bytes read
}

func (b *stubbornBase) RoundTrip(req *http.Request) (*http.Response, error) {
	b.sent.Add(1)
	time.Sleep(b.hold)
	if req.Body != nil {
		n, _ := io.Copy(io.Discard, req.Body)
		b.read.Add(n)
		req.Body.Close()
	}
	defer b.returned.Add(1)
	return &http.Response{StatusCode: 200, Header: http.Header{}, Request: req,
		Body: &closeCounter{Reader: strings.NewReader("late"), n: &b.closed}}, nil
}

type closeCounter struct {
	io.Reader
	n *atomic.Int32
}

func (c *closeCounter) Close() error { c.n.Add(1); return nil }

// A base that ignores its context holds the call past its deadline,
// unless Config.BaseIgnoresContext: then the call returns at its
// deadline, the attempt keeps its bulkhead slot until the base returns,
// and the late response is closed and counted.
func TestBaseIgnoresContextAbandonsAtDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := Policy{Timeout: Timeout{Total: 300 * time.Millisecond}}
		send := func(rt http.RoundTripper, ctx context.Context) (time.Duration, *http.Response, error) {
			req, _ := http.NewRequestWithContext(ctx, "GET", "http://slow.internal/", nil)
			start := time.Now()
			resp, err := rt.RoundTrip(req)
			return time.Since(start), resp, err
		}
		base := &stubbornBase{hold: 2 * time.Second}
		el, resp, err := send(mustNew(t, Config{Base: base, Default: p}), t.Context())
		if el != 2*time.Second || err != nil {
			t.Fatalf("without BaseIgnoresContext: %v, %v after %v; want the base's answer after 2s", resp, err, el)
		}
		resp.Body.Close()

		base = &stubbornBase{hold: 2 * time.Second}
		tr := mustNew(t, Config{Base: base, Default: p, BaseIgnoresContext: true})
		el, resp, err = send(tr, t.Context())
		if el != 300*time.Millisecond || resp != nil || !errors.Is(err, ErrTotalTimeout) && !errors.Is(err, ErrAttemptTimeout) {
			t.Fatalf("BaseIgnoresContext: %v, %v after %v; want Total's timeout after 300ms", resp, err, el)
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("err = %v, want one wrapping context.DeadlineExceeded", err)
		}
		hs := tr.Snapshot().Host("slow.internal:80")[0]
		if hs.AbandonedAttempts != 1 || hs.Bulkhead.InFlight != 1 || base.returned.Load() != 0 {
			t.Fatalf("after the call: %d abandoned, %d slots held, base returned %d times; want 1, 1 (held until the base returns), 0",
				hs.AbandonedAttempts, hs.Bulkhead.InFlight, base.returned.Load())
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		hs = tr.Snapshot().Host("slow.internal:80")[0]
		if base.returned.Load() != 1 || base.closed.Load() != 1 || hs.Bulkhead.InFlight != 0 {
			t.Fatalf("once the base returned: returned %d, late body closed %d times, %d slots held; want 1, 1, 0",
				base.returned.Load(), base.closed.Load(), hs.Bulkhead.InFlight)
		}

		// The caller's own deadline and cancel are kept alike, and name
		// themselves, not bulwark's bounds.
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		el, _, err = send(tr, ctx)
		if el != 50*time.Millisecond || !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrTotalTimeout) || errors.Is(err, ErrAttemptTimeout) {
			t.Errorf("caller's deadline: %v after %v; want context.DeadlineExceeded after 50ms", err, el)
		}
		ctx, cancel = context.WithCancel(t.Context())
		time.AfterFunc(20*time.Millisecond, cancel)
		el, _, err = send(tr, ctx)
		if el != 20*time.Millisecond || !errors.Is(err, context.Canceled) {
			t.Errorf("caller's cancel: %v after %v; want context.Canceled after 20ms", err, el)
		}
		if n := tr.Snapshot().Host("slow.internal:80")[0].AbandonedAttempts; n != 3 {
			t.Errorf("%d attempts abandoned, want 3", n)
		}
		time.Sleep(2 * time.Second) // the abandoned goroutines end with their base
	})
}

// An abandoned attempt's base may still read the request after the
// caller has it back: it reads a copy of its own (the caller may change
// its request at once), and the body, which bulwark neither reads nor
// closes, is the base's to close, once. Under -race this also shows
// that nothing of the caller's request is shared unguarded.
func TestAbandonedAttemptOwnsItsRequest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &stubbornBase{hold: time.Second}
		tr := mustNew(t, Config{Base: base, BaseIgnoresContext: true, Default: Policy{
			Timeout: Timeout{Attempt: 100 * time.Millisecond}, Retry: Retry{Disabled: true}}})
		var closes atomic.Int32
		req, _ := http.NewRequestWithContext(t.Context(), "PUT", "http://slow.internal/a", nil)
		req.Body = &closeCounter{Reader: strings.NewReader("payload"), n: &closes}
		req.Header.Set("X-Mine", "1")
		_, err := tr.RoundTrip(req)
		if !errors.Is(err, ErrAttemptTimeout) {
			t.Fatalf("err = %v, want ErrAttemptTimeout", err)
		}
		if closes.Load() != 0 {
			t.Fatalf("request body closed %d times before the base returned, want 0 (it is the base's)", closes.Load())
		}
		// The caller reuses its request while the base still holds its copy.
		req.Header.Set("X-Mine", "2")
		req.URL.Path = "/b"
		time.Sleep(time.Second)
		synctest.Wait()
		if closes.Load() != 1 || base.read.Load() != int64(len("payload")) {
			t.Fatalf("request body closed %d times, %d bytes read; want 1 and the whole body", closes.Load(), base.read.Load())
		}
	})
}

// Every layer's contract holds with attempts run in a goroutine. The
// attempt timeout is set: learned from a stub that answers at once it
// would be the 50 ms floor, which a loaded machine under -race can pass,
// and an attempt it abandons leaves the request body to the base, which
// the contract's check at return would take for a body left open.
func TestAbandonContract(t *testing.T) {
	runContract(t, func(base http.RoundTripper) http.RoundTripper {
		return mustNew(t, Config{Base: base, BaseIgnoresContext: true, Default: Policy{Timeout: Timeout{Attempt: 10 * time.Second}}})
	})
}

// A base that ends its goroutine (runtime.Goexit, as t.FailNow does)
// leaves an attempt run in a goroutine without an answer: the caller
// gets an error, never (nil, nil).
func TestAbandonBaseGoexit(t *testing.T) {
	tr := mustNew(t, Config{BaseIgnoresContext: true, Base: roundTripFunc(func(*http.Request) (*http.Response, error) {
		runtime.Goexit()
		return nil, nil
	}), Default: Policy{Retry: Retry{Disabled: true}}})
	req, _ := http.NewRequest("GET", "http://x.internal/", nil)
	resp, err := tr.RoundTrip(req)
	if resp != nil || !errors.Is(err, errBaseGoexit) {
		t.Fatalf("RoundTrip = %v, %v; want errBaseGoexit", resp, err)
	}
}

// TestTimeoutNamedOnce: a base that returns its context's cause, as
// net/http's Transport does, gets the caller an error that names the bound
// once, and still matches it.
func TestTimeoutNamedOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
			<-req.Context().Done()
			return nil, context.Cause(req.Context())
		})
		tr := mustNew(t, Config{Base: base, Default: only(Policy{Timeout: Timeout{Attempt: time.Second}}, "timeout")})
		_, err := sendOnce(t, tr, http.MethodGet, "http://h.test/")
		if !errors.Is(err, ErrAttemptTimeout) || strings.Count(err.Error(), "timed out") != 1 {
			t.Fatalf("err = %q, want one that names the attempt timeout once", err)
		}
	})
}

// TestDeadlineTooShortCount: an attempt refused for too little time left
// is counted in the host's Snapshot, and the count outlives an Update.
func TestDeadlineTooShortCount(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &scriptBase{step: always(200)}
		cfg := Config{Base: base, Default: only(Policy{}, "timeout")}
		tr := mustNew(t, cfg)
		call := func(left time.Duration) error {
			ctx, cancel := context.WithTimeout(t.Context(), left)
			defer cancel()
			resp, err := tr.RoundTrip(testRequest(t, ctx, "GET", "http://a.test/", noBody, ""))
			if err == nil {
				resp.Body.Close()
			}
			return err
		}
		if err := call(time.Second); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if err := call(5 * time.Millisecond); !errors.Is(err, ErrDeadlineTooShort) {
				t.Fatalf("a call with 5 ms left: %v, want ErrDeadlineTooShort", err)
			}
		}
		if n := tr.Snapshot().Hosts[0].DeadlineTooShort; n != 2 {
			t.Errorf("DeadlineTooShort = %d, want 2", n)
		}
		cfg.Default.Timeout.Attempt = 20 * time.Second
		if err := tr.Update(cfg); err != nil {
			t.Fatal(err)
		}
		if err := call(time.Millisecond); !errors.Is(err, ErrDeadlineTooShort) {
			t.Fatalf("a call with 1 ms left: %v, want ErrDeadlineTooShort", err)
		}
		if n := tr.Snapshot().Hosts[0].DeadlineTooShort; n != 3 {
			t.Errorf("DeadlineTooShort after an Update and one more refusal = %d, want 3", n)
		}
		if got := base.calls(); got != 1 {
			t.Errorf("the host was sent %d requests, want 1", got)
		}
	})
}

// TestAttemptBelowMinSendTime: an Attempt set below the least time a
// request is sent with (10 ms) is the policy's choice of a short wait: the
// attempt is sent with it, and its deadline header is at least 1 ms. Only
// the call's own deadline (the caller's, or Total's end) that close
// refuses it. The lab's retry storm at -scale below 0.067 (an attempt
// timeout of 150 ms × scale) sent nothing at all before.
func TestAttemptBelowMinSendTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var header atomic.Value
		base := &scriptBase{step: func(_ int, req *http.Request) (*http.Response, error) {
			header.Store(req.Header.Get(DefaultDeadlineHeader))
			return response(req, 200), nil
		}}
		for _, attempt := range []time.Duration{9 * time.Millisecond, 2 * time.Millisecond} {
			tr := mustNew(t, Config{Base: base, Default: only(Policy{Timeout: Timeout{Attempt: attempt}}, "timeout")})
			resp, err := tr.RoundTrip(testRequest(t, t.Context(), "GET", "http://a.test/", noBody, ""))
			if err != nil {
				t.Fatalf("Attempt %v, no caller deadline: %v, want it sent", attempt, err)
			}
			resp.Body.Close()
			want := "4"
			if attempt < 6*time.Millisecond {
				want = "1"
			}
			if got := header.Load(); got != want {
				t.Errorf("Attempt %v: %s = %v, want %s", attempt, DefaultDeadlineHeader, got, want)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 8*time.Millisecond)
			_, err = tr.RoundTrip(testRequest(t, ctx, "GET", "http://a.test/", noBody, ""))
			cancel()
			if !errors.Is(err, ErrDeadlineTooShort) {
				t.Errorf("Attempt %v, 8 ms left to the caller: %v, want ErrDeadlineTooShort", attempt, err)
			}
		}
		if n := base.calls(); n != 2 {
			t.Errorf("the host got %d requests, want 2", n)
		}
	})
}

// TestHostileHeadersThenHang: a server that sends its headers and then
// nothing is ended by the body's idle bound (BodyIdle, which defaults to
// Attempt), and its handler and connection are released.
func TestHostileHeadersThenHang(t *testing.T) {
	release := make(chan struct{})
	up := newCountedUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	defer close(release)
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	tr := mustNew(t, Config{Base: base, Default: Policy{Timeout: Timeout{Attempt: 50 * time.Millisecond}}})
	req, _ := http.NewRequestWithContext(t.Context(), "GET", up.srv.URL, nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("err = %v; want the headers", err)
	}
	_, rerr := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !errors.Is(rerr, context.DeadlineExceeded) || !errors.Is(rerr, ErrAttemptTimeout) {
		t.Errorf("read error %v; want the attempt deadline (ErrAttemptTimeout)", rerr)
	}
	base.CloseIdleConnections()
	for i := 0; i < 300 && up.open.Load() != 0; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if n := up.open.Load(); n != 0 {
		t.Errorf("%d connection(s) left open to the hanging server", n)
	}
}
