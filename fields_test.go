package bulwark

import (
	"math"
	"net/http"
	"strconv"
	"testing"
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
