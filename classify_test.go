package bulwark

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
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
