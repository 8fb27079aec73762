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
// scripts, no fonts, nothing fetched from a network. It opens with every
// scenario's verdict; each section then has one chart per metric, with
// every run of the scenario on the same axes.

// Line styles by position in a chart: the first run (the plain client)
// wide, solid and red; later ones narrower, dashed, in other colours, so
// that a line lying on another stays visible.
var (
	palette = []string{"#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf"}
	dashes  = []string{"", "7,4", "2,3", "10,3,2,3", "5,2", "1,3", "12,4"}
	widths  = []float64{3.5, 2, 2, 2, 2, 2, 2}
)

func writeHTML(w io.Writer, set settings, scs []*scenario, at time.Time) error {
	var b strings.Builder
	b.WriteString(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>bulwark resilience lab</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em auto;max-width:980px;color:#222}
h2{border-bottom:1px solid #ccc;margin-top:1.6em}h3{margin:.8em 0 0;font-size:14px}
table{border-collapse:collapse;margin:.5em 0}td,th{padding:2px 8px;text-align:right;border-bottom:1px solid #eee}
td:first-child,th:first-child{text-align:left}
.note{color:#666}.verdict{font-weight:600;background:#f3f7ee;padding:.3em .6em;border-left:4px solid #2ca02c}
p{margin:.4em 0}svg{display:block;margin:.2em 0 .4em}
.charts{display:grid;grid-template-columns:1fr 1fr;gap:0 16px}figure{margin:0}
</style></head><body>
<h1>bulwark resilience lab</h1>
`)
	fmt.Fprintf(&b, "<p class=\"note\">Measured on this machine at %s, on 127.0.0.1. Time is scaled ×%g: every duration of the scenarios (40 ms, 10 s, a 2 s blip, 100 s) is multiplied by it. Load: %.0f req/s per run.</p>\n",
		html.EscapeString(at.Format(time.RFC3339)), set.scale, set.load)
	b.WriteString("<section class=\"verdicts\">\n")
	for _, sc := range scs {
		if v := verdictLine(sc); v != "" {
			fmt.Fprintf(&b, "<p class=\"verdict\" data-scenario=\"%s\">%s <span class=\"note\">(%s)</span></p>\n", sc.key, html.EscapeString(v), html.EscapeString(sc.title))
		}
	}
	if len(scs) > 1 {
		fmt.Fprintf(&b, "<p class=\"note\">%s</p>\n", html.EscapeString(fleetPointer))
	}
	b.WriteString("</section>\n")
	for _, sc := range scs {
		fmt.Fprintf(&b, "<section class=\"scenario\" id=\"%s\">\n<h2>%s</h2>\n", sc.key, html.EscapeString(sc.title))
		if v := verdictLine(sc); v != "" {
			fmt.Fprintf(&b, "<p class=\"verdict\">%s</p>\n", html.EscapeString(v))
		}
		for _, line := range sc.intro {
			fmt.Fprintf(&b, "<p class=\"note\">%s</p>\n", html.EscapeString(line))
		}
		headlineTable(&b, sc)
		b.WriteString("<div class=\"charts\">\n")
		for _, c := range charts(sc) {
			fmt.Fprintf(&b, "<figure><h3>%s</h3>\n", html.EscapeString(c.heading))
			chart(&b, sc, c)
			b.WriteString("</figure>\n")
		}
		b.WriteString("</div>\n")
		for _, e := range sc.explain {
			fmt.Fprintf(&b, "<p class=\"explain\">%s</p>\n", html.EscapeString(e))
		}
		for _, r := range sc.runs {
			for _, n := range r.notes {
				fmt.Fprintf(&b, "<p class=\"note\">%s</p>\n", html.EscapeString(n))
			}
		}
		b.WriteString("</section>\n")
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
		fmt.Fprintf(b, "<th title=\"%s\">%s</th>", html.EscapeString(r.name), html.EscapeString(r.short))
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
	var key []string
	for _, r := range sc.runs {
		key = append(key, r.short+" = "+r.name)
	}
	fmt.Fprintf(b, "<p class=\"note\">%s</p>\n", html.EscapeString(strings.Join(key, "; ")))
}

// line is one labelled polyline of a chart: a series of one run.
type line struct {
	label string
	s     *series
}

// chartSpec is one chart of a scenario: a metric, every run's series of
// it on the same axes.
type chartSpec struct {
	heading string
	kind    kind
	lines   []line
	merged  bool // holds more than one metric: labels name the metric too
}

// charts lays out a scenario's charts: one per metric (a series shown in
// the table or as a sparkline), with a line per run that measured it. A
// metric only one run has (bulwark's breaker) joins the last chart before
// it with the same unit, rather than standing alone.
func charts(sc *scenario) []chartSpec {
	if len(sc.runs) == 0 {
		return nil
	}
	// Every run's charted series, in the order first defined: a metric
	// only a later run measures (bulwark's limit) is charted too.
	var order []*series
	seen := map[string]bool{}
	for _, r := range sc.runs {
		for _, s := range r.tl.order {
			if (s.spark || s.table) && !seen[s.name] {
				seen[s.name] = true
				order = append(order, s)
			}
		}
	}
	var cs []chartSpec
	for _, s0 := range order {
		var ls []line
		for _, r := range sc.runs {
			if s := r.tl.get(s0.name); s != nil && !((s.kind == kindRate || s.kind == kindGauge) && s.empty()) {
				ls = append(ls, line{r.short, s})
			}
		}
		if len(ls) == 0 {
			continue
		}
		heading := s0.name
		if h, ok := sc.headings[s0.name]; ok {
			heading = h
		}
		last := len(cs) - 1
		for last >= 0 && !sameUnit(cs[last].kind, s0.kind) {
			last--
		}
		if len(ls) < 2 && last >= 0 {
			if !cs[last].merged {
				for i := range cs[last].lines {
					cs[last].lines[i].label += " " + cs[last].lines[i].s.name
				}
				cs[last].merged = true
			}
			for _, l := range ls {
				cs[last].lines = append(cs[last].lines, line{l.label + " " + s0.name, l.s})
			}
			continue
		}
		cs = append(cs, chartSpec{heading: heading, kind: s0.kind, lines: ls})
	}
	return cs
}

func sameUnit(a, b kind) bool {
	lat := func(k kind) bool { return k == kindP50 || k == kindP99 }
	return a == b || lat(a) && lat(b)
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

// chart draws a chart's lines over the scenario's length as an inline
// SVG, shading the scenario's marks, with a y axis from 0 in 1-2-5 steps.
// Rates are in per cent, 0 to 100.
func chart(b *strings.Builder, sc *scenario, c chartSpec) {
	const (
		W, H         = 480.0, 150.0 // two charts a row
		left, right  = 40.0, 142.0
		top, bottom  = 8.0, 22.0
		plotW, plotH = W - left - right, H - top - bottom
	)
	width := c.lines[0].s.width()
	n := int(sc.length / width)
	ymax, step := 1.0, 0.2
	if c.kind != kindRate {
		m := 0.0
		for _, l := range c.lines {
			m = max(m, seriesMax(l.s, n, width))
		}
		ymax, step = niceAxis(m, 4)
		if c.kind == kindGauge && step < 1 {
			ymax, step = math.Max(1, math.Ceil(ymax)), 1
		}
	}
	x := func(i float64) float64 { return left + plotW*i/float64(max(n, 1)) }
	y := func(v float64) float64 { return top + plotH*(1-min(v, ymax)/ymax) }
	fmt.Fprintf(b, "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" role=\"img\" aria-label=\"%s\">\n",
		W, H, W, H, html.EscapeString(c.heading))
	for _, m := range sc.marks {
		x0, x1 := x(float64(m.from)/float64(width)), x(float64(m.to)/float64(width))
		fmt.Fprintf(b, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#fdd\"/><text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" fill=\"#a33\">%s</text>\n",
			x0, top, max(x1-x0, 1), plotH, x0+2, top+10, html.EscapeString(m.label))
	}
	for k := 0; float64(k)*step <= ymax*(1+1e-9); k++ {
		v := float64(k) * step
		label := axisLabel(v, step)
		if c.kind == kindRate {
			label = fmt.Sprintf("%.0f%%", 100*v)
		}
		fmt.Fprintf(b, "<line x1=\"%.0f\" x2=\"%.0f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/><text x=\"%.0f\" y=\"%.1f\" font-size=\"10\" text-anchor=\"end\">%s</text>\n",
			left, left+plotW, y(v), y(v), left-4, y(v)+3, label)
	}
	_, xstep := niceAxis(sc.length.Seconds(), 6)
	xstep = math.Max(xstep, 0.5)
	for t := 0.0; t <= sc.length.Seconds()+1e-9; t += xstep {
		xs := x(t * float64(time.Second) / float64(width))
		fmt.Fprintf(b, "<text x=\"%.1f\" y=\"%.0f\" font-size=\"10\" text-anchor=\"middle\">%ss</text>\n", xs, H-8, axisLabel(t, xstep))
	}
	for k, l := range c.lines {
		var pts strings.Builder
		for i := range n {
			v, ok := l.s.value(i, i+1, width)
			if !ok {
				continue
			}
			fmt.Fprintf(&pts, "%.1f,%.1f ", x(float64(i)+0.5), y(v))
		}
		color, dash, sw := palette[k%len(palette)], dashes[k%len(dashes)], widths[k%len(widths)]
		da := ""
		if dash != "" {
			da = fmt.Sprintf(" stroke-dasharray=\"%s\"", dash)
		}
		fmt.Fprintf(b, "<polyline class=\"series\" fill=\"none\" stroke=\"%s\" stroke-width=\"%.1f\"%s stroke-opacity=\"0.9\" points=\"%s\"/>\n", color, sw, da, strings.TrimSpace(pts.String()))
		ly := top + 10 + 14*float64(k)
		fmt.Fprintf(b, "<line x1=\"%.0f\" x2=\"%.0f\" y1=\"%.0f\" y2=\"%.0f\" stroke=\"%s\" stroke-width=\"%.1f\"%s/><text x=\"%.0f\" y=\"%.0f\" font-size=\"10\" fill=\"%s\">%s</text>\n",
			left+plotW+6, left+plotW+24, ly-3, ly-3, color, sw, da, left+plotW+27, ly, color, html.EscapeString(l.label))
	}
	b.WriteString("</svg>\n")
}

// niceAxis returns an axis top at or above v and its step: the smallest
// step of 1, 2 or 5 times a power of ten that covers v in at most ticks+1
// steps.
func niceAxis(v float64, ticks int) (top, step float64) {
	if !(v > 0) {
		return 1, 0.25
	}
	p := math.Pow(10, math.Floor(math.Log10(v/float64(ticks+1))))
	for _, m := range []float64{1, 2, 5, 10, 20} {
		step = m * p
		if math.Ceil(v/step-1e-9) <= float64(ticks+1) {
			break
		}
	}
	return step * math.Ceil(v/step-1e-9), step
}

// axisLabel prints a tick value with as many decimals as its step needs.
func axisLabel(v, step float64) string {
	if step >= 1 {
		return fmt.Sprintf("%.0f", v)
	}
	d := int(math.Ceil(-math.Log10(step) - 1e-9))
	return fmt.Sprintf("%.*f", d, v)
}
