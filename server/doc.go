// Package server is the callee's half of bulwark: HTTP middleware with
// which a service protects itself, speaking the headers bulwark's client
// (package bulwark) speaks. It imports the client's package for those
// shared names; the client never imports it, as net/http never imports
// net/http/httptest.
//
// DeadlineHandler turns an incoming deadline header (bulwark's, gRPC's
// grpc-timeout, Envoy's x-envoy-expected-rq-timeout-ms) back into the
// request context's deadline, so a deadline crosses every hop. A Shedder
// lets a bounded number of requests into the handler it wraps, keeps a
// short queue ordered by bulwark.Priority in front of it, and refuses the
// rest with a fast 503 carrying Retry-After, bulwark.NoRetryHeader and
// bulwark.ShedPriorityHeader: a bulwark client then neither retries the
// refusal nor holds back requests more important than the one refused.
//
// DeadlineHandler is also the server half of a chain of services, as
// PassUp is for a service without it: it gives each request from a
// bulwark client a bulwark.CallRecord, and when the handler answers a 5xx
// or 429 after a bulwark call below failed in a way the tier below dealt
// with (retried, refused locally, answered don't-retry), it marks the
// answer bulwark.NoRetryFromBelow, so that of a chain of services one
// layer retries and one layer trips (see bulwark.NoRetryFromBelow for the
// rules).
//
// A Shedder also admits work that is not an http.Handler's: Admit (and
// Precheck, which never waits) take a request that stands for the work, so
// that a gRPC server (the nested module github.com/bulwark-http/bulwark/grpc)
// and an HTTP handler can share one Shedder and one pool of workers.
//
// The two compose with the deadline outermost, so that the patience a
// queued request is allowed is the deadline its caller sent:
//
//	shedder, err := server.NewShedder(mux, server.ShedConfig{})
//	…
//	http.ListenAndServe(addr, server.DeadlineHandler(shedder, server.DeadlineOptions{}))
package server
