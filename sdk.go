package bulwark

// The signals of the clients that retry on their own, above bulwark (the
// SDKs people call, or another bulwark Transport), and of the servers that
// speak to them; the headers and what bulwark does with each are listed in
// AttemptHeader's doc. Retries happen at one layer: a request that a client
// above will send again is sent once, with neither retries nor hedges of
// its own and without the learned attempt timeout; the default Total still
// bounds it unless its context carries a deadline, so a header anyone can
// send never leaves a hung host unbounded. A header can stop a retry or
// lengthen a wait, never cause either. See docs/design.md, "The SDK rules".

import (
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/bulwark-http/bulwark/internal/wire"
)

// The request headers by which a retrying client above says so, canonical
// as net/http keys them.
const (
	hdrBulwarkAttempt   = "Bulwark-Attempt" // AttemptHeader
	hdrAmzSDKRequest    = "Amz-Sdk-Request"
	hdrStainlessRetries = "X-Stainless-Retry-Count"
	hdrGoogAPIClient    = "X-Goog-Api-Client"
	hdrMSClientReqID    = "X-Ms-Client-Request-Id"
	hdrStripeClientUA   = "X-Stripe-Client-User-Agent"
)

// The response headers of the servers that speak to those clients.
const (
	hdrShouldRetry       = "X-Should-Retry"
	hdrStripeShouldRetry = "Stripe-Should-Retry"
	hdrRetryAfterMs      = "Retry-After-Ms"
	hdrMSRetryAfterMs    = "X-Ms-Retry-After-Ms"
	hdrAmzRetryAfter     = "X-Amz-Retry-After"
)

// maxAttemptNumber bounds the attempt numbers read from a client above: a
// larger one is no SDK's, and is ignored as malformed.
const maxAttemptNumber = 1000

// above is what a request's headers say of a retrying client above
// bulwark.
type above uint8

const (
	aboveNone  above = iota // no client above retries it, as far as bulwark can tell
	aboveFirst              // a client above will retry it: its first try, a resend it says is not its last, or it does not say which
	// aboveResend: a client above sends it again if it fails, and it is
	// itself that client's resend, maybe its last (the AWS SDKs say which;
	// the others do not): its failure means that client retried below and
	// failed, which the call record notes.
	aboveResend
)

// retriedAbove reads a request's signals of a retrying client above,
// counting each value it had to ignore in ignored (nil: not counted). The
// first signal found that parses decides.
func retriedAbove(h http.Header, ignored *atomic.Uint64) above {
	if len(h) == 0 {
		return aboveNone
	}
	bad := false
	count := func(a above, ok bool) (above, bool) {
		if !ok {
			bad = true
			return aboveNone, false
		}
		return a, true
	}
	a, found := aboveNone, false
	if v, ok := h[hdrBulwarkAttempt]; ok {
		a, found = count(attemptNumber(v, 1))
	}
	if v, ok := h[hdrAmzSDKRequest]; ok && !found {
		a, found = count(amzSDKRequest(v))
	}
	if v, ok := h[hdrStainlessRetries]; ok && !found {
		a, found = count(attemptNumber(v, 0))
	}
	if v, ok := h[hdrGoogAPIClient]; ok && !found {
		if n, has := googAttempt(v); has {
			a, found = count(n, n != aboveNone)
		}
	}
	if v, ok := h[hdrMSClientReqID]; ok && !found {
		a, found = count(aboveFirst, len(v) == 1 && wire.TrimOWS(v[0]) != "")
	}
	if v, ok := h[hdrStripeClientUA]; ok && !found {
		a, _ = count(aboveFirst, len(v) == 1 && wire.TrimOWS(v[0]) != "")
	}
	if bad && ignored != nil {
		ignored.Add(1)
	}
	return a
}

// attemptNumber reads a single attempt number counted from first (1 for
// Bulwark-Attempt, 0 for X-Stainless-Retry-Count): the request is a resend
// when it is past first.
func attemptNumber(v []string, first int) (above, bool) {
	if len(v) != 1 {
		return aboveNone, false
	}
	n, ok := smallNumber(wire.TrimOWS(v[0]))
	if !ok || n < first {
		return aboveNone, false
	}
	if n > first {
		return aboveResend, true
	}
	return aboveFirst, true
}

// smallNumber parses s, all digits, at most maxAttemptNumber.
func smallNumber(s string) (int, bool) {
	if s == "" || len(s) > 4 || !wire.AllDigits(s) {
		return 0, false
	}
	n, _ := strconv.Atoi(s) // at most 4 digits: cannot fail
	return n, n <= maxAttemptNumber
}

