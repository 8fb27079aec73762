package bulwark

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http"
)

// kind is what one outcome (a response or an error) was: the one
// classification every layer reads, so that the breaker, the retry layer,
// the balancer, the fallback and the metrics never disagree about what
// happened. Errors are told apart by type (errors.Is, errors.As), never by
// their text.
type kind uint8

const (
	kindSuccess        kind = iota // a status below 400
	kindClientError                // 4xx other than 408 and 429: the request was wrong
	kindNotImplemented             // 501: the server does not do what was asked, a wrong request too
	kindRequestTime                // 408: the server gave up waiting for the request
	kindTooMany                    // 429
	kindServerError                // 5xx other than 501
	kindTimeout                    // bulwark's own bound: ErrAttemptTimeout or ErrTotalTimeout
	kindDeadline                   // the caller's own deadline
	kindCanceled                   // the caller's own cancellation
	kindTooShort                   // ErrDeadlineTooShort: not sent, too little time left
	kindBreakerOpen                // not sent: ErrBreakerOpen
	kindBulkheadFull               // not sent: ErrBulkheadFull (rate limit included)
	kindPushback                   // not sent: ErrPushback
	kindThrottled                  // not sent: ErrThrottled
	kindBudget                     // ErrRetryBudget
	kindTransient                  // a transport error another try may cure
	kindPermanent                  // a transport error another try will not cure
)

// classify is the one classification of an outcome; exactly one of resp
// and err is non-nil.
func classify(resp *http.Response, err error) kind {
	if err == nil {
		switch c := resp.StatusCode; {
		case c == http.StatusTooManyRequests:
			return kindTooMany
		case c == http.StatusRequestTimeout:
			return kindRequestTime
		case c == http.StatusNotImplemented:
			return kindNotImplemented
		case c >= 500:
			return kindServerError
		case c >= 400:
			return kindClientError
		}
		return kindSuccess
	}
	// The order matters: bulwark's own errors wrap context.DeadlineExceeded.
	switch {
	case errors.Is(err, ErrBreakerOpen):
		return kindBreakerOpen
	case errors.Is(err, ErrBulkheadFull):
		return kindBulkheadFull
	case errors.Is(err, ErrPushback):
		return kindPushback
	case errors.Is(err, ErrThrottled):
		return kindThrottled
	case errors.Is(err, ErrRetryBudget):
		return kindBudget
	case errors.Is(err, ErrDeadlineTooShort):
		return kindTooShort
	case errors.Is(err, ErrAttemptTimeout), errors.Is(err, ErrTotalTimeout):
		return kindTimeout
	case errors.Is(err, context.DeadlineExceeded):
		return kindDeadline
	case errors.Is(err, context.Canceled):
		return kindCanceled
	case permanentError(err):
		return kindPermanent
	}
	return kindTransient
}

// permanentError reports a transport error that another try will not
// cure: certificate and TLS protocol errors, a host that does not exist,
// and a base that broke the RoundTripper contract. Anything else (a refused
// or reset connection, an EOF on a reused connection, a DNS timeout) is
// transient.
func permanentError(err error) bool {
	var (
		cve *tls.CertificateVerificationError
		rhe tls.RecordHeaderError
		ale tls.AlertError
		uae x509.UnknownAuthorityError
		hne x509.HostnameError
		cie x509.CertificateInvalidError
		sre x509.SystemRootsError
		cvr x509.ConstraintViolationError
		dns *net.DNSError
	)
	switch {
	case errors.Is(err, errNilResponse):
		return true
	case errors.As(err, &cve), errors.As(err, &rhe), errors.As(err, &ale),
		errors.As(err, &uae), errors.As(err, &hne), errors.As(err, &cie),
		errors.As(err, &sre), errors.As(err, &cvr):
		return true
	case errors.As(err, &dns) && dns.IsNotFound:
		return true
	}
	return false
}

// health is what k says about the host, for the breaker and the balancer:
// a failure when the host failed or was too slow, ignored when the outcome
// says nothing about the host (the request was wrong, the caller gave up,
// or bulwark refused before the host was reached).
func (k kind) health() Outcome {
	switch k {
	case kindSuccess:
		return OutcomeSuccess
	case kindTooMany, kindServerError, kindTimeout, kindTransient, kindPermanent:
		return OutcomeFailure
	}
	return OutcomeIgnored
}

// retryable reports whether another try may change the outcome: a
// transient transport error, bulwark's own timeout, and the statuses
// Polly's standard pipeline and go-retryablehttp retry (408, 429, 500, 502,
// 503, 504). Other 5xx answers (505, 507, 511, …) and 4xx ones will not
// change. Whether the request may be sent again at all is the retry
// layer's separate question.
func retryable(k kind, resp *http.Response) bool {
	switch k {
	case kindTransient, kindTimeout, kindTooMany, kindRequestTime:
		return true
	case kindServerError:
		switch resp.StatusCode {
		case http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
			return true
		}
	}
	return false
}

// failed reports whether the call failed in a way a fallback may answer
// for: the host failed, or bulwark refused to send. Not a wrong request,
// and not the caller giving up, whose answer nobody would read.
func (k kind) failed() bool {
	switch k {
	case kindSuccess, kindClientError, kindNotImplemented, kindRequestTime, kindDeadline, kindCanceled:
		return false
	}
	return true
}

// reached reports whether an outcome with kind k came from the host, rather
// than from bulwark refusing to send.
func reached(k kind) bool {
	switch k {
	case kindTooShort, kindBreakerOpen, kindBulkheadFull, kindPushback, kindBudget, kindThrottled:
		return false
	}
	return true
}

// label is the bulwark.outcome attribute's value for k.
func (k kind) label() string {
	switch k {
	case kindSuccess:
		return outcomeSuccess
	case kindClientError, kindRequestTime, kindTooMany:
		return outcomeClientError
	case kindServerError, kindNotImplemented:
		return outcomeServerError
	case kindTimeout:
		return outcomeTimeout
	case kindDeadline:
		return outcomeDeadline
	case kindCanceled:
		return outcomeCanceled
	case kindTooShort:
		return outcomeTooShort
	case kindBreakerOpen:
		return outcomeBreaker
	case kindBulkheadFull:
		return outcomeBulkhead
	case kindPushback:
		return outcomePushback
	case kindThrottled:
		return outcomeThrottled
	case kindBudget:
		return outcomeBudget
	}
	return outcomeError
}
