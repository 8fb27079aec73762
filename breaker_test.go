package bulwark

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sony/gobreaker/v2"
)

// opBase answers by the request's X-Op header, one letter:
//
//	S 200   F 503   4 404   N 501   R 429   E transport error
//	T bulwark's attempt timeout     C the caller's cancellation (context.Canceled)
//	L 200 after sleeping slow (use inside a synctest bubble)
//	B blocks until release is closed or the context ends, then 200
type opBase struct {
	slow     time.Duration
	release  chan struct{}
	calls    atomic.Int64
	inFlight atomic.Int64
	maxIn    atomic.Int64
}

func (o *opBase) RoundTrip(req *http.Request) (*http.Response, error) {
	o.calls.Add(1)
	n := o.inFlight.Add(1)
	defer o.inFlight.Add(-1)
	for {
		m := o.maxIn.Load()
		if n <= m || o.maxIn.CompareAndSwap(m, n) {
			break
		}
	}
	closeBody(req)
	code := 200
	switch op := req.Header.Get("X-Op"); op {
	case "", "S":
	case "F":
		code = 503
	case "4":
		code = 404
	case "N":
		code = 501
	case "R":
		code = 429
	case "E":
		return nil, errStub
	case "T":
		return nil, &timeoutError{limit: ErrAttemptTimeout, cause: context.DeadlineExceeded}
	case "C":
		return nil, context.Canceled
	case "L":
		time.Sleep(o.slow)
	case "B":
		select {
		case <-o.release:
		case <-req.Context().Done():
			return nil, req.Context().Err()
		}
	default:
		panic("opBase: unknown op " + op)
	}
	return &http.Response{
		StatusCode: code, Status: http.StatusText(code), Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok")), ContentLength: 2, Request: req,
	}, nil
}

// The host the breaker tests call, as the breaker names it, and a URL of it.
const (
	breakerHost = "h.test:80"
	breakerURL  = "http://h.test/x"
)

// hostBreaker is the snapshot of the breaker of h.test:80; it fails the
// test when there is none.
func hostBreaker(t testing.TB, tr *Transport) BreakerSnapshot {
	t.Helper()
	for _, h := range tr.Snapshot().Host(breakerHost) {
		if h.Breaker != nil {
			return *h.Breaker
		}
	}
	t.Fatalf("no breaker for %s in the snapshot", breakerHost)
	return BreakerSnapshot{}
}

// breakerStateOf is the state of the breaker of h.test:80.
func breakerStateOf(t testing.TB, tr *Transport) CircuitState {
	t.Helper()
	s, ok := breakerState(tr, breakerHost)
	if !ok {
		t.Fatalf("no breaker for %s", breakerHost)
	}
	return s
}

// runScript sends the script's ops one by one to h.test and returns the
// 1-based number of the call after which its breaker was open, or 0.
func runScript(t *testing.T, tr *Transport, script string) int {
	t.Helper()
	for i, op := range script {
		_, err := send(t, tr, t.Context(), breakerURL, string(op))
		if errors.Is(err, ErrBreakerOpen) {
			t.Fatalf("call %d (%c) refused: breaker opened earlier than reported", i+1, op)
		}
		if breakerStateOf(t, tr) == CircuitOpen {
			return i + 1
		}
	}
	return 0
}

// The trip is judged after every counted call, a success too: a success
// that brings the window to MinCalls at the rate trips it.
func TestBreakerTrips(t *testing.T) {
	const slow = time.Second
	tests := []struct {
		name     string
		br       Breaker
		script   string
		wantOpen int // call after which the breaker is open; 0: never
	}{
		{"exactly at failure rate at MinCalls", Breaker{MinCalls: 10}, "SSSSSFFFFF", 10},
		{"below MinCalls all failing", Breaker{MinCalls: 10}, "FFFFFFFFF", 0},
		{"just under the rate", Breaker{MinCalls: 10}, "SSSSSSFFFFF", 0},
		{"threshold reached after MinCalls", Breaker{MinCalls: 10}, "SSSSSSFFFFFF", 12},
		{"a success reaching MinCalls at the rate", Breaker{MinCalls: 10}, "FFFFFSSSSS", 10},
		{"rate 0.3 exact", Breaker{MinCalls: 10, FailureRate: 0.3}, "SSSSSSSFFF", 10},
		{"rate 0.7 exact", Breaker{MinCalls: 10, FailureRate: 0.7}, "SSSFFFFFFF", 10},
		{"rate 0.7 under", Breaker{MinCalls: 10, FailureRate: 0.7}, "SSSSFFFFFF", 0},
		{"rate 0.28, 7 of 25", Breaker{MinCalls: 25, FailureRate: 0.28}, strings.Repeat("S", 18) + "FFFFFFF", 25},
		{"rate 0.3 under", Breaker{MinCalls: 10, FailureRate: 0.3}, "SSSSSSSSFF", 0},
		{"transport errors, timeouts and 429 fail", Breaker{MinCalls: 4, FailureRate: 1}, "ETRF", 4},
		{"4xx, 501 and cancellations ignored", Breaker{MinCalls: 10}, "4444NNCCCCSSSSSFFFF44CC", 0},
		{"ignored calls leave the denominator", Breaker{MinCalls: 10}, "4444NNCCCCSSSSSFFFF44CCF", 24},
		{"every call slow", Breaker{MinCalls: 10, SlowCall: slow}, "LLLLLLLLLL", 10},
		{"half slow", Breaker{MinCalls: 10, SlowCall: slow}, "SSSSSLLLLL", 10},
		{"under the slow rate", Breaker{MinCalls: 10, SlowCall: slow}, "SSSSSSLLLLS", 0},
		{"slow rate 0.2", Breaker{MinCalls: 10, SlowCall: slow, SlowCallRate: 0.2}, "SSSSSSSSLL", 10},
		{"slow successes are not failures", Breaker{MinCalls: 10, SlowCall: slow, SlowCallRate: 1}, "LLLLLFFFFS", 0},
		{"two failures on a quiet endpoint", Breaker{}, "FF", 0},
		{"default MinCalls", Breaker{ConsecutiveFailures: -1}, strings.Repeat("F", 99), 0},
		{"default MinCalls reached", Breaker{ConsecutiveFailures: -1}, strings.Repeat("S", 50) + strings.Repeat("F", 50), 100},
		{"ten unanswered attempts in a row trip a quiet host", Breaker{}, "EEEEETTTTT", 10},
		{"ten 503s in a row are the rate rules' to judge", Breaker{}, "FFFFFFFFFFFF", 0},
		{"an answer ends the run", Breaker{}, "EEEEEFEEEEE", 0},
		{"nine do not", Breaker{}, "EEEEEEEEE", 0},
		{"a success ends the run", Breaker{}, "EEEEEEEEESEEEEEEEEE", 0},
		{"ignored calls do not", Breaker{}, "EEEEE44CCEEEEE", 14},
		{"slow successes end the run too", Breaker{SlowCall: slow}, "EEEEEEEEELEEEEEEEEE", 0},
		{"a run of 3", Breaker{ConsecutiveFailures: 3}, "SEESEEE", 7},
		{"the run rule off", Breaker{ConsecutiveFailures: -1}, strings.Repeat("E", 50), 0},
		{"ReadyToTrip on failures in a row", Breaker{ReadyToTrip: func(c BreakerCounts) bool { return c.ConsecutiveFailures >= 3 }}, "FFSFFF", 6},
		{"ReadyToTrip on slow calls", Breaker{SlowCall: slow, ReadyToTrip: func(c BreakerCounts) bool { return c.Slow >= 2 && c.Calls >= 3 }}, "LSL", 3},
		{"ReadyToTrip is asked after every call", Breaker{ReadyToTrip: func(c BreakerCounts) bool { return c.Calls >= 3 }}, "SSSSF", 3},
		{"ReadyToTrip sees the window's failures", Breaker{ReadyToTrip: func(c BreakerCounts) bool { return c.Failures == 2 && c.Calls == 4 }}, "SFSF", 4},
		{"ReadyToTrip false leaves the rate rules", Breaker{MinCalls: 10, ReadyToTrip: func(BreakerCounts) bool { return false }}, "SSSSSFFFFF", 10},
		{"count window of 20", Breaker{WindowCalls: 20}, strings.Repeat("S", 100) + strings.Repeat("F", 10), 110},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr := testBreaker(t, tt.br, &opBase{slow: 2 * slow})
				if got := runScript(t, tr, tt.script); got != tt.wantOpen {
					t.Errorf("script %q: open after call %d, want %d", tt.script, got, tt.wantOpen)
				}
			})
		})
	}
}

