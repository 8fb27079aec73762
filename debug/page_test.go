package debug

import (
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bulwark-http/bulwark"
)

// TestPageTemplate renders a Page built by hand, for the rows the live
// fixtures do not reach: a forced breaker control, the pauses in force
// (and not those past), each tier by its priority's name, and the sums of
// the counts by kind.
func TestPageTemplate(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var tiers [bulwark.NumPriorities]time.Time
	tiers[bulwark.PriorityNormal] = now.Add(2 * time.Second)
	tiers[bulwark.PriorityLow] = now.Add(-time.Second) // over
	page := Page{Time: now, SampleEvery: time.Second,
		Snapshot: bulwark.Snapshot{Hosts: []bulwark.HostSnapshot{{Host: "a.test:80", Scheme: "http", Upstream: "default",
			Breaker:  &bulwark.BreakerSnapshot{State: bulwark.CircuitOpen, Control: bulwark.BreakerForceOpen},
			Pushback: &bulwark.PushbackSnapshot{Until: now.Add(time.Second), Tiers: tiers},
			Hedge:    &bulwark.HedgeSnapshot{Sent: 4, Skipped: bulwark.HedgeSkips{Budget: 1, Throttle: 2}, Delay: 1500 * time.Microsecond},
			Fault:    &bulwark.FaultSnapshot{FromHeaders: bulwark.FaultCounts{Delays: 1, Resets: 1}},
			Fallback: &bulwark.FallbackSnapshot{Served: 7},
		}, {Host: "b.test:443", Scheme: "https", Upstream: "default",
			Pushback: &bulwark.PushbackSnapshot{Until: now.Add(-time.Second)}, // over
		}}},
		History: []History{{Host: "a.test:80", Scheme: "http"}, {Host: "b.test:443", Scheme: "https"}},
	}
	var b strings.Builder
	if err := pageTemplate.Execute(&b, newView(page, sampleEvery*sampleKeep)); err != nil {
		t.Fatal(err)
	}
	html := b.String()
	for _, want := range []string{
		`<span class="state open">open</span>`,
		"control force-open",
		"paused for 1.0 s",
		"normal and below for 2.0 s",
		"4 sent, 0 won, 3 skipped · delay 1.5 ms",
		"(2 from headers)",
		"7 final failures answered from the fallback",
		`<tr class="host calm" data-host="b.test:443"><td>b.test:443</td>`,
	} {
		if !strings.Contains(html, want) {
			t.Errorf("the page does not show %q:\n%s", want, html)
		}
	}
	if strings.Contains(html, "low and below") {
		t.Errorf("the page shows a tier's pause that is over:\n%s", html)
	}
}

