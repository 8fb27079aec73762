package bench

import (
	"testing"

	"github.com/bulwark-http/bulwark"
)

// BenchmarkAbandonCost is what Config.BaseIgnoresContext costs a base that
// honours its context (ctxBase, which treats it as net/http's Transport
// does), paired: bulwark's default stack without it and with it, where
// each attempt runs in a goroutine of its own that the caller could leave
// behind at the deadline. The difference is the goroutine, its hand-over
// and the copy of the request it reads.
func BenchmarkAbandonCost(b *testing.B) {
	for _, c := range []struct {
		name    string
		abandon bool
	}{{"off", false}, {"on", true}} {
		tr, err := bulwark.New(bulwark.Config{Base: ctxBase{}, BaseIgnoresContext: c.abandon})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(c.name, func(b *testing.B) { roundTrips(b, tr, "http://stub.internal/x", nil) })
	}
}
