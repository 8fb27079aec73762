package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
)

// The direction tests run each scenario's real code (HTTP servers and
// clients, bulwark's layers) with short settings inside a testing/synctest
// bubble on an in-memory network (inBubble): time is fake and advances
// only when every goroutine waits, so a 1 s sick call or a 250 ms deadline
// is exact however starved the machine is, and CPU time costs no scenario
// time. They assert the mechanism first (workers held, requests reaching
// a sick instance, the limit's fall) and then the direction of the
// result. If bulwark stops protecting, they fail. The report tests below
// run the whole lab for real, on 127.0.0.1, and check its output, not its
// figures.

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func testLab(set settings) *lab {
	return &lab{set: set, progress: io.Discard}
}

// inBubble runs f inside a testing/synctest bubble, with the lab's
// servers and clients on an in-memory network: time there is fake and
// advances only when every goroutine of the scenario waits, so the
// scenario's timings (a 1 s sick call, a 250 ms deadline, a 100 ms
// window) are exact whatever the machine's load, and a starved machine
// only makes the test take longer in real time.
func inBubble(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	synctest.Test(t, func(t *testing.T) {
		inMemory = newMemNet()
		defer func() { inMemory = nil }()
		f(t)
	})
}

// runScenario runs one scenario of l and logs what the lab would print.
func runScenario(t *testing.T, l *lab, run func(*lab, context.Context) (*scenario, error)) *scenario {
	t.Helper()
	sc, err := run(l, t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	l.render(&buf, sc)
	t.Log("\n" + buf.String())
	return sc
}

func byShort(t *testing.T, sc *scenario, short string) *run {
	t.Helper()
	for _, r := range sc.runs {
		if r.short == short {
			return r
		}
	}
	t.Fatalf("no run %q in %s", short, sc.key)
	return nil
}

func TestTuesdayProtectsOrders(t *testing.T) { inBubble(t, testTuesdayProtectsOrders) }

func testTuesdayProtectsOrders(t *testing.T) {
	// The lab's own settings (make demo's: ×0.25, 400 req/s, 9 s), so the
	// figures asserted are the scenario's as the lab runs it: tax 10 ms →
	// 2.5 s from 1.35 s to 4.5 s. Its healthy first 1.35 s make some 270
	// tax calls, past the 200 healthy samples bulwark learns a host's
	// bounds from; a shorter or lighter run would test the cold start
	// instead (the static 10 s timeout, which a 2.5 s call never reaches).
	l := testLab(settings{scale: 0.25, load: 400})
	sc := runScenario(t, l, (*lab).tuesday)
	plain, prot, tuned := byShort(t, sc, "plain"), byShort(t, sc, "bulwark"), byShort(t, sc, "bulwark tuned")
	// The mechanism, asserted first: slow tax calls hold the plain
	// client's checkout workers (all of them: a sick tax call lasts 2.5 s
	// and checkouts arrive far faster than 40 a second), while bulwark's
	// bulkhead and breaker keep most of the pool free: the tuned bulkhead
	// lets at most 8 wait on tax, the zero-config one learns tax's timeout
	// and slow-call threshold and opens its breaker. The rates follow.
	if ph := plain.metrics["held"]; ph < 0.9 {
		t.Errorf("most checkout workers waiting on tax at once: plain %.0f%%; want ≥ 90%% (the pool drained)", 100*ph)
	}
	for _, r := range []*run{prot, tuned} {
		if h := r.metrics["held"]; h > 0.5 {
			t.Errorf("most checkout workers waiting on tax at once: %s %.0f%%; want ≤ 50%%", r.short, 100*h)
		}
		if po, bo := plain.metrics["orders_sick"], r.metrics["orders_sick"]; bo < po+0.3 {
			t.Errorf("orders ok while tax sick: %s %.1f%%, plain %.1f%%; want %s ahead by at least 30 points", r.short, 100*bo, 100*po, r.short)
		}
		if pc, bc := plain.metrics["checkout_sick"], r.metrics["checkout_sick"]; bc <= pc {
			t.Errorf("checkout ok while tax sick: %s %.1f%%, plain %.1f%%; want %s ahead", r.short, 100*bc, 100*pc, r.short)
		}
		// The plain client's own drained pool throttles what it sends
		// (one call per stuck worker per sick call); bulwark's open
		// breaker sends only probes, up to HalfOpenCalls per open period
		// (spaced through it, so that a recovery is seen within a tenth
		// of the open time), which at this scale's short sickness comes
		// near the plain client's count: it may not pass it. The
		// absolute bound is issue 28's, below.
		if pt, bt := plain.metrics["tax_sick"], r.metrics["tax_sick"]; bt > pt {
			t.Errorf("tax requests received while sick: %s %.0f, plain %.0f; want %s no more than plain (the breaker open)", r.short, bt, pt, r.short)
		}
		if open := r.metrics["breaker_open_sick"]; open < 0.2 {
			t.Errorf("%s's breaker open for %.1f%% of the sick period; want it open most of it (at least 20%%)", r.short, 100*open)
		}
		if n := r.tl.get("breaker open").den; sum(n) == 0 {
			t.Errorf("%s's breaker-open series has no samples", r.short)
		}
		// The fallback's answers are counted and drawn apart from real
		// ones: an ok at a stale tax rate must not pass for a real one.
		if n := r.metrics["fallback"]; n <= 0 {
			t.Errorf("%s's fallback answered %v checkouts, want some (the breaker was open)", r.short, n)
		}
		if fb := r.tl.get("checkout fallback"); fb.empty() || sum(fb.num) == 0 {
			t.Errorf("%s's checkout fallback series has no fallback answers", r.short)
		}
	}
	// Issue 28's figures for bulwark with zero config (only the fallback
	// set): GET /orders at least 99 % ok while tax is sick, and at most
	// 120 calls reach tax while it is sick (the plain client's drained
	// pool sends about 80; bulwark's open breaker about 20–40).
	if o := prot.metrics["orders_sick"]; o < 0.99 {
		t.Errorf("bulwark with zero config kept GET /orders at %.1f%% ok while tax was sick; want ≥ 99%%", 100*o)
	}
	if n := prot.metrics["tax_sick"]; n > 120 {
		t.Errorf("bulwark with zero config let %.0f calls reach tax while it was sick; want ≤ 120", n)
	}
	if fb := plain.tl.get("checkout fallback"); !fb.empty() {
		t.Errorf("the plain client's checkout fallback series has samples; it has no fallback")
	}
	sc.key = "tuesday"
	v := tuesdaySpec.verdict(sc)
	if want := fmt.Sprintf("%.0f checkouts in the run were charged the last good tax rate", prot.metrics["fallback"]); !strings.Contains(v, want) {
		t.Errorf("verdict = %q\nwant it to say %q", v, want)
	}
}

func sum(xs []int64) (n int64) {
	for _, x := range xs {
		n += x
	}
	return n
}

func TestStormBudgetCapsLoad(t *testing.T) { inBubble(t, testStormBudgetCapsLoad) }

func testStormBudgetCapsLoad(t *testing.T) {
	l := testLab(settings{scale: 0.2, load: 200, duration: 3 * time.Second})
	var none, imm, bud stormStrategy
	for _, st := range stormStrategies() {
		switch st.short {
		case "none":
			none = st
		case "imm×3":
			imm = st
		case "bulwark":
			bud = st
		}
	}
	length := l.set.duration
	blip := l.set.ref(refStormBlip)
	from := length * 20 / 100
	workers := stormWorkers(l.set)
	sc := &scenario{key: "storm", length: length, marks: []mark{{from, from + blip, "blip"}}}
	for _, st := range []stormStrategy{imm, bud, none} {
		r, err := l.stormRun(t.Context(), st, length, 2*time.Second, from, from+blip, workers)
		if err != nil {
			t.Fatal(err)
		}
		sc.runs = append(sc.runs, r)
	}
	var buf bytes.Buffer
	l.render(&buf, sc)
	t.Log("\n" + buf.String())
	ip, bp := sc.runs[0].metrics["peak"], sc.runs[1].metrics["peak"]
	if bp >= ip {
		t.Errorf("peak load during and after the blip: jitter+budget %.0f req/s, immediate retries %.0f req/s; want jitter+budget lower", bp, ip)
	}
	// Immediate retries keep the service past its capacity after the blip
	// in most runs (18–24 % ok, never recovered), but in about one run in
	// fifteen the backlog drains and they end at 87–89 %, above bulwark's
	// 75–88 %: comparing calls ok with theirs failed in those runs. What
	// the budget promises is that retrying costs no recovery: bulwark's
	// calls are back at ≥ 90 % ok as soon as without retries (0.1–0.2 s
	// after the blip, in steps of 0.1 s, over 25 runs), where immediate
	// retries mostly never are.
	br, nr := sc.runs[1].metrics["recovered"], sc.runs[2].metrics["recovered"]
	if br < 0 || nr >= 0 && br > nr+0.15 {
		t.Errorf("recovered after the blip: jitter+budget %.1fs, no retries %.1fs (-1: never); want jitter+budget within 0.1 s of no retries", br, nr)
	}
}

func TestDeadlinesShortBeatsLong(t *testing.T) { inBubble(t, testDeadlinesShortBeatsLong) }

func testDeadlinesShortBeatsLong(t *testing.T) {
	// In the bubble the scale changes no ratio the test asserts on: the
	// deadline is the floor or the measured p99.9, the long one 100 s
	// scaled, and the long run's 50 workers fill with hung calls by 2.5 s.
	l := testLab(settings{scale: 0.5, load: 400, duration: 4 * time.Second})
	sc := runScenario(t, l, (*lab).deadlines)
	// The mechanism: hung calls hold the server's workers until their
	// caller's deadline, so a long deadline lets them fill the server
	// while a short one frees them. Then what follows from it: in the last
	// second the short deadline fails about the 5 % that never complete,
	// the long one most calls.
	lr, sr := byShort(t, sc, "plain 100s"), byShort(t, sc, "bulwark p99.9")
	if lh, sh := lr.metrics["held"], sr.metrics["held"]; lh < 0.8 || sh > 0.5 {
		t.Errorf("most workers held by hung calls: 100 s-style %.0f%%, near p99.9 %.0f%%; want ≥ 80%% and ≤ 50%%", 100*lh, 100*sh)
	}
	if ll, sl := lr.metrics["last"], sr.metrics["last"]; sl > 0.15 || ll < 0.5 {
		t.Errorf("error rate in the last second: 100 s-style %.1f%%, near p99.9 %.1f%%; want ≥ 50%% and ≤ 15%%", 100*ll, 100*sl)
	}
}

func TestOutlierEjectionHelps(t *testing.T) { inBubble(t, testOutlierEjectionHelps) }

func testOutlierEjectionHelps(t *testing.T) {
	// Ejection pays when an instance stays out much longer than its five
	// failures take to arrive: at ×0.25 a first ejection (1.9 s) outlasts
	// the run, and at 400 req/s the failures take a fraction of a second.
	l := testLab(settings{scale: 0.25, load: 400, duration: 2 * time.Second})
	sc := runScenario(t, l, (*lab).outlier)
	off, on := byShort(t, sc, "no-eject"), byShort(t, sc, "eject")
	// Asserted: the mechanism (ejected instances get fewer requests), what
	// it buys (fewer calls answered by a sick instance's 500) and the
	// success rate that follows.
	if fo, no := off.metrics["ok"], on.metrics["ok"]; no <= fo {
		t.Errorf("success rate: with ejection %.1f%%, without %.1f%%; want ejection higher", 100*no, 100*fo)
	}
	// Without ejection the sick instances get at least their 3/20 share;
	// ejected, they get a few requests per return. Half is a wide margin.
	if fs, ns := off.metrics["share"], on.metrics["share"]; ns >= fs/2 {
		t.Errorf("share of requests reaching sick instances: with ejection %.1f%%, without %.1f%%; want ejection under half", 100*ns, 100*fs)
	}
	if f5, n5 := off.metrics["500"], on.metrics["500"]; n5 >= f5/2 {
		t.Errorf("calls answered 500: with ejection %.1f%%, without %.1f%%; want ejection under half", 100*n5, 100*f5)
	}
	if n := sum(on.tl.get("ejected").num); n == 0 {
		t.Errorf("the ejection run never saw an instance ejected")
	}
}

func TestTailHedgingCutsTail(t *testing.T) { inBubble(t, testTailHedgingCutsTail) }

func testTailHedgingCutsTail(t *testing.T) {
	// The faults are seeded (tailSeed), so the plain client, which sends
	// each call once, meets the same number of one-second attempts in
	// every run of this test; what is asserted is that hedging leaves
	// fewer calls that slow, at a load the retry budget bounds.
	l := testLab(settings{scale: 0.25, load: 200, duration: 3 * time.Second})
	sc := runScenario(t, l, (*lab).tail)
	plain, hedge := byShort(t, sc, "plain").metrics, byShort(t, sc, "hedging").metrics
	if plain["slow"] < 2 {
		t.Fatalf("the plain client met %.0f calls of 0.5 s or more in %.0f; the seeded 1 %% fault should give it several", plain["slow"], plain["calls"])
	}
	if hedge["hedges"] < 1 {
		t.Errorf("bulwark hedging sent no hedge")
	}
	if hedge["slow"] >= plain["slow"] {
		t.Errorf("calls of 0.5 s or more: hedging %.0f, plain %.0f; want hedging fewer", hedge["slow"], plain["slow"])
	}
	// Each hedge takes a token from the retry budget: 20 % of calls plus
	// 10 a second, so at 200 calls a second at most 1.25 requests a call.
	if hedge["load"] > 1.3 || plain["load"] != 1 {
		t.Errorf("upstream requests per call: hedging %.3f, plain %.3f; want at most 1.3 (the budget) and exactly 1", hedge["load"], plain["load"])
	}
}

func TestCapacityLimitFollowsCores(t *testing.T) { inBubble(t, testCapacityLimitFollowsCores) }

func testCapacityLimitFollowsCores(t *testing.T) {
	// Asserted: the mechanism (the adaptive limit falls when the cores
	// do, and so bounds the service's queue, which the plain client's
	// open-loop calls fill) and the direction of the calls answered in
	// time.
	l := testLab(settings{scale: 0.25, load: 400})
	sc := runScenario(t, l, (*lab).capacity)
	plain, bw := byShort(t, sc, "plain").metrics, byShort(t, sc, "bulwark tuned").metrics
	if bw["min_limit"] > bw["ceiling"]/2 {
		t.Errorf("bulwark's lowest limit with a quarter of the cores: %.0f; want it under half its ceiling (%.0f)", bw["min_limit"], bw["ceiling"])
	}
	if plain["max_queue"] < 2*bw["max_queue"] {
		t.Errorf("longest queue at the service: plain %.0f, bulwark %.0f; want plain at least twice bulwark's", plain["max_queue"], bw["max_queue"])
	}
	if bg, pg := bw["low_good"]+bw["after_good"], plain["low_good"]+plain["after_good"]; bg <= pg {
		t.Errorf("calls/s answered in time during and after the drop: bulwark %.0f, plain %.0f; want bulwark more", bg, pg)
	}
}

func TestCapacityZeroConfig(t *testing.T) { inBubble(t, testCapacityZeroConfig) }

// testCapacityZeroConfig: issue 28's capacity figures for bulwark with
// zero config, at the lab's own settings (make demo's: 1,200 calls a
// second, 40 cores → 10 → 40 at 20 ms, 250 ms deadlines): in each phase at
// least 95 % of what the service can serve of what is offered is answered
// in time, and while it has 10 cores the calls answered take at most
// 50 ms at the p99 (they do not wait in its queue).
func testCapacityZeroConfig(t *testing.T) {
	l := testLab(settings{scale: 0.25, load: 400})
	sc := runScenario(t, l, (*lab).capacity)
	plain, bw := byShort(t, sc, "plain").metrics, byShort(t, sc, "bulwark").metrics
	if bw["full"] != 40 || bw["low"] != 10 || bw["load"] != 1200 {
		t.Fatalf("scenario at %.0f → %.0f cores, %.0f calls/s; want the issue's 40 → 10 at 1,200", bw["full"], bw["low"], bw["load"])
	}
	full, low := min(bw["load"], bw["full_capacity"]), min(bw["load"], bw["low_capacity"])
	t.Logf("zero config: %.0f / %.0f / %.0f calls/s answered in time (of %.0f / %.0f / %.0f served), drop p99 of those %.1f ms, limit %.1f (lowest %.0f), %.0f refused, %.0f by the breaker; plain in the drop %.0f calls/s",
		bw["before_good"], bw["low_good"], bw["after_good"], full, low, full, bw["low_ok_p99"], bw["low_limit"], bw["min_limit"], bw["refused"], bw["breaker"], plain["low_good"])
	// The mechanism first: the plain client's queue collapses the drop,
	// and the zero-config limit comes down to about the cores.
	if plain["low_good"] > 0.5*low {
		t.Errorf("plain client in the drop: %.0f calls/s in time; want under half of %.0f (the scenario no longer overloads the service)", plain["low_good"], low)
	}
	if bw["min_limit"] > 2*bw["low"] {
		t.Errorf("zero config's lowest limit in the drop %.0f; want at most twice the %.0f cores", bw["min_limit"], bw["low"])
	}
	for _, ph := range []struct {
		name     string
		good, of float64
	}{{"before the drop", bw["before_good"], full}, {"in the drop", bw["low_good"], low}, {"after the drop", bw["after_good"], full}} {
		if ph.good < 0.95*ph.of {
			t.Errorf("zero config %s: %.0f calls/s answered in time; want ≥ 95 %% of %.0f", ph.name, ph.good, ph.of)
		}
	}
	if p := bw["low_ok_p99"]; p > 50 {
		t.Errorf("zero config in the drop: p99 of the calls answered %.1f ms; want ≤ 50 ms", p)
	}
}

func TestThrottleCapsSends(t *testing.T) { inBubble(t, testThrottleCapsSends) }

func testThrottleCapsSends(t *testing.T) {
	l := testLab(settings{scale: 0.25, load: 200, duration: 3 * time.Second})
	sc := runScenario(t, l, (*lab).throttle)
	plain, bw := byShort(t, sc, "plain").metrics, byShort(t, sc, "bulwark").metrics
	// The throttle's refusal probability comes from its counts of
	// requests and accepts and holds the ratio near K = 2; the plain client
	// sends all five times what is accepted.
	if bw["ratio"] > 2.6 || plain["ratio"] < 3.5 {
		t.Errorf("backend received ÷ accepted: bulwark %.2f, plain %.2f; want bulwark ≤ 2.6 (K = 2) and plain ≥ 3.5 (offered 5×)", bw["ratio"], plain["ratio"])
	}
	if bw["local"] <= 0 {
		t.Errorf("bulwark's throttle refused nothing locally")
	}
}

// TestStormVerdict checks that the storm's verdict compares bulwark with
// no retries as well as with immediate retries, and says who wins on what
// whichever way the figures fall.
func TestStormVerdict(t *testing.T) {
	m := func(peak, ok float64) map[string]float64 { return map[string]float64{"peak": peak, "ok": ok} }
	for _, tc := range []struct {
		name          string
		none, imm, bw map[string]float64
		want          []string
	}{
		{"no retries ahead on ok", m(150, 0.865), m(520, 0.60), m(180, 0.836), []string{
			"150 from a client that does not retry", "no retries 86.5 %", "bulwark wins on both",
			"Not retrying at all beats bulwark on calls ok (by 2.9 points), at a lower load"}},
		{"bulwark ahead of both", m(150, 0.80), m(520, 0.60), m(180, 0.90), []string{
			"bulwark wins on both", "Against no retries bulwark wins on calls ok (by 10.0 points), at 30 req/s more at the peak"}},
		{"immediate retries ahead on ok", m(150, 0.70), m(520, 0.95), m(180, 0.90), []string{
			"bulwark wins on load, not on calls ok"}},
	} {
		got := stormVerdict(tc.none, tc.imm, tc.bw)
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: stormVerdict = %q\nwant it to say %q", tc.name, got, w)
			}
		}
	}
}

