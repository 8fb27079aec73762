package bulwark

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// TestClassify is the one classification's table: for each outcome, what
// every layer reads from it.
func TestClassify(t *testing.T) {
	resp := func(code int) *http.Response { return &http.Response{StatusCode: code} }
	reset := &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	tests := []struct {
		name      string
		resp      *http.Response
		err       error
		health    Outcome
		retryable bool
		failed    bool // a fallback may answer
		label     string
	}{
		{"200", resp(200), nil, OutcomeSuccess, false, false, "success"},
		{"304", resp(304), nil, OutcomeSuccess, false, false, "success"},
		{"400", resp(400), nil, OutcomeIgnored, false, false, "client_error"},
		{"404", resp(404), nil, OutcomeIgnored, false, false, "client_error"},
		{"408", resp(408), nil, OutcomeIgnored, true, false, "client_error"},
		{"429", resp(429), nil, OutcomeFailure, true, true, "client_error"},
		{"500", resp(500), nil, OutcomeFailure, true, true, "server_error"},
		{"501", resp(501), nil, OutcomeIgnored, false, false, "server_error"},
		{"502", resp(502), nil, OutcomeFailure, true, true, "server_error"},
		{"503", resp(503), nil, OutcomeFailure, true, true, "server_error"},
		{"504", resp(504), nil, OutcomeFailure, true, true, "server_error"},
		{"505", resp(505), nil, OutcomeFailure, false, true, "server_error"},
		{"507", resp(507), nil, OutcomeFailure, false, true, "server_error"},
		{"reset", nil, reset, OutcomeFailure, true, true, "error"},
		{"attempt timeout", nil, &timeoutError{limit: ErrAttemptTimeout, cause: context.DeadlineExceeded}, OutcomeFailure, true, true, "timeout"},
		{"total timeout", nil, &timeoutError{limit: ErrTotalTimeout, cause: context.DeadlineExceeded}, OutcomeFailure, true, true, "timeout"},
		{"caller deadline", nil, fmt.Errorf("get: %w", context.DeadlineExceeded), OutcomeIgnored, false, false, "deadline"},
		{"caller cancel", nil, context.Canceled, OutcomeIgnored, false, false, "canceled"},
		{"too short", nil, ErrDeadlineTooShort, OutcomeIgnored, false, true, "deadline_too_short"},
		{"breaker open", nil, &BreakerOpenError{Host: "h:80"}, OutcomeIgnored, false, true, "breaker_open"},
		{"bulkhead full", nil, &BulkheadFullError{Host: "h:80"}, OutcomeIgnored, false, true, "bulkhead_full"},
		{"rate limited", nil, &RateLimitError{Host: "h:80"}, OutcomeIgnored, false, true, "bulkhead_full"},
		{"pushback", nil, &PushbackError{Host: "h:80"}, OutcomeIgnored, false, true, "pushback"},
		{"budget", nil, &RetryError{Attempts: 1, Budget: true, Err: reset}, OutcomeIgnored, false, true, "retry_budget"},
		{"unknown authority", nil, fmt.Errorf("tls: %w", x509.UnknownAuthorityError{}), OutcomeFailure, false, true, "error"},
		{"no such host", nil, &net.DNSError{Err: "no such host", IsNotFound: true}, OutcomeFailure, false, true, "error"},
		{"dns timeout", nil, &net.DNSError{Err: "timeout", IsTimeout: true}, OutcomeFailure, true, true, "error"},
		{"nil response", nil, errNilResponse, OutcomeFailure, false, true, "error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := classify(tt.resp, tt.err)
			if got := k.health(); got != tt.health {
				t.Errorf("health = %v, want %v", got, tt.health)
			}
			if got, want := DefaultClassify(tt.resp, tt.err), (Verdict{Outcome: tt.health, Retryable: tt.retryable}); got != want {
				t.Errorf("DefaultClassify = %+v, want %+v", got, want)
			}
			if got := retryable(k, tt.resp); got != tt.retryable {
				t.Errorf("retryable = %v, want %v", got, tt.retryable)
			}
			if got := k.failed(); got != tt.failed {
				t.Errorf("failed = %v, want %v", got, tt.failed)
			}
			wantReached := !strings.HasPrefix(tt.label, "breaker") && !strings.HasPrefix(tt.label, "bulkhead") &&
				tt.label != "pushback" && tt.label != "retry_budget" && tt.label != "deadline_too_short"
			if got := reached(k); got != wantReached {
				t.Errorf("reached = %v, want %v", got, wantReached)
			}
			if got := k.label(); got != tt.label {
				t.Errorf("label = %q, want %q", got, tt.label)
			}
		})
	}
}

