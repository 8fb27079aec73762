package bulwark

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/url"
	"testing"

	"pgregory.net/rapid"
)

// TestInvalidRequestAgreesWithNetHTTP holds the hand-written checks of
// invalidRequest to net/http's own: for methods, schemes, header and
// trailer fields drawn from bytes near the RFC's edges, invalidRequest
// refuses a request exactly when an http.Transport refuses it before
// dialing (its dialer, which fails every dial with errDialed, is never
// reached).
func TestInvalidRequestAgreesWithNetHTTP(t *testing.T) {
	errDialed := errors.New("dialed")
	base := &http.Transport{
		Proxy:       nil,
		DialContext: func(context.Context, string, string) (net.Conn, error) { return nil, errDialed },
	}
	t.Cleanup(base.CloseIdleConnections)
	edge := []byte("aZ09-_.!~`|#'*+^%&$ \t\r\n\x00\x01\x1f\x7f\x80\xff:;\"(),/<>=?@[]{}\\")
	field := rapid.Custom(func(t *rapid.T) string {
		return string(rapid.SliceOfN(rapid.SampledFrom(edge), 0, 4).Draw(t, "bytes"))
	})
	// Most draws are well formed, so that both sides are reached often;
	// the rest come from the edge bytes.
	name := rapid.OneOf(rapid.SampledFrom([]string{"X-Id", "Accept"}), rapid.SampledFrom([]string{"X-Id", "Accept"}), field)
	value := rapid.OneOf(rapid.SampledFrom([]string{"", "v 1"}), rapid.SampledFrom([]string{"", "v 1"}), field)
	var refused, sent int
	rapid.Check(t, func(rt *rapid.T) {
		req := &http.Request{
			Method: rapid.OneOf(rapid.SampledFrom([]string{"", "GET", "POST"}), rapid.SampledFrom([]string{"", "GET", "POST"}), field).Draw(rt, "method"),
			URL: &url.URL{
				Scheme: rapid.SampledFrom([]string{"http", "https", "http", "https", "ftp", ""}).Draw(rt, "scheme"),
				Host:   rapid.SampledFrom([]string{"127.0.0.1:1", "127.0.0.1:1", "127.0.0.1:1", ""}).Draw(rt, "host"),
				Path:   "/",
			},
			Header: http.Header{},
		}
		for range rapid.IntRange(0, 2).Draw(rt, "headers") {
			req.Header[name.Draw(rt, "name")] = []string{value.Draw(rt, "value")}
		}
		if rapid.Bool().Draw(rt, "trailer") {
			req.Trailer = http.Header{name.Draw(rt, "tname"): {value.Draw(rt, "tvalue")}}
		}
		_, netErr := base.RoundTrip(req.WithContext(context.Background()))
		ours := invalidRequest(req, true)
		netRefused := netErr != nil && !errors.Is(netErr, errDialed)
		if (ours != nil) != netRefused {
			rt.Fatalf("invalidRequest = %v, net/http = %v: they disagree on %q %s %q trailer %q",
				ours, netErr, req.Method, req.URL, req.Header, req.Trailer)
		}
		if ours != nil && !errors.Is(ours, ErrInvalidRequest) {
			rt.Fatalf("invalidRequest = %v, not ErrInvalidRequest", ours)
		}
		if netRefused {
			refused++
		} else {
			sent++
		}
	})
	// The draws must reach both sides, or the agreement says nothing.
	t.Logf("%d refused before dialing, %d dialed", refused, sent)
	if refused == 0 || sent == 0 {
		t.Fatalf("%d refused, %d sent: the draws missed one side", refused, sent)
	}
}
