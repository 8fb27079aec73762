package bulwark

// The fields a response uses to ask its callers to wait: Retry-After and the
// rate-limit fields. Reading them is shared by the layers that obey them
// (the retry layer's wait, the pushback layer's pause, the bulkhead's
// advertised rate), so it lives here, apart from any one of them.

import (
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/bulwark-http/bulwark/internal/wire"
)

// Rate-limit fields a response may carry, canonical as net/http keys them:
// the IETF RateLimit field (draft-ietf-httpapi-ratelimit-headers: a list of
// policies, each with r, the quota remaining, and t, the seconds until it
// resets), the earlier drafts' RateLimit-Remaining / RateLimit-Reset, and
// the common X-RateLimit-Remaining / X-RateLimit-Reset; and the policies,
// which say the quota itself: RateLimit-Policy (q requests per w seconds),
// and the earlier drafts' RateLimit-Limit, which X-RateLimit-Limit copies.
const (
	hdrRateLimit      = "Ratelimit"
	hdrRLRemaining    = "Ratelimit-Remaining"
	hdrRLReset        = "Ratelimit-Reset"
	hdrXRLRemaining   = "X-Ratelimit-Remaining"
	hdrXRLReset       = "X-Ratelimit-Reset"
	hdrRLPolicy       = "Ratelimit-Policy"
	hdrRLLimit        = "Ratelimit-Limit"
	hdrXRLLimit       = "X-Ratelimit-Limit"
	unixResetFloorSec = 1_000_000_000 // a reset this large is a unix time (2001 on), not a delta
)

// rateLimitPause reads the rate-limit fields of a response, of any status:
// when a quota has nothing remaining and says when it resets, the wait
// until then (the longest, when several quotas are spent). A field that
// says nothing is spent gives retryAfterAbsent; a malformed one (a sign, a
// fraction, several values of a single-valued field, a reset past a day)
// gives retryAfterIgnored, to be counted and not obeyed, as with
// Retry-After.
func rateLimitPause(h http.Header, now time.Time) (time.Duration, retryAfterResult) {
	var best time.Duration
	res := retryAfterAbsent
	merge := func(d time.Duration, r retryAfterResult) {
		switch {
		case r == retryAfterIgnored:
			res = retryAfterIgnored
		case r == retryAfterValid && res != retryAfterIgnored:
			res, best = retryAfterValid, max(best, d)
		}
	}
	if v, ok := h[hdrRateLimit]; ok {
		merge(parseRateLimitField(v))
	}
	if v, ok := h[hdrRLRemaining]; ok {
		merge(remainingReset(v, h[hdrRLReset], now))
	}
	if v, ok := h[hdrXRLRemaining]; ok {
		merge(remainingReset(v, h[hdrXRLReset], now))
	}
	if res != retryAfterValid {
		return 0, res
	}
	return best, res
}

// remainingReset reads a Remaining / Reset pair: a pause only when nothing
// remains. Reset is delta-seconds, or a unix time in seconds as Envoy's
// reset_headers and several APIs send it.
func remainingReset(rem, reset []string, now time.Time) (time.Duration, retryAfterResult) {
	n, ok := oneCount(rem)
	if !ok {
		return 0, retryAfterIgnored
	}
	if n > 0 {
		return 0, retryAfterAbsent
	}
	if len(reset) == 0 {
		return 0, retryAfterAbsent // spent, but no word on when: nothing to obey
	}
	secs, ok := oneCount(reset)
	if !ok {
		return 0, retryAfterIgnored
	}
	var d time.Duration
	if secs >= unixResetFloorSec {
		d = time.Unix(secs, 0).Sub(now)
		if d < 0 {
			d = 0
		}
	} else {
		d = time.Duration(secs) * time.Second
	}
	if d > maxRetryAfterHeader {
		return 0, retryAfterIgnored
	}
	return d, retryAfterValid
}

// oneCount reads a field that must hold one non-negative integer (at most
// 18 digits, so no overflow).
func oneCount(v []string) (int64, bool) {
	if len(v) != 1 {
		return 0, false
	}
	s := trimOWS(v[0])
	if s == "" || len(s) > 18 || !allDigits(s) {
		return 0, false
	}
	n, _ := strconv.ParseInt(s, 10, 64)
	return n, true
}