// TestClassifyNeverReadsText checks that an error is classified by its
// type alone: the words of a permanent error in a transient one's text do
// not make it permanent.
func TestClassifyNeverReadsText(t *testing.T) {
	err := errors.New("x509: certificate signed by unknown authority; no such host")
	if k := classify(nil, err); k != kindTransient {
		t.Errorf("classify(%q) = %v, want kindTransient", err, k)
	}
}

// TestRefusalKinds holds each layer's refusal to the kind it names for
// itself (the shortcut classify takes for it as returned) being the kind
// classify's walk finds for it wrapped, where no shortcut applies.
func TestRefusalKinds(t *testing.T) {
	for _, r := range []refusal{
		&BreakerOpenError{Host: "h:80"},
		&BulkheadFullError{Host: "h:80"},
		&PushbackError{Host: "h:80"},
		&ThrottledError{Host: "h:80"},
	} {
		walked := classify(nil, fmt.Errorf("wrapped: %w", r))
		if got := classify(nil, r); got != r.refusalKind() || got != walked {
			t.Errorf("%T: classify = %v, its own kind %v, wrapped %v; want all three equal", r, got, r.refusalKind(), walked)
		}
	}
}

// tableClassify is the one custom classifier the layers' table runs: this
// upstream answers 404 when an instance lost its index (a failure, which
// another try, on another instance, may cure), 503 while it drains (which
// says nothing about its health, and which another try will not change),
// and 200 with X-Degraded when it served from a degraded path (a failure,
// final). Everything else is DefaultClassify's.
func tableClassify(resp *http.Response, err error) Verdict {
	if resp != nil {
		switch {
		case resp.StatusCode == http.StatusNotFound:
			return Verdict{Outcome: OutcomeFailure, Retryable: true}
		case resp.StatusCode == http.StatusServiceUnavailable:
			return Verdict{Outcome: OutcomeIgnored}
		case resp.Header.Get("X-Degraded") != "":
			return Verdict{Outcome: OutcomeFailure}
		}
	}
	return DefaultClassify(resp, err)
}

// classifyCase is one answer of the upstream's, sent through every layer.
type classifyCase struct {
	name   string
	status int
	kv     []string // response header, name and value pairs
}

func (cc classifyCase) response(req *http.Request, kv ...string) *http.Response {
	return response(req, cc.status, append(append([]string(nil), cc.kv...), kv...)...)
}

// verdictOf is what cl (nil: DefaultClassify) says of cc's answer.
func (cc classifyCase) verdictOf(cl Classifier) Verdict {
	if cl == nil {
		cl = DefaultClassify
	}
	return cl(cc.response(nil), nil)
}

// classifyRow is one layer: run sends cc's answers through a Transport
// whose policy has Classify cl and returns what the layer did; want is
// what it must have done, given the classifier's Verdict.
type classifyRow struct {
	layer string
	run   func(t *testing.T, cl Classifier, cc classifyCase) string
	want  func(v Verdict, cc classifyCase) string
}

// TestClassifierReachesEveryLayer runs one custom classifier, and the
// default, through every layer that judges an outcome, over answers on
// which the two disagree (404, 503, a degraded 200) and one on which they
// agree (200): each layer must do what the Verdict says, so the layers
// agree with each other whichever classifier the policy has. A layer that
// read its own classification instead of Policy.Classify fails its row on
// the 404, the 503 or the degraded 200.
func TestClassifierReachesEveryLayer(t *testing.T) {
	cases := []classifyCase{
		{"404", http.StatusNotFound, nil},
		{"503", http.StatusServiceUnavailable, nil},
		{"degraded 200", http.StatusOK, []string{"X-Degraded", "1"}},
		{"200", http.StatusOK, nil},
	}
	classifiers := []struct {
		name string
		cl   Classifier
	}{{"custom", tableClassify}, {"default", nil}}
	failure := func(v Verdict, _ classifyCase) string { return yes(v.Outcome == OutcomeFailure) }
	rows := []classifyRow{
		{"breaker trips on failures", runBreakerRow, failure},
		{"retry retries what is retryable", runRetryRow, func(v Verdict, _ classifyCase) string {
			if v.Retryable {
				return "3 attempts"
			}
			return "1 attempts"
		}},
		{"hedge: an answer not retryable wins", runHedgeRow, func(v Verdict, _ classifyCase) string { return yes(!v.Retryable) }},
		{"outlier ejection ejects on failures", runBalancerRow, failure},
		{"throttle counts failures as rejections", runThrottleRow, failure},
		// Every failure here is a 503 or one the classifier declares
		// where DefaultClassify does not: both are drops (see Classifier).
		{"adaptive limit counts failures as drops", runAdaptiveRow, failure},
		{"fallback answers for failures", runFallbackRow, failure},
		{"metrics label the outcome", runMetricsRow, wantLabel},
	}
	for _, row := range rows {
		t.Run(row.layer, func(t *testing.T) {
			for _, c := range classifiers {
				for _, cc := range cases {
					want := row.want(cc.verdictOf(c.cl), cc)
					if got := row.run(t, c.cl, cc); got != want {
						t.Errorf("%s classifier, %s: %s, want %s", c.name, cc.name, got, want)
					}
				}
			}
		})
	}
	// The table must tell the classifiers apart: on each answer but the
	// plain 200, the custom one says something else than the default.
	for _, cc := range cases[:3] {
		if cc.verdictOf(tableClassify) == cc.verdictOf(nil) {
			t.Errorf("%s: the classifiers agree, so no row could fail on it", cc.name)
		}
	}
}