// TestPageRanksByHarm renders hosts in every state the ranking knows and
// checks the order (bad before warn before calm; an open breaker first,
// then by failure share), the colours of the shares whatever MinCalls
// says, the countdown to the next probe, and the calm hosts folded.
func TestPageRanksByHarm(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	br := func(st bulwark.CircuitState, calls, failed, slow int64) *bulwark.BreakerSnapshot {
		return &bulwark.BreakerSnapshot{State: st, Calls: calls, Failures: failed, Slow: slow}
	}
	open := br(bulwark.CircuitOpen, 0, 0, 0)
	open.OpenUntil = now.Add(3200 * time.Millisecond)
	hosts := []bulwark.HostSnapshot{
		{Host: "a-calm.test:80", Breaker: br(bulwark.CircuitClosed, 100, 1, 0)},
		{Host: "b-failing.test:80", Breaker: br(bulwark.CircuitClosed, 83, 83, 0)}, // below MinCalls: no rate, still red
		{Host: "c-halfopen.test:80", Breaker: br(bulwark.CircuitHalfOpen, 0, 0, 0)},
		{Host: "d-open.test:80", Breaker: open},
		{Host: "e-slow.test:80", Breaker: br(bulwark.CircuitClosed, 10, 0, 2)},
		{Host: "f-idle.test:80", Breaker: br(bulwark.CircuitClosed, 0, 0, 0)},
		{Host: "g-some.test:80", Breaker: br(bulwark.CircuitClosed, 10, 6, 0)},
	}
	page := Page{Time: now, SampleEvery: sampleEvery, Snapshot: bulwark.Snapshot{Hosts: hosts}}
	v := newView(page, sampleEvery*sampleKeep)
	var got []string
	for _, h := range v.Hot {
		got = append(got, h.Host+" "+h.Harm.String())
	}
	want := []string{"d-open.test:80 bad", "b-failing.test:80 bad", "g-some.test:80 bad", "e-slow.test:80 warn", "c-halfopen.test:80 warn"}
	if strings.Join(got, ", ") != strings.Join(want, ", ") {
		t.Errorf("hosts in trouble, in order:\n got %q\nwant %q", got, want)
	}
	if len(v.Calm) != 2 || v.Calm[0].Host != "a-calm.test:80" || v.Calm[1].Host != "f-idle.test:80" {
		t.Errorf("calm hosts = %v, want a-calm and f-idle in host order", v.Calm)
	}
	var b strings.Builder
	if err := pageTemplate.Execute(&b, v); err != nil {
		t.Fatal(err)
	}
	html := b.String()
	for _, want := range []string{
		`<span class="share bad">100 % failed</span> (83)`,
		`<td>a-calm.test:80</td><td> · upstream  · breaker closed, 100 calls, 1 % failed, 0 % slow · 0 in flight</td>`,
		`<span class="share warn">20 % slow</span> (2)`,
		`next probe in 3.2 s`,
		`<span class="why">83 of 83 calls failed</span>`,
		`emptied when the breaker opened`,
		`<details class="calm"><summary>2 calm hosts`,
	} {
		if !strings.Contains(html, want) {
			t.Errorf("the page does not show %q", want)
		}
	}
	if i, j := strings.Index(html, `data-host="d-open.test:80"`), strings.Index(html, `<details class="calm"`); i < 0 || j < i || strings.Index(html, `data-host="a-calm.test:80"`) < j {
		t.Errorf("the open host is not first, or a calm host is not folded")
	}
}

// TestSpark draws a history: the first sample shows at once, at the right
// edge; a sample with an empty window (the breaker just opened) breaks the
// failure line instead of drawing a fall to 0; open samples are a band.
func TestSpark(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	st := func(s bulwark.CircuitState) *bulwark.CircuitState { return &s }
	h := bulwark.HostSnapshot{Breaker: &bulwark.BreakerSnapshot{}, Bulkhead: &bulwark.BulkheadSnapshot{Limit: 4}}
	span := sampleEvery * sampleKeep

	one := spark(h, History{Samples: []Sample{{Time: now, InFlight: 4, Calls: 2, Failures: 2, State: st(bulwark.CircuitClosed)}}}, now, sampleEvery, span)
	if one.N != 1 || one.In != "334,4 333,4" || len(one.Fail) != 1 || one.Fail[0] != "334,4" {
		t.Errorf("one sample = %+v, want a visible point at the right edge, at the top", one)
	}
	if one.Span != "5 min" || one.Every != "1 s" || one.Peak != 4 {
		t.Errorf("axis = %q, every %q, peak %d; want 5 min, 1 s, 4", one.Span, one.Every, one.Peak)
	}

	var samples []Sample
	for i, s := range []struct {
		calls, failed int64
		state         bulwark.CircuitState
	}{{10, 10, bulwark.CircuitClosed}, {0, 0, bulwark.CircuitOpen}, {0, 0, bulwark.CircuitOpen}, {4, 0, bulwark.CircuitHalfOpen}} {
		samples = append(samples, Sample{Time: now.Add(time.Duration(i-3) * time.Second), Calls: s.calls, Failures: s.failed, State: st(s.state)})
	}
	sl := spark(h, History{Samples: samples}, now, sampleEvery, span)
	if want := []string{"331,4", "334,44"}; !slices.Equal(sl.Fail, want) {
		t.Errorf("failure lines = %q, want %q (broken where the window was empty)", sl.Fail, want)
	}
	if want := []band{{X: 331, W: 2}}; !slices.Equal(sl.Open, want) {
		t.Errorf("open bands = %+v, want %+v", sl.Open, want)
	}
	if sl := spark(h, History{Samples: []Sample{{Time: now.Add(-time.Hour)}}}, now, sampleEvery, span); !strings.HasPrefix(sl.In, "34,") {
		t.Errorf("a sample older than the span = %q, want it at the left edge", sl.In)
	}
}

// hostile are host names, patterns and addresses that would break out of
// an element or an attribute if printed as they are.
var hostile = []string{
	`<script>alert(1)</script>:80`,
	`"><img src=x onerror=alert(1)>:80`,
	`' onmouseover='alert(1)`,
	`javascript:alert(1)`,
	`</style><svg onload=alert(1)>`,
}

