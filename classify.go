package bulwark

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
)

// Outcome is what one attempt's result says about its host's health, as a
// Classifier decides it and every layer that judges a host reads it.
type Outcome uint8

const (
	// OutcomeSuccess is an attempt the host served. The breaker counts it
	// toward its window (and toward the slow-call rate when it took
	// SlowCall or longer), the balancer and the throttle as an answer the
	// host gave, and the metrics label it "success".
	OutcomeSuccess Outcome = iota
	// OutcomeFailure is an attempt the host failed: it counts toward the
	// breaker's failure rate, an instance's ejection, the throttle's
	// rejections and the adaptive limit's drops (see Classifier), and a
	// fallback answers for a call that ends with it.
	OutcomeFailure
	// OutcomeIgnored is an attempt that says nothing about the host's
	// health, such as a request the host refused as malformed: the breaker
	// and the balancer do not count it (a half-open probe that ends this
	// way frees its slot without a verdict), and no fallback answers for
	// it. The host did answer, so the throttle counts it as accepted and
	// the adaptive limit takes its latency.
	OutcomeIgnored
)

// String returns "success", "failure" or "ignored".
func (o Outcome) String() string {
	switch o {
	case OutcomeSuccess:
		return "success"
	case OutcomeFailure:
		return "failure"
	case OutcomeIgnored:
		return "ignored"
	}
	return "outcome(" + strconv.Itoa(int(o)) + ")"
}

// Verdict is a Classifier's judgement of one outcome. The zero Verdict is
// a success that another try would not change.
type Verdict struct {
	// Outcome is what the outcome says about the host's health.
	Outcome Outcome
	// Retryable reports whether another try may change the outcome: the
	// retry layer sends the request again only when it is set (and every
	// other rule of Retry allows it), and of a hedged round's attempts the
	// first that returns one not retryable wins. Whether the request may be
	// sent twice at all is the retry layer's own question (see Retry).
	Retryable bool
}

// Classifier decides the Verdict of one attempt's outcome: exactly one of
// resp and err is non-nil. It is Policy.Classify's type.
//
// One classifier serves every layer that judges an outcome, so that they
// agree: the breaker, the retries and hedges, the balancer's outlier
// ejection, the throttle, the adaptive limit, the fallback and the
// bulwark.outcome metric attribute. It runs several times for one attempt,
// on the request path, outside any lock, and concurrently: it must be
// cheap, safe for concurrent use, give the same Verdict for the same
// outcome, and not read or close resp.Body. err may wrap the attempt's
// error (a *RetryError, at the fallback): use errors.Is and errors.As.
//
// It is asked only about what the host did: a response, a transport error,
// or bulwark's own timeout (ErrAttemptTimeout, ErrTotalTimeout). bulwark's
// refusals (ErrBreakerOpen, ErrBulkheadFull, ErrPushback, ErrThrottled,
// ErrRetryBudget, ErrDeadlineTooShort), the caller's own cancellation or
// deadline, and a 429 or 5xx marked NoRetryFromBelow are OutcomeIgnored
// and not retryable whatever the classifier, so that no layer counts its
// own refusals against the host; a fallback still answers for a refusal
// or a pass-up.
//
// The adaptive limit (Bulkhead.Adaptive) counts as a drop an OutcomeFailure
// that is bulwark's own timeout, a 429 or a 503, and any OutcomeFailure
// the classifier declares where DefaultClassify would not; what it does not
// call a failure is never a drop. See docs/design.md, "Classification".
type Classifier func(resp *http.Response, err error) Verdict

// DefaultClassify is the Classifier a nil Policy.Classify means. Its
// Outcome: a failure for a transport error, bulwark's own timeout
// (ErrAttemptTimeout, ErrTotalTimeout), a 429 and a 5xx other than 501;
// ignored for a 501 or a 4xx other than 429, which say the request was
// wrong, not that the host is sick, and for the caller's own cancellation
// or deadline and bulwark's refusals; a success otherwise. Retryable: a
// transport error other than a permanent one (certificate and TLS errors,
// a host that does not exist), bulwark's own timeout, and the statuses
// 408, 429, 500, 502, 503 and 504 (Polly's standard pipeline retries 408,
// 429 and every status ≥ 500; go-retryablehttp 429 and every 5xx but
// 501). Errors are told apart by type, never by their text. A custom
// classifier can wrap it:
func DefaultClassify(resp *http.Response, err error) Verdict {
	return classify(resp, err).verdict(resp)
}

// judged is one outcome as the layers read it: its kind, the finer
// reading bulwark keeps for itself (refusals, the caller's end, labels),
// and the call's classifier's Verdict, which decides health and retries.
type judged struct {
	k kind
	v Verdict
}

// judge is the one place an outcome is judged: every layer that asks
// whether an outcome was a failure, or retryable, asks here, through the
// call's classifier (call.judge); fn nil is DefaultClassify, without the
// indirect call.
func judge(fn Classifier, resp *http.Response, err error) judged {
	return judgeKind(fn, classify(resp, err), resp, err)
}