func yes(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// caseBase answers every request with cc's answer.
func caseBase(cc classifyCase, sent *atomic.Int64) roundTripFunc {
	return func(req *http.Request) (*http.Response, error) {
		if sent != nil {
			sent.Add(1)
		}
		return cc.response(req), nil
	}
}

// sendN sends n GETs to url one after another, closing every body, and
// returns the last response's header (nil after an error).
func sendN(t *testing.T, tr *Transport, url string, n int) http.Header {
	t.Helper()
	var h http.Header
	for range n {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
		resp, err := tr.RoundTrip(req)
		h = nil
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			h = resp.Header
		}
	}
	return h
}

// runBreakerRow: does the breaker open after ten such answers?
func runBreakerRow(t *testing.T, cl Classifier, cc classifyCase) (got string) {
	synctest.Test(t, func(t *testing.T) {
		p := only(Policy{Breaker: Breaker{MinCalls: 4}, Classify: cl}, "breaker")
		tr := mustNew(t, Config{Base: caseBase(cc, nil), Default: p})
		sendN(t, tr, "http://svc.test/", 10)
		open := false
		for _, h := range tr.Snapshot().Host("svc.test:80") {
			open = h.Breaker != nil && h.Breaker.State == CircuitOpen
		}
		got = yes(open)
	})
	return got
}

// runRetryRow: how many attempts does one call make?
func runRetryRow(t *testing.T, cl Classifier, cc classifyCase) (got string) {
	synctest.Test(t, func(t *testing.T) {
		var sent atomic.Int64
		p := only(Policy{Retry: Retry{MaxAttempts: 3}, Classify: cl}, "retry")
		tr := mustNew(t, Config{Base: caseBase(cc, &sent), Default: p})
		sendN(t, tr, "http://svc.test/", 1)
		got = strconv.FormatInt(sent.Load(), 10) + " attempts"
	})
	return got
}

// runHedgeRow: the first attempt answers 200 after 100 ms, the hedge sent
// at 10 ms answers at once with cc's answer. Does the caller get the
// hedge's?
func runHedgeRow(t *testing.T, cl Classifier, cc classifyCase) (got string) {
	synctest.Test(t, func(t *testing.T) {
		var sent atomic.Int64
		base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if sent.Add(1) == 1 {
				select {
				case <-time.After(100 * time.Millisecond):
				case <-req.Context().Done():
					return nil, req.Context().Err()
				}
				return response(req, http.StatusOK, "X-Which", "first"), nil
			}
			return cc.response(req, "X-Which", "hedge"), nil
		})
		p := only(Policy{Hedge: Hedge{Delay: 10 * time.Millisecond, MaxHedges: 1}, Classify: cl}, "timeout")
		tr := mustNew(t, Config{Base: base, Default: p})
		h := sendN(t, tr, "http://svc.test/", 1)
		if sent.Load() != 2 {
			t.Fatalf("%d attempts sent, want the first and a hedge", sent.Load())
		}
		got = yes(h.Get("X-Which") == "hedge")
	})
	return got
}

// runBalancerRow: of two instances taken in turn, one gives cc's answer,
// the other 200. Is the first ejected after ten calls (five its own, over
// Consecutive 3)?
func runBalancerRow(t *testing.T, cl Classifier, cc classifyCase) (got string) {
	synctest.Test(t, func(t *testing.T) {
		const sick = "10.0.0.1:80"
		base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if req.URL.Host == sick {
				return cc.response(req), nil
			}
			return response(req, http.StatusOK), nil
		})
		p := only(Policy{Endpoints: Endpoints{Addrs: []string{sick, "10.0.0.2:80"}, RoundRobin: true,
			Outlier: Outlier{Consecutive: 3}}, Classify: cl})
		tr := mustNew(t, Config{Base: base, Default: only(Policy{}), Upstreams: map[string]Policy{"svc.test": p}})
		sendN(t, tr, "http://svc.test/", 10)
		ejected := false
		for _, h := range tr.Snapshot().Host("svc.test:80") {
			for _, e := range h.Endpoints {
				ejected = ejected || (e.Addr == sick && e.Ejected)
			}
		}
		got = yes(ejected)
	})
	return got
}

