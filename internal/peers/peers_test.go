package peers

import (
	"strconv"
	"testing"
	"time"

	"github.com/bulwark-http/bulwark/internal/window"
)

// TestTable is a timeline of steps on one table.
func TestTable(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	var p Table
	if p.Any() {
		t.Fatal("a zero Table says it may hold counts")
	}
	steps := []struct {
		name string
		do   func() window.Counts
		want window.Counts
	}{
		{"empty", func() window.Counts { return p.Add(window.Counts{1}, at(0)) }, window.Counts{1}},
		{"one", func() window.Counts {
			p.Set("a", window.Counts{2, 1}, at(10), at(0))
			return p.Add(window.Counts{1}, at(1))
		}, window.Counts{3, 1}},
		{"two", func() window.Counts {
			p.Set("b", window.Counts{4, 0, 1}, at(5), at(1))
			return p.Add(window.Counts{}, at(2))
		}, window.Counts{6, 1, 1}},
		{"overwrite", func() window.Counts {
			p.Set("a", window.Counts{1}, at(10), at(2))
			return p.Add(window.Counts{}, at(3))
		}, window.Counts{5, 0, 1}},
		{"b stale", func() window.Counts { return p.Add(window.Counts{}, at(5)) }, window.Counts{1}},
		{"all stale", func() window.Counts { return p.Add(window.Counts{}, at(10)) }, window.Counts{}},
	}
	for _, s := range steps {
		if got := s.do(); got != s.want {
			t.Fatalf("%s: Add = %v, want %v", s.name, got, s.want)
		}
	}
	if p.Any() {
		t.Error("Any after every count went stale = true, want false")
	}
	// Match and ResetExcept: a's counts have no failures, b's have one.
	clean := func(c window.Counts) bool { return c[0] > 0 && c[1] == 0 }
	p.Set("a", window.Counts{3}, at(20), at(10))
	p.Set("b", window.Counts{3, 1}, at(20), at(10))
	for _, m := range []struct {
		except string
		now    time.Time
		want   bool
	}{{"", at(11), true}, {"b", at(11), true}, {"a", at(11), false}, {"", at(20), false}} {
		if got := p.Match(m.except, m.now, clean); got != m.want {
			t.Errorf("Match(except %q, at %v) = %v, want %v", m.except, m.now.Sub(t0), got, m.want)
		}
	}
	p.Set("a", window.Counts{3}, at(30), at(20))
	p.Set("b", window.Counts{3, 1}, at(30), at(20))
	p.ResetExcept(clean)
	if got := p.Add(window.Counts{}, at(21)); got != (window.Counts{3}) {
		t.Errorf("after ResetExcept: Add = %v, want a's counts alone", got)
	}
	p.ResetExcept(func(window.Counts) bool { return false })
	if p.Any() || p.Add(window.Counts{}, at(21)) != (window.Counts{}) {
		t.Error("counts left after ResetExcept of none")
	}
}

// TestTableBounded: a table keeps at most Max processes, making room
// from stale ones only.
func TestTableBounded(t *testing.T) {
	now := time.Unix(1000, 0)
	var p Table
	for i := range Max {
		until := now.Add(time.Minute)
		if i == 0 {
			until = now.Add(time.Second)
		}
		if !p.Set(strconv.Itoa(i), window.Counts{1}, until, now) {
			t.Fatalf("Set(%d) refused below Max", i)
		}
	}
	if p.Set("new", window.Counts{1}, now.Add(time.Minute), now) {
		t.Fatal("Set of one more than Max accepted")
	}
	if !p.Set("0", window.Counts{1}, now.Add(time.Minute), now) {
		t.Fatal("Set of a process already kept refused")
	}
	later := now.Add(30 * time.Second)
	p.Set("0", window.Counts{1}, now.Add(time.Second), now)
	if !p.Set("new", window.Counts{1}, now.Add(time.Minute), later) {
		t.Fatal("Set refused with a stale process to make room")
	}
	if got := p.Add(window.Counts{}, later); got[0] != Max {
		t.Fatalf("Add = %v, want %d calls", got, Max)
	}
}
