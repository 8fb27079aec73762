package bulwarkgrpc

import (
	"context"
	"errors"
	"net/http"
	"strconv"

	"github.com/bulwark-http/bulwark"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// StatusHeader is the header of the response a gRPC attempt is turned into
// that carries the attempt's gRPC status code, in decimal (as the
// grpc-status trailer does): what a Policy.Classify reads, with Code, to
// judge gRPC outcomes its own way.
const StatusHeader = "Grpc-Status"

// statusNotRetried is the HTTP status a gRPC failure that must not be
// retried (UNKNOWN, INTERNAL, DATA_LOSS) is given: bulwark's DefaultClassify
// counts 510 as the host's failure and never retries it. The number
// carries no meaning of its own: StatusHeader says which code it was.
const statusNotRetried = http.StatusNotExtended

// httpStatus is the status of the response a gRPC code is turned into, as
// the package doc's table says: the status DefaultClassify judges the way
// the code asks to be judged.
func httpStatus(c codes.Code) int {
	switch c {
	case codes.OK:
		return http.StatusOK
	case codes.Canceled:
		return 499 // nginx's "client closed request": the server's end says the call was cancelled
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
		return http.StatusBadRequest
	case codes.NotFound:
		return http.StatusNotFound
	case codes.AlreadyExists, codes.Aborted:
		return http.StatusConflict
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.Unimplemented:
		return http.StatusNotImplemented
	case codes.ResourceExhausted:
		return http.StatusTooManyRequests
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	default: // Unknown, Internal, DataLoss, and codes gRPC has not defined
		return statusNotRetried
	}
}

// Code returns the gRPC status code of resp, the response a gRPC attempt
// was turned into, and whether resp is one: for a Policy.Classify that
// judges gRPC outcomes its own way.
//
//	Classify: func(resp *http.Response, err error) bulwark.Verdict {
//		if c, ok := bulwarkgrpc.Code(resp); ok && c == codes.Internal {
//			return bulwark.Verdict{Outcome: bulwark.OutcomeFailure, Retryable: true}
//		}
//		return bulwark.DefaultClassify(resp, err)
//	}
func Code(resp *http.Response) (codes.Code, bool) {
	if resp == nil {
		return 0, false
	}
	v, ok := resp.Header[StatusHeader]
	if !ok || len(v) != 1 {
		return 0, false
	}
	n, err := strconv.ParseUint(v[0], 10, 32)
	if err != nil {
		return 0, false
	}
	return codes.Code(n), true
}

// pushbackKey is the trailer by which a gRPC server asks its clients to
// wait before they retry (gRFC A6), as grpc-go's metadata keys it.
const pushbackKey = "grpc-retry-pushback-ms"

// response turns an attempt's outcome, its status and trailers, into the
// response the layers judge: the status by httpStatus, the code in
// StatusHeader, and the server's pushback both as itself (a negative one
// stops retries, as gRFC A6 says) and, on RESOURCE_EXHAUSTED and
// UNAVAILABLE, as Retry-After-Ms, by which bulwark's pushback layer pauses
// the host's callers.
func response(req *http.Request, st *status.Status, trailer metadata.MD) *http.Response {
	code := st.Code()
	h := make(http.Header, 3)
	if int(code) < len(codeValues) {
		h[StatusHeader] = codeValues[code][:1:1]
	} else {
		h[StatusHeader] = []string{strconv.Itoa(int(code))}
	}
	if v := trailer.Get(pushbackKey); len(v) > 0 {
		// Every value goes to the retry layer, which stops on two or on
		// one that does not parse, as gRFC A6 says, and counts it. Only
		// a plain count of milliseconds up to a day pauses the host, as
		// Retry-After-Ms would: no sign, no second count of a bad one.
		h["Grpc-Retry-Pushback-Ms"] = v
		if len(v) == 1 && pauseMs(v[0]) && (code == codes.ResourceExhausted || code == codes.Unavailable) {
			h["Retry-After-Ms"] = v
		}
	}
	passUpHeaders(h, st, trailer)
	return &http.Response{
		StatusCode: httpStatus(code),
		Proto:      "HTTP/2.0", ProtoMajor: 2,
		Header: h, Body: http.NoBody, ContentLength: -1, Request: req,
	}
}

// pauseMs reports whether v, a grpc-retry-pushback-ms value, is digits
// alone and at most a day of milliseconds: one that may pause the host.
func pauseMs(v string) bool {
	if v == "" || len(v) > 8 {
		return false
	}
	for _, c := range []byte(v) {
		if c < '0' || c > '9' {
			return false
		}
	}
	n, _ := strconv.Atoi(v)
	return n <= 24*60*60*1000
}

// codeValues are StatusHeader's values for the codes gRPC defines, made
// once: a response's header shares them, capped so that nothing can
// append into them.
var codeValues = func() [][]string {
	v := make([][]string, 17)
	for i := range v {
		v[i] = []string{strconv.Itoa(i)}
	}
	return v
}()

// refusal is an error of bulwark's own (a refusal, its timeout) as a gRPC
// caller gets it: a status gRPC code understands (GRPCStatus), that still
// unwraps to bulwark's sentinel for errors.Is.
type refusal struct {
	err  error
	code codes.Code
}

func (r *refusal) Error() string { return r.err.Error() }

func (r *refusal) Unwrap() error { return r.err }

// GRPCStatus is the status grpc-go's status.FromError and status.Code read.
func (r *refusal) GRPCStatus() *status.Status { return status.New(r.code, r.err.Error()) }

// callError turns an error of the stack into what a gRPC caller gets: an
// error that already has a status keeps it; bulwark's refusals and
// timeouts become the status the package doc's table gives them, and
// still unwrap to their sentinels.
func callError(err error) error {
	if hasStatus(err) {
		return err
	}
	return &refusal{err: err, code: refusalCode(err)}
}

// hasStatus reports whether err, or an error it wraps, has a gRPC status,
// as status.FromError would find it. Written out rather than errors.As,
// whose target escapes: an open breaker's refusal would allocate it.
func hasStatus(err error) bool {
	type grpcStatus interface{ GRPCStatus() *status.Status }
	for err != nil {
		switch e := err.(type) {
		case grpcStatus:
			return true
		case interface{ Unwrap() []error }:
			for _, x := range e.Unwrap() {
				if hasStatus(x) {
					return true
				}
			}
			return false
		}
		err = errors.Unwrap(err)
	}
	return false
}

// refusalCode is the gRPC code of an error of the stack that carries none.
func refusalCode(err error) codes.Code {
	switch {
	case errors.Is(err, bulwark.ErrBreakerOpen):
		return codes.Unavailable
	case errors.Is(err, bulwark.ErrBulkheadFull), errors.Is(err, bulwark.ErrThrottled),
		errors.Is(err, bulwark.ErrPushback), errors.Is(err, bulwark.ErrRetryBudget):
		return codes.ResourceExhausted
	case errors.Is(err, bulwark.ErrAttemptTimeout), errors.Is(err, bulwark.ErrTotalTimeout), errors.Is(err, bulwark.ErrDeadlineTooShort):
		// Before Canceled: a timeout of bulwark's may end its attempt by
		// cancelling its context.
		return codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	case errors.Is(err, bulwark.ErrInvalidRequest):
		return codes.Internal
	}
	return codes.Unavailable
}