// judgeKind is judge for an outcome already classified as k.
func judgeKind(fn Classifier, k kind, resp *http.Response, err error) judged {
	// A failure passed up from below is not the classifier's to judge: no
	// classifier can make the breaker or the adaptive limit count it
	// (NoRetryFromBelow).
	if fn == nil || !k.fromHost() || k == kindPassedUp {
		return judged{k: k, v: k.verdict(resp)}
	}
	return judged{k: k, v: fn(resp, err)}
}

// verdict is DefaultClassify's Verdict for an outcome of kind k.
func (k kind) verdict(resp *http.Response) Verdict {
	return Verdict{Outcome: k.health(), Retryable: retryable(k, resp)}
}

// fromHost reports whether an outcome of kind k is the host's doing, what
// a Classifier is asked about: not a refusal of bulwark's (the request was
// never sent), nor the caller giving up (the host did not end it).
func (k kind) fromHost() bool {
	return reached(k) && k != kindCanceled && k != kindDeadline
}

// failed reports whether the call failed in a way a fallback may answer
// for: the classifier called it a failure, or bulwark refused to send. Not
// a success, nor what the classifier ignores (by default a wrong request,
// or the caller giving up, whose answer nobody would read), nor a request
// that could not be written (kindLocal), which is a bug to see, not an
// outage to hide.
func (j judged) failed() bool {
	return j.v.Outcome == OutcomeFailure || (!reached(j.k) && j.k != kindLocal) || j.k == kindPassedUp
}

// failed is judged.failed under DefaultClassify.
func (k kind) failed() bool {
	return judged{k: k, v: Verdict{Outcome: k.health()}}.failed()
}

// dropped reports whether the adaptive limit counts the outcome as a
// drop (see Classifier): with DefaultClassify, exactly bulwark's own
// timeout, a 429 and a 503.
func (j judged) dropped(resp *http.Response) bool {
	if j.v.Outcome != OutcomeFailure {
		return false
	}
	switch j.k {
	case kindTimeout, kindTooMany:
		return true
	case kindServerError:
		if resp.StatusCode == http.StatusServiceUnavailable {
			return true
		}
	}
	return j.k.health() != OutcomeFailure
}

// label is the bulwark.outcome attribute's value: "success" exactly when
// the Verdict is OutcomeSuccess; otherwise the kind's finer label, or, for
// a response below 400 that the classifier did not call a success,
// "failure" or "ignored". With DefaultClassify it is the kind's label.
func (j judged) label() string {
	switch {
	case j.v.Outcome == OutcomeSuccess:
		return outcomeSuccess
	case j.k != kindSuccess:
		return j.k.label()
	case j.v.Outcome == OutcomeFailure:
		return outcomeFailure
	}
	return outcomeIgnored
}

// kind is what one outcome (a response or an error) was, as bulwark reads
// it: DefaultClassify's Verdict is made from it, and the layers read it for
// what no Classifier decides (was the request refused, did the caller give
// up, which label). Errors are told apart by type (errors.Is, errors.As),
// never by their text.
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
	kindLocal                      // the request's own fault (ErrInvalidRequest, ErrRequestBody): says nothing of the host
	kindPassedUp                   // a 429 or 5xx (not 501) marked NoRetryFromBelow: a failure below, passed up
)

