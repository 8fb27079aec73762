package debug

import (
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
		}, {Host: "b.test:443", Scheme: "https", Upstream: "default",
			Pushback: &bulwark.PushbackSnapshot{Until: now.Add(-time.Second)}, // over
		}}},
		History: []History{{Host: "a.test:80", Scheme: "http"}, {Host: "b.test:443", Scheme: "https"}},
	}
	var b strings.Builder
	if err := pageTemplate.Execute(&b, page); err != nil {
		t.Fatal(err)
	}
	html := b.String()
	for _, want := range []string{
		`<span class="state open">open</span>`,
		"control force-open",
		"paused until 12:00:01.000",
		"normal and below until 12:00:02.000",
		"4 sent, 0 won, 3 skipped · delay 1.5 ms",
		"(2 from headers)",
		"<td>none</td>",
	} {
		if !strings.Contains(html, want) {
			t.Errorf("the page does not show %q:\n%s", want, html)
		}
	}
	if strings.Contains(html, "low and below") {
		t.Errorf("the page shows a tier's pause that is over:\n%s", html)
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
	if err := pageTemplate.Execute(&b, page); err != nil {
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
