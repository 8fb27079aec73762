package main

import (
	"fmt"
	"io"
	"math"
	"strings"
	"time"
	"unicode/utf8"
)

var sparkRunes = []rune("▁▂▃▄▅▆▇█")

// sparkWidth is the most characters a sparkline takes; longer runs put
// more than one bucket in a character.
const sparkWidth = 72

// cell formats one value of a series for the terminal.
func cell(s *series, v float64, ok bool) string {
	if !ok {
		return "-"
	}
	switch s.kind {
	case kindRate:
		return fmt.Sprintf("%.0f%%", 100*v)
	case kindP99, kindP50:
		if v < 10 {
			return fmt.Sprintf("%.1fms", v)
		}
		return fmt.Sprintf("%.0fms", v)
	case kindGauge:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.0f", v)
}

// columns are the table's short names for series.
var columns = map[string]string{
	"tax recv": "tax/s", "refused": "refusd", "checkout ok": "chk ok", "orders ok": "ord ok", "orders p99": "ord p99",
	"breaker open": "brk op",
	"recv":         "recv/s", "503": "503/s",
	"p50": "p50", "sick recv": "sick/s", "ejected": "ejectd",
	"sent": "sent/s", "good": "good/s", "accepted": "acc/s", "refused locally": "local/s",
}

// abbrev shortens a series name for a table header.
func abbrev(name string) string {
	if c, ok := columns[name]; ok {
		return c
	}
	return name
}

func (l *lab) render(w io.Writer, sc *scenario) {
	fmt.Fprintf(w, "\n%s\n%s\n", sc.title, strings.Repeat("=", utf8.RuneCountInString(sc.title)))
	if v := verdictLine(sc); v != "" {
		fmt.Fprintf(w, "%s\n\n", v)
	}
	for _, line := range sc.intro {
		fmt.Fprintf(w, "  %s\n", line)
	}
	fmt.Fprintf(w, "  time is scaled ×%g: every duration of the scenarios (40 ms, 10 s, a 2 s blip, 100 s) is multiplied by it\n", l.set.scale)
	if len(sc.runs) == 0 {
		return
	}
	l.renderTable(w, sc)
	l.renderSparks(w, sc)
	renderHeadlines(w, sc)
	if len(sc.explain) > 0 {
		fmt.Fprintln(w)
	}
	for _, e := range sc.explain {
		fmt.Fprintf(w, "  %s\n", e)
	}
}

// renderTable prints one row per second and a column per table series of
// each run.
func (l *lab) renderTable(w io.Writer, sc *scenario) {
	const cw = 8
	var h1, h2 strings.Builder
	fmt.Fprintf(&h1, "\n  %5s ", "")
	fmt.Fprintf(&h2, "  %5s ", "t(s)")
	for _, r := range sc.runs {
		n := 0
		for _, s := range r.tl.order {
			if s.table {
				fmt.Fprintf(&h2, "%*s", cw, abbrev(s.name))
				n++
			}
		}
		label := "── " + r.short + " "
		fmt.Fprintf(&h1, " %s%s", label, strings.Repeat("─", max(0, n*cw-1-utf8.RuneCountInString(label))))
		h2.WriteString(" ")
	}
	fmt.Fprintln(w, h1.String())
	fmt.Fprintln(w, h2.String())
	tl0 := sc.runs[0].tl
	per := tl0.at(time.Second)
	secs := int(math.Ceil(sc.length.Seconds()))
	endB := tl0.at(sc.length)
	for sec := range secs {
		i, j := sec*per, min((sec+1)*per, endB)
		in := " "
		for _, m := range sc.marks {
			if time.Duration(sec)*time.Second < m.to && time.Duration(sec+1)*time.Second > m.from {
				in = "*"
			}
		}
		fmt.Fprintf(w, "  %4d%s ", sec, in)
		for _, r := range sc.runs {
			for _, s := range r.tl.order {
				if s.table {
					v, ok := s.value(i, j, r.tl.width)
					fmt.Fprintf(w, "%*s", cw, cell(s, v, ok))
				}
			}
			fmt.Fprint(w, " ")
		}
		fmt.Fprintln(w)
	}
	if len(sc.marks) > 0 {
		fmt.Fprintf(w, "  * = %s; load columns are req/s, rates are of requests started that second\n", sc.marks[0].label)
	}
}

// spark draws buckets [0, n) of s, group buckets a character. Loads are
// scaled to top; rates to 0..100 %.
func spark(s *series, n, group int, width time.Duration, top float64) string {
	var b strings.Builder
	for i := 0; i < n; i += group {
		v, ok := s.value(i, min(i+group, n), width)
		switch {
		case !ok || s.kind == kindLoad && v == 0:
			b.WriteRune(' ')
		case s.kind == kindRate:
			b.WriteRune(sparkRunes[int(math.Round(v*7))])
		default:
			k := int(math.Ceil(v/top*8)) - 1
			b.WriteRune(sparkRunes[min(max(k, 0), 7)])
		}
	}
	return b.String()
}

func (l *lab) renderSparks(w io.Writer, sc *scenario) {
	tl0 := sc.runs[0].tl
	n := tl0.at(sc.length)
	group := (n + sparkWidth - 1) / sparkWidth
	fmt.Fprintf(w, "\n  one character = %v\n", time.Duration(group)*tl0.width)
	labelW := 0
	for _, r := range sc.runs {
		labelW = max(labelW, utf8.RuneCountInString(r.short))
	}
	// Every run's sparkline series, in the order first defined: a series
	// only a later run has (bulwark's limit) gets its rows too.
	var order []*series
	seen := map[string]bool{}
	for _, r := range sc.runs {
		for _, s := range r.tl.order {
			if s.spark && !seen[s.name] {
				seen[s.name] = true
				order = append(order, s)
			}
		}
	}
	for _, s0 := range order {
		top := 0.0
		for _, r := range sc.runs {
			s := r.tl.get(s0.name)
			if s == nil {
				continue
			}
			for i := 0; i < n; i += group {
				v, _ := s.value(i, min(i+group, n), r.tl.width)
				top = max(top, v)
			}
		}
		scale := "0–100%"
		switch s0.kind {
		case kindLoad:
			scale = fmt.Sprintf("█ = %.0f req/s", top)
		case kindGauge:
			scale = fmt.Sprintf("█ = %.0f", top)
		case kindP99, kindP50:
			scale = fmt.Sprintf("█ = %.0f ms", top)
		}
		fmt.Fprintf(w, "  %s (%s)\n", s0.name, scale)
		for _, r := range sc.runs {
			if s := r.tl.get(s0.name); s != nil {
				fmt.Fprintf(w, "    %-*s │%s│\n", labelW, r.short, spark(s, n, group, r.tl.width, top))
			}
		}
	}
	for _, m := range sc.marks {
		var b strings.Builder
		for i := 0; i < n; i += group {
			t := time.Duration(i) * tl0.width
			if t+time.Duration(group)*tl0.width > m.from && t < m.to {
				b.WriteRune('━')
			} else {
				b.WriteRune(' ')
			}
		}
		fmt.Fprintf(w, "    %-*s  %s %s\n", labelW, "", b.String(), m.label)
	}
}

func renderHeadlines(w io.Writer, sc *scenario) {
	labelW := 0
	for _, st := range sc.runs[0].headline {
		labelW = max(labelW, utf8.RuneCountInString(st.label))
	}
	colW := make([]int, len(sc.runs))
	for i, r := range sc.runs {
		colW[i] = utf8.RuneCountInString(r.short)
		for _, st := range r.headline {
			colW[i] = max(colW[i], utf8.RuneCountInString(st.value))
		}
	}
	fmt.Fprintf(w, "\n  %-*s", labelW, "")
	for i, r := range sc.runs {
		fmt.Fprintf(w, "  %*s", colW[i], r.short)
	}
	fmt.Fprintln(w)
	for k, st := range sc.runs[0].headline {
		fmt.Fprintf(w, "  %-*s", labelW, st.label) // fmt pads by runes
		for i, r := range sc.runs {
			v := ""
			if k < len(r.headline) {
				v = r.headline[k].value
			}
			fmt.Fprintf(w, "  %*s", colW[i], v)
		}
		fmt.Fprintln(w)
	}
	for _, r := range sc.runs {
		if len(r.notes) > 0 || len(sc.runs) > 2 {
			fmt.Fprintf(w, "  %s = %s\n", r.short, r.name)
		}
		for _, n := range r.notes {
			fmt.Fprintf(w, "    %s\n", n)
		}
	}
}