// TestDefaultReport checks where the report goes without -out: the
// working directory, under a name that differs from one run to the next.
func TestDefaultReport(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 2, 46, 0, 0, time.UTC)
	a, b := defaultReport(t0), defaultReport(t0.Add(time.Second))
	if filepath.Dir(a) != "." || filepath.Ext(a) != ".html" {
		t.Errorf("defaultReport = %q, want an .html file in the working directory", a)
	}
	if a == b {
		t.Errorf("defaultReport gives %q for two runs a second apart: the second overwrites the first", a)
	}
}

func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // in the error; empty: flag.ErrHelp
	}{
		{[]string{"-h"}, ""},
		{[]string{"-scale", "0"}, "-scale"},
		{[]string{"-load", "1e9"}, "-load"},
		{[]string{"-duration", "1ms"}, "-duration"},
		{[]string{"-scenario", "friday"}, "-scenario"},
		{[]string{"extra"}, "unexpected"},
	} {
		var stderr bytes.Buffer
		err := mainErr(tc.args, io.Discard, &stderr)
		switch {
		case tc.want == "" && !errors.Is(err, flag.ErrHelp):
			t.Errorf("mainErr(%q) = %v, want flag.ErrHelp", tc.args, err)
		case tc.want == "" && !strings.Contains(stderr.String(), "-scenario"):
			t.Errorf("mainErr(%q) usage does not document -scenario:\n%s", tc.args, stderr.String())
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("mainErr(%q) = %v, want an error about %s", tc.args, err, tc.want)
		}
	}
}

