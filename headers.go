package bulwark

import (
	"maps"
	"net/http"

	"github.com/bulwark-http/bulwark/internal/wire"
)

// The headers by which bulwark's client and its server half (package
// server) speak to each other. Both halves import this package, so the
// names live here, with the root's helpers for reading and copying
// headers. The retry layer's NoRetryHeader is with the layer that reads it,
// in retry_rt.go.

// PriorityHeader is the request header that carries a request's Priority
// from client to server: "critical", "high", "normal", "low" or "test" (any
// case). RequestPriority reads it first; bulwark's client sends a priority
// set with WithPriority as this header.
const PriorityHeader = "Bulwark-Priority"

// ShedPriorityHeader is the response header on a Shedder's 503 (package
// server) that names the Priority it refused, as Priority.String spells it.
// Bulwark's client reads it: the refusal's Retry-After then pauses requests
// to that host of that priority and less important ones only. Without it, a
// Shedder refusing low-priority work would stop the client's critical
// requests too, before they could reach the workers the Shedder reserves
// for them.
const ShedPriorityHeader = "Bulwark-Shed-Priority"

// DefaultDeadlineHeader is the request header that carries the time the
// caller has left, in whole milliseconds, from one hop to the next.
// Bulwark's client writes it unless Timeout.Header names another;
// server.DeadlineHandler reads it.
const DefaultDeadlineHeader = "Bulwark-Timeout-Ms"

// AttemptHeader is the request header that numbers the attempts of one call
// (1 for the first send, 2 for the first retry, …), like Envoy's
// x-envoy-attempt-count, so a server can tell a retry from a new call (a
// Shedder refuses retries first). It is written only when the retry layer
// is on and the deadline header is sent.
const AttemptHeader = "Bulwark-Attempt"

// cloneHeader copies h's map so that keys can be added or replaced without
// touching h. The value slices are shared with h, not copied: no layer
// writes into a value slice (each replaces it, as http.Header.Set does),
// and the RoundTripper contract forbids the base to modify the request at
// all. Sharing them lets maps.Clone copy the map's storage wholesale, about
// half the cost of rebuilding it key by key as http.Header.Clone does.
func cloneHeader(h http.Header) http.Header {
	if h == nil {
		return make(http.Header, 2)
	}
	return maps.Clone(h)
}

// allDigits is wire.AllDigits, under the short name the root's header
// parsers use.
func allDigits(s string) bool { return wire.AllDigits(s) }

// trimOWS is wire.TrimOWS, under the short name the root's header parsers
// use.
func trimOWS(s string) string { return wire.TrimOWS(s) }
