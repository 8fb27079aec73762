package bulwark

import "net/http"

// RoundTripVia sends req through t's layers as RoundTrip does, each attempt
// going to send instead of Config.Base: the router, the policies and the
// per-host state are the ones RoundTrip uses for req's URL. send must keep
// the RoundTripper contract; it receives each attempt's request, with the
// attempt's context.
//
// It is how a protocol that is not plain HTTP, but maps onto a request and
// a response, shares a Transport's protection: package bulwarkgrpc sends
// gRPC calls through it.
func (t *Transport) RoundTripVia(send http.RoundTripper, req *http.Request) (*http.Response, error) {
	return t.roundTrip(req, send)
}