func TestBreakerWindowRolls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := testBreaker(t, Breaker{MinCalls: 10, Window: 10 * time.Second}, &opBase{})
		// Five successes, then 5 s on four failures: 9 calls, under MinCalls.
		steps := []struct {
			advance  time.Duration
			script   string
			wantOpen int
		}{
			{0, "SSSSS", 0},
			{5 * time.Second, "FFFF", 0},
			// A full window after the first successes they have expired;
			// five successes and one failure make 10 calls with 5
			// failures, which trips. Had the first successes stayed it
			// would be 5 of 15.
			{5 * time.Second, "SSSSSF", 6},
		}
		for _, st := range steps {
			time.Sleep(st.advance)
			if got := runScript(t, tr, st.script); got != st.wantOpen {
				t.Fatalf("+%v %q: open after call %d, want %d", st.advance, st.script, got, st.wantOpen)
			}
		}
	})
}

// TestBreakerDefaultsTripWithinAHundredCalls: with the package defaults, a
// host that turns sick after a long healthy past is cut off within a
// hundred calls, since the window is the last 100 calls, not a stretch of
// time that the past fills; and a host failing from its first call trips
// once MinCalls (100) calls are in.
func TestBreakerDefaultsTripWithinAHundredCalls(t *testing.T) {
	// failingUntilOpen sends failing calls until the breaker refuses one,
	// and returns how many reached the base.
	failingUntilOpen := func(t *testing.T, tr *Transport, base *opBase, op string) int64 {
		t.Helper()
		before := base.calls.Load()
		for range 1000 {
			if _, err := send(t, tr, t.Context(), breakerURL, op); errors.Is(err, ErrBreakerOpen) {
				return base.calls.Load() - before
			}
		}
		t.Fatal("the breaker never opened in 1000 failing calls")
		return 0
	}

	// The rate rule is under test in the first two: the run of failures
	// (ConsecutiveFailures) would trip first; the third has it.
	rateOnly := Policy{Breaker: Breaker{ConsecutiveFailures: -1}}
	t.Run("after a healthy past", func(t *testing.T) {
		base := &opBase{}
		tr := mustNew(t, Config{Base: base, Default: only(rateOnly, "breaker")})
		for i := range 10_000 {
			if code, err := send(t, tr, t.Context(), breakerURL, "S"); err != nil || code != 200 {
				t.Fatalf("healthy call %d: %d, %v", i+1, code, err)
			}
		}
		if s := breakerStateOf(t, tr); s != CircuitClosed {
			t.Fatalf("after 10,000 healthy calls: %v, want closed", s)
		}
		n := failingUntilOpen(t, tr, base, "F")
		t.Logf("after 10,000 healthy calls, %d failing calls reached the upstream before the breaker opened", n)
		// The window is the last 100 calls exactly: the 50th failure
		// makes half of them.
		if n != DefaultMinCalls/2 {
			t.Errorf("%d failing calls reached the upstream before the breaker opened, want %d", n, DefaultMinCalls/2)
		}
	})
	t.Run("cold", func(t *testing.T) {
		base := &opBase{}
		tr := mustNew(t, Config{Base: base, Default: only(rateOnly, "breaker")})
		if n := failingUntilOpen(t, tr, base, "F"); n != DefaultMinCalls {
			t.Errorf("failing from the first call: %d calls reached the upstream before the breaker opened, want %d (MinCalls)", n, DefaultMinCalls)
		}
	})
	t.Run("a run of unanswered attempts", func(t *testing.T) {
		base := &opBase{}
		tr := mustNew(t, Config{Base: base, Default: only(Policy{}, "breaker")})
		for range 10_000 {
			send(t, tr, t.Context(), breakerURL, "S")
		}
		if n := failingUntilOpen(t, tr, base, "E"); n != DefaultBreakerConsecutive {
			t.Errorf("%d unanswered calls in a row reached the upstream before the breaker opened, want %d (ConsecutiveFailures)", n, DefaultBreakerConsecutive)
		}
	})
}

func TestBreakerDefaults(t *testing.T) {
	p := Policy{Timeout: Timeout{Attempt: 2 * time.Second}}.withDefaults()
	// The window is the last DefaultWindowCalls calls, no time window: the
	// redesign's count-based default (DefaultBreakerWindow is gone), and
	// the open time grows up to DefaultMaxOpenFor.
	want := Breaker{
		FailureRate: DefaultFailureRate, SlowCallRate: DefaultSlowCallRate, SlowCall: time.Second,
		WindowCalls: DefaultWindowCalls, MinCalls: DefaultMinCalls, OpenFor: DefaultOpenFor,
		MaxOpenFor: DefaultMaxOpenFor, HalfOpenCalls: DefaultHalfOpenCalls,
		ConsecutiveFailures: DefaultBreakerConsecutive,
		learn:               true, // SlowCall is learned, under half the attempt timeout
		holdMax:             2 * time.Second,
	}
	got := p.Breaker
	if fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", want) {
		t.Errorf("defaults = %+v, want %+v", got, want)
	}
	// Nil Policy.Classify means DefaultClassify, without the indirect call.
	if p.Classify != nil {
		t.Error("Classify default is not nil")
	}
	if d := (Policy{}).withDefaults().Breaker.SlowCall; d != attemptCeiling/2 {
		t.Errorf("SlowCall with package defaults = %v, want %v", d, attemptCeiling/2)
	}
	if DefaultOpenFor != time.Second || DefaultWindowCalls != 100 || DefaultMinCalls != 100 {
		t.Errorf("DefaultOpenFor %v, DefaultWindowCalls %d, DefaultMinCalls %d; want 1s, 100, 100",
			DefaultOpenFor, DefaultWindowCalls, DefaultMinCalls)
	}
	// MinCalls is capped at a count window's size, not at a time window's.
	if m := (Policy{Breaker: Breaker{WindowCalls: 20}}).withDefaults().Breaker.MinCalls; m != 20 {
		t.Errorf("MinCalls with WindowCalls 20 = %d, want 20", m)
	}
	if m := (Policy{Breaker: Breaker{WindowCalls: 20, Window: time.Minute}}).withDefaults().Breaker.MinCalls; m != DefaultMinCalls {
		t.Errorf("MinCalls with a time window = %d, want %d", m, DefaultMinCalls)
	}
	// MaxOpenFor is at least OpenFor.
	if m := (Policy{Breaker: Breaker{OpenFor: 2 * time.Minute}}).withDefaults().Breaker.MaxOpenFor; m != 2*time.Minute {
		t.Errorf("MaxOpenFor with OpenFor 2m = %v, want 2m", m)
	}
	// Inheritance: an upstream's zero fields come from Default.
	up := Policy{Breaker: Breaker{MinCalls: 5}}.inherit(Policy{Breaker: Breaker{MinCalls: 7, OpenFor: time.Second, Disabled: true}})
	if up.Breaker.MinCalls != 5 || up.Breaker.OpenFor != time.Second || !up.Breaker.Disabled {
		t.Errorf("inherit = %+v", up.Breaker)
	}
}

