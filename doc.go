// Package bulwark is HTTP client middleware that keeps a slow or failing
// dependency from taking down the service that calls it.
//
// The module's packages, by who imports them; the others import this one,
// and it imports none of them:
//
//	bulwark                the client: Transport, Config, Policy, Snapshot, hooks, errors, the Fleet interface,
//	                       and what both halves share: the header names, Priority, WithPriority
//	bulwark/server         the server half: DeadlineHandler and the Shedder, for the services you own
//	bulwark/debug          a live page and JSON of a Transport's Snapshot, for operators
//	bulwark/bulwarktest    a scripted upstream and a Recorder of the hooks, for tests of code that uses bulwark
//	bulwark/redisfleet     a nested module: the Fleet over Redis (shared trips, pauses, quota, retry budget)
//	bulwark/config         a nested module: a Config from a YAML or JSON file, reloaded live (Watch), and its JSON Schema
//	bulwark/grpc           a nested module: gRPC client and server interceptors over a Transport (package bulwarkgrpc)
//
// New builds a Transport, an http.RoundTripper, from a Config of policies
// per upstream; NewClient wraps it in an *http.Client, a drop-in for
// http.DefaultClient. For each host the Transport composes, once, a stack
// of layers from the host's Policy, outer to inner:
//
//	layer             per       does
//	router            request   picks the upstream's policy and per-host state, and the route's (transport.go, hosts.go, route.go)
//	fallback          host      on a final failure, answers from something local (fallback.go)
//	total deadline    request   bounds the whole call, retries included (deadline.go)
//	retry             request   backoff with jitter, attempt cap, budget, Retry-After; replayable requests only (retry.go)
//	pushback          host      a Retry-After on 429/503, or a spent RateLimit quota, pauses the host (pushback.go; fields.go reads the fields)
//	throttle          host      opt-in: refuses locally as the host's accept ratio falls, as in Google's SRE book (throttle.go)
//	breaker           host      trips on failure rate and slow-call rate (breaker.go)
//	balancer          host      with Endpoints: sends each attempt to one instance, ejects outliers (balancer.go)
//	bulkhead          host      bounded concurrency (adaptive by default), short FIFO queue, rate limit; per instance when balanced (bulkhead.go)
//	attempt deadline  attempt   bounds one attempt; writes the deadline header (deadline.go)
//	attempt span      attempt   one OpenTelemetry client span per attempt; injects its trace context (span.go)
//	fault             attempt   with a Fault policy only: injects latency, answers and resets, for chaos tests (fault.go)
//	base              -         a clone of http.DefaultTransport by default
//
// Why this order: a retry waits outside the breaker and the bulkhead, so a
// waiting retry holds no permit; the breaker sees every attempt; an open
// breaker is terminal for the retry loop; the fallback sees only the final
// outcome. Each sub-policy has a Disabled field that removes its layer, and
// an Enabled field that puts it back for one upstream. Every layer that
// judges an outcome reads one classifier, Policy.Classify (nil:
// DefaultClassify), which decides success, failure or ignored, and
// retryable or not: the breaker, the retries and hedges, the balancer's
// outlier ejection, the throttle, the adaptive limit, the fallback and the
// bulwark.outcome metric attribute never disagree about what happened,
// whether the classifier is bulwark's or the caller's. It is asked only
// about what the host did: bulwark's own refusals and the caller's
// cancellation keep their fixed meaning (see Classifier).
//
// Retries happen at one layer. A request that a retrying client above
// bulwark marks with its own attempt header (the AWS, OpenAI, Anthropic,
// Google, Azure and Stripe SDKs, or another bulwark Transport: see
// AttemptHeader for the list) is sent once, with neither the learned
// attempt timeout nor the default Total: that client resends it and
// bounds it. Its breaker, bulkhead, budget and pushback still see it, and
// the servers' x-should-retry, retry-after-ms and X-Amz-Retry-After are
// read as bulwark's own don't-retry and Retry-After (sdk.go).
//
// Every layer keeps the http.RoundTripper contract: it never modifies the
// caller's request, always closes the request body (rejections included),
// and returns a response or an error, never both. A context the stack
// creates ends when the caller closes the response body or reads it to
// EOF. Every permit (bulkhead slot, queue place, half-open probe) is
// released on every path, a panic below included; the panic still reaches
// the caller.
//
// Config.Routes gives endpoints policies of their own, keyed by
// http.ServeMux patterns ("POST api.example.com/v1/charges"): a route has
// its own breaker, retries, timeouts, fallback and faults, and shares its
// host's bulkhead, pushback and balancer.
//
// Package bulwarktest has a scripted upstream, in memory for synctest
// bubbles or over a socket, and a Recorder of the hooks, for testing code
// that uses bulwark.
//
// State can be seen and steered: Transport.Snapshot reports every host's
// breaker, bulkhead, retry budget, pushback and instances;
// Breaker.OnStateChange and Retry.OnRetry are hooks; ControlBreaker forces a
// host's breaker open or closed; spans, events and metrics go to
// OpenTelemetry (see Config.TracerProvider); package
// github.com/bulwark-http/bulwark/debug serves it all as a live page and as
// JSON. Transport.Update changes policies while requests
// run, and a Shadow setting on the breaker, the bulkhead and the Shedder
// has a layer report what it would refuse without refusing it.
//
// The server side is package server (github.com/bulwark-http/bulwark/server),
// which imports this one: server.DeadlineHandler turns an incoming deadline
// header back into a context deadline, so a deadline crosses every hop, and
// a server.Shedder refuses with a fast 503 (with Retry-After and
// NoRetryHeader) instead of queueing past its callers' patience.
package bulwark
