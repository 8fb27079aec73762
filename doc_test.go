package bulwark_test

import (
	"os"
	"strings"
	"testing"
)

// TestDocsTellPeersTruly: the README and the doc comments no longer say
// what the peers do not: that 408, 429, 500, 502, 503 and 504 are the set
// Polly and go-retryablehttp retry, that bulwark's breaker rates are
// resilience4j's defaults (its slow-call rate is 100 %), or that the
// adaptive limit never refuses a healthy burst.
func TestDocsTellPeersTruly(t *testing.T) {
	for _, f := range []string{"README.md", "classify.go", "retry.go", "breaker.go", "bulkhead.go"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		text := strings.Join(strings.Fields(strings.ReplaceAll(string(b), "//", "")), " ")
		for _, claim := range []string{
			"the set Polly's standard pipeline and go-retryablehttp retry",
			"as Polly's standard pipeline and go-retryablehttp retry them",
			"Polly's standard pipeline and go-retryablehttp retry:",
			"(resilience4j's defaults)",
			"The rates, the window of the last 100 calls and the 100-call minimum are resilience4j's defaults",
			"is never refused",
			"bursts are never refused",
		} {
			if strings.Contains(text, claim) {
				t.Errorf("%s still says %q", f, claim)
			}
		}
	}
}
