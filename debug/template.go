package debug

import (
	_ "embed"
	"fmt"
	"html/template"
	"reflect"
	"strings"
	"time"

	"github.com/bulwark-http/bulwark"
)

// page.html reads the Snapshot's fields directly: showing a new field of a
// layer's snapshot type takes a line there and nothing here. The funcs
// below only derive what a template cannot (charts, sums, units).
//
//go:embed page.html
var pageHTML string

var pageTemplate = template.Must(template.New("page").Funcs(template.FuncMap{
	"spark":    spark,
	"sum":      sum,
	"ts":       func(t time.Time) string { return t.UTC().Format("15:04:05.000") },
	"pct":      func(p float64) float64 { return 100 * p },
	"ms":       func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) },
	"priority": func(i int) string { return bulwark.Priority(i).String() },
}).Parse(pageHTML))

// The sparkline's size, in SVG user units.
const sparkW, sparkH = 240.0, 40.0

// sparkline is a host's chart as page.html draws it: N samples, In and Fail
// as SVG polyline point lists ("" for a line not drawn).
type sparkline struct {
	In, Fail string
	N        int
}

// spark draws h's history: requests in flight (scaled to their peak, or the
// bulkhead's limit if larger) and the breaker window's failure share
// (scaled to 100 %, and not drawn without a breaker).
func spark(h bulwark.HostSnapshot, hist History) sparkline {
	n := len(hist.Samples)
	if n == 0 {
		return sparkline{}
	}
	peak := 1
	if h.Bulkhead != nil {
		peak = max(peak, h.Bulkhead.Limit)
	}
	for _, s := range hist.Samples {
		peak = max(peak, s.InFlight)
	}
	var a, b strings.Builder
	for i, s := range hist.Samples {
		x := sparkW
		if n > 1 {
			x = float64(i) * sparkW / float64(n-1)
		}
		fmt.Fprintf(&a, "%.1f,%.1f ", x, sparkY(float64(s.InFlight)/float64(peak)))
		share := 0.0
		if s.Calls > 0 {
			share = float64(s.Failures) / float64(s.Calls)
		}
		fmt.Fprintf(&b, "%.1f,%.1f ", x, sparkY(share))
	}
	sl := sparkline{In: strings.TrimSpace(a.String()), N: n}
	if h.Breaker != nil {
		sl.Fail = strings.TrimSpace(b.String())
	}
	return sl
}

// sparkY is the height of a share (0 to 1) of the chart, 2 units in from
// each edge so a line at either bound is not hidden by the border.
func sparkY(share float64) float64 { return sparkH - 2 - share*(sparkH-4) }

// sum adds up the unsigned counters of a struct of counts by kind
// (bulwark.HedgeSkips, bulwark.FaultCounts), for a total on the page. It
// reads every field rather than naming them, so a kind added to one of
// those types is counted with no change here.
func sum(counts any) uint64 {
	v := reflect.ValueOf(counts)
	var n uint64
	for i := range v.NumField() {
		if f := v.Field(i); f.CanUint() {
			n += f.Uint()
		}
	}
	return n
}