// runThrottleRow: after twenty calls, did the host accept none of those
// the throttle counted? (It counts one at least: the first is always sent.)
func runThrottleRow(t *testing.T, cl Classifier, cc classifyCase) (got string) {
	synctest.Test(t, func(t *testing.T) {
		p := only(Policy{Throttle: Throttle{Enabled: true}, Classify: cl})
		tr := mustNew(t, Config{Base: caseBase(cc, nil), Default: p})
		sendN(t, tr, "http://svc.test/", 20)
		var s *ThrottleSnapshot
		for _, h := range tr.Snapshot().Host("svc.test:80") {
			s = h.Throttle
		}
		switch {
		case s == nil || s.Requests == 0:
			t.Fatalf("throttle snapshot %+v, want requests counted", s)
		case s.Accepts != 0 && s.Accepts != s.Requests:
			t.Fatalf("throttle accepted %d of %d answers that were all alike", s.Accepts, s.Requests)
		}
		got = yes(s.Accepts == 0)
	})
	return got
}

// runAdaptiveRow: eight callers press on an adaptive limit of eight, each
// answer taking 10 ms. Without drops the limit stays at its ceiling (the
// latency never moves); each window with a drop steps it down. Is it
// below eight after 400 ms?
func runAdaptiveRow(t *testing.T, cl Classifier, cc classifyCase) (got string) {
	synctest.Test(t, func(t *testing.T) {
		base := roundTripFunc(func(req *http.Request) (*http.Response, error) {
			select {
			case <-time.After(10 * time.Millisecond):
			case <-req.Context().Done():
				return nil, req.Context().Err()
			}
			return cc.response(req), nil
		})
		p := only(Policy{Bulkhead: Bulkhead{Adaptive: true, MinConcurrent: 1, MaxConcurrent: 8, MaxQueue: 8}, Classify: cl}, "bulkhead")
		tr := mustNew(t, Config{Base: base, Default: p})
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() { sendN(t, tr, "http://svc.test/", 40) })
		}
		wg.Wait()
		var s *BulkheadSnapshot
		for _, h := range tr.Snapshot().Host("svc.test:80") {
			s = h.Bulkhead
		}
		if s == nil || !s.Adaptive {
			t.Fatalf("bulkhead snapshot %+v, want an adaptive limit", s)
		}
		got = yes(s.Limit < 8)
	})
	return got
}

// runFallbackRow: does a constant fallback answer for the call?
func runFallbackRow(t *testing.T, cl Classifier, cc classifyCase) (got string) {
	synctest.Test(t, func(t *testing.T) {
		p := only(Policy{Fallback: Fallback{Constant: &ConstantResponse{Body: []byte("from memory")}}, Classify: cl})
		tr := mustNew(t, Config{Base: caseBase(cc, nil), Default: p})
		h := sendN(t, tr, "http://svc.test/", 1)
		got = yes(h.Get(FallbackHeader) != "")
	})
	return got
}

// runMetricsRow: the bulwark.outcome of the call (bulwark.requests) and
// of its attempt (bulwark.attempt.duration), which must be the same.
func runMetricsRow(t *testing.T, cl Classifier, cc classifyCase) (got string) {
	synctest.Test(t, func(t *testing.T) {
		kit := newOtelKit(t)
		cfg := kit.config(caseBase(cc, nil))
		cfg.Default.Classify = cl
		tr := mustNew(t, cfg)
		sendN(t, tr, "http://svc.test/", 1)
		rm := kit.collect(t)
		call := outcomesOf(t, rm, "bulwark.requests")
		attempt := outcomesOf(t, rm, "bulwark.attempt.duration")
		if call != attempt {
			t.Errorf("bulwark.requests outcome %q, bulwark.attempt.duration's %q", call, attempt)
		}
		got = call
	})
	return got
}

// wantLabel is the bulwark.outcome the Verdict makes of cc's answer:
// "success" exactly for a success; a status from 400 up keeps its class,
// one below says what the classifier made of it.
func wantLabel(v Verdict, cc classifyCase) string {
	switch {
	case v.Outcome == OutcomeSuccess:
		return "success"
	case cc.status >= 500:
		return "server_error"
	case cc.status >= 400:
		return "client_error"
	}
	return v.Outcome.String()
}