func TestBreakerValidate(t *testing.T) {
	tests := []struct {
		br    Breaker
		field string
	}{
		{Breaker{FailureRate: 1.5}, "Breaker.FailureRate"},
		{Breaker{FailureRate: -0.1}, "Breaker.FailureRate"},
		{Breaker{SlowCallRate: 2}, "Breaker.SlowCallRate"},
		{Breaker{SlowCall: -1}, "Breaker.SlowCall"},
		{Breaker{Window: time.Millisecond}, "Breaker.Window"},
		{Breaker{WindowCalls: -1}, "Breaker.WindowCalls"},
		{Breaker{WindowCalls: maxWindowCalls + 1}, "Breaker.WindowCalls"},
		{Breaker{MinCalls: -1}, "Breaker.MinCalls"},
		{Breaker{MinCalls: DefaultWindowCalls + 1}, "Breaker.MinCalls"},
		{Breaker{OpenFor: -time.Second}, "Breaker.OpenFor"},
		{Breaker{OpenFor: 10 * time.Second, MaxOpenFor: 5 * time.Second}, "Breaker.MaxOpenFor"},
		{Breaker{HalfOpenCalls: -3}, "Breaker.HalfOpenCalls"},
	}
	for _, tt := range tests {
		_, err := New(Config{Upstreams: map[string]Policy{"api.test": {Breaker: tt.br}}})
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != tt.field || ce.Upstream != "api.test" {
			t.Errorf("New(%+v) = %v, want a ConfigError for %s", tt.br, err, tt.field)
		}
	}
	for _, br := range []Breaker{
		{FailureRate: 1, SlowCallRate: 1, MinCalls: 1},
		// A time window counts what arrives in it: MinCalls may exceed
		// WindowCalls, which it ignores.
		{Window: time.Minute, MinCalls: 2 * DefaultWindowCalls},
	} {
		if _, err := New(Config{Default: Policy{Breaker: br}}); err != nil {
			t.Errorf("valid breaker %+v refused: %v", br, err)
		}
	}
}

func TestDefaultClassify(t *testing.T) {
	resp := func(code int) *http.Response { return &http.Response{StatusCode: code} }
	tests := []struct {
		resp *http.Response
		err  error
		want Outcome
	}{
		{resp(200), nil, OutcomeSuccess},
		{resp(204), nil, OutcomeSuccess},
		{resp(304), nil, OutcomeSuccess},
		{resp(400), nil, OutcomeIgnored},
		{resp(404), nil, OutcomeIgnored},
		{resp(429), nil, OutcomeFailure},
		{resp(500), nil, OutcomeFailure},
		{resp(501), nil, OutcomeIgnored},
		{resp(502), nil, OutcomeFailure},
		{resp(503), nil, OutcomeFailure},
		{nil, errStub, OutcomeFailure},
		{nil, &timeoutError{limit: ErrAttemptTimeout, cause: errStub}, OutcomeFailure},
		{nil, &timeoutError{limit: ErrTotalTimeout, cause: errStub}, OutcomeFailure},
		{nil, ErrAttemptTimeout, OutcomeFailure},
		{nil, context.Canceled, OutcomeIgnored},
		{nil, fmt.Errorf("wrapped: %w", context.DeadlineExceeded), OutcomeIgnored},
		{nil, ErrDeadlineTooShort, OutcomeIgnored},
		{nil, ErrBulkheadFull, OutcomeIgnored},
	}
	for _, tt := range tests {
		code := 0
		if tt.resp != nil {
			code = tt.resp.StatusCode
		}
		if got := DefaultClassify(tt.resp, tt.err).Outcome; got != tt.want {
			t.Errorf("DefaultClassify(%d, %v) = %v, want %v", code, tt.err, got, tt.want)
		}
	}
}

func TestBreakerCustomClassify(t *testing.T) {
	// Count 404 as a failure: this upstream answers 404 when its index is gone.
	classify := func(resp *http.Response, err error) Verdict {
		if resp != nil && resp.StatusCode == 404 {
			return Verdict{Outcome: OutcomeFailure}
		}
		return DefaultClassify(resp, err)
	}
	p := only(Policy{Breaker: Breaker{MinCalls: 4}, Classify: classify}, "breaker")
	tr := mustNew(t, Config{Base: &opBase{}, Default: p})
	if got := runScript(t, tr, "S4S4"); got != 4 {
		t.Errorf("open after %d, want 4", got)
	}
}

// trip opens tr's breaker for h.test with failures and fails the test if it
// does not open.
func trip(t *testing.T, tr *Transport) {
	t.Helper()
	for range 1000 {
		send(t, tr, t.Context(), breakerURL, "F")
		if breakerStateOf(t, tr) == CircuitOpen {
			return
		}
	}
	t.Fatal("breaker never opened")
}

func TestBreakerOpenRejects(t *testing.T) {
	base := &opBase{}
	// Open for an hour: no timer probe (one per OpenFor ÷ HalfOpenCalls)
	// comes due while it checks, on the real clock, that nothing is sent.
	tr := testBreaker(t, Breaker{MinCalls: 1, OpenFor: time.Hour}, base)
	trip(t, tr)
	calls := base.calls.Load()
	for _, cr := range contractRequests {
		var bs bodies
		req := newContractRequest(t, t.Context(), "http://h.test/y", cr, &bs)
		_, _, err := checkContract(t, tr, req, &bs)
		if !errors.Is(err, ErrBreakerOpen) {
			t.Fatalf("%s: err = %v, want ErrBreakerOpen", cr.name, err)
		}
		var oe *BreakerOpenError
		if !errors.As(err, &oe) || oe.Host != breakerHost || oe.ProbeAt.IsZero() {
			t.Errorf("%s: err = %#v, want a *BreakerOpenError for %s with ProbeAt", cr.name, err, breakerHost)
		}
	}
	if n := base.calls.Load(); n != calls {
		t.Errorf("open breaker sent %d requests", n-calls)
	}
	req, _ := http.NewRequest(http.MethodGet, "http://h.test/z", nil)
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := tr.RoundTrip(req); err == nil {
			t.Fatal("open breaker let a request through")
		}
	})
	if allocs != 0 {
		t.Errorf("open rejection allocates %v times, want 0", allocs)
	}
}

func TestBreakerHalfOpen(t *testing.T) {
	tests := []struct {
		name      string
		probes    string // ops of the admitted probes, in order of release
		wantState CircuitState
	}{
		{"all succeed", "SSS", CircuitClosed},
		{"one fails", "SF", CircuitOpen},
		{"one slow", "SL", CircuitOpen},
		{"first fails", "F", CircuitOpen},
		{"one ignored frees its slot", "S4SS", CircuitClosed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const openFor = 10 * time.Second
				base := &opBase{slow: 2 * time.Second}
				tr := testBreaker(t, Breaker{MinCalls: 1, OpenFor: openFor, HalfOpenCalls: 3, SlowCall: time.Second}, base)
				trip(t, tr)
				b := layerOf[*breakerLayer](t, tr, breakerURL)
				opened := b.openErr.Load()
				// The first open time is at most OpenFor.
				time.Sleep(openFor)
				if s := breakerStateOf(t, tr); s != CircuitHalfOpen {
					t.Fatalf("after OpenFor: state %v, want half-open", s)
				}
				// Probes one at a time keep the order of verdicts fixed.
				for i, op := range tt.probes {
					if _, err := send(t, tr, t.Context(), "http://h.test/p", string(op)); err != nil {
						t.Fatalf("probe %d (%c): %v", i+1, op, err)
					}
				}
				if s := breakerStateOf(t, tr); s != tt.wantState {
					t.Errorf("after probes %q: state %v, want %v", tt.probes, s, tt.wantState)
				}
				if tt.wantState == CircuitOpen {
					e := b.openErr.Load()
					if e == opened || !e.ProbeAt.After(opened.ProbeAt) {
						t.Errorf("reopened without a new ProbeAt: %v then %v", opened.ProbeAt, e.ProbeAt)
					}
				}
			})
		})
	}
}

func TestBreakerHalfOpenConcurrency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const probes = 3
		base := &opBase{release: make(chan struct{})}
		tr := testBreaker(t, Breaker{MinCalls: 1, OpenFor: time.Second, HalfOpenCalls: probes}, base)
		trip(t, tr)
		time.Sleep(2 * time.Second)
		sent := base.calls.Load()

		// Ten callers at once: three probes go out, the rest are refused.
		ctx, cancelOne := context.WithCancel(t.Context())
		var refused atomic.Int64
		var wg sync.WaitGroup
		for i := range 10 {
			c := t.Context()
			if i == 0 {
				c = ctx
			}
			req := breakerReq(t, c, "http://h.test/p", "B")
			wg.Go(func() {
				if _, err := do(tr, req); errors.Is(err, ErrBreakerOpen) {
					refused.Add(1)
				}
			})
			synctest.Wait()
		}
		if n := base.inFlight.Load(); n != probes {
			t.Errorf("%d probes in flight, want %d", n, probes)
		}
		if n := refused.Load(); n != 10-probes {
			t.Errorf("%d callers refused, want %d", n, 10-probes)
		}
		// The caller cancels the first probe: its slot frees without a
		// verdict, so one more probe may go.
		cancelOne()
		synctest.Wait()
		if s := breakerStateOf(t, tr); s != CircuitHalfOpen {
			t.Fatalf("after a cancelled probe: state %v, want half-open", s)
		}
		req := breakerReq(t, t.Context(), "http://h.test/p", "B")
		wg.Go(func() {
			if _, err := do(tr, req); err != nil {
				t.Errorf("probe after a freed slot: %v", err)
			}
		})
		synctest.Wait()
		if _, err := send(t, tr, t.Context(), "http://h.test/p", "S"); !errors.Is(err, ErrBreakerOpen) {
			t.Errorf("a fourth probe: err = %v, want ErrBreakerOpen", err)
		}
		if n := base.maxIn.Load(); n > probes {
			t.Errorf("%d probes in flight at once, want ≤ %d", n, probes)
		}
		close(base.release)
		wg.Wait()
		if s := breakerStateOf(t, tr); s != CircuitClosed {
			t.Errorf("after %d good probes: state %v, want closed", probes, s)
		}
		if n := base.calls.Load() - sent; n != probes+1 {
			t.Errorf("%d requests sent while half-open, want %d", n, probes+1)
		}
	})
}

