package bench

import (
	"io"
	"net/http"
	"testing"
)

// TestStacks sends one request through every stack over the stub: each is
// built and answers, fast enough for make test.
func TestStacks(t *testing.T) {
	peers, err := Peers(Defaults, stubBase{})
	if err != nil {
		t.Fatal(err)
	}
	layers, err := BulwarkLayers(Defaults, stubBase{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range append(peers, layers...) {
		req, _ := http.NewRequestWithContext(t.Context(), "GET", "http://stub.internal/x", nil)
		resp, err := s.RT.RoundTrip(req)
		if err != nil {
			t.Fatalf("%s: %v", s.Name, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s: status %d", s.Name, resp.StatusCode)
		}
	}
}
