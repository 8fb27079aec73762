// Package bulwarkgrpc protects gRPC client calls with a bulwark.Transport:
// the same policies, per-host state, Snapshot, debug page, Update,
// config.Watch, fleet and OpenTelemetry metrics as the Transport's HTTP
// calls, from one Transport.
//
// The package is named bulwarkgrpc, not grpc, though it lives in the
// directory grpc: its users import google.golang.org/grpc beside it.
//
//	t, err := bulwark.New(bulwark.Config{})
//	...
//	cc, err := grpc.NewClient("dns:///orders.internal:443",
//		grpc.WithUnaryInterceptor(bulwarkgrpc.UnaryClientInterceptor(t)),
//		grpc.WithStreamInterceptor(bulwarkgrpc.StreamClientInterceptor(t)),
//		...)
//
// # A call is the HTTP/2 POST it is
//
// Each call crosses the Transport's layers as a POST of
// http://<authority>/<pkg.Service>/<Method> (Transport.RoundTripVia): the
// channel's authority picks its upstream in Config.Upstreams
// ("orders.internal:443" above; the endpoint of the channel's target, so a
// channel made with grpc.WithAuthority is still keyed by its target), and
// Config.Routes match the full method name, as any ServeMux pattern does:
// "/pkg.Service/Method" one method, "/pkg.Service/" every method of the
// service. The call's outgoing metadata is the request's headers (text
// keys only), its context the request's; each attempt calls grpc-go's
// invoker, or streamer, with the attempt's context, and its outcome comes
// back to the layers as a response whose status says how to judge it.
// What the layers add to an attempt's headers for a server (the priority
// from bulwark.WithPriority, the trace context, the attempt's number from
// the second on, a generated idempotency key) goes as that attempt's
// metadata; the deadline goes as grpc-timeout.
//
// # Status codes
//
// How each code is judged by bulwark's DefaultClassify, through the status
// of the response it becomes:
//
//	gRPC code                                   status  the host   retried (a method safe to repeat)
//	OK                                          200     success    no
//	UNAVAILABLE                                 503     failure    yes
//	UNAVAILABLE, no connection carried it       error   failure    yes; unanswered, as a refused connection: ConsecutiveFailures counts it
//	RESOURCE_EXHAUSTED                          429     failure    yes, after the pushback; grpc-retry-pushback-ms pauses the host (as Retry-After-Ms)
//	DEADLINE_EXCEEDED from the server           504     failure    yes
//	the attempt's own bound (or the caller's)   error   timeout    bulwark's ErrAttemptTimeout, as for HTTP; the caller's deadline ends the call
//	UNKNOWN, INTERNAL, DATA_LOSS                510     failure    no
//	CANCELLED by the server                     499     ignored    no
//	INVALID_ARGUMENT, FAILED_PRECONDITION,
//	OUT_OF_RANGE                                400     ignored    no
//	NOT_FOUND                                   404     ignored    no
//	ALREADY_EXISTS, ABORTED                     409     ignored    no
//	PERMISSION_DENIED                           403     ignored    no
//	UNAUTHENTICATED                             401     ignored    no
//	UNIMPLEMENTED                               501     ignored    no
//
// "Ignored" is the caller's error: it counts neither for nor against the
// host. A negative grpc-retry-pushback-ms stops retries, as gRFC A6 says.
// The response carries the code in StatusHeader; a Policy.Classify reads
// it with Code to judge otherwise (see Code's example). Whatever the
// layers decide, the caller gets the status of the attempt whose answer
// the call takes, its reply, headers and trailers: never a status of
// bulwark's making for an answer the server gave.
//
// bulwark's own refusals and timeouts reach the caller as statuses gRPC
// code understands, which still unwrap to bulwark's sentinels
// (errors.Is(err, bulwark.ErrBreakerOpen) holds):
//
//	bulwark's error                                        gRPC code
//	ErrBreakerOpen                                         UNAVAILABLE
//	ErrBulkheadFull, ErrThrottled, ErrPushback,
//	ErrRetryBudget                                         RESOURCE_EXHAUSTED
//	ErrAttemptTimeout, ErrTotalTimeout,
//	ErrDeadlineTooShort                                    DEADLINE_EXCEEDED
//	the caller's cancellation                              CANCELLED
//	ErrInvalidRequest                                      INTERNAL
//
// So a grpc-go retryPolicy above that retries UNAVAILABLE retries an open
// breaker's refusal too, unlike an UNKNOWN code would.
//
// # Which calls are sent twice
//
// bulwark retries or hedges a call only when it is safe to repeat:
//   - its method's descriptor, looked up by its full name in
//     protoregistry.GlobalFiles, declares idempotency_level NO_SIDE_EFFECTS
//     or IDEMPOTENT;
//   - its outgoing metadata carries an idempotency-key (as the HTTP
//     Idempotency-Key header does a POST);
//   - a route marks it: a Config.Routes entry for the method (or its
//     service) with Retry.KeyPOST gives each call a random key, the same on
//     every attempt, sent as idempotency-key metadata for the server to
//     collapse duplicates.
//
// Any other call is sent once. A reply that is not a proto.Message (a
// custom codec's) is always sent once: each attempt needs a reply of its
// own, and bulwark can make one only for a proto message.
//
// Retries happen at one layer. When the channel's service config gives the
// method a retryPolicy, grpc-go retries it inside each of bulwark's
// attempts, and bulwark sends it once, bounded per attempt only by a
// Timeout.Attempt the policy sets, never a learned one (as for any
// retrying client: bulwark.AttemptHeader), and does not retry
// its failure: grpc-go reads the service config only once the channel has
// resolved, so the first calls of a fresh channel are told apart by their
// failure, which carries bulwark.NoRetryHeader. A Google Cloud client
// library's x-goog-api-client metadata says the same of its own retries,
// and is read the same way.
//
// # Deadlines
//
// The call's deadline (its context's, which grpc-go sends as grpc-timeout)
// bounds the whole call, retries included, as Timeout.Total does. Each
// attempt's invoker gets the attempt's context: the attempt bound
// (Timeout.Attempt, or the one bulwark learned from the host's latency)
// applies to each attempt, and the server receives it as the attempt's
// grpc-timeout, less bulwark's margin for the way back. A policy whose
// Timeout.Header is not bulwark's default leaves the server the call's
// deadline; the attempt is still bounded locally.
//
// # Streams
//
// The layers judge a stream's establishment: an attempt lasts until the
// server's headers arrive (or the stream ends first), so the breaker and
// the bulkhead see a stream that cannot start, and the retry layer
// re-establishes a stream of a method safe to repeat, replaying what the
// caller sent so far. What was sent is kept up to ReplayBuffer bytes
// (grpc-go's own retry buffer's default): a stream that sends more is
// committed to its attempt at once and never replayed. A bidirectional
// stream, whose server may say nothing until the caller has, is
// established as soon as it is open.
//
// An established stream holds its bulkhead slot until it ends: until
// RecvMsg returns an error (io.EOF included) or the caller's context ends.
// A long-lived stream (a watch, a subscription) holds one slot for its
// whole life, and nothing else of the host's: the breaker does not judge
// it after it is established, and neither the attempt bound nor
// Timeout.Total ends it; only the caller's own context does. Size
// Bulkhead.MaxConcurrent for the streams a host keeps open, or give them a
// route of their own with Bulkhead.Disabled.
//
// # The server half
//
// ServerOptions (or UnaryServerInterceptor, StreamServerInterceptor and
// TapHandle) give a gRPC server what package server gives an HTTP
// handler: the call's deadline capped (grpc-timeout, bulwark's deadline
// key, Envoy's; server.DeadlineOptions.Max), a server.Shedder in front of
// the handlers, with the priority the bulwark-priority metadata names, and
// a bulwark.CallRecord on the handler's context, so that a failure the
// tier below already dealt with goes back marked with the trailer
// bulwark-no-retry: below, which this package's client reads as the HTTP
// client reads bulwark.NoRetryHeader: a chain of gRPC services retries at
// one layer and trips at one layer. A Shedder's refusal is
// RESOURCE_EXHAUSTED with grpc-retry-pushback-ms and bulwark-no-retry "1"
// (and the same as status details, for a refusal by the tap, which has no
// trailers): this package's client does not retry it and pauses the
// priorities refused for the wait it asks for. A stream the Shedder
// admits holds its worker for its whole life.
//
// # What does not apply
//
// Policy.Endpoints: grpc-go balances a channel's calls itself. A Fallback
// that answers with a response of its own gives the caller UNAVAILABLE,
// since no gRPC reply can be made of it.
package bulwarkgrpc
