package window

import (
	"testing"

	"pgregory.net/rapid"
)

// TestRecentMatchesSlice: Recent's sums are those of the last n events of
// a plain slice, after any sequence of adds and resets.
func TestRecentMatchesSlice(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 40).Draw(t, "n")
		r, err := NewRecent(n)
		if err != nil {
			t.Fatal(err)
		}
		var all []Counts
		for i := range rapid.IntRange(0, 200).Draw(t, "events") {
			if rapid.IntRange(0, 50).Draw(t, "reset") == 0 {
				r.Reset()
				all = nil
				continue
			}
			var c Counts
			for k := range c {
				c[k] = int64(rapid.IntRange(0, 1).Draw(t, "bit"))
			}
			r.Add(c)
			all = append(all, c)
			var want Counts
			last := all[max(0, len(all)-n):]
			for _, e := range last {
				for k := range want {
					want[k] += e[k]
				}
			}
			if got := r.Sum(); got != want || r.Len() != len(last) {
				t.Fatalf("after event %d: Sum %v Len %d, want %v %d", i, got, r.Len(), want, len(last))
			}
		}
	})
}

func TestNewRecentErrors(t *testing.T) {
	for _, n := range []int{0, -1, MaxCalls + 1} {
		if _, err := NewRecent(n); err == nil {
			t.Errorf("NewRecent(%d): no error", n)
		}
	}
	if _, err := NewRecent(MaxCalls); err != nil {
		t.Errorf("NewRecent(MaxCalls): %v", err)
	}
}
