package bulwark

import (
	"math"
	"net/http"
	"strconv"
	"testing"
	"testing/synctest"
	"time"
)

func TestRateLimitPause(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	const (
		absent  = retryAfterAbsent
		valid   = retryAfterValid
		ignored = retryAfterIgnored
	)
	for _, tc := range []struct {
		name string
		h    http.Header
		d    time.Duration
		res  retryAfterResult
	}{
		{"none", http.Header{}, 0, absent},
		{"ietf spent", http.Header{hdrRateLimit: {`"default";r=0;t=30`}}, 30 * time.Second, valid},
		{"ietf left", http.Header{hdrRateLimit: {`"default";r=5;t=30`}}, 0, absent},
		{"ietf two policies, one spent", http.Header{hdrRateLimit: {`"burst";r=3;t=1, "day";r=0;t=600`}}, 600 * time.Second, valid},
		{"ietf two spent, longest", http.Header{hdrRateLimit: {`"a";r=0;t=5`, `"b";r=0;t=9`}}, 9 * time.Second, valid},
		{"ietf spent, no reset", http.Header{hdrRateLimit: {`"default";r=0`}}, 0, absent},
		{"ietf negative", http.Header{hdrRateLimit: {`"default";r=0;t=-5`}}, 0, ignored},
		{"ietf fraction", http.Header{hdrRateLimit: {`"default";r=0;t=1.5`}}, 0, ignored},
		{"ietf r twice", http.Header{hdrRateLimit: {`"default";r=0;r=9;t=5`}}, 0, ignored},
		{"ietf past a day", http.Header{hdrRateLimit: {`"default";r=0;t=86401`}}, 0, ignored},
		{"ietf huge", http.Header{hdrRateLimit: {`"default";r=0;t=99999999999999999999999`}}, 0, ignored},
		{"draft dict spent", http.Header{hdrRateLimit: {"limit=100, remaining=0, reset=7"}}, 7 * time.Second, valid},
		{"draft dict left", http.Header{hdrRateLimit: {"limit=100, remaining=1, reset=7"}}, 0, absent},
		{"draft fields", http.Header{hdrRLRemaining: {"0"}, hdrRLReset: {"12"}}, 12 * time.Second, valid},
		{"x seconds", http.Header{hdrXRLRemaining: {"0"}, hdrXRLReset: {"20"}}, 20 * time.Second, valid},
		{"x unix time", http.Header{hdrXRLRemaining: {"0"}, hdrXRLReset: {strconv.FormatInt(now.Unix()+45, 10)}}, 45 * time.Second, valid},
		{"x unix time past", http.Header{hdrXRLRemaining: {"0"}, hdrXRLReset: {strconv.FormatInt(now.Unix()-45, 10)}}, 0, valid},
		{"x unix time far", http.Header{hdrXRLRemaining: {"0"}, hdrXRLReset: {strconv.FormatInt(now.Unix()+2*86400, 10)}}, 0, ignored},
		{"x left", http.Header{hdrXRLRemaining: {"3"}, hdrXRLReset: {"20"}}, 0, absent},
		{"x negative remaining", http.Header{hdrXRLRemaining: {"-1"}, hdrXRLReset: {"20"}}, 0, ignored},
		{"x two values", http.Header{hdrXRLRemaining: {"0", "5"}, hdrXRLReset: {"20"}}, 0, ignored},
		{"x garbage reset", http.Header{hdrXRLRemaining: {"0"}, hdrXRLReset: {"soon"}}, 0, ignored},
		{"x spent, no reset", http.Header{hdrXRLRemaining: {"0"}}, 0, absent},
		{"x whitespace", http.Header{hdrXRLRemaining: {" 0 "}, hdrXRLReset: {"\t3"}}, 3 * time.Second, valid},
	} {
		d, res := rateLimitPause(tc.h, now)
		if d != tc.d || res != tc.res {
			t.Errorf("%s: rateLimitPause(%v) = %v, %v; want %v, %v", tc.name, tc.h, d, res, tc.d, tc.res)
		}
	}
}

