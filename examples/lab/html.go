package main

import (
	"fmt"
	"html"
	"io"
	"math"
	"strings"
	"time"
)

// The HTML report is one self-contained file: inline CSS and SVG, no
// scripts, no fonts, nothing fetched from a network.

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"}

func writeHTML(w io.Writer, set settings, scs []*scenario, at time.Time) error {
	var b strings.Builder
	b.WriteString(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>bulwark resilience lab</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:2em auto;max-width:960px;color:#222}
h2{border-bottom:1px solid #ccc;margin-top:2em}
table{border-collapse:collapse;margin:.5em 0}td,th{padding:2px 8px;text-align:right;border-bottom:1px solid #eee}
td:first-child,th:first-child{text-align:left}
.note{color:#666}svg{display:block;margin:.3em 0 1em}
</style></head><body>
<h1>bulwark resilience lab</h1>
`)
	fmt.Fprintf(&b, "<p class=\"note\">Measured on this machine at %s, on 127.0.0.1. Time is scaled ×%g: every duration of the scenarios (40 ms, 10 s, a 2 s blip, 100 s) is multiplied by it. Load: %.0f req/s per run.</p>\n",
		html.EscapeString(at.Format(time.RFC3339)), set.scale, set.load)
	for _, sc := range scs {
		fmt.Fprintf(&b, "<h2 id=\"%s\">%s</h2>\n", sc.key, html.EscapeString(sc.title))
		for _, line := range sc.intro {
			fmt.Fprintf(&b, "<p>%s</p>\n", html.EscapeString(line))
		}
		headlineTable(&b, sc)
		// One y scale for every load chart of a scenario, so runs compare
		// at a glance.
		loadMax := 1.0
		for _, r := range sc.runs {
			for _, s := range r.tl.order {
				if s.kind == kindLoad {
					loadMax = max(loadMax, seriesMax(s, r.tl.at(sc.length), r.tl.width))
				}
			}
		}
		loadMax = niceCeil(loadMax)
		// Latency and gauge charts share a scale across runs the same way.
		latMax, gaugeMax := 1.0, 4.0
		for _, r := range sc.runs {
			for _, s := range r.tl.order {
				switch s.kind {
				case kindP99, kindP50:
					latMax = max(latMax, seriesMax(s, r.tl.at(sc.length), r.tl.width))
				case kindGauge:
					gaugeMax = max(gaugeMax, seriesMax(s, r.tl.at(sc.length), r.tl.width))
				}
			}
		}
		latMax, gaugeMax = niceCeil(latMax), 4*math.Ceil(gaugeMax/4)
		if len(sc.runs) > 2 {
			// Many runs: first the storm's own picture, one row per run of
			// what the upstream received.
			for _, s0 := range sc.runs[0].tl.order {
				if s0.kind != kindLoad || !s0.spark {
					continue
				}
				var ls []line
				for _, r := range sc.runs {
					ls = append(ls, line{r.short, r.tl.get(s0.name)})
				}
				fmt.Fprintf(&b, "<h3>%s, every run</h3>\n", html.EscapeString(s0.name))
				chart(&b, sc, sc.runs[0].tl, ls, "req/s", loadMax)
			}
		}
		for _, r := range sc.runs {
			fmt.Fprintf(&b, "<h3>%s</h3>\n", html.EscapeString(r.name))
			for _, n := range r.notes {
				fmt.Fprintf(&b, "<p class=\"note\">%s</p>\n", html.EscapeString(n))
			}
			var loads, rates, lats, gauges []line
			for _, s := range r.tl.order {
				switch {
				case s.kind == kindLoad:
					loads = append(loads, line{s.name, s})
				case s.kind == kindRate && (s.spark || s.table) && !s.empty():
					rates = append(rates, line{s.name, s})
				case s.kind == kindGauge:
					gauges = append(gauges, line{s.name, s})
				case (s.kind == kindP50 || s.kind == kindP99) && s.spark:
					lats = append(lats, line{s.name, s})
				}
			}
			chart(&b, sc, r.tl, loads, "req/s", loadMax)
			unit := "success %"
			if r.tl.get("breaker open") != nil && !r.tl.get("breaker open").empty() {
				unit = "ok % · open %"
			}
			chart(&b, sc, r.tl, rates, unit, 1)
			chart(&b, sc, r.tl, lats, "ms", latMax)
			chart(&b, sc, r.tl, gauges, "instances", gaugeMax)
		}
	}
	b.WriteString("</body></html>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func headlineTable(b *strings.Builder, sc *scenario) {
	if len(sc.runs) == 0 {
		return
	}
	b.WriteString("<table><tr><th></th>")
	for _, r := range sc.runs {
		fmt.Fprintf(b, "<th>%s</th>", html.EscapeString(r.short))
	}
	b.WriteString("</tr>\n")
	for k, st := range sc.runs[0].headline {
		fmt.Fprintf(b, "<tr><td>%s</td>", html.EscapeString(st.label))
		for _, r := range sc.runs {
			v := ""
			if k < len(r.headline) {
				v = r.headline[k].value
			}
			fmt.Fprintf(b, "<td>%s</td>", html.EscapeString(v))
		}
		b.WriteString("</tr>\n")
	}
	b.WriteString("</table>\n")
}

// line is one labelled polyline of a chart.
type line struct {
	label string
	s     *series
}

// seriesMax is the largest bucket value of s among the first n.
func seriesMax(s *series, n int, width time.Duration) float64 {
	m := 0.0
	for i := range min(n, len(s.num)) {
		v, _ := s.value(i, i+1, width)
		m = max(m, v)
	}
	return m
}

// chart draws lines over the scenario's length as an inline SVG line
// chart from 0 to ymax, shading the scenario's marks. Rates (ymax 1) are
// labelled in per cent.
func chart(b *strings.Builder, sc *scenario, tl *timeline, ls []line, unit string, ymax float64) {
	if len(ls) == 0 {
		return
	}
	const (
		W, H         = 900.0, 180.0
		left, right  = 50.0, 170.0
		top, bottom  = 10.0, 25.0
		plotW, plotH = W - left - right, H - top - bottom
	)
	n := tl.at(sc.length)
	rate := ls[0].s.kind == kindRate
	x := func(i float64) float64 { return left + plotW*i/float64(max(n, 1)) }
	y := func(v float64) float64 { return top + plotH*(1-min(v, ymax)/ymax) }
	fmt.Fprintf(b, "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" role=\"img\" aria-label=\"%s\">\n",
		W, H, W, H, html.EscapeString(unit))
	for _, m := range sc.marks {
		x0, x1 := x(float64(m.from)/float64(tl.width)), x(float64(m.to)/float64(tl.width))
		fmt.Fprintf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#fdd\"/><text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" fill=\"#a33\">%s</text>\n",
			x0, top, max(x1-x0, 1), plotH, x0+2, top+10, html.EscapeString(m.label))
	}
	for k := 0; k <= 4; k++ {
		v := ymax * float64(k) / 4
		label := fmt.Sprintf("%.0f", v)
		if rate {
			label = fmt.Sprintf("%.0f%%", 100*v)
		}
		fmt.Fprintf(b, "<line x1=\"%.0f\" x2=\"%.0f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/><text x=\"%.0f\" y=\"%.1f\" font-size=\"10\" text-anchor=\"end\">%s</text>\n",
			left, left+plotW, y(v), y(v), left-4, y(v)+3, label)
	}
	for s := 0; s <= int(sc.length/time.Second); s++ {
		xs := x(float64(time.Duration(s)*time.Second) / float64(tl.width))
		fmt.Fprintf(b, "<text x=\"%.1f\" y=\"%.0f\" font-size=\"10\" text-anchor=\"middle\">%ds</text>\n", xs, H-8, s)
	}
	for k, l := range ls {
		var pts strings.Builder
		for i := range n {
			v, ok := l.s.value(i, i+1, tl.width)
			if !ok {
				continue
			}
			fmt.Fprintf(&pts, "%.1f,%.1f ", x(float64(i)+0.5), y(v))
		}
		color := palette[k%len(palette)]
		fmt.Fprintf(b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"%s\"/>\n", color, strings.TrimSpace(pts.String()))
		fmt.Fprintf(b, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"11\" fill=\"%s\">%s</text>\n", left+plotW+8, top+12+14*float64(k), color, html.EscapeString(l.label))
	}
	fmt.Fprintf(b, "<text x=\"%.0f\" y=\"%.0f\" font-size=\"10\" fill=\"#666\">%s</text>\n", left+plotW+8, top+plotH, unit)
	b.WriteString("</svg>\n")
}

// niceCeil rounds v up to a round number for an axis: 1, 1.5, 2, 2.5, 3,
// 4, 5, 6 or 8 times a power of ten.
func niceCeil(v float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 1.5, 2, 2.5, 3, 4, 5, 6, 8} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}
