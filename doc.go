// Package bulwark is HTTP client middleware that keeps a slow or failing
// dependency from taking down the service that calls it.
//
// Each resilience concern is an http.RoundTripper that wraps the next. New
// composes them once per upstream host, from the Policy configured for it:
//
//	#  layer             per       does
//	1  router            request   picks the upstream's policy and per-host state
//	2  fallback          host      on a final failure, answers from something local
//	3  total deadline    request   bounds the whole call, retries included
//	4  retry             request   backoff with jitter, attempt cap, budget, Retry-After; replayable requests only
//	5  pushback          host      a Retry-After on 429/503 pauses every request to the host
//	6  breaker           host      trips on failure rate and slow-call rate
//	6b balancer          host      sends each attempt to one instance (Endpoints), ejects outliers
//	7  bulkhead          host      bounded concurrency, short FIFO queue, rate limit (per instance under 6b)
//	8  attempt deadline  attempt   bounds one attempt; writes the deadline header
//	8½ attempt span      attempt   one OpenTelemetry client span per attempt; injects its trace context
//	9  base              -         a clone of http.DefaultTransport by default
//
// Why this order: a retry sleeps outside the breaker and the bulkhead, so a
// waiting retry holds no permit; the breaker sees every attempt; an open
// breaker is terminal for the retry loop; the fallback sees only the final
// outcome. Each sub-policy has a Disabled field that removes its layer.
//
// Every layer keeps the http.RoundTripper contract: it never modifies the
// caller's request, always closes the request body (rejections included),
// and returns a response or an error, never both. A context the stack
// creates ends when the caller closes the response body or reads it to EOF.
//
// What a call costs is kept to what the features need. The router makes
// the call's state once, in one allocation with room for the first
// attempt's context, body wrapper and header values, and bulwark's layers
// hand it down to each other directly; the caller's request reaches the
// attempt layer unchanged, which makes the one copy an attempt needs (its
// context and its deadline headers). The attempt context makes its
// channel and timer only when something below waits on it, and while the
// breaker is closed its calls do not take gobreaker's lock. BENCHMARKS.md has the
// measured figures (make bench).
//
// On the server side, DeadlineHandler turns an incoming deadline header back
// into a context deadline, so a deadline crosses every hop, and a Shedder
// refuses with a fast 503 (with Retry-After and NoRetryHeader) instead of
// queueing past its callers' patience.
package bulwark