func TestAdvertisedRate(t *testing.T) {
	const (
		absent  = retryAfterAbsent
		valid   = retryAfterValid
		ignored = retryAfterIgnored
	)
	for _, tc := range []struct {
		name string
		h    http.Header
		rate float64
		res  retryAfterResult
	}{
		{"none", http.Header{}, 0, absent},
		{"ietf policy", http.Header{"Ratelimit-Policy": {`"default";q=100;w=60`}}, 100.0 / 60, valid},
		{"ietf, the tightest of two", http.Header{"Ratelimit-Policy": {`"burst";q=100;w=1, "daily";q=86400;w=86400`}}, 1, valid},
		{"ietf, two lines", http.Header{"Ratelimit-Policy": {`"a";q=50;w=10`, `"b";q=9;w=3`}}, 3, valid},
		{"earlier draft", http.Header{"Ratelimit-Policy": {"10;w=1, 50;w=60"}}, 50.0 / 60, valid},
		{"earlier draft limit, leading quota", http.Header{"Ratelimit-Limit": {"100, 100;w=60"}}, 100.0 / 60, valid},
		{"x-ratelimit-limit with a window", http.Header{"X-Ratelimit-Limit": {"20, 20;w=2"}}, 10, valid},
		{"x-ratelimit-limit without one", http.Header{"X-Ratelimit-Limit": {"5000"}}, 0, absent},
		{"tightest across fields", http.Header{"Ratelimit-Policy": {`"p";q=10;w=1`}, "X-Ratelimit-Limit": {"4;w=1"}}, 4, valid},
		{"other parameters", http.Header{"Ratelimit-Policy": {`"p";q=6;w=2;qu="requests";pk=:AbC=:`}}, 3, valid},
		{"zero quota", http.Header{"Ratelimit-Policy": {`"p";q=0;w=60`}}, 0, ignored},
		{"zero window", http.Header{"Ratelimit-Policy": {`"p";q=10;w=0`}}, 0, ignored},
		{"window past a day", http.Header{"Ratelimit-Policy": {`"p";q=10;w=86401`}}, 0, ignored},
		{"negative quota", http.Header{"Ratelimit-Policy": {`"p";q=-10;w=60`}}, 0, ignored},
		{"fraction", http.Header{"Ratelimit-Policy": {`"p";q=1.5;w=60`}}, 0, ignored},
		{"q twice", http.Header{"Ratelimit-Policy": {`"p";q=10;q=1;w=60`}}, 0, ignored},
		{"huge", http.Header{"Ratelimit-Policy": {`"p";q=99999999999999999999;w=1`}}, 0, ignored},
		{"window, no quota", http.Header{"Ratelimit-Policy": {`"p";w=60`}}, 0, ignored},
		{"one bad among good", http.Header{"Ratelimit-Policy": {`"a";q=10;w=1, "b";q=x;w=1`}}, 0, ignored},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, res := advertisedRate(tc.h)
			if res != tc.res || math.Abs(r-tc.rate) > 1e-12 {
				t.Errorf("advertisedRate(%v) = %v, %v; want %v, %v", tc.h, r, res, tc.rate, tc.res)
			}
		})
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	in := func(d time.Duration) time.Time { return now.Add(d) }
	tests := []struct {
		v    []string
		want time.Duration
		res  retryAfterResult
	}{
		{nil, 0, retryAfterAbsent},
		{[]string{"0"}, 0, retryAfterValid},
		{[]string{"5"}, 5 * time.Second, retryAfterValid},
		{[]string{" 7\t"}, 7 * time.Second, retryAfterValid},
		{[]string{"86400"}, 24 * time.Hour, retryAfterValid},
		{[]string{"86401"}, 0, retryAfterIgnored},                // absurd
		{[]string{"99999999999999999999"}, 0, retryAfterIgnored}, // absurd, would overflow
		{[]string{"-1"}, 0, retryAfterIgnored},
		{[]string{"+5"}, 0, retryAfterIgnored},
		{[]string{"1.5"}, 0, retryAfterIgnored},
		{[]string{""}, 0, retryAfterIgnored},
		{[]string{"soon"}, 0, retryAfterIgnored},
		{[]string{"5", "6"}, 0, retryAfterIgnored},
		{[]string{in(90 * time.Second).Format(http.TimeFormat)}, 90 * time.Second, retryAfterValid},         // IMF-fixdate
		{[]string{in(90 * time.Second).Format(time.RFC850)}, 90 * time.Second, retryAfterValid},             // obsolete RFC 850
		{[]string{in(90 * time.Second).Format(time.ANSIC)}, 90 * time.Second, retryAfterValid},              // asctime
		{[]string{in(-time.Hour).Format(http.TimeFormat)}, 0, retryAfterValid},                              // past: now
		{[]string{time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC).Format(http.TimeFormat)}, 0, retryAfterValid}, // far past: now
		{[]string{in(48 * time.Hour).Format(http.TimeFormat)}, 0, retryAfterIgnored},                        // absurd
		{[]string{"Sun, 31 Feb 2026 25:61:00 GMT"}, 0, retryAfterIgnored},
	}
	for _, tt := range tests {
		got, res := parseRetryAfter(tt.v, now)
		if got != tt.want || res != tt.res {
			t.Errorf("parseRetryAfter(%q) = %v, %d; want %v, %d", tt.v, got, res, tt.want, tt.res)
		}
	}
}

