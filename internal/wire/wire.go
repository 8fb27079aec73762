// Package wire reads the header values that bulwark's client and its server
// half both depend on: priority names, small integers, deadlines. It is pure
// parsing, with no state and no policy, so that the two halves read the
// same bytes the same way without one importing the other.
package wire

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// MaxRetryAfter is the longest Retry-After bulwark's client believes. A
// server asking callers to stay away for more than a day is broken or
// hostile; the client ignores such a value, so a bulwark server never sends
// one.
const MaxRetryAfter = 24 * time.Hour

// PriorityNames are the names of bulwark's priorities as its priority
// headers spell them, most important first: index i names
// bulwark.Priority(i).
var PriorityNames = [...]string{"critical", "high", "normal", "low", "test"}

// ParsePriority reads a priority's name, in any case, and returns its index
// in PriorityNames.
func ParsePriority(v string) (int, bool) {
	for i, name := range PriorityNames {
		if strings.EqualFold(v, name) {
			return i, true
		}
	}
	return 0, false
}

// AllDigits reports whether s is a non-empty run of ASCII digits: no sign,
// no space, no other script's digits.
func AllDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// TrimOWS trims the optional whitespace HTTP allows around a field value.
func TrimOWS(s string) string {
	for s != "" && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for s != "" && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

// HeaderAbove reports whether h's key holds one integer above n. A value
// that does not parse, or several values, say nothing: false.
func HeaderAbove(h http.Header, key string, n int64) bool {
	v, ok := h[key]
	if !ok || len(v) != 1 {
		return false
	}
	s := TrimOWS(v[0])
	// 18 digits always fit an int64: no overflow to think about.
	if s == "" || len(s) > 18 || !AllDigits(s) {
		return false
	}
	x, _ := strconv.ParseInt(s, 10, 64)
	return x > n
}

// maxHeaderMillis bounds a millisecond header before conversion, so that a
// value like 10^18 cannot overflow time.Duration; anything past it is capped
// by the reader's own maximum anyway.
const maxHeaderMillis = int64(1<<63-1) / int64(time.Millisecond)

// ParseMillis parses a positive whole number of milliseconds, as bulwark's
// deadline header and Envoy's x-envoy-expected-rq-timeout-ms carry it. A
// number too large for time.Duration is capped rather than refused: it is
// valid, only absurd, and the reader caps it anyway.
func ParseMillis(s string) (time.Duration, bool) {
	s = strings.TrimSpace(s)
	if !AllDigits(s) {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n > maxHeaderMillis {
		// After AllDigits only overflow is left to fail.
		n = maxHeaderMillis
	}
	if n == 0 {
		return 0, false
	}
	return time.Duration(n) * time.Millisecond, true
}

// ParseGRPCTimeout parses a grpc-timeout header value: 1 to 8 ASCII digits
// followed by a unit, H, M, S, m, u or n (hours to nanoseconds), as the gRPC
// over HTTP/2 specification defines it. It reports false for anything else
// and for a zero timeout.
func ParseGRPCTimeout(s string) (time.Duration, bool) {
	if len(s) < 2 || len(s) > 9 {
		return 0, false
	}
	digits, unit := s[:len(s)-1], s[len(s)-1]
	if !AllDigits(digits) {
		return 0, false
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil || n == 0 {
		return 0, false
	}
	var u time.Duration
	switch unit {
	case 'H':
		u = time.Hour
	case 'M':
		u = time.Minute
	case 'S':
		u = time.Second
	case 'm':
		u = time.Millisecond
	case 'u':
		u = time.Microsecond
	case 'n':
		u = time.Nanosecond
	default:
		return 0, false
	}
	// 8 digits of hours (about 11,400 years) would overflow: cap instead.
	if n > int64(1<<63-1)/int64(u) {
		return time.Duration(1<<63 - 1), true
	}
	return time.Duration(n) * u, true
}
