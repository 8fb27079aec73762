package main

import (
	"os"
	"strings"
	"testing"
)

// TestTableFromBenchmarks renders the table from the repository's own
// BENCHMARKS.md: every row has bulwark's figure, and the figures are the
// report's.
func TestTableFromBenchmarks(t *testing.T) {
	b, err := os.ReadFile("../../../BENCHMARKS.md")
	if err != nil {
		t.Fatal(err)
	}
	got, err := table(string(b))
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + got)
	prot, err := tableAfter(string(b), "## Protection")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := prot.cell("bulwark", "sick: received / offered")
	if want == "" || !strings.Contains(got, "| "+want+" |") {
		t.Errorf("table lacks bulwark's sick figure %q:\n%s", want, got)
	}
	for _, line := range strings.Split(strings.TrimSpace(got), "\n")[3:] {
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) != 1+len(stacks) {
			t.Errorf("row %q has %d cells, want %d", line, len(cells), 1+len(stacks))
		}
		if strings.TrimSpace(cells[1]) == "—" {
			t.Errorf("row %q has no figure for bulwark", line)
		}
	}
}

func TestSplice(t *testing.T) {
	readme := "intro\n" + begin + "\nold\n" + end + "\nrest\n"
	got, err := splice(readme, "new\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := "intro\n" + begin + "\nnew\n" + end + "\nrest\n"; got != want {
		t.Errorf("splice = %q, want %q", got, want)
	}
	if _, err := splice("no markers", "x"); err == nil {
		t.Errorf("splice without markers: no error")
	}
}