// TestPageEscapesHostile renders every string the page prints from the
// Snapshot (host, scheme, upstream, route pattern, instance address, a
// breaker change's reason, the fleet's last error, a calm host's row) set
// to hostile text, and checks that none of it reaches the page as markup.
func TestPageEscapesHostile(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var hosts []bulwark.HostSnapshot
	var hist []History
	for _, s := range hostile {
		change := bulwark.BreakerChange{At: now, To: bulwark.CircuitOpen, Reason: s, Calls: 1}
		hosts = append(hosts, bulwark.HostSnapshot{Host: s, Scheme: s, Upstream: s,
			Breaker: &bulwark.BreakerSnapshot{State: bulwark.CircuitOpen, OpenUntil: now.Add(time.Second),
				Changes: []bulwark.BreakerChange{change}, LastTrip: &change},
			Routes:    []bulwark.RouteSnapshot{{Pattern: s, Breaker: &bulwark.BreakerSnapshot{State: bulwark.CircuitOpen}}},
			Endpoints: []bulwark.EndpointState{{Addr: s, Ejected: true, EjectedUntil: now.Add(time.Second)}},
		})
		hist = append(hist, History{Host: s, Scheme: s, Samples: []Sample{{Time: now}}})
	}
	var b strings.Builder
	// Calm hosts, whose rows are built in Go (view.CalmRows).
	for _, s := range hostile {
		hosts = append(hosts, bulwark.HostSnapshot{Host: s, Scheme: s, Upstream: s, Breaker: &bulwark.BreakerSnapshot{}})
		hist = append(hist, History{Host: s, Scheme: s})
	}
	// A fleet's error text is the store's, and could quote anything.
	fleet := &bulwark.FleetSnapshot{LastError: hostile[0], LastErrorAt: now}
	if err := pageTemplate.Execute(&b, newView(Page{Time: now, SampleEvery: sampleEvery, Snapshot: bulwark.Snapshot{Hosts: hosts, Fleet: fleet}, History: hist}, sampleEvery*sampleKeep)); err != nil {
		t.Fatal(err)
	}
	html := b.String()
	for _, bad := range []string{"<script", "<img", "onmouseover='", "<svg onload", "</style><svg"} {
		if strings.Contains(html, bad) {
			t.Errorf("the page carries %q as markup", bad)
		}
	}
	if n := strings.Count(html, "&lt;script&gt;alert(1)&lt;/script&gt;:80"); n < 10 {
		t.Errorf("the hostile host is shown escaped %d times, want it in the heading, the upstream, the route, the instance, the last trip's and the state change's reasons, the fleet's error, and the calm row (its name twice, its summary)", n)
	}
	if !strings.Contains(html, `data-host="&#34;&gt;&lt;img src=x onerror=alert(1)&gt;:80"><td>&#34;&gt;&lt;img`) {
		t.Errorf("a calm host's name that ends its attribute is not escaped in its row:\n%s", html)
	}
}

// TestPageConfig shows the configuration version in force and the last
// one refused, with why.
func TestPageConfig(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	page := Page{Time: now, SampleEvery: time.Second, Snapshot: bulwark.Snapshot{Config: &bulwark.ConfigSnapshot{
		Version: "sha256:ab12", Source: "/etc/bulwark/policies.yaml", Applied: now.Add(-time.Minute),
		Rejected: &bulwark.RejectedConfig{Version: "sha256:cd34", Error: "policies.yaml:7:14: upstream \"pay\": Retry.MaxAttempts: bad", At: now},
	}}}
	var b strings.Builder
	if err := pageTemplate.Execute(&b, newView(page, sampleEvery*sampleKeep)); err != nil {
		t.Fatal(err)
	}
	html := b.String()
	for _, want := range []string{
		"config sha256:ab12",
		"from /etc/bulwark/policies.yaml · applied 11:59:00.000",
		"rejected sha256:cd34 at 12:00:00.000: policies.yaml:7:14: upstream &#34;pay&#34;: Retry.MaxAttempts: bad",
	} {
		if !strings.Contains(html, want) {
			t.Errorf("the page does not show %q:\n%s", want, html)
		}
	}
}

