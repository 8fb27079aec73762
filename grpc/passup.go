package bulwarkgrpc

import (
	"net/http"
	"strconv"

	"github.com/bulwark-http/bulwark"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// passUpHeaders carries the server half's trailers (server.go) into the
// response an attempt is turned into, as the HTTP headers of the same
// names: bulwark-no-retry as bulwark.NoRetryHeader ("below" on a failure
// passed up from a tier that already dealt with it, "1" on a Shedder's
// refusal), which the retry layer and the breaker read, so that a chain of
// gRPC services retries at one layer and trips at one layer as an HTTP
// chain does; and bulwark-shed-priority as bulwark.ShedPriorityHeader, by
// which the pushback layer pauses only the priorities a Shedder refused.
// Only the first value of each counts, as on HTTP. A Shedder's refusal by
// the server's tap has no trailers: on RESOURCE_EXHAUSTED the same words
// are read from the status's details (shedDetails).
func passUpHeaders(h http.Header, st *status.Status, trailer metadata.MD) {
	if v := trailer.Get(mdNoRetry); len(v) > 0 {
		h[bulwark.NoRetryHeader] = v[:1]
	}
	if v := trailer.Get(mdShedPriority); len(v) > 0 {
		h[bulwark.ShedPriorityHeader] = v[:1]
	}
	if st.Code() == codes.ResourceExhausted && len(trailer.Get(mdNoRetry)) == 0 {
		shedDetails(h, st)
	}
}

// shedDetails reads a Shedder's refusal from a status's details: its
// google.rpc.ErrorInfo (domain "bulwark", reason "SHED") as the trailers,
// and its google.rpc.RetryInfo as the pause it asks for (Retry-After-Ms),
// unless a grpc-retry-pushback-ms trailer already gave one. Details of
// any other domain are not bulwark's, and are left alone.
func shedDetails(h http.Header, st *status.Status) {
	var shed bool
	var wait *durationpb.Duration
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			if d.GetDomain() == shedDomain && d.GetReason() == shedReason {
				shed = true
				h[bulwark.NoRetryHeader] = []string{"1"}
				if p := d.GetMetadata()[mdShedPriority]; p != "" {
					h[bulwark.ShedPriorityHeader] = []string{p}
				}
			}
		case *errdetails.RetryInfo:
			wait = d.GetRetryDelay()
		}
	}
	if _, set := h["Retry-After-Ms"]; shed && !set && wait.IsValid() && wait.AsDuration() >= 0 {
		h["Retry-After-Ms"] = []string{strconv.FormatInt(wait.AsDuration().Milliseconds(), 10)}
	}
}
