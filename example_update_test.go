package bulwark_test

import (
	"fmt"
	"log"

	"github.com/bulwark-http/bulwark"
)

// Update changes a running Transport's policies; an invalid Config is
// refused and the old one stays.
func ExampleTransport_Update() {
	cfg := bulwark.Config{Default: bulwark.Policy{Breaker: bulwark.Breaker{FailureRate: 0.5}}}
	tr, err := bulwark.New(cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer tr.CloseIdleConnections()

	// Tighten the breaker: its window and state carry over.
	cfg.Default.Breaker.FailureRate = 0.25
	fmt.Println(tr.Update(cfg))

	cfg.Default.Breaker.FailureRate = 2
	fmt.Println(tr.Update(cfg))
	// Output:
	// <nil>
	// bulwark: Default: Breaker.FailureRate = 2: must be in (0, 1]
}