// parseRateLimitField reads the IETF RateLimit field: a list of policies,
// `"name";r=0;t=30`, each r its remaining quota and t the seconds to its
// reset. It also reads the earlier drafts' single policy
// `limit=100, remaining=0, reset=30`. The field may come in several lines,
// which a list joins with commas.
func parseRateLimitField(v []string) (time.Duration, retryAfterResult) {
	joined := strings.Join(v, ",")
	if strings.Contains(joined, "remaining=") && !strings.Contains(joined, ";") {
		return parseRateLimitDict(joined)
	}
	var best time.Duration
	res := retryAfterAbsent
	for item := range strings.SplitSeq(joined, ",") {
		params := strings.Split(item, ";")
		r, t, ok := itemParams(params[1:], "r", "t")
		if !ok {
			return 0, retryAfterIgnored // a bad number, or r or t twice
		}
		if r != 0 || t < 0 {
			continue // quota left, or no reset given
		}
		d := time.Duration(t) * time.Second
		if t > int64(maxRetryAfterHeader/time.Second) {
			return 0, retryAfterIgnored
		}
		res, best = retryAfterValid, max(best, d)
	}
	return best, res
}

// parseRateLimitDict reads `limit=100, remaining=0, reset=30`.
func parseRateLimitDict(s string) (time.Duration, retryAfterResult) {
	var rem, reset []string
	for kv := range strings.SplitSeq(s, ",") {
		k, val, _ := strings.Cut(trimOWS(kv), "=")
		switch k {
		case "remaining":
			rem = append(rem, val)
		case "reset":
			reset = append(reset, val)
		}
	}
	rr, ok := oneCount(rem)
	if !ok {
		return 0, retryAfterIgnored
	}
	if rr > 0 {
		return 0, retryAfterAbsent
	}
	t, ok := oneCount(reset)
	switch {
	case len(reset) == 0:
		return 0, retryAfterAbsent
	case !ok || t > int64(maxRetryAfterHeader/time.Second):
		return 0, retryAfterIgnored
	}
	return time.Duration(t) * time.Second, retryAfterValid
}

// advertisedRate reads the rate-limit policies of a response (see
// Bulkhead.Rate): RateLimit-Policy, RateLimit-Limit and X-RateLimit-Limit,
// each a list of items, either `"name";q=100;w=60` (the current draft) or
// `100;w=60` (the earlier drafts, which may lead with a bare `100`, the
// quota of the policy in force). It returns the tightest quota a second,
// q ÷ w, over every item that names a window. An item without a window
// says no rate and is skipped; a bad number, q or w twice, a zero quota
// (which only a pause can obey, and the pushback layer reads a spent quota
// as one) or a window of zero or past a day gives retryAfterIgnored.
func advertisedRate(h http.Header) (float64, retryAfterResult) {
	best, res := 0.0, retryAfterAbsent
	for _, k := range [...]string{hdrRLPolicy, hdrRLLimit, hdrXRLLimit} {
		v, ok := h[k]
		if !ok {
			continue
		}
		r, kres := parsePolicies(strings.Join(v, ","))
		switch kres {
		case retryAfterIgnored:
			return 0, retryAfterIgnored
		case retryAfterValid:
			if res != retryAfterValid || r < best {
				best = r
			}
			res = retryAfterValid
		}
	}
	return best, res
}

// parsePolicies reads one field's list of policies; see advertisedRate.
func parsePolicies(list string) (float64, retryAfterResult) {
	best, res := 0.0, retryAfterAbsent
	for item := range strings.SplitSeq(list, ",") {
		params := strings.Split(item, ";")
		q, w, ok := itemParams(params[1:], "q", "w")
		if !ok {
			return 0, retryAfterIgnored // a bad number, or q or w twice
		}
		if w < 0 {
			continue // no window: no rate
		}
		if bare := trimOWS(params[0]); q < 0 && allDigits(bare) && bare != "" {
			n, ok := oneCount([]string{bare})
			if !ok {
				return 0, retryAfterIgnored
			}
			q = n
		}
		if q <= 0 || w == 0 || w > int64(maxRetryAfterHeader/time.Second) {
			return 0, retryAfterIgnored // no quota, a zero quota, or a window out of bounds
		}
		if r := float64(q) / float64(w); res != retryAfterValid || r < best {
			best, res = r, retryAfterValid
		}
	}
	return best, res
}

