package main

import (
	"fmt"
	"strings"
	"testing"
)

// synthetic is go test -bench output, three samples a benchmark, with
// medians chosen so that each target is met at one -cpu and not at the
// other (bulwark's -cpu scaling is met, open-breaker allocs are not).
const synthetic = `goos: linux
BenchmarkCtxBase/bare         	100	1000 ns/op	464 B/op	6 allocs/op
BenchmarkCtxBase/bare         	100	 900 ns/op	464 B/op	6 allocs/op
BenchmarkCtxBase/bare         	100	1100 ns/op	464 B/op	6 allocs/op
BenchmarkCtxBase/bare-2       	100	 500 ns/op	464 B/op	6 allocs/op
BenchmarkCtxBase/bare-2       	100	 500 ns/op	464 B/op	6 allocs/op
BenchmarkCtxBase/bare-2       	100	 500 ns/op	464 B/op	6 allocs/op
BenchmarkCtxBase/floor        	100	2000 ns/op	999 B/op	16 allocs/op
BenchmarkCtxBase/floor        	100	2000 ns/op	999 B/op	16 allocs/op
BenchmarkCtxBase/floor        	100	9000 ns/op	999 B/op	16 allocs/op
BenchmarkCtxBase/floor-2      	100	1500 ns/op	999 B/op	16 allocs/op
BenchmarkCtxBase/floor-2      	100	1500 ns/op	999 B/op	16 allocs/op
BenchmarkCtxBase/floor-2      	100	1500 ns/op	999 B/op	16 allocs/op
BenchmarkCtxBase/bulwark      	100	2100 ns/op	999 B/op	12 allocs/op
BenchmarkCtxBase/bulwark      	100	2100 ns/op	999 B/op	12 allocs/op
BenchmarkCtxBase/bulwark      	100	2100 ns/op	999 B/op	12 allocs/op
BenchmarkCtxBase/bulwark-2    	100	1700 ns/op	999 B/op	12 allocs/op
BenchmarkCtxBase/bulwark-2    	100	1700 ns/op	999 B/op	12 allocs/op
BenchmarkCtxBase/bulwark-2    	100	1700 ns/op	999 B/op	12 allocs/op
BenchmarkCtxBase/failsafe-go  	100	3300 ns/op	999 B/op	50 allocs/op
BenchmarkCtxBase/failsafe-go  	100	3300 ns/op	999 B/op	50 allocs/op
BenchmarkCtxBase/failsafe-go  	100	3300 ns/op	999 B/op	50 allocs/op
BenchmarkCtxBase/failsafe-go-2	100	2800 ns/op	999 B/op	50 allocs/op
BenchmarkCtxBase/failsafe-go-2	100	2800 ns/op	999 B/op	50 allocs/op
BenchmarkCtxBase/failsafe-go-2	100	2800 ns/op	999 B/op	50 allocs/op
BenchmarkLoopbackPaired/background/bulwark  	100	70000 ns/op	33000 bare-ns/req	34000 stack-ns/req	1.030 stack/bare	999 B/op	20 allocs/op
BenchmarkLoopbackPaired/background/floor    	100	70000 ns/op	33000 bare-ns/req	34000 stack-ns/req	1.020 stack/bare	999 B/op	20 allocs/op
BenchmarkLoopbackPaired/background/bulwark-2	100	70000 ns/op	33000 bare-ns/req	34000 stack-ns/req	1.100 stack/bare	999 B/op	20 allocs/op
BenchmarkLoopbackPaired/background/floor-2  	100	70000 ns/op	33000 bare-ns/req	34000 stack-ns/req	1.050 stack/bare	999 B/op	20 allocs/op
BenchmarkOpenBreaker/bulwark  	100	 120 ns/op	0 B/op	0 allocs/op
BenchmarkOpenBreaker/bulwark-2	100	 140 ns/op	16 B/op	1 allocs/op
BenchmarkHedgeCost/off        	100	2000 ns/op	999 B/op	17 allocs/op
BenchmarkHedgeCost/quantile   	100	2080 ns/op	999 B/op	17 allocs/op
BenchmarkHedgeCost/paired     	100	4100 ns/op	80 added-ns/req	2080 hedge-ns/req	2000 off-ns/req	999 B/op	34 allocs/op
BenchmarkHedgeCost/off-2      	100	1000 ns/op	999 B/op	17 allocs/op
BenchmarkHedgeCost/quantile-2 	100	1200 ns/op	999 B/op	17 allocs/op
BenchmarkHedgeCost/paired-2   	100	2200 ns/op	200 added-ns/req	1200 hedge-ns/req	1000 off-ns/req	999 B/op	34 allocs/op
PASS
`

