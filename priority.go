package bulwark

import (
	"context"
	"net/http"
	"strconv"

	"github.com/bulwark-http/bulwark/internal/wire"
)

// Priority is how critical a request is to the service: under overload a
// Shedder (package server) refuses lower priorities first, and bulwark's
// client pauses only the priorities a Shedder refused. A smaller value is
// more important; PriorityCritical is the most important and PriorityTest
// the least. A value beyond PriorityTest is treated as PriorityTest.
type Priority uint8

// The priorities, most important first. They follow the order of Stripe's
// last line of defence, its load shedder (Stripe's engineering blog,
// "Scaling your API with rate limiters", 2017): critical methods, then
// writes (POST), then reads (GET), then test-mode traffic, with PriorityLow
// between reads and test traffic for work that can always wait (batch,
// prefetch).
const (
	PriorityCritical Priority = iota
	PriorityHigh
	PriorityNormal
	PriorityLow
	PriorityTest

	// NumPriorities is how many priorities there are, one past
	// PriorityTest: the length of an array by priority, such as
	// PushbackSnapshot.Tiers. Ranging over it yields every Priority, most
	// important first. It is not a priority itself.
	NumPriorities
)

// numPriorities is NumPriorities as an int.
const numPriorities = int(NumPriorities)

// priorityNames are the names PriorityHeader and ShedPriorityHeader carry;
// the array's type checks that wire's list has one name per priority.
var priorityNames [numPriorities]string = wire.PriorityNames

// String returns the priority's lower-case name, as PriorityHeader spells it.
func (p Priority) String() string {
	if int(p) < numPriorities {
		return priorityNames[p]
	}
	return "Priority(" + strconv.Itoa(int(p)) + ")"
}

// clamp maps an out-of-range priority to the least important one, so that a
// classifier's mistake can never buy a request the critical reserve.
func (p Priority) clamp() Priority { return min(p, PriorityTest) }

// RequestPriority is the Priority bulwark gives r, on both sides of a call.
// A PriorityHeader naming a priority wins; then a priority r's context
// carries (WithPriority); otherwise the method decides, in Stripe's order:
// requests that change state (POST, PUT, PATCH, DELETE and any other unsafe
// method) are PriorityHigh, safe ones (GET, HEAD, OPTIONS, TRACE) are
// PriorityNormal.
//
// The client's pushback holds a request back by it (see
// ShedPriorityHeader), and a Shedder's default classifier,
// server.DefaultPriority, is this same reading, so that the client pauses
// exactly the priorities a Shedder refused.
func RequestPriority(r *http.Request) Priority {
	p, _ := requestPriority(r)
	return p
}

// requestPriority is RequestPriority, the one reading of a request's
// priority. fromContext reports that the priority is WithPriority's: the
// header named none.
func requestPriority(r *http.Request) (p Priority, fromContext bool) {
	if v := r.Header[PriorityHeader]; len(v) > 0 {
		if p, ok := parsePriority(v[0]); ok {
			return p, false
		}
	}
	if p, ok := r.Context().Value(priorityKey{}).(Priority); ok {
		return p, true
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, "":
		return PriorityNormal, false
	}
	return PriorityHigh, false
}

// parsePriority reads a priority's name, in any case.
func parsePriority(v string) (Priority, bool) {
	i, ok := wire.ParsePriority(v)
	return Priority(i), ok
}

// priorityKey is the context key WithPriority stores a Priority under.
type priorityKey struct{}

// WithPriority returns a copy of ctx that carries p as the Priority of the
// requests made with it, for a caller that would rather not set
// PriorityHeader on each request itself. A request's own PriorityHeader
// still wins; a value beyond PriorityTest counts as PriorityTest.
//
// On bulwark's client it decides which Shedder refusals pause the request
// (see ShedPriorityHeader), and bulwark sends it upstream as
// PriorityHeader, on a copy of the request, when the request has no such
// header, so the server's Shedder sees the same priority. The header is
// added by the pushback layer: an upstream with Retry.NoPushback gets no
// header from it. On a server, RequestPriority reads it after the header.
func WithPriority(ctx context.Context, p Priority) context.Context {
	return context.WithValue(ctx, priorityKey{}, p.clamp())
}