// outcomesOf is the bulwark.outcome of the one data point of metric name.
func outcomesOf(t *testing.T, rm metricdata.ResourceMetrics, name string) string {
	t.Helper()
	m := findMetric(rm, name)
	if m == nil {
		t.Fatalf("no %s", name)
	}
	var sets []string
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, dp := range d.DataPoints {
			v, _ := dp.Attributes.Value(keyOutcome)
			sets = append(sets, v.AsString())
		}
	case metricdata.Histogram[float64]:
		for _, dp := range d.DataPoints {
			v, _ := dp.Attributes.Value(keyOutcome)
			sets = append(sets, v.AsString())
		}
	}
	if len(sets) != 1 {
		t.Fatalf("%s outcomes %q, want one", name, sets)
	}
	return sets[0]
}

// TestClassifierNotAskedAboutRefusals: bulwark's own refusals and the
// caller's own end keep DefaultClassify's Verdict; the classifier is never
// asked about them, so it cannot count them against the host.
func TestClassifierNotAskedAboutRefusals(t *testing.T) {
	asked := func(resp *http.Response, err error) Verdict {
		t.Errorf("classifier asked about %v", err)
		return Verdict{Outcome: OutcomeFailure, Retryable: true}
	}
	for _, err := range []error{
		&BreakerOpenError{Host: "h:80"}, ErrBulkheadFull, &PushbackError{Host: "h:80"}, ErrThrottled,
		&RetryError{Attempts: 1, Budget: true, Err: ErrRetryBudget}, ErrDeadlineTooShort,
		context.Canceled, context.DeadlineExceeded, &RetryError{Attempts: 2, Err: context.Canceled},
	} {
		if got, want := judge(asked, nil, err).v, DefaultClassify(nil, err); got != want {
			t.Errorf("judge(%v) = %+v, want DefaultClassify's %+v", err, got, want)
		}
	}
	// What the host did is the classifier's to judge, bulwark's own
	// timeout included.
	for _, err := range []error{errStub, ErrAttemptTimeout, &timeoutError{limit: ErrTotalTimeout, cause: errStub}} {
		n := 0
		count := func(*http.Response, error) Verdict { n++; return Verdict{Outcome: OutcomeIgnored} }
		if got := judge(count, nil, err).v; n != 1 || got.Outcome != OutcomeIgnored {
			t.Errorf("judge(%v) = %+v after %d calls, want the classifier's", err, got, n)
		}
	}
}

// TestUpdateMovesClassifier: a new Policy.Classify applies to the new
// stack's calls and keeps the breaker's window.
func TestUpdateMovesClassifier(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		notFound := classifyCase{"404", http.StatusNotFound, nil}
		policy := func(cl Classifier) Config {
			return Config{Base: caseBase(notFound, nil), Default: only(Policy{Breaker: Breaker{MinCalls: 4}, Classify: cl}, "breaker")}
		}
		failures := func(tr *Transport) (int64, CircuitState) {
			for _, h := range tr.Snapshot().Host("svc.test:80") {
				return h.Breaker.Failures, h.Breaker.State
			}
			t.Fatal("no host")
			return 0, 0
		}
		tr := mustNew(t, policy(tableClassify))
		sendN(t, tr, "http://svc.test/", 3)
		if f, s := failures(tr); f != 3 || s != CircuitClosed {
			t.Fatalf("after three 404s: %d failures, %v; want 3, closed", f, s)
		}
		// Another classifier that also fails 404s: the window is kept.
		also := func(resp *http.Response, err error) Verdict { return tableClassify(resp, err) }
		if err := tr.Update(policy(also)); err != nil {
			t.Fatal(err)
		}
		if f, _ := failures(tr); f != 3 {
			t.Fatalf("after Update: %d failures, want the 3 kept", f)
		}
		// The default ignores 404s: the breaker counts nothing more.
		if err := tr.Update(policy(nil)); err != nil {
			t.Fatal(err)
		}
		sendN(t, tr, "http://svc.test/", 5)
		if f, s := failures(tr); f != 3 || s != CircuitClosed {
			t.Fatalf("404s under the default: %d failures, %v; want 3, closed", f, s)
		}
		if err := tr.Update(policy(also)); err != nil {
			t.Fatal(err)
		}
		sendN(t, tr, "http://svc.test/", 1)
		if _, s := failures(tr); s != CircuitOpen {
			t.Fatalf("the fourth failure: %v, want open", s)
		}
	})
}