// TestPageOnCallRows renders the rows an on-call engineer reads past the
// ranking: the breaker's recent state changes, newest first, with their
// reasons and how long ago; the window at its last trip beside the live
// one; the calls by outcome since start; per-second rates of calls (and
// the share ok, coloured), refusals (each layer's and all of them),
// failures passed up from below and fallback answers from the history;
// latency percentiles; the refusals for too little time left; the stale
// cache; the fleet's link and the host's quota and peers.
func TestPageOnCallRows(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	trip := bulwark.BreakerChange{At: now.Add(-12 * time.Second), From: bulwark.CircuitClosed, To: bulwark.CircuitOpen,
		Reason: "failure rate 60 % ≥ 50 %", Calls: 100, Failures: 60, Slow: 3}
	h := bulwark.HostSnapshot{Host: "a.test:80", Scheme: "http", Upstream: "default",
		Breaker: &bulwark.BreakerSnapshot{State: bulwark.CircuitOpen, OpenUntil: now.Add(3 * time.Second), Calls: 0,
			Refused: 40, LastTrip: &trip, Changes: []bulwark.BreakerChange{
				{At: now.Add(-20 * time.Second), From: bulwark.CircuitHalfOpen, To: bulwark.CircuitClosed, Reason: "every probe succeeded"},
				trip,
			}},
		Budget:           &bulwark.BudgetSnapshot{Remaining: 0, FleetCalls: 70, FleetRetries: 9, ThrottleTokens: 4.2, Throttled: true},
		Quota:            &bulwark.QuotaSnapshot{FleetRate: 500, Tokens: 65, LeaseUntil: now.Add(2 * time.Second), Pods: 4, Demand: 120.5, Refused: 2, Leases: 9},
		Fallback:         &bulwark.FallbackSnapshot{Served: 30, StaleEntries: 2, StaleBytes: 512, StaleOldest: now.Add(-90 * time.Second)},
		Latency:          &bulwark.LatencySnapshot{Samples: 812, P50: 4 * time.Millisecond, P99: 41500 * time.Microsecond, P999: 250 * time.Millisecond},
		Learned:          &bulwark.LearnedSnapshot{AttemptTimeout: time.Second, AttemptFrom: bulwark.FromColdStart},
		DeadlineTooShort: 5,
		Calls:            bulwark.CallCounts{Calls: 1000, Succeeded: 900, Failed: 60, TimedOut: 10, Refused: 25},
		PassedUp:         12,
	}
	// Ten seconds of history, over which: 40 refusals by the breaker and 5
	// for too little time left, so 4.0, 0.5 and 4.5 a second in all; 30
	// fallback answers, 3.0 a second; 10 failures passed up, 1.0 a second.
	var hist History
	for i := range 12 {
		s := Sample{Time: now.Add(time.Duration(i-11) * time.Second)}
		if i >= 1 {
			k := uint64(i - 1)
			s.RefusedBy = Refusals{Breaker: 4 * k, DeadlineTooShort: k / 2}
			s.Refused, s.Served = s.RefusedBy.Breaker+s.RefusedBy.DeadlineTooShort, 3*k
			s.Requests, s.Succeeded = 800+20*k, 750+15*k // 20 a second, 75 % ok
			s.PassedUp = 2 + k
		}
		hist.Samples = append(hist.Samples, s)
	}
	page := Page{Time: now, SampleEvery: time.Second, History: []History{hist},
		Snapshot: bulwark.Snapshot{Hosts: []bulwark.HostSnapshot{h}, Fleet: &bulwark.FleetSnapshot{Published: 12, Received: 30, Applied: 7,
			LastError: "redis: connection refused", LastErrorAt: now.Add(-5 * time.Second)}}}
	var b strings.Builder
	if err := pageTemplate.Execute(&b, newView(page, sampleEvery*sampleKeep)); err != nil {
		t.Fatal(err)
	}
	html := b.String()
	text := strings.ReplaceAll(regexp.MustCompile(`<[^>]*>`).ReplaceAllString(html, ""), "&#39;", "'")
	if !strings.Contains(html, `<span class="share warn">75 % ok</span>`) {
		t.Errorf("the calls ok over the last 10 s (75 %%) are not amber")
	}
	if !strings.Contains(html, `<span class="full">40 breaker open (4.0/s)</span> · <span>0 retry budget spent</span>`) {
		t.Errorf("the breaker's refusals are not red beside the budget's none")
	}
	for _, want := range []string{
		"window at last trip100 calls: 60 failed, 3 slow · failure rate 60 % ≥ 50 % · 12.0 s ago (11:59:48.000 UTC)",
		"state changesclosed → open failure rate 60 % ≥ 50 % · 12.0 s agohalf-open → closed every probe succeeded · 20.0 s ago",
		"calls since start1000: 900 succeeded · 60 failed · 10 timed out · 25 refused · now 20.0/s, 75 % ok (last 10 s)",
		"refused since start40 breaker open (4.0/s) · 0 retry budget spent · 5 deadline too short (0.5/s) · now 4.5/s in all (last 10 s)",
		"passed up from below12 failures passed up from below since start · now 1.0/s (last 10 s) · not this host's fault: a service below it failed and was retried there if it could be; not retried here, not counted by this host's breaker or concurrency limit",
		"30 final failures answered from the fallback since the policy was set · now 3.0/s · stale cache 2 answers, 512 bytes, the oldest received 1 min 30 s ago",
		"latency nowp50 4.0 ms · p99 41.5 ms · p99.9 250.0 ms (812 attempts in the last 5–10 s, failures included)",
		"retry budgetheld by the retry throttle (4.2 of 10 tokens): no retry or hedge until successes earn tokens back · 0 retries left · window 0 calls, 0 retries · other pods: 70 calls, 9 retries",
		"fleet quota65 tokens held for 2.0 s of 500/s for the fleet, shared by 4 pods · demand here 120.5/s · 2 refused · 9 leases, 0 failed",
		"fleet not connected · 12 updates published (0 failed, 0 dropped) · 30 received, 7 applied, 0 ignored · last error 5.0 s ago: redis: connection refused",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the page does not show %q:\n%s", want, text)
		}
	}
}