// openCheck checks, at the moment tr's breaker for h.test has just opened,
// that it stays open for exactly want: the snapshot's OpenUntil and the
// refusal's ProbeAt say so, a request 1 ms before is refused without
// reaching base, and one just after (1 ns: gobreaker ends its own open
// time strictly after it, which the full cut of the jitter makes the same
// instant) goes through as a probe with op. It leaves the clock at the
// probe. Use it inside a synctest bubble.
func openCheck(t *testing.T, tr *Transport, base *opBase, want time.Duration, op string) {
	t.Helper()
	opened := time.Now()
	s := hostBreaker(t, tr)
	if s.State != CircuitOpen || !s.OpenUntil.Equal(opened.Add(want)) {
		t.Fatalf("trip %d: state %v until +%v, want open until +%v", s.Trips, s.State, s.OpenUntil.Sub(opened), want)
	}
	time.Sleep(want - time.Millisecond)
	calls := base.calls.Load()
	_, err := send(t, tr, t.Context(), breakerURL, "S")
	var oe *BreakerOpenError
	if !errors.As(err, &oe) || !oe.ProbeAt.Equal(opened.Add(want)) {
		t.Fatalf("trip %d, at +%v: err = %v, want a *BreakerOpenError with ProbeAt +%v", s.Trips, want-time.Millisecond, err, want)
	}
	if base.calls.Load() != calls {
		t.Fatalf("trip %d: a refused request reached the base", s.Trips)
	}
	time.Sleep(time.Millisecond + time.Nanosecond)
	if _, err := send(t, tr, t.Context(), breakerURL, op); err != nil {
		t.Fatalf("trip %d, at +%v: probe %s: %v", s.Trips, want, op, err)
	}
	if base.calls.Load() != calls+1 {
		t.Fatalf("trip %d: the probe did not reach the base", s.Trips)
	}
}

// TestBreakerOpenTimeGrows: each trip in a row doubles the open time up to
// MaxOpenFor, and closing starts it over from OpenFor.
func TestBreakerOpenTimeGrows(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &opBase{}
		tr := testBreaker(t, Breaker{MinCalls: 1, OpenFor: time.Second, MaxOpenFor: 3 * time.Second, HalfOpenCalls: 1}, base)
		tr.randN = func(int64) int64 { return 0 } // no cut
		trip(t, tr)
		for i, tt := range []struct {
			open  time.Duration
			probe string
		}{
			{time.Second, "F"},     // the first trip; its probe fails, so
			{2 * time.Second, "F"}, // the second is twice as long,
			{3 * time.Second, "F"}, // the third capped at MaxOpenFor,
			{3 * time.Second, "S"}, // and so is the fourth; a probe closes it
		} {
			if s := hostBreaker(t, tr); s.Trips != i+1 {
				t.Errorf("trip %d: Trips = %d, want %d", i+1, s.Trips, i+1)
			}
			openCheck(t, tr, base, tt.open, tt.probe)
		}
		if s := hostBreaker(t, tr); s.State != CircuitClosed || s.Trips != 0 {
			t.Fatalf("after a good probe: %v with %d trips, want closed with 0", s.State, s.Trips)
		}
		// Closed, the next trip is the first of a new run.
		trip(t, tr)
		openCheck(t, tr, base, time.Second, "S")
	})
}

// TestBreakerJitteredOpenTime: the open time is cut by up to a fifth at
// random, so that the hosts of a fleet do not probe in step.
func TestBreakerJitteredOpenTime(t *testing.T) {
	const openFor = 10 * time.Second
	synctest.Test(t, func(t *testing.T) {
		base := &opBase{}
		tr := testBreaker(t, Breaker{MinCalls: 1, OpenFor: openFor, HalfOpenCalls: 1}, base)
		tr.randN = func(n int64) int64 { return n - 1 } // the full cut
		trip(t, tr)
		openCheck(t, tr, base, openFor-openFor/5, "F")
		// The second trip in a row: the doubled time, cut by a fifth of it.
		openCheck(t, tr, base, 2*openFor-2*openFor/5, "S")
	})
	// With the package's own randomness the open time lies within
	// [OpenFor - OpenFor/5, OpenFor].
	synctest.Test(t, func(t *testing.T) {
		for range 20 {
			tr := testBreaker(t, Breaker{MinCalls: 1, OpenFor: openFor}, &opBase{})
			trip(t, tr)
			if d := time.Until(hostBreaker(t, tr).OpenUntil); d < openFor-openFor/5 || d > openFor {
				t.Errorf("open for %v, want %v to %v", d, openFor-openFor/5, openFor)
			}
		}
	})
}

// TestBreakerOnStateChange: the hook sees every change in order, with the
// host, after it happened and outside the breaker's locks: it may ask the
// Transport for a snapshot. Were it called under gobreaker's mutex or the
// window's, the snapshot would deadlock, and go test's -timeout would fail
// the test with every goroutine's stack.
func TestBreakerOnStateChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		type change struct {
			host     string
			from, to CircuitState
			seen     CircuitState // the breaker's state in a snapshot the hook took
		}
		var (
			mu      sync.Mutex
			changes []change
			tr      *Transport
		)
		hook := func(host string, from, to CircuitState) {
			seen := CircuitState(99)
			for _, h := range tr.Snapshot().Host(host) {
				if h.Breaker != nil {
					seen = h.Breaker.State
				}
			}
			mu.Lock()
			changes = append(changes, change{host, from, to, seen})
			mu.Unlock()
		}
		tr = testBreaker(t, Breaker{MinCalls: 1, OpenFor: time.Second, HalfOpenCalls: 1, OnStateChange: hook}, &opBase{})
		trip(t, tr)
		time.Sleep(time.Second)
		if code, err := send(t, tr, t.Context(), breakerURL, "S"); err != nil || code != 200 {
			t.Fatalf("probe: %d, %v", code, err)
		}
		mu.Lock()
		defer mu.Unlock()
		want := []change{
			{breakerHost, CircuitClosed, CircuitOpen, CircuitOpen},
			{breakerHost, CircuitOpen, CircuitHalfOpen, CircuitClosed},
			{breakerHost, CircuitHalfOpen, CircuitClosed, CircuitClosed},
		}
		if fmt.Sprint(changes) != fmt.Sprint(want) {
			t.Errorf("hook saw %v, want %v", changes, want)
		}
	})
}

