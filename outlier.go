package bulwark

import (
	"cmp"
	"math"
	"net"
	"strconv"
	"time"
)

// defaultResolveEvery is Endpoints.ResolveEvery's package default.
const defaultResolveEvery = 30 * time.Second

// Outlier's package defaults: Envoy's outlier detection defaults, given in
// each field's doc.
const (
	defaultConsecutiveFailures  = 5
	defaultOutlierInterval      = 10 * time.Second
	defaultBaseEjection         = 30 * time.Second
	defaultMaxEjection          = 300 * time.Second
	defaultMaxEjectedPercent    = 10
	defaultSuccessRateMinHosts  = 5
	defaultSuccessRateVolume    = 100
	defaultSuccessRateStdevMult = 1.9
)

// Endpoints makes a logical upstream a set of instances. Requests are
// written against the logical name (http://tax.internal/rate); the
// balancer sends each attempt to one instance by rewriting a copy of the
// request's URL host to the instance's "host:port". The Host header stays
// the logical name, and for https the TLS server name is the logical host,
// so certificates are verified against the name the caller asked for.
//
// Each instance gets a stack of its own below the balancer: a bulkhead
// (Policy.Bulkhead applies per instance), the attempt deadline, and its own
// clone of the base *http.Transport, which sets the TLS server name. A Base
// that is not an *http.Transport cannot be cloned and is shared by all
// instances; it must set the TLS server name itself. The breaker sits
// above the balancer and sees every attempt, so when all instances are
// sick it opens as it would for one host.
//
// Endpoints is set per upstream: Addrs and Resolver are not inherited from
// Default (which may not set them); the other fields are.
type Endpoints struct {
	// Addrs is a static list of instances, "host:port" each.
	Addrs []string

	// Resolver, when not nil, finds the instances instead of Addrs (which
	// must then be empty); DNSResolver is built in.
	Resolver Resolver

	// ResolveEvery is how often Resolver is asked again, in the background
	// while requests use the last good set. Zero inherits from Default,
	// then 30 s.
	ResolveEvery time.Duration

	// RoundRobin picks instances in turn rather than by the power of two
	// choices. The default, two random non-ejected instances and the one
	// with fewer requests in flight, sends less to a slow instance (its
	// requests pile up) without the herding of always picking the least
	// loaded, and costs two random numbers. Inherited from Default
	// OR-wise.
	RoundRobin bool

	// Outlier configures the ejection of sick instances.
	Outlier Outlier

	// Disabled turns the balancer off: requests go to the URL's host. An
	// upstream inherits Disabled from Default unless it sets Enabled.
	Disabled bool

	// Enabled turns the balancer back on for an upstream whose Default set
	// Disabled. Setting both is an error.
	Enabled bool
}