// amzSDKRequest reads the AWS SDKs' "attempt=N; max=M" (and "ttl=…", not
// read). max=1 says the SDK will not retry: bulwark is then the layer
// that may.
func amzSDKRequest(v []string) (above, bool) {
	if len(v) != 1 {
		return aboveNone, false
	}
	attempt, most := -1, -1
	for part := range strings.SplitSeq(v[0], ";") {
		k, val, ok := strings.Cut(wire.TrimOWS(part), "=")
		if !ok {
			return aboveNone, false
		}
		var dst *int
		switch k {
		case "attempt":
			dst = &attempt
		case "max":
			dst = &most
		default:
			continue
		}
		n, ok := smallNumber(val)
		if !ok || n < 1 || *dst != -1 {
			return aboveNone, false
		}
		*dst = n
	}
	switch {
	case attempt < 1, most != -1 && attempt > most:
		return aboveNone, false
	case most == 1:
		return aboveNone, true
	case attempt > 1 && (most == -1 || attempt == most):
		return aboveResend, true
	}
	return aboveFirst, true
}

// googAttempt finds "gccl-attempt-count/N" among the tokens of
// X-Goog-Api-Client, the last one counting when several values carry one
// (Google's clients append it); has is false when none does, since the
// header without it is sent by calls that do not retry. A malformed
// count gives aboveNone with has set.
func googAttempt(v []string) (a above, has bool) {
	const key = "gccl-attempt-count/"
	for _, s := range v {
		for tok := range strings.FieldsSeq(s) {
			n, ok := strings.CutPrefix(tok, key)
			if !ok {
				continue
			}
			has = true
			a, _ = attemptNumber([]string{n}, 1)
		}
	}
	return a, has
}

// shouldNotRetry reads the servers' own don't-retry answers, x-should-retry
// and Stripe-Should-Retry: stop on "false" (any case), nothing on "true",
// and bad on anything else, which is counted and ignored.
func shouldNotRetry(h http.Header) (stop, bad bool) {
	for _, k := range [...]string{hdrShouldRetry, hdrStripeShouldRetry} {
		v, ok := h[k]
		if !ok {
			continue
		}
		switch {
		case len(v) != 1:
			bad = true
		case strings.EqualFold(wire.TrimOWS(v[0]), "false"):
			return true, bad
		case !strings.EqualFold(wire.TrimOWS(v[0]), "true"):
			bad = true
		}
	}
	return false, bad
}

// retryAfterMs reads the waits in milliseconds that servers give beside
// Retry-After (retry-after-ms, x-ms-retry-after-ms, X-Amz-Retry-After):
// the longest valid one. A value that is not a non-negative decimal
// number of milliseconds (a fraction allowed, as the Stainless SDKs read
// it), is given twice, or asks for more than a day, is ignored: ok
// reports that a valid one was given, and bad that some value was
// ignored, to be counted.
func retryAfterMs(h http.Header) (d time.Duration, ok, bad bool) {
	for _, k := range [...]string{hdrRetryAfterMs, hdrMSRetryAfterMs, hdrAmzRetryAfter} {
		v, has := h[k]
		if !has {
			continue
		}
		ms, valid := parseMillis(v)
		if !valid {
			bad = true
			continue
		}
		d, ok = max(d, ms), true
	}
	return d, ok, bad
}

// parseMillis reads one value of a milliseconds header: digits, and at
// most one '.' followed by digits; the fraction is rounded up, so that the
// wait is never shorter than asked.
func parseMillis(v []string) (time.Duration, bool) {
	if len(v) != 1 {
		return 0, false
	}
	whole, frac, hasFrac := strings.Cut(wire.TrimOWS(v[0]), ".")
	// 9 digits of milliseconds (11.6 days) are past the day allowed, so
	// checking the length first means no overflow to think about.
	if whole == "" || len(whole) > 9 || !wire.AllDigits(whole) || hasFrac && (frac == "" || !wire.AllDigits(frac)) {
		return 0, false
	}
	n, _ := strconv.ParseInt(whole, 10, 64)
	d := time.Duration(n) * time.Millisecond
	if hasFrac && strings.Trim(frac, "0") != "" {
		d += time.Millisecond
	}
	if d > wire.MaxRetryAfter {
		return 0, false
	}
	return d, true
}
