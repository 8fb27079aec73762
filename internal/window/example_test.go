package window_test

import (
	"fmt"

	"github.com/bulwark-http/bulwark/internal/window"
)

// A count window: the position is each call's sequence number, and the
// window keeps the last 100 calls in 10 buckets of 10, so the share of
// failures below covers the last 91 to 100 calls.
func Example() {
	const calls, failures = 0, 1 // what the Counts indexes mean here
	w, err := window.New(100, 10)
	if err != nil {
		panic(err)
	}
	var seq int64
	call := func(failed bool) {
		c := window.Counts{calls: 1}
		if failed {
			c[failures] = 1
		}
		w.Add(seq, c)
		seq++
	}
	share := func() string {
		s := w.Sum(seq - 1)
		return fmt.Sprintf("%d of %d calls failed (%.0f%%)", s[failures], s[calls], 100*float64(s[failures])/float64(s[calls]))
	}

	for i := range 100 {
		call(i%4 == 0) // an outage: every fourth call fails
	}
	fmt.Println(share())
	for range 50 {
		call(false) // recovered: calls 50 to 99 are still in the window
	}
	fmt.Println(share())
	for range 50 {
		call(false)
	}
	fmt.Println(share())
	// Output:
	// 25 of 100 calls failed (25%)
	// 12 of 100 calls failed (12%)
	// 0 of 100 calls failed (0%)
}