// Outlier configures outlier detection, after Envoy's: an instance is
// ejected (gets no requests) after Consecutive failures in a row, or when
// its success rate over an Interval falls below the mean of all instances'
// by StdevFactor standard deviations. It is ejected for BaseEjection times
// the number of times it has been ejected, at most MaxEjection; then it
// returns and is watched: ejected again, it stays out longer. An instance
// that stays in as long as it was last out has its count lowered by one.
// At most MaxEjectedPercent of the instances are ejected at once, but
// always at least one may be, and never all.
//
// A failure is what Policy.Classify calls one (with DefaultClassify: a
// 429 or 5xx other than 501, a transport error or an attempt timeout);
// the caller's own cancellation and local refusals (a full bulkhead, too
// little time to send) say nothing about the instance and do not count.
// Ejection decisions happen on requests (no goroutine of its own), on the
// Transport's clock.
type Outlier struct {
	// Consecutive is how many failures in a row eject an instance. Zero
	// inherits from Default, then 5; negative turns this check off.
	Consecutive int

	// Interval is how often success rates are compared, and the
	// granularity of a return. Zero inherits from Default, then
	// 10 s.
	Interval time.Duration

	// BaseEjection is the ejection time of a first ejection; the n-th in a
	// row lasts n times as long. Zero inherits from Default, then
	// 30 s.
	BaseEjection time.Duration

	// MaxEjection caps one ejection's time. Zero inherits from Default,
	// then 300 s.
	MaxEjection time.Duration

	// MaxEjectedPercent is the most instances ejected at once, in percent
	// of the set (rounded down, but at least one, and never all). Zero
	// inherits from Default, then 10.
	MaxEjectedPercent int

	// SuccessRateMinHosts is how many instances must each have at least
	// SuccessRateVolume requests in an Interval for success rates to be
	// compared. Zero inherits from Default, then 5; negative turns the
	// success-rate check off.
	SuccessRateMinHosts int

	// SuccessRateVolume is how many requests in an Interval make an
	// instance's success rate count. Zero inherits from Default, then 100.
	SuccessRateVolume int

	// StdevFactor: an instance whose success rate is below mean −
	// StdevFactor × σ is ejected. Zero inherits from Default, then 1.9.
	StdevFactor float64

	// Disabled turns ejection off: every instance always takes requests.
	// An upstream inherits Disabled from Default unless it sets Enabled.
	Disabled bool

	// Enabled turns ejection back on for an upstream whose Default set
	// Disabled. Setting both is an error.
	Enabled bool
}

// set reports whether e names instances.
func (e Endpoints) set() bool { return len(e.Addrs) > 0 || e.Resolver != nil }

// enabled reports whether the upstream is balanced.
func (e Endpoints) enabled() bool { return e.set() && !e.Disabled }

func (e Endpoints) inherit(parent Endpoints) Endpoints {
	// Addrs and Resolver are the upstream's own: see Endpoints.
	e.ResolveEvery = cmp.Or(e.ResolveEvery, parent.ResolveEvery)
	e.RoundRobin = e.RoundRobin || parent.RoundRobin
	e.Disabled = inheritOff(e.Disabled, e.Enabled, parent.Disabled)
	e.Outlier = e.Outlier.inherit(parent.Outlier)
	return e
}

func (o Outlier) inherit(parent Outlier) Outlier {
	o.Consecutive = cmp.Or(o.Consecutive, parent.Consecutive)
	o.Interval = cmp.Or(o.Interval, parent.Interval)
	o.BaseEjection = cmp.Or(o.BaseEjection, parent.BaseEjection)
	o.MaxEjection = cmp.Or(o.MaxEjection, parent.MaxEjection)
	o.MaxEjectedPercent = cmp.Or(o.MaxEjectedPercent, parent.MaxEjectedPercent)
	o.SuccessRateMinHosts = cmp.Or(o.SuccessRateMinHosts, parent.SuccessRateMinHosts)
	o.SuccessRateVolume = cmp.Or(o.SuccessRateVolume, parent.SuccessRateVolume)
	o.StdevFactor = cmp.Or(o.StdevFactor, parent.StdevFactor)
	o.Disabled = inheritOff(o.Disabled, o.Enabled, parent.Disabled)
	return o
}

func (e Endpoints) withDefaults() Endpoints {
	e.ResolveEvery = cmp.Or(e.ResolveEvery, defaultResolveEvery)
	o := &e.Outlier
	o.Consecutive = cmp.Or(o.Consecutive, defaultConsecutiveFailures)
	o.Interval = cmp.Or(o.Interval, defaultOutlierInterval)
	o.BaseEjection = cmp.Or(o.BaseEjection, defaultBaseEjection)
	o.MaxEjection = cmp.Or(o.MaxEjection, max(defaultMaxEjection, o.BaseEjection))
	o.MaxEjectedPercent = cmp.Or(o.MaxEjectedPercent, defaultMaxEjectedPercent)
	o.SuccessRateMinHosts = cmp.Or(o.SuccessRateMinHosts, defaultSuccessRateMinHosts)
	o.SuccessRateVolume = cmp.Or(o.SuccessRateVolume, defaultSuccessRateVolume)
	o.StdevFactor = cmp.Or(o.StdevFactor, defaultSuccessRateStdevMult)
	return e
}