// labRun is one run of the whole lab, as make demo runs it but with short
// settings, its output captured as a pipe would capture it.
type labRun struct {
	html, stdout, stderr string
}

var (
	labOnce sync.Once
	labOut  labRun
	labErr  error
)

// report runs every scenario of the registry once, briefly (about 15 s in
// all, the storm's five runs most of it), and writes the HTML report; the
// tests that read the report or the output share the one run.
func report(t *testing.T) labRun {
	t.Helper()
	labOnce.Do(func() {
		dir, err := os.MkdirTemp("", "lab-report")
		if err != nil {
			labErr = err
			return
		}
		path := filepath.Join(dir, "lab.html")
		var out, errOut bytes.Buffer
		// ×0.05 and 1.4 s: the shortest run in which the storm still has
		// a second after its (0.1 s) blip.
		args := []string{"-scenario", "all", "-duration", "1.4s", "-load", "100", "-scale", "0.05", "-out", path}
		if labErr = mainErr(args, &out, &errOut); labErr != nil {
			return
		}
		labOut = labRun{html: path, stdout: out.String(), stderr: errOut.String()}
	})
	if labErr != nil {
		t.Fatal(labErr)
	}
	if !strings.Contains(labOut.stdout, labOut.html) {
		t.Errorf("output does not name the report path %s:\n%s", labOut.html, labOut.stdout)
	}
	return labOut
}