// itemParams reads the integer parameters named a and b of one list item's
// parameters (`a=1`, `b=2`), -1 for one not given; !ok for a bad number or
// one given twice. Other parameters are skipped.
func itemParams(params []string, a, b string) (x, y int64, ok bool) {
	x, y = -1, -1
	for _, p := range params {
		k, val, found := strings.Cut(trimOWS(p), "=")
		if !found {
			continue // a bare parameter is true; none we read is boolean
		}
		var dst *int64
		switch k {
		case a:
			dst = &x
		case b:
			dst = &y
		default:
			continue
		}
		n, ok := oneCount([]string{val})
		if !ok || *dst != -1 {
			return 0, 0, false
		}
		*dst = n
	}
	return x, y, true
}

// maxRetryAfterHeader is the longest Retry-After bulwark believes. A server
// asking callers to stay away for more than a day is broken or hostile; such
// a value is ignored (and counted), not obeyed nor capped, since it tells us
// nothing about when the server will have room.
const maxRetryAfterHeader = wire.MaxRetryAfter

// retryAfterResult is what parseRetryAfter made of a header.
type retryAfterResult uint8

const (
	retryAfterAbsent retryAfterResult = iota
	retryAfterValid
	retryAfterIgnored // malformed, negative or absurd
)

// parseRetryAfter reads a Retry-After header (RFC 9110 §10.2.3): either
// delta-seconds or an HTTP-date in any of the three formats http.ParseTime
// knows, the date read against now. A date in the past means "now" (zero).
// Several values, a sign, a fraction, a value past maxRetryAfterHeader or
// anything else that does not parse is ignored.
func parseRetryAfter(v []string, now time.Time) (time.Duration, retryAfterResult) {
	if len(v) == 0 {
		return 0, retryAfterAbsent
	}
	if len(v) > 1 {
		return 0, retryAfterIgnored
	}
	s := trimOWS(v[0])
	if s == "" {
		return 0, retryAfterIgnored
	}
	if allDigits(s) {
		// Ten digits are already past a day: refusing them before
		// converting means no overflow to think about.
		if len(s) > 9 {
			return 0, retryAfterIgnored
		}
		n, _ := strconv.Atoi(s)
		d := time.Duration(n) * time.Second
		if d > maxRetryAfterHeader {
			return 0, retryAfterIgnored
		}
		return d, retryAfterValid
	}
	t, err := http.ParseTime(s)
	if err != nil {
		return 0, retryAfterIgnored
	}
	d := t.Sub(now)
	switch {
	case d <= 0:
		return 0, retryAfterValid
	case d > maxRetryAfterHeader:
		return 0, retryAfterIgnored
	}
	return d, retryAfterValid
}

// pushbackStatus reports whether a response with this status may carry a
// Retry-After that bulwark obeys: 429 (rate limited) and 503 (overloaded).
func pushbackStatus(code int) bool {
	return code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable
}

// retryAfter returns the wait a 429 or 503 response asks for, counting a
// header that had to be ignored in ignored when it is not nil: its
// Retry-After, or the milliseconds some servers give beside it
// (retry-after-ms and the others retryAfterMs reads), the longest, so that
// no attempt goes sooner than any of them asked.
func retryAfter(resp *http.Response, now time.Time, ignored *atomic.Uint64) (time.Duration, bool) {
	if !pushbackStatus(resp.StatusCode) {
		return 0, false
	}
	d, res := parseRetryAfter(resp.Header["Retry-After"], now)
	ms, msOK, msBad := retryAfterMs(resp.Header)
	if (res == retryAfterIgnored || msBad) && ignored != nil {
		ignored.Add(1)
	}
	if msOK {
		return max(d, ms), true
	}
	return d, res == retryAfterValid
}