func TestControlBreaker(t *testing.T) {
	base := &opBase{}
	tr := testBreaker(t, Breaker{MinCalls: 1}, base)
	other := "http://other.test/x"
	if _, err := send(t, tr, t.Context(), other, "S"); err != nil {
		t.Fatal(err)
	}

	// Set before the host has state: it applies when the state is made.
	if err := tr.ControlBreaker("H.test:80", BreakerForceOpen); err != nil {
		t.Fatalf("ControlBreaker: %v", err)
	}
	if _, err := send(t, tr, t.Context(), breakerURL, "S"); !errors.Is(err, ErrBreakerOpen) {
		t.Errorf("forced open: err = %v, want ErrBreakerOpen", err)
	}
	if s := hostBreaker(t, tr); s.Control != BreakerForceOpen || s.State != CircuitOpen {
		t.Errorf("forced open: control %v, state %v; want force-open, open", s.Control, s.State)
	}
	if n := base.calls.Load(); n != 1 {
		t.Errorf("forced open: %d calls reached the base, want none", n-1)
	}
	// On a host that has state already.
	if err := tr.ControlBreaker("other.test:80", BreakerForceOpen); err != nil {
		t.Fatal(err)
	}
	if _, err := send(t, tr, t.Context(), other, "S"); !errors.Is(err, ErrBreakerOpen) {
		t.Errorf("other.test forced open: err = %v, want ErrBreakerOpen", err)
	}

	// Forced closed, failures go through and are not counted: MinCalls 1
	// would trip on the first.
	if err := tr.ControlBreaker(breakerHost, BreakerForceClosed); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if code, err := send(t, tr, t.Context(), breakerURL, "F"); err != nil || code != 503 {
			t.Fatalf("forced closed, call %d: %d, %v; want 503", i+1, code, err)
		}
	}
	s := hostBreaker(t, tr)
	if s.Control != BreakerForceClosed || s.State != CircuitClosed || s.Calls != 0 || s.Trips != 0 {
		t.Errorf("forced closed: %+v, want force-closed, closed, no calls, no trips", s)
	}

	// Auto hands the decision back: the next failure counts and trips it.
	if err := tr.ControlBreaker(breakerHost, BreakerAuto); err != nil {
		t.Fatal(err)
	}
	if code, err := send(t, tr, t.Context(), breakerURL, "F"); err != nil || code != 503 {
		t.Errorf("auto, failing: %d, %v; want 503", code, err)
	}
	if s := hostBreaker(t, tr); s.Control != BreakerAuto || s.State != CircuitOpen {
		t.Errorf("auto after a failure: control %v, state %v; want auto, open", s.Control, s.State)
	}
	// Forced closed lets requests through an open breaker, and Auto gives
	// the host back to it, still open.
	if err := tr.ControlBreaker(breakerHost, BreakerForceClosed); err != nil {
		t.Fatal(err)
	}
	if code, err := send(t, tr, t.Context(), breakerURL, "S"); err != nil || code != 200 {
		t.Errorf("forced closed over an open breaker: %d, %v; want 200", code, err)
	}
	if err := tr.ControlBreaker(breakerHost, BreakerAuto); err != nil {
		t.Fatal(err)
	}
	if _, err := send(t, tr, t.Context(), breakerURL, "S"); !errors.Is(err, ErrBreakerOpen) {
		t.Errorf("auto again over the open breaker: err = %v, want ErrBreakerOpen", err)
	}
	// other.test is still forced open.
	if _, err := send(t, tr, t.Context(), other, "S"); !errors.Is(err, ErrBreakerOpen) {
		t.Errorf("other.test: err = %v, want ErrBreakerOpen", err)
	}

	for _, tt := range []struct {
		host string
		c    BreakerControl
	}{
		{"h.test", BreakerForceOpen},
		{"", BreakerForceOpen},
		{":80", BreakerForceOpen},
		{"h.test:", BreakerForceOpen},
		{breakerHost, BreakerControl(7)},
	} {
		if err := tr.ControlBreaker(tt.host, tt.c); err == nil {
			t.Errorf("ControlBreaker(%q, %v) = nil, want an error", tt.host, tt.c)
		}
	}
	if s := hostBreaker(t, tr); s.Control != BreakerAuto || s.State != CircuitOpen {
		t.Errorf("after invalid calls: control %v, state %v; want auto, open still", s.Control, s.State)
	}
}

// TestBreakerReenabled: Enabled turns back on, for one upstream, the
// breaker that Default disabled.
func TestBreakerReenabled(t *testing.T) {
	base := &opBase{}
	tr := mustNew(t, Config{
		Base:      base,
		Default:   only(Policy{Breaker: Breaker{MinCalls: 1}}), // every layer off, the breaker too
		Upstreams: map[string]Policy{"on.test": {Breaker: Breaker{Enabled: true}}},
	})
	for range 5 {
		if code, err := send(t, tr, t.Context(), "http://off.test/", "F"); err != nil || code != 503 {
			t.Fatalf("no breaker: %d, %v; want 503", code, err)
		}
	}
	if code, err := send(t, tr, t.Context(), "http://on.test/", "F"); err != nil || code != 503 {
		t.Fatalf("re-enabled breaker, first call: %d, %v; want 503", code, err)
	}
	if _, err := send(t, tr, t.Context(), "http://on.test/", "S"); !errors.Is(err, ErrBreakerOpen) {
		t.Errorf("re-enabled breaker (MinCalls 1 from Default) after a failure: err = %v, want ErrBreakerOpen", err)
	}
	snap := tr.Snapshot()
	if h := snap.Host("on.test:80"); len(h) != 1 || h[0].Breaker == nil || h[0].Breaker.State != CircuitOpen {
		t.Errorf("on.test: %+v, want one host with an open breaker", h)
	}
	if h := snap.Host("off.test:80"); len(h) != 1 || h[0].Breaker != nil {
		t.Errorf("off.test: %+v, want one host without a breaker", h)
	}

	both := Policy{Breaker: Breaker{Disabled: true, Enabled: true}}
	for name, cfg := range map[string]Config{
		"Default":  {Default: both},
		"upstream": {Upstreams: map[string]Policy{"both.test": both}},
		"upstream under a disabled Default": {Default: Policy{Breaker: Breaker{Disabled: true}},
			Upstreams: map[string]Policy{"both.test": both}},
	} {
		_, err := New(cfg)
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != "Breaker.Enabled" {
			t.Errorf("%s with Breaker Disabled and Enabled: New = %v, want a *ConfigError for Breaker.Enabled", name, err)
		}
	}
}

// reentrantHandler asks the Transport for the breaker's state while
// logging: were bulwark to log under gobreaker's mutex, this would deadlock.
type reentrantHandler struct {
	slog.Handler
	tr   *Transport
	host string
}

func (h reentrantHandler) Handle(ctx context.Context, r slog.Record) error {
	breakerState(h.tr, h.host)
	return h.Handler.Handle(ctx, r)
}

func TestBreakerPerHost(t *testing.T) {
	var logs syncBuffer
	var tr *Transport
	base := http.RoundTripper(roundTripFunc(func(req *http.Request) (*http.Response, error) {
		if req.URL.Hostname() == "sick.test" {
			req.Header.Set("X-Op", "F")
		}
		return (&opBase{}).RoundTrip(req)
	}))
	h := &reentrantHandler{Handler: slog.NewTextHandler(&logs, nil), host: "sick.test:80"}
	tr = mustNew(t, Config{
		Base:   base,
		Logger: slog.New(h),
		// Retries off: each call is one verdict, so the counts are exact.
		Default: Policy{Breaker: Breaker{MinCalls: 5}, Retry: Retry{Disabled: true}},
	})
	h.tr = tr
	for i := range 20 {
		if code, err := send(t, tr, t.Context(), "http://well.test/x", "S"); err != nil || code != 200 {
			t.Fatalf("well.test call %d: %d, %v", i, code, err)
		}
		code, err := send(t, tr, t.Context(), "http://sick.test/x", "S")
		switch {
		case i < 5 && code != 503:
			t.Fatalf("sick.test call %d: %d, %v; want 503", i, code, err)
		case i >= 5 && !errors.Is(err, ErrBreakerOpen):
			t.Fatalf("sick.test call %d: %d, %v; want ErrBreakerOpen", i, code, err)
		}
	}
	if s, ok := breakerState(tr, "sick.test:80"); !ok || s != CircuitOpen {
		t.Errorf("sick.test: %v, %v; want open", s, ok)
	}
	if s, ok := breakerState(tr, "WELL.test:80"); !ok || s != CircuitClosed {
		t.Errorf("well.test: %v, %v; want closed", s, ok)
	}
	if _, ok := breakerState(tr, "other.test:80"); ok {
		t.Error("BreakerState of an unseen host: ok")
	}
	if got := logs.String(); !strings.Contains(got, "circuit breaker open") || !strings.Contains(got, "host=sick.test:80") ||
		strings.Contains(got, "well.test") {
		t.Errorf("log = %q, want one open transition for sick.test only", got)
	}
}

