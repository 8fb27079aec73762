package bulwark

import (
	"reflect"
	"time"
)

// Policy is the resilience policy for one upstream. Each field configures one
// layer of the stack. A zero field inherits the Default policy's value, and
// Default's zero fields take the package defaults that each field documents,
// so Policy{} is a complete, sensible policy.
type Policy struct {
	// Timeout bounds the call and each attempt, and names the deadline
	// header sent upstream.
	Timeout Timeout

	// Breaker stops calls to a host whose failure rate or slow-call rate
	// has reached its threshold, and probes it gently before letting
	// traffic back; see Breaker.
	Breaker Breaker

	// Fallback answers from something local when a call has finally
	// failed; see Fallback. The zero value has no fallback.
	Fallback Fallback

	// Bulkhead bounds the requests in flight to each host of the upstream,
	// queues a few, and can rate-limit them; see Bulkhead.
	Bulkhead Bulkhead

	// Retry configures retries (backoff, jitter, attempt cap, budget,
	// Retry-After) and the host-wide pushback a Retry-After triggers.
	Retry Retry

	// Hedge sends a second attempt beside a slow one and takes the first
	// answer; see Hedge. The zero value does not hedge.
	Hedge Hedge

	// Endpoints lists the instances behind a logical upstream (statically
	// or through a Resolver), and turns on the balancer that sends each
	// attempt to one of them and ejects the sick ones; see Endpoints. The
	// zero value sends requests to the URL's host as it is.
	Endpoints Endpoints

	// Throttle is client-side adaptive throttling per host: it refuses
	// locally a share of requests that grows as the host accepts fewer of
	// them; see Throttle. The zero value is off.
	Throttle Throttle

	// Classify decides, for every layer that judges an outcome, whether
	// an attempt's response or error is a success, a failure or ignored
	// for its host's health, and whether another try may change it; see
	// Classifier for what each layer does with the Verdict and which
	// outcomes it is asked about. Nil inherits from Default, then means
	// DefaultClassify. On a route (Config.Routes), the route's classifier
	// judges the route's calls in every layer they pass, the host's shared
	// bulkhead and balancer included. Transport.Update moves it in place:
	// it keeps every layer's state.
	Classify Classifier

	// Fault injects latency, answers and connection resets into attempts,
	// for chaos tests; see Fault. The zero value injects nothing, and the
	// layer is then not in the stack.
	Fault Fault
}

// inherit fills p's zero fields from parent.
func (p Policy) inherit(parent Policy) Policy {
	p.Timeout = p.Timeout.inherit(parent.Timeout)
	p.Bulkhead = p.Bulkhead.inherit(parent.Bulkhead)
	p.Breaker = p.Breaker.inherit(parent.Breaker)
	p.Fallback = p.Fallback.inherit(parent.Fallback)
	p.Retry = p.Retry.inherit(parent.Retry)
	p.Hedge = p.Hedge.inherit(parent.Hedge)
	p.Endpoints = p.Endpoints.inherit(parent.Endpoints)
	p.Throttle = p.Throttle.inherit(parent.Throttle)
	p.Fault = p.Fault.inherit(parent.Fault)
	if p.Classify == nil {
		p.Classify = parent.Classify
	}
	return p
}

// withDefaults fills the zero fields left after inheritance with the
// package defaults. Later layers' defaults may depend on earlier ones (the
// breaker's slow-call threshold on the attempt timeout), so the order here
// is the order of dependence.
func (p Policy) withDefaults() Policy {
	p.Timeout = p.Timeout.withDefaults()
	p.Bulkhead = p.Bulkhead.withDefaults()
	attempt := p.Timeout.Attempt // the ceiling of the breaker's learned bounds
	if attempt <= 0 {
		attempt = attemptCeiling
	}
	p.Breaker = p.Breaker.withDefaults(attempt)
	p.Fallback = p.Fallback.withDefaults()
	p.Retry = p.Retry.withDefaults()
	p.Hedge = p.Hedge.withDefaults()
	p.Endpoints = p.Endpoints.withDefaults()
	p.Throttle = p.Throttle.withDefaults()
	return p
}

// switches refuses a sub-policy that is both Disabled and Enabled. It
// reads the policy as given, before inheritance settles each switch.
func (p Policy) switches() error {
	for _, s := range []struct {
		field             string
		disabled, enabled bool
	}{
		{"Timeout", p.Timeout.Disabled, p.Timeout.Enabled},
		{"Breaker", p.Breaker.Disabled, p.Breaker.Enabled},
		{"Fallback", p.Fallback.Disabled, p.Fallback.Enabled},
		{"Bulkhead", p.Bulkhead.Disabled, p.Bulkhead.Enabled},
		{"Retry", p.Retry.Disabled, p.Retry.Enabled},
		{"Retry.Budget", p.Retry.Budget.Disabled, p.Retry.Budget.Enabled},
		{"Hedge", p.Hedge.Disabled, p.Hedge.Enabled},
		{"Endpoints", p.Endpoints.Disabled, p.Endpoints.Enabled},
		{"Endpoints.Outlier", p.Endpoints.Outlier.Disabled, p.Endpoints.Outlier.Enabled},
		{"Throttle", p.Throttle.Disabled, p.Throttle.Enabled},
		{"Fault", p.Fault.Disabled, p.Fault.Enabled},
	} {
		if s.disabled && s.enabled {
			return fieldError(s.field+".Enabled", true, "conflicts with "+s.field+".Disabled")
		}
	}
	return nil
}

// validate reports the first invalid field of a policy after inheritance
// and defaults.
func (p Policy) validate() error {
	if err := durationsInRange(reflect.ValueOf(p), ""); err != nil {
		return err
	}
	for _, err := range []error{
		p.Timeout.validate(),
		p.Retry.validate(),
		p.Hedge.validate(p.Timeout.Disabled),
		p.Breaker.validate(),
		p.Bulkhead.validate(),
		p.Fallback.validate(),
		p.Endpoints.validate(),
		p.Throttle.validate(),
		p.Fault.validate(),
	} {
		if err != nil {
			return err
		}
	}
	return nil
}

// durationsInRange refuses any time.Duration field of v (a struct, walked
// through nested structs) past maxPolicyDuration, naming it as a path from
// prefix. Negative values are each field's own validate's to refuse, with
// its own reason.
func durationsInRange(v reflect.Value, prefix string) error {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		fv := v.Field(i)
		switch {
		case f.Type == reflect.TypeFor[time.Duration]():
			if d := time.Duration(fv.Int()); d > maxPolicyDuration {
				return fieldError(prefix+f.Name, d, "must be ≤ "+maxPolicyDuration.String())
			}
		case f.Type.Kind() == reflect.Struct:
			if err := durationsInRange(fv, prefix+f.Name+"."); err != nil {
				return err
			}
		}
	}
	return nil
}

// compiled is an upstream's Policy compiled (inherited and defaulted), and
// the upstream label it goes by.
type compiled struct {
	upstream string // the Upstreams key, or "default"
	policy   Policy
	raw      Policy // as written, over Default's: what routes inherit from
}
