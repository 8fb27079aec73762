package integration_test

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// Toxiproxy v2.5.0 strands the goroutines of a link whose far end
		// stopped reading (a toxic that ends the stream itself, limit_data
		// or reset_peer, or a destination socket already closed): the
		// stages before it block forever sending into a channel nobody
		// reads any more. Proxy.Stop cannot reach them, since the finished
		// link has already removed itself. They hold no socket of ours: the
		// upstream connection count in faults_test.go checks that
		// separately.
		goleak.IgnoreTopFunction("github.com/Shopify/toxiproxy/v2/toxics.(*NoopToxic).Pipe"),
		goleak.IgnoreTopFunction("github.com/Shopify/toxiproxy/v2/stream.(*ChanWriter).Write"),
		goleak.IgnoreTopFunction("github.com/Shopify/toxiproxy/v2/toxics.(*LatencyToxic).Pipe"),
		goleak.IgnoreTopFunction("github.com/Shopify/toxiproxy/v2/toxics.(*BandwidthToxic).Pipe"),
	)
}