func TestBreakerDisabled(t *testing.T) {
	// In a bubble: the retries of the 503s wait their backoff on the fake
	// clock.
	synctest.Test(t, func(t *testing.T) {
		base := &opBase{}
		tr := mustNew(t, Config{Base: base, Upstreams: map[string]Policy{"off.test": {Breaker: Breaker{Disabled: true}}},
			Default: Policy{Breaker: Breaker{MinCalls: 1}}})
		for range 5 {
			if _, err := send(t, tr, t.Context(), "http://off.test/", "F"); err != nil {
				t.Fatalf("disabled breaker: %v", err)
			}
		}
		if _, ok := breakerState(tr, "off.test:80"); ok {
			t.Error("disabled breaker reports a state")
		}
	})
}

func TestBreakerContract(t *testing.T) {
	runContract(t, func(base http.RoundTripper) http.RoundTripper {
		return testBreaker(t, Breaker{}, base)
	})
}

func TestBreakerTransportContract(t *testing.T) {
	runContract(t, func(base http.RoundTripper) http.RoundTripper {
		return mustNew(t, Config{Base: base, Default: Policy{Breaker: Breaker{MinCalls: 1000, WindowCalls: 1000}}})
	})
}

func BenchmarkBreaker(b *testing.B) {
	resp := &http.Response{StatusCode: 200, Body: http.NoBody}
	req, _ := http.NewRequest(http.MethodGet, "http://h.test/x", nil)
	b.Run("base", func(b *testing.B) {
		rt := &staticBase{resp}
		b.ReportAllocs()
		for b.Loop() {
			rt.RoundTrip(req)
		}
	})
	b.Run("gobreaker-alone", func(b *testing.B) {
		// The floor: gobreaker's Execute, which reads time.Now twice.
		cb := gobreaker.NewCircuitBreaker[struct{}](gobreaker.Settings{Interval: time.Minute, BucketPeriod: 6 * time.Second})
		b.ReportAllocs()
		for b.Loop() {
			if _, err := cb.Execute(func() (struct{}, error) { return struct{}{}, nil }); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("time.Now", func(b *testing.B) {
		for b.Loop() {
			time.Now()
		}
	})
	b.Run("router", func(b *testing.B) {
		// The Transport with every layer off: what the breaker adds to.
		rt := mustNew(b, Config{Base: &staticBase{resp}, Default: only(Policy{})})
		b.ReportAllocs()
		for b.Loop() {
			rt.RoundTrip(req)
		}
	})
	b.Run("closed", func(b *testing.B) {
		rt := testBreaker(b, Breaker{}, &staticBase{resp})
		b.ReportAllocs()
		for b.Loop() {
			rt.RoundTrip(req)
		}
	})
	b.Run("open", func(b *testing.B) {
		// Open for an hour: no timer probe comes due while it measures.
		rt := testBreaker(b, Breaker{MinCalls: 1, OpenFor: time.Hour}, &staticBase{&http.Response{StatusCode: 503, Body: http.NoBody}})
		rt.RoundTrip(req)
		if s, _ := breakerState(rt, breakerHost); s != CircuitOpen {
			b.Fatal("breaker not open")
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := rt.RoundTrip(req); err == nil {
				b.Fatal("open breaker let a request through")
			}
		}
	})
	b.Run("closed-parallel", func(b *testing.B) {
		rt := testBreaker(b, Breaker{}, &staticBase{resp})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				rt.RoundTrip(req)
			}
		})
	})
}

// panicBase panics on every call, as a buggy base might.
type panicBase struct{}

func (panicBase) RoundTrip(*http.Request) (*http.Response, error) { panic("base exploded") }

// TestBreakerPanicIsFailure: a panic below the breaker goes on up to the
// caller, and the breaker counts it as a failure, so a half-open probe that
// panics reopens the circuit and frees its slot instead of keeping it for
// good: the next probe goes through.
func TestBreakerPanicIsFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const openFor = 10 * time.Second
		var sw switchRT
		sw.set(&opBase{})
		tr := testBreaker(t, Breaker{MinCalls: 1, OpenFor: openFor, MaxOpenFor: openFor, HalfOpenCalls: 1}, &sw)
		trip(t, tr)
		time.Sleep(openFor)
		if s := breakerStateOf(t, tr); s != CircuitHalfOpen {
			t.Fatalf("after OpenFor: state %v, want half-open", s)
		}
		// sendPanicking sends one call that must panic with the base's value.
		sendPanicking := func(rt http.RoundTripper) {
			t.Helper()
			req := breakerReq(t, t.Context(), "http://h.test/p", "S")
			defer func() {
				if r := recover(); r != "base exploded" {
					t.Errorf("recovered %v, want the base's panic", r)
				}
			}()
			_, _ = do(rt, req)
		}
		sw.set(panicBase{})
		sendPanicking(tr)
		if s := breakerStateOf(t, tr); s != CircuitOpen {
			t.Errorf("after a panicking probe: state %v, want open", s)
		}
		// The one probe slot is free: after the open time the next probe
		// is let through, and its success closes the breaker.
		sw.set(&opBase{})
		time.Sleep(openFor)
		if code, err := send(t, tr, t.Context(), "http://h.test/p", "S"); err != nil || code != 200 {
			t.Errorf("the probe after a panicking one: %d, %v; want 200", code, err)
		}
		if s := breakerStateOf(t, tr); s != CircuitClosed {
			t.Errorf("after a good probe: state %v, want closed", s)
		}

		// Closed: the panic is a failed call in the window (one of one).
		c := testBreaker(t, Breaker{MinCalls: 1}, panicBase{})
		sendPanicking(c)
		if s := breakerStateOf(t, c); s != CircuitOpen {
			t.Errorf("closed, after one panicking call of MinCalls 1: state %v, want open", s)
		}
	})
}

// switchRT forwards to a RoundTripper that a test can replace.
type switchRT struct {
	rt atomic.Pointer[http.RoundTripper]
}

func (s *switchRT) set(rt http.RoundTripper) { s.rt.Store(&rt) }

func (s *switchRT) RoundTrip(req *http.Request) (*http.Response, error) {
	return (*s.rt.Load()).RoundTrip(req)
}

// BenchmarkBreakerJudge is what judging after every call costs: the
// closed breaker's bookkeeping of one outcome (record, under the lock, as
// isSuccessful does) without and with the judgement of the rules that
// follows it (judge), in one run, for a healthy host and for one whose
// every third attempt fails, with the package defaults (a count window of
// 100, SlowCall learned).
func BenchmarkBreakerJudge(b *testing.B) {
	for _, mix := range []struct {
		name  string
		every int // every every-th outcome is a failure; 0: none
	}{{"healthy", 0}, {"a third failing", 3}} {
		for _, judged := range []bool{false, true} {
			name := mix.name + "/record"
			if judged {
				name = mix.name + "/record+judge"
			}
			b.Run(name, func(b *testing.B) {
				tr := mustNew(b, Config{Base: &staticBase{}, Default: only(Policy{Breaker: Breaker{ConsecutiveFailures: -1, FailureRate: 1}}, "breaker")})
				c := layerOf[*breakerLayer](b, tr, breakerURL).breakerCore
				b.ReportAllocs()
				n := 0
				for b.Loop() {
					var v error
					if n++; mix.every > 0 && n%mix.every == 0 {
						v = errVerdictFailure
					}
					var clk breakerClock
					c.winMu.Lock()
					c.record(v, false, &clk)
					if judged && c.judge(&clk, v != nil) {
						b.Fatal("tripped")
					}
					c.winMu.Unlock()
				}
			})
		}
	}
}

// BenchmarkBreakerHooks is gobreaker's view of one outcome in a closed
// breaker, as its afterRequest makes it: IsSuccessful, then ReadyToTrip
// when that says failure. The same code runs on an older tree, for a
// paired comparison of what judging costs per call.
func BenchmarkBreakerHooks(b *testing.B) {
	for _, mix := range []struct {
		name  string
		every int
	}{{"healthy", 0}, {"a third failing", 3}} {
		b.Run(mix.name, func(b *testing.B) {
			tr := mustNew(b, Config{Base: &staticBase{}, Default: only(Policy{Breaker: Breaker{ConsecutiveFailures: -1, FailureRate: 1}}, "breaker")})
			c := layerOf[*breakerLayer](b, tr, breakerURL).breakerCore
			b.ReportAllocs()
			n := 0
			for b.Loop() {
				var v error
				if n++; mix.every > 0 && n%mix.every == 0 {
					v = errVerdictFailure
				}
				if !c.isSuccessful(v) && c.readyToTrip(gobreaker.Counts{}) {
					b.Fatal("tripped")
				}
			}
		})
	}
}