func FuzzParseRetryAfter(f *testing.F) {
	for _, s := range []string{"5", "-1", "Sun, 01 Mar 2026 12:00:05 GMT", "999999999", "", " 1 "} {
		f.Add(s)
	}
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, s string) {
		d, res := parseRetryAfter([]string{s}, now)
		if d < 0 || d > maxRetryAfterHeader || (res != retryAfterValid && d != 0) {
			t.Fatalf("parseRetryAfter(%q) = %v, %d", s, d, res)
		}
	})
}

// TestHostileRateLimit: broken rate-limit fields on a 200 are ignored and
// counted, and never pause the host.
// TestHostileRatePolicy: rate-limit policies bulwark cannot follow (a
// zero, negative, fractional or huge quota, a window of zero or past a
// day, a parameter twice) are ignored and counted, and the bulkhead's rate
// stays at Bulkhead.Rate.
func TestHostileRatePolicy(t *testing.T) {
	for _, tt := range []struct {
		name string
		h    http.Header
	}{
		{"zero quota", http.Header{"Ratelimit-Policy": {`"p";q=0;w=60`}}},
		{"negative quota", http.Header{"Ratelimit-Policy": {`"p";q=-1;w=60`}}},
		{"fractional quota", http.Header{"Ratelimit-Policy": {`"p";q=0.5;w=1`}}},
		{"huge quota", http.Header{"Ratelimit-Policy": {`"p";q=99999999999999999999;w=1`}}},
		{"zero window", http.Header{"Ratelimit-Policy": {`"p";q=10;w=0`}}},
		{"window past a day", http.Header{"Ratelimit-Policy": {`"p";q=10;w=999999`}}},
		{"window twice", http.Header{"Ratelimit-Policy": {`"p";q=10;w=1;w=1000`}}},
		{"malformed", http.Header{"Ratelimit-Policy": {"\x00;q=™;w=1"}}},
		{"x-ratelimit-limit negative", http.Header{"X-Ratelimit-Limit": {"-5;w=1"}}},
		{"draft limit, zero window", http.Header{"Ratelimit-Limit": {"100, 100;w=0"}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &statusBase{codes: []int{200}, header: tt.h}
				tr := mustNew(t, Config{Base: base, Default: only(Policy{Bulkhead: Bulkhead{Rate: 50, Burst: 1}}, "bulkhead")})
				for i := range 2 {
					if _, err := sendOnce(t, tr, http.MethodGet, "http://api.test/"); err != nil {
						t.Fatalf("call %d: %v; want it sent", i+1, err)
					}
				}
				s := tr.Snapshot()
				if s.RetryAfterIgnored != 2 {
					t.Errorf("ignored %d, want 2", s.RetryAfterIgnored)
				}
				if h := s.Host("api.test:80"); len(h) != 1 || h[0].Bulkhead == nil || h[0].Bulkhead.Rate != 50 {
					t.Errorf("bulkhead %+v, want its rate still 50", h)
				}
			})
		})
	}
}

func TestHostileRateLimit(t *testing.T) {
	for _, tt := range []struct {
		name string
		h    http.Header
	}{
		{"negative reset", http.Header{"X-Ratelimit-Remaining": {"0"}, "X-Ratelimit-Reset": {"-1"}}},
		{"huge reset", http.Header{"X-Ratelimit-Remaining": {"0"}, "X-Ratelimit-Reset": {"99999999999999999999"}}},
		{"unix reset past a day", http.Header{"X-Ratelimit-Remaining": {"0"}, "X-Ratelimit-Reset": {"9999999999"}}},
		{"several remaining", http.Header{"X-Ratelimit-Remaining": {"0", "0"}, "X-Ratelimit-Reset": {"5"}}},
		{"malformed remaining", http.Header{"X-Ratelimit-Remaining": {"\x00none™"}, "X-Ratelimit-Reset": {"5"}}},
		{"ietf negative", http.Header{"Ratelimit": {`"d";r=0;t=-3`}}},
		{"ietf huge", http.Header{"Ratelimit": {`"d";r=0;t=86401`}}},
		{"ietf malformed", http.Header{"Ratelimit": {`"d";r=zero;t=3`}}},
		{"draft fields negative", http.Header{"Ratelimit-Remaining": {"0"}, "Ratelimit-Reset": {"-7"}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &statusBase{codes: []int{200}, header: tt.h}
				tr := mustNew(t, Config{Base: base, Default: only(Policy{}, "pushback")})
				for i := range 2 {
					if _, err := sendOnce(t, tr, http.MethodGet, "http://api.test/"); err != nil {
						t.Fatalf("call %d: %v; want it sent", i+1, err)
					}
				}
				if n := tr.Snapshot().RetryAfterIgnored; n != 2 {
					t.Errorf("ignored %d, want 2", n)
				}
			})
		})
	}
}