// classify is the one classification of an outcome; exactly one of resp
// and err is non-nil.
func classify(resp *http.Response, err error) kind {
	if err == nil {
		switch c := resp.StatusCode; {
		case (c == http.StatusTooManyRequests || c >= 500 && c != http.StatusNotImplemented) && passedUp(resp.Header):
			return kindPassedUp
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
	// A layer's refusal as the layer returns it names its kind: no walk
	// down its chain for the commonest errors of an outage.
	if r, ok := err.(refusal); ok {
		return r.refusalKind()
	}
	// The order matters: bulwark's own errors wrap context.DeadlineExceeded.
	// AsType rather than As: As's target escapes, an allocation on every
	// refusal the router counts (callCounts), which refuses without one.
	_, local := errors.AsType[*localError](err)
	switch {
	case local:
		// First: a body that failed because its context ended is still
		// the request's fault, not the host's.
		return kindLocal
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

// refusal is a layer's own refusal error (an open breaker's, a full
// bulkhead's, a pause's, the throttle's), which knows its kind: the one
// the walk in classify finds for it wrapped (TestRefusalKinds).
type refusal interface {
	error
	refusalKind() kind
}

// connRefused reports a connection the host refused: nothing was sent, so
// the host spent nothing on it but a reset, and a retry soon costs it as
// little (the retry layer waits at most refusedWait before one).
func connRefused(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED)
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

// health is DefaultClassify's Outcome for k: a failure when the host failed or was too slow, ignored when the outcome
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
// transient transport error, bulwark's own timeout, and the statuses 408,
// 429, 500, 502, 503 and 504 (where this differs from Polly and
// go-retryablehttp, and why: DefaultClassify). Other 5xx answers (505,
// 507, 511, …) and 4xx ones will not change. Whether the request may be sent again at all is the retry
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

// reached reports whether an outcome with kind k came from the host, rather
// than from bulwark refusing to send or the request's own fault.
func reached(k kind) bool {
	switch k {
	case kindTooShort, kindBreakerOpen, kindBulkheadFull, kindPushback, kindBudget, kindThrottled, kindLocal:
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
	case kindPassedUp:
		return outcomePassedUp
	}
	return outcomeError
}

// Request and attempt outcomes, the bulwark.outcome attribute: "success"
// exactly when Policy.Classify's Verdict is OutcomeSuccess, otherwise what
// the outcome was (judged.label). With DefaultClassify, a success is a
// response with status < 400.
const (
	outcomeSuccess     = "success"      // OutcomeSuccess
	outcomeClientError = "client_error" // 4xx
	outcomeServerError = "server_error" // 5xx
	outcomeFailure     = "failure"      // a status < 400 that Classify calls a failure
	outcomeIgnored     = "ignored"      // a status < 400 that Classify ignores
	outcomeTimeout     = "timeout"      // bulwark's own Timeout.Attempt or Total
	outcomeDeadline    = "deadline"     // the caller's deadline
	outcomeCanceled    = "canceled"
	outcomeBreaker     = "breaker_open"
	outcomeBulkhead    = "bulkhead_full"
	outcomePushback    = "pushback"
	outcomeThrottled   = "throttled"
	outcomeBudget      = "retry_budget"
	outcomeTooShort    = "deadline_too_short"
	outcomePassedUp    = "passed_up" // a failure passed up from below (NoRetryFromBelow)
	outcomeError       = "error"     // any other transport error
)

// invalidRequest is the local fault of req that net/http's Transport would
// refuse it for, checked before any layer sees req, or nil. net/http
// returns these faults as errors of no type of their own (errors.New,
// fmt.Errorf), so they cannot be told from a host's transport error after
// the fact except by their text, which bulwark never matches: the checks
// are made here instead, as net/http makes them (transport.go roundTrip,
// validateHeaders), in the same order. ownBase is whether the base is
// bulwark's own clone of http.DefaultTransport (Config.Base nil), on which
// no protocol is registered: only then is a scheme other than http and
// https known to fail, since a Base of the caller's may serve one
// (Transport.RegisterProtocol).
func invalidRequest(req *http.Request, ownBase bool) error {
	switch {
	case req.URL == nil:
		return &localError{ErrInvalidRequest, errNilURL}
	case req.Header == nil:
		return &localError{ErrInvalidRequest, errNilHeader}
	}
	isHTTP := req.URL.Scheme == "http" || req.URL.Scheme == "https"
	if isHTTP {
		if err := badHeader(req.Header, "header"); err != nil {
			return err
		}
		if err := badHeader(req.Trailer, "trailer"); err != nil {
			return err
		}
	}
	switch {
	case !isHTTP && ownBase:
		return &localError{ErrInvalidRequest, fmt.Errorf("bulwark: unsupported protocol scheme %q", req.URL.Scheme)}
	case !isHTTP:
		return nil // the caller's Base decides
	case req.Method != "" && !validToken(req.Method):
		return &localError{ErrInvalidRequest, fmt.Errorf("bulwark: invalid method %q", req.Method)}
	case req.URL.Host == "":
		return &localError{ErrInvalidRequest, errors.New("bulwark: no Host in request URL")}
	}
	return nil
}

// badHeader is the first field of h that net/http would refuse to write,
// as an error, or nil: a name that is not an RFC 9110 token, or a value
// with a control byte other than horizontal tab (httpguts's
// ValidHeaderFieldName and ValidHeaderFieldValue). Written here rather than
// imported from golang.org/x/net/http/httpguts: that package imports
// x/net/idna and with it x/text, two modules every user's build would
// gain for these twenty lines; TestInvalidRequestAgreesWithNetHTTP holds
// them to net/http's own checks.
func badHeader(h http.Header, what string) error {
	for k, vv := range h {
		if !validToken(k) {
			return &localError{ErrInvalidRequest, fmt.Errorf("bulwark: invalid %s field name %q", what, k)}
		}
		for _, v := range vv {
			for i := 0; i < len(v); i++ {
				if b := v[i]; (b < ' ' && b != '\t') || b == 0x7f {
					return &localError{ErrInvalidRequest, fmt.Errorf("bulwark: invalid %s field value for %q", what, k)}
				}
			}
		}
	}
	return nil
}

// validToken reports whether s is an RFC 9110 token: what a header name
// and a method must be.
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// sendBody is the request body as the base reads it: a read error other
// than io.EOF is the body's, and says so by type (ErrRequestBody), so
// that classify knows it for the request's fault, not the host's.
// net/http hands such an error back unchanged, as the attempt's error
// (persistConn.writeLoop, "Errors reading from the user's Request.Body
// are high priority").
type sendBody struct{ rc io.ReadCloser }

func (b sendBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err != nil && err != io.EOF {
		err = &localError{ErrRequestBody, err}
	}
	return n, err
}

func (b sendBody) Close() error { return b.rc.Close() }