// TestBreakerTimerProbes: a tripped breaker over a host that stays sick
// lets at most HalfOpenCalls requests through per open period, spaced
// through it; once the host recovers, the breaker answers again within
// one spacing (OpenFor ÷ HalfOpenCalls, the open time in force being
// doubled on each trip in a row), not at the end of the open time.
func TestBreakerTimerProbes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const halfOpen = 10
		var healthy atomic.Bool
		base := recoveringBase(&healthy)
		var sent atomic.Int64
		counted := roundTripFunc(func(req *http.Request) (*http.Response, error) {
			sent.Add(1)
			return base(req)
		})
		tr := testBreaker(t, Breaker{MinCalls: 1, OpenFor: time.Second, HalfOpenCalls: halfOpen}, counted)
		call := func() bool {
			code, err := send(t, tr, t.Context(), breakerURL, "")
			return err == nil && code == 200
		}
		call() // trips it
		if s := hostBreaker(t, tr); s.State != CircuitOpen {
			t.Fatalf("state %v after a failure with MinCalls 1, want open", s.State)
		}
		// Sick for 6 s, called every 5 ms: 1,200 calls over trips of 0.8–1
		// s, 1.6–2 s and 3.2–4 s. Count what reached the host in each open
		// period, from one trip to the next.
		var perPeriod []int64
		trips := hostBreaker(t, tr).TotalTrips
		last := sent.Load()
		for range 1200 {
			time.Sleep(5 * time.Millisecond)
			call()
			if n := hostBreaker(t, tr).TotalTrips; n != trips {
				perPeriod = append(perPeriod, sent.Load()-last)
				trips, last = n, sent.Load()
			}
		}
		if len(perPeriod) < 2 {
			t.Fatalf("open periods seen: %v, want at least 2", perPeriod)
		}
		for i, n := range perPeriod {
			if n > halfOpen {
				t.Errorf("open period %d: %d requests reached the sick host, want ≤ %d", i+1, n, halfOpen)
			}
			if n < 2 {
				t.Errorf("open period %d: %d requests reached the sick host, want timer probes besides the half-open round", i+1, n)
			}
		}
		// Recovered: answered again within one spacing of the open time in
		// force, OpenFor doubled for each trip in a row before it, ÷
		// HalfOpenCalls (the last spaced probe goes at nine tenths of it,
		// the half-open round at its end), and a 5 ms call interval.
		s := hostBreaker(t, tr)
		spacing := (time.Second << (s.Trips - 1)) / halfOpen
		healthy.Store(true)
		recovered := time.Now()
		for !call() {
			time.Sleep(5 * time.Millisecond)
			if time.Since(recovered) > 10*time.Second {
				t.Fatal("not answered 10 s after the host recovered")
			}
		}
		took := time.Since(recovered)
		t.Logf("requests to the sick host per open period: %v; answered %v after it recovered (a spacing %v; open until %v)", perPeriod, took, spacing, s.OpenUntil.Sub(recovered))
		if took > spacing+10*time.Millisecond {
			t.Errorf("answered %v after the host recovered, want within one spacing (%v)", took, spacing)
		}
	})
}

// TestBreakerSpacedProbeReason: the breaker's history explains an open →
// half-open change that a spaced probe's success brought about as such,
// and one the open time brought about (its spaced probes failed) as "open
// time over": the note of the first open period does not reach the next.
func TestBreakerSpacedProbeReason(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var healthy atomic.Bool
		base := recoveringBase(&healthy)
		tr := testBreaker(t, Breaker{MinCalls: 1, WindowCalls: 1, OpenFor: time.Second, HalfOpenCalls: 10}, base)
		// until calls every 10 ms, for at most 10 s, until done holds.
		until := func(what string, done func(BreakerSnapshot) bool) {
			t.Helper()
			for range 1000 {
				_, _ = send(t, tr, t.Context(), breakerURL, "")
				if done(hostBreaker(t, tr)) {
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
			t.Fatalf("not %s after 10 s: %+v", what, hostBreaker(t, tr))
		}
		state := func(st CircuitState) func(BreakerSnapshot) bool {
			return func(s BreakerSnapshot) bool { return s.State == st }
		}
		// lastHalfOpen is the reason of the last open → half-open change.
		lastHalfOpen := func() string {
			why := ""
			for _, c := range hostBreaker(t, tr).Changes {
				if c.From == CircuitOpen && c.To == CircuitHalfOpen {
					why = c.Reason
				}
			}
			return why
		}
		until("open", state(CircuitOpen))
		healthy.Store(true) // the first spaced probe, a tenth of the way in, succeeds
		until("closed", state(CircuitClosed))
		if got := lastHalfOpen(); got != "a spaced probe succeeded" {
			t.Errorf("open → half-open after a spaced probe succeeded: reason %q, want \"a spaced probe succeeded\"", got)
		}
		healthy.Store(false) // trips again; every probe fails
		until("open", state(CircuitOpen))
		trips := hostBreaker(t, tr).TotalTrips
		until("tripped again by its half-open round", func(s BreakerSnapshot) bool { return s.TotalTrips > trips })
		if got := lastHalfOpen(); got != "open time over" {
			t.Errorf("open → half-open with every spaced probe failing: reason %q, want \"open time over\"", got)
		}
	})
}

// TestSpacedProbeEndsFirstOpenTime: a host that recovers right after the
// breaker's first trip is answered again within one spacing (open time ÷
// HalfOpenCalls), not at the end of the open time. gobreaker's own open
// time once held the breaker open after a spaced probe succeeded, for
// four fifths of OpenFor (8 s here), whatever the probe found.
func TestSpacedProbeEndsFirstOpenTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var healthy atomic.Bool
		base := recoveringBase(&healthy)
		const openFor, halfOpen = 10 * time.Second, 10
		tr := testBreaker(t, Breaker{MinCalls: 1, OpenFor: openFor, HalfOpenCalls: halfOpen}, base)
		call := func() bool {
			code, err := send(t, tr, t.Context(), breakerURL, "")
			return err == nil && code == 200
		}
		call() // trips it
		if s := hostBreaker(t, tr); s.State != CircuitOpen {
			t.Fatalf("state %v after a failure with MinCalls 1, want open", s.State)
		}
		healthy.Store(true)
		recovered := time.Now()
		for !call() {
			time.Sleep(5 * time.Millisecond)
			if time.Since(recovered) > 2*openFor {
				t.Fatal("not answered after twice the open time")
			}
		}
		took := time.Since(recovered)
		s := hostBreaker(t, tr)
		t.Logf("answered %v after the host recovered (spacing %v, open time %v); breaker %v", took, openFor/halfOpen, openFor, s.State)
		if took > openFor/halfOpen+10*time.Millisecond {
			t.Errorf("answered %v after the host recovered, want within one spacing (%v)", took, openFor/halfOpen)
		}
		// The half-open round follows at once and closes it.
		for range halfOpen {
			if !call() {
				t.Fatalf("a call after the spaced probe failed; breaker %+v", hostBreaker(t, tr))
			}
		}
		if s := hostBreaker(t, tr); s.State != CircuitClosed {
			t.Errorf("state %v after %d successes past the spaced probe, want closed", s.State, halfOpen)
		}
		for _, c := range hostBreaker(t, tr).Changes {
			t.Logf("change %v → %v: %s", c.From, c.To, c.Reason)
		}
	})
}

