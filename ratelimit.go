package bulwark

import (
	"net/http"
	"strconv"
	"strings"
	"time"
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

// obeyRateLimit pauses the host, as a Retry-After does and capped the same
// way, when resp says its quota is spent until a reset; a malformed field
// is counted in the Transport's ignored count.
func (p *pushbackStage) obeyRateLimit(resp *http.Response) {
	h := resp.Header
	if h == nil {
		return
	}
	_, a := h[hdrRateLimit]
	_, b := h[hdrRLRemaining]
	_, c := h[hdrXRLRemaining]
	if !a && !b && !c {
		return
	}
	now := time.Now()
	d, res := rateLimitPause(h, now)
	switch {
	case res == retryAfterIgnored:
		if p.ignored != nil {
			p.ignored.Add(1)
		}
	case res == retryAfterValid && d > 0:
		p.pauseIn(&p.paused, now.Add(min(d, p.max)))
	}
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