func TestEvalTargets(t *testing.T) {
	samples, err := parse(strings.NewReader(synthetic))
	if err != nil {
		t.Fatal(err)
	}
	type key struct{ what, cpu string }
	got := map[key]target{}
	for _, tg := range evalTargets(samples) {
		got[key{tg.what, tg.cpu}] = tg
	}
	const (
		floorT   = "ctx base: bulwark adds ≤ 1.1 × floor's ns, ≤ floor's allocs"
		bgT      = "loopback (background): bulwark ÷ bare ≤ floor ÷ bare + 0.02"
		cancelT  = "loopback (cancelable): bulwark ÷ bare ≤ floor ÷ bare + 0.02"
		peerT    = "ctx base: failsafe-go adds ≥ 2 × bulwark's ns"
		scaleT   = "ctx base: bulwark ns/op at -cpu 2 ≤ at -cpu 1"
		breakerT = "open breaker, full stack: ≤ 150 ns, 0 allocs"
		hedgeT   = "hedge scheduler, no hedge fired: ≤ 100 ns, 0 allocs added"
	)
	want := []struct {
		what, cpu string
		met       bool
		measured  string // "" = any but notMeasured
	}{
		// -cpu 1: bare 1000, floor 2000 (+1000, +10), bulwark 2100 (+1100, +6).
		{floorT, "1", true, "bulwark +1100 ns, +6 allocs; floor +1000 ns, +10 allocs; ns ratio 1.10"},
		// -cpu 2: floor +1000, bulwark +1200: 1.2 × the floor's.
		{floorT, "2", false, ""},
		{bgT, "1", true, "bulwark 1.030; floor 1.020"},
		{bgT, "2", false, "bulwark 1.100; floor 1.050"},
		{cancelT, "1", false, notMeasured},
		{cancelT, "2", false, notMeasured},
		// failsafe-go +2300 vs bulwark +1100 at 1; +2300 vs +1200 at 2 is < 2.4.
		{peerT, "1", true, ""},
		{peerT, "2", false, ""},
		{scaleT, "1, 2", true, "2100 ns at 1; 1700 ns at 2"},
		{breakerT, "1", true, "120 ns, 0 allocs"},
		{breakerT, "2", false, "140 ns, 1 allocs"},
		{hedgeT, "1", true, "+80 ns, +0 allocs"},
		{hedgeT, "2", false, "+200 ns, +0 allocs"},
	}
	if len(got) != len(want) {
		t.Errorf("%d targets, want %d", len(got), len(want))
	}
	for _, w := range want {
		g, ok := got[key{w.what, w.cpu}]
		switch {
		case !ok:
			t.Errorf("%s at %s: missing", w.what, w.cpu)
		case g.met != w.met:
			t.Errorf("%s at %s: met %v, want %v (%s)", w.what, w.cpu, g.met, w.met, g.measured)
		case w.measured != "" && g.measured != w.measured:
			t.Errorf("%s at %s: measured %q, want %q", w.what, w.cpu, g.measured, w.measured)
		case w.measured == "" && g.measured == notMeasured:
			t.Errorf("%s at %s: not measured", w.what, w.cpu)
		}
	}
}

// TestTargetsRender: the section names every target with its verdict and
// carries the stub only as a reference.
func TestTargetsRender(t *testing.T) {
	samples, err := parse(strings.NewReader(synthetic + "BenchmarkStub/bare 100 100 ns/op 1 B/op 4 allocs/op\nBenchmarkStub/bulwark 100 300 ns/op 1 B/op 8 allocs/op\nBenchmarkStub/failsafe-go 100 900 ns/op 1 B/op 50 allocs/op\n"))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	targets(func(f string, a ...any) { fmt.Fprintf(&b, f, a...) }, samples)
	out := b.String()
	for _, s := range []string{
		"| ctx base: bulwark adds ≤ 1.1 × floor's ns, ≤ floor's allocs | 1 | bulwark +1100 ns, +6 allocs; floor +1000 ns, +10 allocs; ns ratio 1.10 | met |",
		"| open breaker, full stack: ≤ 150 ns, 0 allocs | 2 | 140 ns, 1 allocs | not met |",
		"Reference, not a target: on the never-waits stub (BenchmarkStub, -cpu 1) bulwark adds +200 ns, +4 allocs",
		"| BenchmarkLoopbackPaired/background/floor-2 | 33000 | 34000 | 1.050 |",
	} {
		if !strings.Contains(out, s) {
			t.Errorf("missing %q in\n%s", s, out)
		}
	}
}

