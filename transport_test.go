package bulwark

import (
	"net/http"
	"testing"
)

func TestTransportContract(t *testing.T) {
	runContract(t, func(base http.RoundTripper) http.RoundTripper {
		tr, err := New(Config{Base: base})
		if err != nil {
			t.Fatal(err)
		}
		return tr
	})
}
