package bulwarkgrpc

import (
	"net/http"

	"github.com/bulwark-http/bulwark"
	"google.golang.org/grpc/metadata"
)

// passUpHeaders carries the server half's trailers (server.go) into the
// response an attempt is turned into, as the HTTP headers of the same
// names: bulwark-no-retry as bulwark.NoRetryHeader ("below" on a failure
// passed up from a tier that already dealt with it, "1" on a Shedder's
// refusal), which the retry layer and the breaker read, so that a chain of
// gRPC services retries at one layer and trips at one layer as an HTTP
// chain does; and bulwark-shed-priority as bulwark.ShedPriorityHeader, by
// which the pushback layer pauses only the priorities a Shedder refused.
// Only the first value of each counts, as on HTTP.
func passUpHeaders(h http.Header, trailer metadata.MD) {
	if v := trailer.Get(mdNoRetry); len(v) > 0 {
		h[bulwark.NoRetryHeader] = v[:1]
	}
	if v := trailer.Get(mdShedPriority); len(v) > 0 {
		h[bulwark.ShedPriorityHeader] = v[:1]
	}
}