// TestFleetSection: fleetlab's section goes in as written; output that is
// not one (a failed run) says so instead of vanishing.
func TestFleetSection(t *testing.T) {
	md := "## Fleet (redisfleet/cmd/fleetlab: 8 OS processes)\n\n| mode | reach req/s |\n|---|---:|\n| shared | 100.0 |\n\n"
	if got := fleetSection(md); got != strings.TrimSpace(md)+"\n" {
		t.Errorf("fleetSection(section) = %q, want it as written", got)
	}
	for _, bad := range []string{"", "fleetlab: redis-server not installed\n", "# Fleet\n"} {
		if got := fleetSection(bad); !strings.HasPrefix(got, "## Fleet") || !strings.Contains(got, "No figures") {
			t.Errorf("fleetSection(%q) = %q, want a section saying there are no figures", bad, got)
		}
	}
}

// TestAdaptiveSection: the -adaptive input is carried verbatim under its
// heading, and BenchmarkAdaptiveCost's paired medians are held to the
// ≤ 100 ns, 0 allocs target per adaptive layer (what adaptivity adds to
// the bulkhead, and the throttle; the rest are for reference).
func TestAdaptiveSection(t *testing.T) {
	const tables = "### Capacity drop: cores 40 → 10 → 40\n\n| stack | phase |\n|---|---|\n| bulwark adaptive 1..100 | 10 cores |\n"
	samples, err := parse(strings.NewReader(`BenchmarkAdaptiveCost/bulkhead-adaptive-vs-fixed 100 2000 ns/op 0 added-allocs/req 60 added-ns/req 1060 with-ns/req 1000 without-ns/req 900 B/op 12 allocs/op
BenchmarkAdaptiveCost/bulkhead-adaptive-vs-fixed 100 2000 ns/op 0 added-allocs/req 80 added-ns/req 1080 with-ns/req 1000 without-ns/req 900 B/op 12 allocs/op
BenchmarkAdaptiveCost/bulkhead-adaptive-vs-fixed 100 2000 ns/op 0 added-allocs/req 500 added-ns/req 1500 with-ns/req 1000 without-ns/req 900 B/op 12 allocs/op
BenchmarkAdaptiveCost/throttle-2 100 2000 ns/op 1 added-allocs/req 90 added-ns/req 1090 with-ns/req 1000 without-ns/req 900 B/op 12 allocs/op
BenchmarkAdaptiveCost/bulkhead-fixed 100 2000 ns/op 1 added-allocs/req 150 added-ns/req 1150 with-ns/req 1000 without-ns/req 900 B/op 12 allocs/op
BenchmarkAdaptiveCost/failsafe-adaptivelimiter 100 2000 ns/op 20 added-allocs/req 2000 added-ns/req 3000 with-ns/req 1000 without-ns/req 900 B/op 12 allocs/op
BenchmarkAdaptiveCost/bulkhead-adaptive 100 2000 ns/op 1 added-allocs/req 300 added-ns/req 1300 with-ns/req 1000 without-ns/req 900 B/op 12 allocs/op
BenchmarkCtxBase/bare 100 1000 ns/op 464 B/op 6 allocs/op
`))
	if err != nil {
		t.Fatal(err)
	}
	out := adaptiveSection(tables, samples)
	for _, s := range []string{
		"## Adaptive limits and throttling (bench/cmd/adaptive, 127.0.0.1)",
		tables,
		// The median of 60, 80 and 500.
		"| BenchmarkAdaptiveCost/bulkhead-adaptive-vs-fixed | 1000 | 1080 | 80 | 0 | met |",
		"| BenchmarkAdaptiveCost/throttle-2 | 1000 | 1090 | 90 | 1 | not met |",
		"| BenchmarkAdaptiveCost/bulkhead-fixed | 1000 | 1150 | 150 | 1 | — |",
		"| BenchmarkAdaptiveCost/failsafe-adaptivelimiter | 1000 | 3000 | 2000 | 20 | — |",
		"| BenchmarkAdaptiveCost/bulkhead-adaptive | 1000 | 1300 | 300 | 1 | — |",
	} {
		if !strings.Contains(out, s) {
			t.Errorf("missing %q in\n%s", s, out)
		}
	}
	if strings.Contains(out, "BenchmarkCtxBase") {
		t.Errorf("the section lists a benchmark other than BenchmarkAdaptiveCost:\n%s", out)
	}
	// Without cost samples, the tables alone.
	if out := adaptiveSection(tables, nil); strings.Contains(out, "### Cost per adaptive layer") || !strings.Contains(out, tables) {
		t.Errorf("without samples:\n%s", out)
	}
}