// TestSpacedProbesLeaveRefusals: a spaced probe goes only once a request
// was refused since the last. A breaker open for 1 s (spacing 100 ms, or
// down to 80 ms as the open time's jitter takes up to a fifth) whose host
// stays sick, called every 100 ms: of its first 7 requests, 3 or 4 are
// probes and the others are refused at once, where each of the 7 was a
// probe before (the spacing had always passed).
func TestSpacedProbesLeaveRefusals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var healthy atomic.Bool
		var sent atomic.Int64
		sick := recoveringBase(&healthy)
		base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
			sent.Add(1)
			return sick(req)
		})
		tr := testBreaker(t, Breaker{MinCalls: 1, OpenFor: time.Second, HalfOpenCalls: 10}, base)
		_, _ = send(t, tr, t.Context(), breakerURL, "") // trips it
		if s := hostBreaker(t, tr); s.State != CircuitOpen {
			t.Fatalf("state %v after a failure with MinCalls 1, want open", s.State)
		}
		start := sent.Load()
		refused := 0
		for range 7 {
			time.Sleep(100 * time.Millisecond)
			if _, err := send(t, tr, t.Context(), breakerURL, ""); errors.Is(err, ErrBreakerOpen) {
				refused++
			}
		}
		probes := sent.Load() - start
		t.Logf("%d spaced probes and %d refusals of 7 requests in a 1 s open time", probes, refused)
		if probes < 3 || probes > 4 || int(probes)+refused != 7 {
			t.Errorf("%d spaced probes reached the sick host and %d requests were refused, of 7 100 ms apart; want 3 or 4 probes, the rest refused", probes, refused)
		}
	})
}

// recoveringBase answers 503 until healthy holds, then 200.
func recoveringBase(healthy *atomic.Bool) roundTripFunc {
	return func(req *http.Request) (*http.Response, error) {
		closeBody(req)
		code := 503
		if healthy.Load() {
			code = 200
		}
		return &http.Response{StatusCode: code, Header: http.Header{}, Body: http.NoBody, Request: req}, nil
	}
}

// TestBreakerHistory: the breaker's Snapshot keeps its last state changes
// with their reasons and times, oldest first and at most eight, and the
// window as it was at its last trip beside the live (emptied) one. Steps
// on one timeline of the fake clock.
func TestBreakerHistory(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var status atomic.Int32
		status.Store(500)
		base := &scriptBase{step: func(_ int, req *http.Request) (*http.Response, error) {
			return response(req, int(status.Load())), nil
		}}
		tr := mustNew(t, Config{Base: base, Default: only(Policy{Breaker: Breaker{WindowCalls: 10, MinCalls: 4,
			OpenFor: time.Second, MaxOpenFor: time.Second, HalfOpenCalls: 1, ConsecutiveFailures: -1}}, "breaker")})
		get := func() {
			t.Helper()
			req := testRequest(t, t.Context(), "GET", "http://a.test/", noBody, "")
			if resp, err := tr.RoundTrip(req); err == nil {
				resp.Body.Close()
			}
		}
		breaker := func() *BreakerSnapshot {
			t.Helper()
			return tr.Snapshot().Hosts[0].Breaker
		}
		start := time.Now()
		get()
		if b := breaker(); len(b.Changes) != 0 || b.LastTrip != nil {
			t.Fatalf("before any trip: Changes %v, LastTrip %v; want none", b.Changes, b.LastTrip)
		}
		for range 3 {
			get()
		}
		b := breaker()
		if len(b.Changes) != 1 || b.LastTrip == nil {
			t.Fatalf("after 4 failed calls: Changes %v, LastTrip %v; want one trip", b.Changes, b.LastTrip)
		}
		want := BreakerChange{At: start, From: CircuitClosed, To: CircuitOpen, Reason: "failure rate 100 % ≥ 50 %", Calls: 4, Failures: 4}
		if b.Changes[0] != want || *b.LastTrip != want {
			t.Errorf("the trip: Changes[0] %+v, LastTrip %+v; want %+v", b.Changes[0], *b.LastTrip, want)
		}
		if b.Calls != 0 {
			t.Errorf("live window holds %d calls after the trip, want 0 (LastTrip keeps them)", b.Calls)
		}

		// A probe that fails, then one that succeeds.
		time.Sleep(1100 * time.Millisecond)
		get()
		time.Sleep(1100 * time.Millisecond)
		status.Store(200)
		get()
		b = breaker()
		reasons := []string{"failure rate 100 % ≥ 50 %", "open time over", "a probe failed or was slow", "open time over", "every probe succeeded"}
		if len(b.Changes) != len(reasons) {
			t.Fatalf("got %d changes %+v, want %d", len(b.Changes), b.Changes, len(reasons))
		}
		for i, r := range reasons {
			if b.Changes[i].Reason != r {
				t.Errorf("Changes[%d].Reason = %q, want %q", i, b.Changes[i].Reason, r)
			}
		}
		if c := b.Changes[4]; c.From != CircuitHalfOpen || c.To != CircuitClosed || c.At != start.Add(2200*time.Millisecond) {
			t.Errorf("the close: %+v, want half-open → closed at +2.2 s", c)
		}
		if *b.LastTrip != want {
			t.Errorf("LastTrip after a failed probe is %+v, want the trip on the window's counts %+v", *b.LastTrip, want)
		}

		// A manual control is a change too; the ring keeps the last eight.
		for _, c := range []BreakerControl{BreakerForceOpen, BreakerAuto, BreakerForceClosed, BreakerAuto} {
			if err := tr.ControlBreaker("a.test:80", c); err != nil {
				t.Fatal(err)
			}
		}
		b = breaker()
		if len(b.Changes) != 8 {
			t.Fatalf("got %d changes, want the last 8", len(b.Changes))
		}
		if c := b.Changes[0]; c.Reason != "open time over" {
			t.Errorf("oldest kept change %+v, want the first half-open", c)
		}
		if c := b.Changes[4]; c.Reason != "control force-open" || c.From != CircuitClosed || c.To != CircuitOpen {
			t.Errorf("Changes[4] = %+v, want closed → open by control force-open", c)
		}
		if c := b.Changes[7]; c.Reason != "control auto" || c.From != CircuitClosed || c.To != CircuitClosed {
			t.Errorf("Changes[7] = %+v, want closed → closed by control auto", c)
		}
	})
}

// scriptedStatus answers a request for "/N" by the script: a failure in
// the bursts of bad calls, a success otherwise. It depends only on N, so
// an enforcing and a shadow Transport see the same outcome for every call
// they send.
type scriptedStatus struct{}

func (scriptedStatus) RoundTrip(req *http.Request) (*http.Response, error) {
	n, _ := strconv.Atoi(req.URL.Path[1:])
	code := http.StatusOK
	if (n >= 20 && n < 60) || (n >= 120 && n < 130) || (n >= 200 && n < 230) {
		code = http.StatusInternalServerError
	}
	return response(req, code), nil
}

// TestShadowBreakerMatchesEnforcingTwin: a breaker in shadow mode, fed the
// traffic an enforcing twin gets, counts as WouldReject exactly the
// requests the twin refuses, and refuses none itself.
func TestShadowBreakerMatchesEnforcingTwin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := only(Policy{}, "breaker")
		p.Breaker = Breaker{WindowCalls: 20, MinCalls: 10, FailureRate: 0.5, OpenFor: time.Second, MaxOpenFor: 4 * time.Second, HalfOpenCalls: 3}
		build := func(shadow bool) *Transport {
			q := p
			q.Breaker.Shadow = shadow
			tr := mustNew(t, Config{Base: scriptedStatus{}, Default: q})
			tr.randN = func(int64) int64 { return 0 }
			return tr
		}
		enforcing, shadow := build(false), build(true)
		refused := 0
		for i := range 300 {
			url := "http://api.test/" + strconv.Itoa(i)
			if _, err := sendOnce(t, enforcing, "GET", url); errors.Is(err, ErrBreakerOpen) {
				refused++
			} else if err != nil {
				t.Fatalf("enforcing call %d: %v", i, err)
			}
			if _, err := sendOnce(t, shadow, "GET", url); err != nil {
				t.Fatalf("shadow call %d: %v; a shadow breaker never refuses", i, err)
			}
			// 70 ms never divides an open time (1, 2, 4 s), so a call
			// never comes at the instant a hold ends; and the timer that
			// ends it has run by the time the next call is sent.
			time.Sleep(70 * time.Millisecond)
			synctest.Wait()
		}
		if refused == 0 {
			t.Fatal("the script never opened the enforcing breaker: the test proves nothing")
		}
		b := shadow.Snapshot().Hosts[0].Breaker
		if !b.Shadow || b.WouldReject != uint64(refused) {
			t.Errorf("shadow breaker: Shadow %v, WouldReject %d; the enforcing twin refused %d", b.Shadow, b.WouldReject, refused)
		}
		if e := enforcing.Snapshot().Hosts[0].Breaker; e.WouldReject != 0 || e.Shadow {
			t.Errorf("enforcing breaker reports shadow counts: %+v", e)
		}
	})
}