// TestPagePassedUp: a host whose answers pass failures up from below is
// amber while they go on (read from the history), ranked after a red
// host, with its count, rate and what they mean; one whose pass-ups have
// stopped is calm again, its folded row still giving the count.
func TestPagePassedUp(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	hist := func(host string, passedUp ...uint64) History {
		h := History{Host: host, Scheme: "http"}
		for i, n := range passedUp {
			h.Samples = append(h.Samples, Sample{Time: now.Add(time.Duration(i-len(passedUp)+1) * time.Second), PassedUp: n})
		}
		return h
	}
	closed := func() *bulwark.BreakerSnapshot { return &bulwark.BreakerSnapshot{State: bulwark.CircuitClosed} }
	page := Page{Time: now, SampleEvery: sampleEvery,
		Snapshot: bulwark.Snapshot{Hosts: []bulwark.HostSnapshot{
			{Host: "a-mid.test:80", Scheme: "http", Breaker: closed(), PassedUp: 30},
			{Host: "b-bottom.test:80", Scheme: "http", Breaker: &bulwark.BreakerSnapshot{State: bulwark.CircuitOpen}},
			{Host: "c-over.test:80", Scheme: "http", Breaker: closed(), PassedUp: 5},
		}},
		History: []History{hist("a-mid.test:80", 10, 20, 30), hist("b-bottom.test:80", 0, 0), hist("c-over.test:80", 5, 5, 5)},
	}
	v := newView(page, sampleEvery*sampleKeep)
	var got []string
	for _, h := range v.Hot {
		got = append(got, h.Host+" "+h.Harm.String())
	}
	if want := []string{"b-bottom.test:80 bad", "a-mid.test:80 warn"}; !slices.Equal(got, want) {
		t.Errorf("hosts in trouble = %q, want %q", got, want)
	}
	if len(v.Calm) != 1 || v.Calm[0].Host != "c-over.test:80" {
		t.Errorf("calm hosts = %v, want c-over.test, whose pass-ups stopped", v.Calm)
	}
	var b strings.Builder
	if err := pageTemplate.Execute(&b, v); err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(regexp.MustCompile(`<[^>]*>`).ReplaceAllString(b.String(), ""), "&#39;", "'")
	for _, want := range []string{
		"a-mid.test:80 http · upstream failures passed up from below",
		"passed up from below30 failures passed up from below since start · now 10.0/s (last 2 s) · not this host's fault",
		"c-over.test:80http · upstream  · breaker closed, 0 calls, 0 % failed, 0 % slow · 0 in flight · 5 failures passed up from below",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("the page does not show %q:\n%s", want, text)
		}
	}
}