func TestReportSelfContained(t *testing.T) {
	b, err := os.ReadFile(report(t).html)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	if n := strings.Count(s, "<svg"); n < 2*len(scenarios) {
		t.Errorf("report has %d <svg> charts, want at least %d (two per scenario)", n, 2*len(scenarios))
	}
	for _, bad := range []string{"<script", " src=", "href=", "url(", "@import"} {
		if strings.Contains(s, bad) {
			t.Errorf("report contains %q: it must not load anything", bad)
		}
	}
}

// TestOutputInAPipe checks what a log gets from the lab: no carriage
// returns (no redrawn progress bar), one progress line per scenario, and
// a verdict for each scenario in its section and in the summary.
func TestOutputInAPipe(t *testing.T) {
	r := report(t)
	for name, s := range map[string]string{"stdout": r.stdout, "stderr": r.stderr} {
		if strings.Contains(s, "\r") {
			t.Errorf("%s in a pipe has carriage returns:\n%q", name, s)
		}
	}
	var progress []string
	for _, l := range strings.Split(strings.TrimSpace(r.stderr), "\n") {
		if l != "" {
			progress = append(progress, l)
		}
	}
	if len(progress) != len(scenarios) {
		t.Errorf("stderr in a pipe has %d lines, want one per scenario (%d):\n%s", len(progress), len(scenarios), r.stderr)
	}
	for k, sp := range scenarios {
		if want := fmt.Sprintf("scenario %d of %d: %s", k+1, len(scenarios), sp.key); k < len(progress) && progress[k] != want {
			t.Errorf("progress line %d = %q, want %q", k+1, progress[k], want)
		}
	}
	n := 0
	lines := strings.Split(r.stdout, "\n")
	for _, l := range lines {
		if strings.HasPrefix(l, "Verdict: ") {
			n++
		}
	}
	if n != 2*len(scenarios) {
		t.Errorf("stdout has %d lines starting with \"Verdict: \", want %d (the opening and each section):\n%s", n, 2*len(scenarios), r.stdout)
	}
	// The output opens with every verdict, one line each, in the
	// registry's order, before any detail: a header, a blank line, then
	// the verdicts.
	if len(lines) < 2+len(scenarios) {
		t.Fatalf("stdout has %d lines:\n%s", len(lines), r.stdout)
	}
	for k, sp := range scenarios {
		if l := lines[2+k]; !strings.HasPrefix(l, "Verdict: ") || !strings.HasSuffix(l, " ["+sp.key+"]") {
			t.Errorf("stdout line %d = %q, want the verdict of %s", 3+k, l, sp.key)
		}
	}
	lastVerdict := strings.Index(r.stdout, " ["+scenarios[len(scenarios)-1].key+"]\n")
	if first := strings.Index(r.stdout, scenarios[0].title); first < 0 || first < lastVerdict {
		t.Errorf("a scenario's detail comes before the last opening verdict:\n%s", r.stdout)
	}
}