func (e Endpoints) validate() error {
	if len(e.Addrs) > 0 && e.Resolver != nil {
		return fieldError("Endpoints.Addrs", len(e.Addrs), "must be empty when Endpoints.Resolver is set")
	}
	seen := make(map[string]bool, len(e.Addrs))
	for _, a := range e.Addrs {
		if err := checkAddr(a); err != nil {
			return fieldError("Endpoints.Addrs", strconv.Quote(a), err.Error())
		}
		if seen[a] {
			return fieldError("Endpoints.Addrs", strconv.Quote(a), "listed twice")
		}
		seen[a] = true
	}
	if e.ResolveEvery < 0 {
		return fieldError("Endpoints.ResolveEvery", e.ResolveEvery, "must be ≥ 0")
	}
	return e.Outlier.validate()
}

// validate is Endpoints.validate's part for the outlier detection.
func (o Outlier) validate() error {
	switch {
	case o.Interval < 0:
		return fieldError("Endpoints.Outlier.Interval", o.Interval, "must be ≥ 0")
	case o.BaseEjection < 0:
		return fieldError("Endpoints.Outlier.BaseEjection", o.BaseEjection, "must be ≥ 0")
	case o.MaxEjection < o.BaseEjection:
		return fieldError("Endpoints.Outlier.MaxEjection", o.MaxEjection, "must be ≥ Endpoints.Outlier.BaseEjection ("+o.BaseEjection.String()+")")
	case o.MaxEjectedPercent < 0 || o.MaxEjectedPercent > 100:
		return fieldError("Endpoints.Outlier.MaxEjectedPercent", o.MaxEjectedPercent, "must be in [0, 100]")
	case o.SuccessRateVolume < 0:
		return fieldError("Endpoints.Outlier.SuccessRateVolume", o.SuccessRateVolume, "must be ≥ 0")
	case o.StdevFactor < 0 || math.IsNaN(o.StdevFactor) || math.IsInf(o.StdevFactor, 0):
		return fieldError("Endpoints.Outlier.StdevFactor", o.StdevFactor, "must be a finite number ≥ 0")
	}
	return nil
}

// checkAddr accepts exactly "host:port" with a port in 1..65535.
func checkAddr(a string) error {
	host, port, err := net.SplitHostPort(a)
	if err != nil || host == "" {
		return errString("must be host:port")
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return errString("port must be 1..65535")
	}
	return nil
}

// ejectCap is how many of n instances may be ejected at once: pct percent
// rounded down, but at least one, and never all.
func ejectCap(n, pct int) int {
	return min(max(1, n*pct/100), n-1)
}

// ejectionTime is the length of the times-th ejection in a row.
func (o *Outlier) ejectionTime(times int) time.Duration {
	if times <= 0 {
		times = 1
	}
	if o.BaseEjection > 0 && time.Duration(times) > o.MaxEjection/o.BaseEjection {
		return o.MaxEjection
	}
	return min(o.BaseEjection*time.Duration(times), o.MaxEjection)
}

// rateSample is one instance's interval for the success-rate check.
type rateSample struct {
	in   *instance
	rate float64
}

// successRateOutliers returns the samples whose success rate is below mean
// − factor × σ (population standard deviation), given enough samples.
func successRateOutliers(samples []rateSample, minHosts int, factor float64) []rateSample {
	if minHosts < 0 || len(samples) < minHosts || len(samples) == 0 {
		return nil
	}
	var sum float64
	for _, s := range samples {
		sum += s.rate
	}
	mean := sum / float64(len(samples))
	var sq float64
	for _, s := range samples {
		sq += (s.rate - mean) * (s.rate - mean)
	}
	threshold := mean - factor*math.Sqrt(sq/float64(len(samples)))
	out := samples[:0:0]
	for _, s := range samples {
		if s.rate < threshold {
			out = append(out, s)
		}
	}
	return out
}