// TestProgressOnATerminal draws the progress line as on a terminal and
// checks that it says which scenario runs and never shows more time
// elapsed than the total.
func TestProgressOnATerminal(t *testing.T) {
	var buf syncBuffer
	l := &lab{progress: &buf, tty: true, k: 2, n: 4}
	stop := l.showProgress("storm: full jitter", 100*time.Millisecond)
	time.Sleep(500 * time.Millisecond) // long past the total: the clamp shows
	stop()
	out := buf.String()
	if !strings.Contains(out, "scenario 2 of 4") {
		t.Errorf("progress does not say \"scenario 2 of 4\": %q", out)
	}
	re := regexp.MustCompile(`([0-9.]+)s/([0-9.]+)s`)
	for _, m := range re.FindAllStringSubmatch(out, -1) {
		el, _ := strconv.ParseFloat(m[1], 64)
		total, _ := strconv.ParseFloat(m[2], 64)
		if el > total {
			t.Errorf("progress overshoots: %s", m[0])
		}
	}
	if isTerminal(&buf) {
		t.Errorf("a buffer counts as a terminal")
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestRegistry(t *testing.T) {
	seen := map[string]bool{}
	for _, sp := range scenarios {
		if sp.key == "" || sp.title == "" || sp.blurb == "" || sp.run == nil || sp.verdict == nil {
			t.Errorf("scenario %q: every field of its spec must be set", sp.key)
		}
		if seen[sp.key] {
			t.Errorf("scenario %q registered twice", sp.key)
		}
		seen[sp.key] = true
	}
}

func TestNiceAxis(t *testing.T) {
	for _, tc := range []struct{ v, top, step float64 }{
		{25, 25, 5}, {19, 20, 5}, {2100, 2500, 500}, {3450, 4000, 1000}, {0.8, 0.8, 0.2}, {7, 8, 2}, {1, 1, 0.2}, {12, 15, 5},
	} {
		top, step := niceAxis(tc.v, 4)
		if math.Abs(top-tc.top) > 1e-9 || math.Abs(step-tc.step) > 1e-9 {
			t.Errorf("niceAxis(%g, 4) = %g, %g; want %g, %g", tc.v, top, step, tc.top, tc.step)
		}
	}
}

func TestStallNote(t *testing.T) {
	defer longestStall.Store(0)
	longestStall.Store(0)
	noteStall(40 * time.Millisecond)
	if n := stallNote(); n != "" {
		t.Errorf("a 40 ms gap gave a note: %q", n)
	}
	noteStall(350 * time.Millisecond)
	noteStall(120 * time.Millisecond)
	if n := stallNote(); !strings.Contains(n, "350ms") {
		t.Errorf("the longest gap was 350 ms; the note says %q", n)
	}
}

func TestRoundUp(t *testing.T) {
	for _, tc := range []struct{ d, want time.Duration }{
		{37400 * time.Microsecond, 38 * time.Millisecond},
		{37600 * time.Microsecond, 38 * time.Millisecond},
		{38 * time.Millisecond, 38 * time.Millisecond},
	} {
		if got := roundUp(tc.d, time.Millisecond); got != tc.want || got < tc.d {
			t.Errorf("roundUp(%v) = %v, want %v (never below)", tc.d, got, tc.want)
		}
	}
}

// citations are phrases that point at documents a reader of the report
// cannot open; the lab cites public sources by name instead.
var citations = []string{"reference note", "the note", "the book", "Tuesday"}

// goIdent matches a Go identifier a heading should not show: camelCase
// (protectedTaxClient) or a qualified field (Outlier.Disabled).
var goIdent = regexp.MustCompile(`\b[a-z]+[A-Z][A-Za-z]*\b|\b[A-Z][a-z]+\.[A-Z][A-Za-z]*\b`)

// notIdents are names spelled like identifiers that are a protocol's own
// name, not Go's, and that a heading may show.
var notIdents = strings.NewReplacer("gRPC", "")

// TestReportInChromium opens the report in headless Chromium and checks
// the DOM it built: a verdict at the top and in every scenario's section,
// at least two series with data in every chart, headings without Go
// identifiers, and no text citing a document absent from the repository.
// CI installs Chromium; where it is absent the test is skipped and says
// so.
func TestReportInChromium(t *testing.T) {
	const chromium = "/usr/bin/chromium"
	if _, err := os.Stat(chromium); err != nil {
		t.Skip("skipped: " + chromium + " not found, so the HTML report was not checked in a browser")
	}
	path := report(t).html
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, chromium,
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir="+t.TempDir(), "--dump-dom", "file://"+path)
	cmd.WaitDelay = 5 * time.Second
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium: %v\n%s", err, stderr.String())
	}
	dom := string(out)
	if !strings.Contains(dom, "<polyline") {
		t.Fatalf("chromium's DOM has no <polyline>: the charts drew no lines")
	}

	// The verdicts first: one per scenario before the first section.
	first := strings.Index(dom, `<section class="scenario"`)
	if first < 0 {
		t.Fatalf("chromium's DOM has no scenario section:\n%.2000s", dom)
	}
	if n := strings.Count(dom[:first], ">Verdict: "); n != len(scenarios) {
		t.Errorf("%d verdicts at the top of the page, want %d (one per scenario)", n, len(scenarios))
	}
	sections := strings.Split(dom[first:], `<section class="scenario"`)[1:]
	if len(sections) != len(scenarios) {
		t.Errorf("%d scenario sections, want %d", len(sections), len(scenarios))
	}
	points := regexp.MustCompile(`<polyline[^>]* points="([^"]*)"`)
	for k, sec := range sections {
		key := fmt.Sprint(k + 1)
		if m := regexp.MustCompile(`id="([^"]+)"`).FindStringSubmatch(sec); m != nil {
			key = m[1]
		}
		if !regexp.MustCompile(`<p class="verdict">Verdict: [^<]*[0-9]`).MatchString(sec) {
			t.Errorf("section %s has no verdict with a figure", key)
		}
		svgs := strings.Split(sec, "<svg")[1:]
		if len(svgs) == 0 {
			t.Errorf("section %s has no chart", key)
		}
		for i, svg := range svgs {
			svg = svg[:strings.Index(svg, "</svg>")]
			withData := 0
			for _, m := range points.FindAllStringSubmatch(svg, -1) {
				if len(strings.Fields(m[1])) >= 2 {
					withData++
				}
			}
			if withData < 2 {
				t.Errorf("section %s, chart %d: %d series with data, want at least 2 (plain and bulwark on the same axes)", key, i+1, withData)
			}
		}
		for _, m := range regexp.MustCompile(`<h[23][^>]*>([^<]*)</h[23]>`).FindAllStringSubmatch(sec, -1) {
			if id := goIdent.FindString(notIdents.Replace(m[1])); id != "" {
				t.Errorf("section %s: heading %q shows the Go identifier %q", key, m[1], id)
			}
		}
	}
	text := html.UnescapeString(regexp.MustCompile(`<[^>]*>`).ReplaceAllString(dom, " "))
	for _, c := range citations {
		if i := strings.Index(strings.ToLower(text), strings.ToLower(c)); i >= 0 {
			t.Errorf("the page cites a document absent from the repository (%q): …%s…", c, text[max(0, i-60):min(len(text), i+60)])
		}
	}
}

func TestChainRetriesAtOneLayer(t *testing.T) { inBubble(t, testChainRetriesAtOneLayer) }

// testChainRetriesAtOneLayer is issue 30's lab scenario, three services in
// a chain at 200 req/s, the figures of the issue asserted: with bulwark
// at every tier tax receives at most 1.3 requests per call offered during
// the blip, and the gateway answers ≥ 99 % of calls from 1.5 s after it and
// ≥ 90 % over the 4 s after it. The mechanism first: the plain clients'
// retries multiply at every tier (up to 27 at tax per call), and bulwark's
// checkout passes its failures up marked, so the gateway's client sees
// them as such.
func testChainRetriesAtOneLayer(t *testing.T) {
	l := testLab(settings{scale: 0.25, load: 200})
	sc := runScenario(t, l, (*lab).chain)
	plain, bw := byShort(t, sc, "plain").metrics, byShort(t, sc, "bulwark").metrics
	if plain["load_blip"] < 9 {
		t.Errorf("plain clients: tax received %.1f requests per call offered during the blip, want ≥ 9 (retries multiplied at every tier)", plain["load_blip"])
	}
	if bw["passed_up"] == 0 {
		t.Error("bulwark: no failure came up to the gateway's client marked as passed up")
	}
	if bw["load_blip"] > 1.3 {
		t.Errorf("bulwark: tax received %.2f requests per call offered during the blip, want ≤ 1.3", bw["load_blip"])
	}
	if bw["ok_late"] < 0.99 {
		t.Errorf("bulwark: %.1f %% answered from 1.5 s after the blip, want ≥ 99 %%", 100*bw["ok_late"])
	}
	if bw["ok_after"] < 0.90 {
		t.Errorf("bulwark: %.1f %% answered over the 4 s after the blip, want ≥ 90 %%", 100*bw["ok_after"])
	}
}

func TestTuesdayGRPCProtectsOrders(t *testing.T) { inBubble(t, testTuesdayGRPCProtectsOrders) }

// testTuesdayGRPCProtectsOrders: the slow tax service called over gRPC,
// at the lab's own settings (as testTuesdayProtectsOrders): the plain
// channel's slow calls hold checkout's workers and GET /orders fails with
// them; bulwark's interceptor at zero config keeps at least 99 % of GET
// /orders answered while tax is sick and lets at most 120 calls reach it.
func testTuesdayGRPCProtectsOrders(t *testing.T) {
	l := testLab(settings{scale: 0.25, load: 400})
	sc := runScenario(t, l, tuesdayGRPCSpec.run)
	plain, prot := byShort(t, sc, "plain"), byShort(t, sc, "bulwark")
	if ph := plain.metrics["held"]; ph < 0.9 {
		t.Errorf("most checkout workers waiting on tax at once: plain channel %.0f%%; want ≥ 90%% (the pool drained)", 100*ph)
	}
	if h := prot.metrics["held"]; h > 0.5 {
		t.Errorf("most checkout workers waiting on tax at once: bulwark %.0f%%; want ≤ 50%%", 100*h)
	}
	if po := plain.metrics["orders_sick"]; po > 0.9 {
		t.Errorf("the plain channel kept GET /orders at %.1f%% ok while tax was sick: the scenario did not drain its pool", 100*po)
	}
	if o := prot.metrics["orders_sick"]; o < 0.99 {
		t.Errorf("bulwark with zero config kept GET /orders at %.1f%% ok while tax was sick; want ≥ 99%%", 100*o)
	}
	if n := prot.metrics["tax_sick"]; n > 120 {
		t.Errorf("bulwark with zero config let %.0f calls reach tax while it was sick; want ≤ 120", n)
	}
	if open := prot.metrics["breaker_open_sick"]; open < 0.2 {
		t.Errorf("bulwark's breaker open for %.1f%% of the sick period; want at least 20%%", 100*open)
	}
	sc.key = tuesdayGRPCSpec.key
	t.Log("Verdict: " + tuesdayGRPCSpec.verdict(sc))
}
