package bulwark

// Observability: OpenTelemetry spans, events and metrics, and log lines,
// for every decision the stack makes, through the OpenTelemetry API alone
// (the SDK is the application's choice). Layers report through the
// *reporter in their env: with the layer's request context, never while
// holding a lock, since a report may log and a provider's work runs
// inline. The gauges read Transport.Snapshot, never a layer's fields.
// Attributes are bounded: bulwark.upstream is the Upstreams key, never a
// raw host, and a layer-supplied value past maxLabelValues distinct ones
// per host is "other". Spans, stacking with otelhttp, the metric names and
// the cost with nothing configured: see docs/design.md, "Observability".

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bulwark-http/bulwark/internal/version"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
)

// instrumentationName names bulwark's tracer and meter.
const instrumentationName = "github.com/bulwark-http/bulwark"

// Span names and event names.
const (
	spanRequest         = "bulwark.request"
	eventRetry          = "bulwark.retry"
	eventHedge          = "bulwark.hedge"
	eventRejected       = "bulwark.rejected"
	eventShadowRejected = "bulwark.shadow_rejected"
	eventFallback       = "bulwark.fallback"
	eventEjected        = "bulwark.outlier.ejected"
	eventReturned       = "bulwark.outlier.returned"
	otherLabel          = "other"
	redactedMarker      = "REDACTED"
)

// The layers that reject a request, as rejected() takes them and as the
// bulwark.layer attribute reports them.
const (
	layerBreaker  = "breaker"
	layerBulkhead = "bulkhead"
	layerPushback = "pushback"
	layerThrottle = "throttle"
	layerBudget   = "budget"
	layerDeadline = "deadline"
)

// Attribute keys bulwark adds beside the semantic conventions' ones.
const (
	keyUpstream       = attribute.Key("bulwark.upstream")
	keyRoute          = attribute.Key("bulwark.route") // the Config.Routes key
	keyOutcome        = attribute.Key("bulwark.outcome")
	keyAttempt        = attribute.Key("bulwark.attempt")
	keyHedge          = attribute.Key("bulwark.hedge")
	keyLayer          = attribute.Key("bulwark.layer")
	keyRetryReason    = attribute.Key("bulwark.retry.reason")
	keyRetryDelay     = attribute.Key("bulwark.retry.delay") // seconds, float
	keyFromRetryAfter = attribute.Key("bulwark.retry.from_retry_after")
	keyFallbackKind   = attribute.Key("bulwark.fallback.kind")
	keyBreakerState   = attribute.Key("bulwark.breaker.state")
	keyInstance       = attribute.Key("bulwark.instance")
	keyOutlierReason  = attribute.Key("bulwark.outlier.reason")
	keyEjectionTime   = attribute.Key("bulwark.outlier.ejection_time") // seconds, float
	keyEjections      = attribute.Key("bulwark.outlier.ejections")     // times in a row
)

// observer holds a Transport's providers and the instruments made from them
// once, in New.
type observer struct {
	tracer  trace.Tracer                  // nil: tracing is off for good
	unsetTP trace.TracerProvider          // non-nil: tracer came from otel's placeholder; off while it is the global
	prop    propagation.TextMapPropagator // nil: nothing is injected
	unsetTM propagation.TextMapPropagator // like unsetTP, for the propagator
	meterOn bool
	unsetMP metric.MeterProvider // like unsetTP, for the meter
	meter   metric.Meter

	requests, retries, rejections, fallbacks, transitions metric.Int64Counter
	shadowRejections, hedges                              metric.Int64Counter
	ejections, returns, faults                            metric.Int64Counter
	attemptDuration, retryDelay                           metric.Float64Histogram

	// state is what is on (obsTracing, …), kept by refresh; static means
	// no placeholder is involved, so state never changes after New.
	state  atomic.Uint32
	static bool

	logger *slog.Logger
}

// isPlaceholder reports whether v is one of the placeholders otel installs
// as a global until the application sets one. They live in otel's internal
// package, so the package path is the only way to recognise them; should it
// ever change, bulwark treats the placeholder as a real provider, which is
// correct, only slower.
func isPlaceholder(v any) bool {
	t := reflect.TypeOf(v)
	return t != nil && t.Kind() == reflect.Pointer && t.Elem().PkgPath() == "go.opentelemetry.io/otel/internal/global"
}

// newObserver makes the observer of Config's providers (nil: the global
// ones).
func newObserver(tp trace.TracerProvider, prop propagation.TextMapPropagator, mp metric.MeterProvider, logger *slog.Logger) *observer {
	o := &observer{logger: logger}

	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	switch tp.(type) {
	case tracenoop.TracerProvider, *tracenoop.TracerProvider:
	default:
		o.tracer = tp.Tracer(instrumentationName, trace.WithSchemaURL(semconv.SchemaURL), trace.WithInstrumentationVersion(version.Module()))
		if isPlaceholder(tp) {
			o.unsetTP = tp
		}
	}

	o.prop = prop
	if o.prop == nil {
		o.prop = otel.GetTextMapPropagator()
	}
	if isPlaceholder(o.prop) {
		o.unsetTM = o.prop
	}

	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	switch mp.(type) {
	case metricnoop.MeterProvider, *metricnoop.MeterProvider:
		mp = metricnoop.NewMeterProvider()
	default:
		o.meterOn = true
		if isPlaceholder(mp) {
			o.unsetMP = mp
		}
	}
	o.meter = mp.Meter(instrumentationName, metric.WithSchemaURL(semconv.SchemaURL), metric.WithInstrumentationVersion(version.Module()))

	if errs := o.instruments(); len(errs) > 0 {
		logger.Warn("bulwark: creating metric instruments", "err", errors.Join(errs...))
	}
	o.refresh()
	o.static = o.unsetTP == nil && o.unsetMP == nil && o.unsetTM == nil
	return o
}

// instruments creates o's counters and histograms on o.meter. An
// instrument the meter refuses is a no-op one, and its error is returned.
func (o *observer) instruments() []error {
	var errs []error
	// unit is a UCUM annotation of what one count is, in the singular, as
	// the semantic conventions' instrument units ask: {request}, not
	// {requests}.
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := o.meter.Int64Counter(name, metric.WithDescription(desc), metric.WithUnit(unit))
		if err != nil {
			errs = append(errs, err)
			c, _ = metricnoop.Meter{}.Int64Counter(name)
		}
		return c
	}
	hist := func(name, desc string, bounds []float64) metric.Float64Histogram {
		h, err := o.meter.Float64Histogram(name, metric.WithDescription(desc), metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(bounds...))
		if err != nil {
			errs = append(errs, err)
			h, _ = metricnoop.Meter{}.Float64Histogram(name)
		}
		return h
	}
	o.requests = counter("bulwark.requests", "{request}", "Calls through bulwark, by final outcome.")
	o.retries = counter("bulwark.retries", "{retry}", "Retries scheduled, by reason.")
	o.hedges = counter("bulwark.hedges", "{hedge}", "Hedged attempts sent, won, and skipped (by reason).")
	o.rejections = counter("bulwark.rejections", "{attempt}", "Attempts bulwark refused to send, by the layer that refused.")
	o.shadowRejections = counter("bulwark.shadow.rejections", "{attempt}", "Attempts a layer in shadow mode would have refused and sent anyway, by layer.")
	o.fallbacks = counter("bulwark.fallbacks", "{request}", "Final failures answered by a fallback, by kind.")
	o.transitions = counter("bulwark.breaker.transitions", "{transition}", "Circuit breaker state changes, by the new state.")
	o.ejections = counter("bulwark.outlier.ejections", "{instance}", "Instances ejected by outlier detection.")
	o.returns = counter("bulwark.outlier.returns", "{instance}", "Ejected instances returned to the balancer's set.")
	o.faults = counter("bulwark.faults", "{fault}", "Faults injected by the fault layer, by kind; refused header triggers as kind refused.")
	// The semantic conventions' buckets for http.client.request.duration.
	durations := []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}
	o.attemptDuration = hist("bulwark.attempt.duration", "Duration of one attempt, until its response body is read or closed.", durations)
	o.retryDelay = hist("bulwark.retry.delay", "Wait before a retry, backoff or Retry-After.", []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60})
	return errs
}

// The bits of observer.state: what is on, as of the last refresh.
const (
	obsTracing uint32 = 1 << iota
	obsMetering
	obsPropagating
)

// refresh re-evaluates which providers are live and publishes the answer
// in o.state, which the per-request checks read with one atomic load. The
// router calls it when it creates a host and whenever it updates a host's
// last-used time (at most every touchEvery per host), so a global provider
// set after New is seen by a host's first request, or within touchEvery of
// it on a busy host. Looking the three globals up on every request instead
// costs about 4 ns each, twice per call: over 5 % of the router's own cost.
func (o *observer) refresh() {
	if o.static {
		return
	}
	var s uint32
	if o.tracer != nil && (o.unsetTP == nil || otel.GetTracerProvider() != o.unsetTP) {
		s |= obsTracing
	}
	if o.meterOn && (o.unsetMP == nil || otel.GetMeterProvider() != o.unsetMP) {
		s |= obsMetering
	}
	if o.unsetTM == nil || otel.GetTextMapPropagator() != o.unsetTM {
		s |= obsPropagating
	}
	if o.state.Load() != s {
		o.state.Store(s)
	}
}

// metering reports whether measurements go anywhere.
func (o *observer) metering() bool { return o.state.Load()&obsMetering != 0 }

// maxLabelValues bounds the distinct values of one attribute a host caches
// measurement options for; a value past it is reported as "other", so a
// layer passing an unbounded string cannot blow up cardinality.
const maxLabelValues = 32

// labelOpts is the measurement options for one attribute set
// {bulwark.upstream, key=value}, in the slice shapes the instruments take,
// so that recording passes an existing slice and allocates nothing.
type labelOpts struct {
	key attribute.Key
	val string
	add []metric.AddOption
	rec []metric.RecordOption
}

// reporter is where one host's layers report what they decide: spans'
// events, metrics and log lines. It holds the host's cache of measurement
// options, filled on first use of each value and read without a lock.
type reporter struct {
	o        *observer
	logger   *slog.Logger
	upstream string
	host     string // "host:port"
	port     int    // for server.port; 0 when unknown
	// route is the Config.Routes key of a route's reporter (forRoute), ""
	// for a host's: it is a bulwark.route attribute of every metric point
	// and span the reporter makes.
	route string

	mu   sync.Mutex // serialises additions to opts
	opts atomic.Pointer[[]*labelOpts]
	bare atomic.Pointer[labelOpts] // {bulwark.upstream} alone

	// calls counts the host's calls by final outcome, its routes' too
	// (forRoute shares it); never nil.
	calls *callCounts
}

// callCounts is a host's calls by final outcome, as CallCounts reports
// them: one atomic add a call, on the request path whatever the
// providers, so that the debug page has them with no metrics set up. Its
// cost is BenchmarkCallCounts'. (Counts striped over cache lines by a
// call's start time were no cheaper there: without a stripe per core,
// every line still moves between the cores.)
type callCounts struct{ n [numCallKinds]atomic.Uint64 }

// The final outcomes callCounts tells apart.
const (
	callOther    = iota // a 4xx, the caller's own cancel or deadline, a body that failed to read
	callOK              // Policy.Classify's success
	callFailed          // its failure, other than bulwark's own timeout
	callTimedOut        // ErrAttemptTimeout or ErrTotalTimeout
	callRefused         // not sent by a layer of bulwark's
	callPassedUp        // a failure passed up from below (NoRetryFromBelow)
	numCallKinds
)

// count adds a call whose final outcome was judged j. The order of the
// cases is the labels' (judged.label): a classifier's verdict first. c
// may be nil: nothing is counted (a reporter made bare, in a test).
func (c *callCounts) count(j judged) {
	if c == nil {
		return
	}
	i := callOther
	switch {
	case j.v.Outcome == OutcomeSuccess:
		i = callOK
	case j.k == kindPassedUp:
		i = callPassedUp
	case j.k == kindTimeout:
		i = callTimedOut
	case j.v.Outcome == OutcomeFailure:
		i = callFailed
	case !reached(j.k) && j.k != kindLocal:
		i = callRefused
	}
	c.n[i].Add(1)
}

// CallCounts are a host's calls since its state was made (its routes'
// included), by final outcome: what the caller got, after retries,
// hedges and fallback, judged by Policy.Classify as the bulwark.requests
// metric judges it.
type CallCounts struct {
	// Calls is every call, whatever its outcome: the others below and
	// those that are none of them (a 4xx, the caller's own cancellation or
	// deadline, a request body that failed to read). A request that could
	// not be written at all (ErrInvalidRequest) is refused before it
	// reaches a host, and is no host's call.
	Calls uint64
	// Succeeded is the calls whose outcome Policy.Classify called a
	// success; an answer from the fallback is one (FallbackSnapshot.Served
	// counts those).
	Succeeded uint64
	// Failed is the calls it called a failure (a 5xx or 429, a transport
	// error), other than TimedOut.
	Failed uint64
	// TimedOut is the calls that ran past bulwark's own bound:
	// ErrAttemptTimeout or ErrTotalTimeout.
	TimedOut uint64
	// Refused is the calls a layer of bulwark's did not send (breaker
	// open, bulkhead full, pushback, throttle, retry budget, deadline too
	// short; each layer's own count is in its piece of the Snapshot).
	Refused uint64
	// PassedUp is the calls whose final answer passed a failure up from
	// below (NoRetryFromBelow): failed, but not the host's own failure.
	PassedUp uint64
}

// snapshot is the counts as CallCounts.
func (c *callCounts) snapshot() CallCounts {
	var n [numCallKinds]uint64
	for i := range n {
		n[i] = c.n[i].Load()
	}
	s := CallCounts{Succeeded: n[callOK], Failed: n[callFailed], TimedOut: n[callTimedOut], Refused: n[callRefused], PassedUp: n[callPassedUp]}
	for _, v := range n {
		s.Calls += v
	}
	return s
}

// reporter makes the reporter of one host.
func (o *observer) reporter(upstream, host, port string) *reporter {
	p, _ := strconv.Atoi(port)
	return &reporter{o: o, logger: o.logger, upstream: upstream, host: host, port: p, calls: new(callCounts)}
}

// forRoute makes the reporter of one route on the host: the same, with a
// bulwark.route attribute. The pattern, not the path: the patterns are the
// configuration's, so the attribute's values are as few as Config.Routes
// has keys, where a path (an ID in it) would be unbounded.
func (rep *reporter) forRoute(pattern string) *reporter {
	return &reporter{o: rep.o, logger: rep.logger, upstream: rep.upstream, host: rep.host, port: rep.port, route: pattern, calls: rep.calls}
}

// labels returns the options for {bulwark.upstream, key=val} (and
// bulwark.route on a route's reporter); an empty key means the upstream
// alone.
func (rep *reporter) labels(key attribute.Key, val string) *labelOpts {
	if key == "" {
		if l := rep.bare.Load(); l != nil {
			return l
		}
	} else if p := rep.opts.Load(); p != nil {
		for _, l := range *p {
			if l.key == key && l.val == val {
				return l
			}
		}
	}
	return rep.addLabels(key, val)
}

func (rep *reporter) addLabels(key attribute.Key, val string) *labelOpts {
	rep.mu.Lock()
	defer rep.mu.Unlock()
	var old []*labelOpts
	if p := rep.opts.Load(); p != nil {
		old = *p
	}
	find := func(v string) (*labelOpts, int) {
		n := 0
		for _, l := range old {
			if l.key == key {
				if l.val == v {
					return l, n
				}
				n++
			}
		}
		return nil, n
	}
	l, n := find(val)
	if l != nil {
		return l
	}
	if key != "" && n >= maxLabelValues {
		val = otherLabel
		if l, _ = find(val); l != nil {
			return l
		}
	}
	kvs := make([]attribute.KeyValue, 0, 3)
	kvs = append(kvs, keyUpstream.String(rep.upstream))
	if rep.route != "" {
		kvs = append(kvs, keyRoute.String(rep.route))
	}
	if key != "" {
		kvs = append(kvs, key.String(val))
	}
	set := attribute.NewSet(kvs...)
	opt := metric.WithAttributeSet(set)
	l = &labelOpts{key: key, val: strings.Clone(val), add: []metric.AddOption{opt}, rec: []metric.RecordOption{opt}}
	if key == "" {
		rep.bare.Store(l)
		return l
	}
	next := make([]*labelOpts, len(old), len(old)+1)
	copy(next, old)
	next = append(next, l)
	rep.opts.Store(&next)
	return l
}

// event adds an event to the span in ctx (the caller's, or the logical
// request span), if it is recording. The attrs slice is built by the caller
// before this runs, so hot paths should check recording(ctx) first.
func event(ctx context.Context, name string, attrs ...attribute.KeyValue) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.AddEvent(name, trace.WithAttributes(attrs...))
	}
}

// recording reports whether an event on ctx's span would be recorded.
func recording(ctx context.Context) bool { return trace.SpanFromContext(ctx).IsRecording() }

// retryScheduled reports that the retry layer will send attempt (the number
// of the attempt about to be sent, 2 for the first retry) after delay, for
// reason (a short fixed word, see retryReason: "status_503",
// "attempt_timeout", "transport_error", …), and
// whether delay came from the server's Retry-After.
func (rep *reporter) retryScheduled(ctx context.Context, attempt int, delay time.Duration, reason string, fromRetryAfter bool) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.AddEvent(eventRetry, trace.WithAttributes(
			keyAttempt.Int(attempt), keyRetryDelay.Float64(delay.Seconds()),
			keyRetryReason.String(reason), keyFromRetryAfter.Bool(fromRetryAfter)))
	}
	if o := rep.o; o.metering() {
		o.retries.Add(ctx, 1, rep.labels(keyRetryReason, reason).add...)
		o.retryDelay.Record(ctx, delay.Seconds(), rep.labels("", "").rec...)
	}
	if l := rep.logger; l.Enabled(ctx, slog.LevelDebug) {
		l.LogAttrs(ctx, slog.LevelDebug, "bulwark: retry scheduled",
			slog.String("upstream", rep.upstream), slog.String("host", rep.host),
			slog.Int("attempt", attempt), slog.Duration("delay", delay),
			slog.String("reason", reason), slog.Bool("retry_after", fromRetryAfter))
	}
}

// hedge reports a hedging event: "sent", "won", or "skipped_" and the
// reason (budget, deadline, breaker, pushback, bulkhead), a short fixed word.
func (rep *reporter) hedge(ctx context.Context, what string) {
	if recording(ctx) {
		event(ctx, eventHedge, keyHedge.String(what))
	}
	if o := rep.o; o.metering() {
		o.hedges.Add(ctx, 1, rep.labels(keyHedge, what).add...)
	}
}

// rejected reports that layer (layerBreaker, layerBulkhead, layerPushback,
// layerBudget, layerDeadline) refused to send the request.
func (rep *reporter) rejected(ctx context.Context, layer string) {
	if recording(ctx) {
		event(ctx, eventRejected, keyLayer.String(layer))
	}
	if o := rep.o; o.metering() {
		o.rejections.Add(ctx, 1, rep.labels(keyLayer, layer).add...)
	}
}

// shadowRejected reports that layer, in shadow mode, would have refused
// the request and sends it instead: a "bulwark.shadow_rejected" event on
// the span and the bulwark.shadow.rejections counter, so a threshold can be
// tuned on real traffic before it is enforced.
func (rep *reporter) shadowRejected(ctx context.Context, layer string) {
	if recording(ctx) {
		event(ctx, eventShadowRejected, keyLayer.String(layer))
	}
	if o := rep.o; o.metering() {
		o.shadowRejections.Add(ctx, 1, rep.labels(keyLayer, layer).add...)
	}
}

// faultInjected reports that the fault layer injected a fault of kind
// ("delay", "abort", "reset"), or refused a header trigger ("refused").
func (rep *reporter) faultInjected(ctx context.Context, kind string) {
	if o := rep.o; o.metering() {
		o.faults.Add(ctx, 1, rep.labels(keyFault, kind).add...)
	}
}

// fallbackServed reports that the fallback layer answered a final failure
// from kind ("stale", "constant" or "func": the FallbackHeader's value).
func (rep *reporter) fallbackServed(ctx context.Context, kind string) {
	if recording(ctx) {
		event(ctx, eventFallback, keyFallbackKind.String(kind))
	}
	if o := rep.o; o.metering() {
		o.fallbacks.Add(ctx, 1, rep.labels(keyFallbackKind, kind).add...)
	}
}

// breakerStateChanged reports a breaker transition ("closed", "open",
// "half-open") at Info and counts it under the new state's stateLabel. It has no request context: a state
// changes for the host, not for one call. extra goes on the log line only.
// Never call it under a lock.
func (rep *reporter) breakerStateChanged(from, to string, extra ...slog.Attr) {
	ctx := context.Background()
	if o := rep.o; o.metering() {
		o.transitions.Add(ctx, 1, rep.labels(keyBreakerState, stateLabel(to)).add...)
	}
	if l := rep.logger; l.Enabled(ctx, slog.LevelInfo) {
		attrs := append([]slog.Attr{slog.String("upstream", rep.upstream), slog.String("host", rep.host),
			slog.String("from", from), slog.String("to", to)}, extra...)
		l.LogAttrs(ctx, slog.LevelInfo, "bulwark: circuit breaker "+to, attrs...)
	}
}

// stateLabel is a state's name ("half-open") as a metric attribute's
// value: the semantic conventions write an enumeration's values in
// snake_case ("half_open").
func stateLabel(name string) string { return strings.ReplaceAll(name, "-", "_") }

// endpointChanged reports an outlier ejection or return decided during the
// request whose context is ctx: a log line at Info, an event on its span
// and a count. Never call it under the balancer's lock.
func (rep *reporter) endpointChanged(ctx context.Context, ev endpointEvent) {
	if ev.ejected {
		rep.logger.Info("bulwark: endpoint ejected", "host", rep.host, "upstream", rep.upstream,
			"endpoint", ev.addr, "reason", ev.reason, "for", ev.duration, "ejections", ev.times)
	} else {
		rep.logger.Info("bulwark: endpoint returned", "host", rep.host, "upstream", rep.upstream, "endpoint", ev.addr)
	}
	o := rep.o
	metering, rec := o.metering(), recording(ctx)
	if !metering && !rec {
		return
	}
	// The capped value, so that spans and metrics name the same instances.
	l := rep.labels(keyInstance, ev.addr)
	if metering {
		if ev.ejected {
			o.ejections.Add(ctx, 1, l.add...)
		} else {
			o.returns.Add(ctx, 1, l.add...)
		}
	}
	if !rec {
		return
	}
	if ev.ejected {
		event(ctx, eventEjected, keyInstance.String(l.val), keyOutlierReason.String(ev.reason),
			keyEjectionTime.Float64(ev.duration.Seconds()), keyEjections.Int(ev.times))
	} else {
		event(ctx, eventReturned, keyInstance.String(l.val))
	}
}

// pushbackChanged reports, at Info, that the host started asking callers to
// stay away until until (active) or that the pause is over.
func (rep *reporter) pushbackChanged(active bool, until time.Time) {
	ctx := context.Background()
	if l := rep.logger; l.Enabled(ctx, slog.LevelInfo) {
		msg := "bulwark: pushback ended"
		if active {
			msg = "bulwark: pushback started"
		}
		l.LogAttrs(ctx, slog.LevelInfo, msg,
			slog.String("upstream", rep.upstream), slog.String("host", rep.host),
			slog.Time("until", until))
	}
}

// limitChanged reports, at Info, that the adaptive bulkhead limit of name
// (the host, or an instance) moved from old to limit.
func (rep *reporter) limitChanged(name string, old, limit int) {
	ctx := context.Background()
	if l := rep.logger; l.Enabled(ctx, slog.LevelInfo) {
		l.LogAttrs(ctx, slog.LevelInfo, "bulwark: adaptive limit changed",
			slog.String("upstream", rep.upstream), slog.String("host", name),
			slog.Int("from", old), slog.Int("to", limit))
	}
}

// learnedChanged reports, at Info, that the healthy p99.9 a host's
// learned bounds follow moved by more than 2×, from old (zero: nothing
// learned yet) to p999.
func (rep *reporter) learnedChanged(old, p999 time.Duration) {
	ctx := context.Background()
	if l := rep.logger; l.Enabled(ctx, slog.LevelInfo) {
		l.LogAttrs(ctx, slog.LevelInfo, "bulwark: learned latency changed",
			slog.String("upstream", rep.upstream), slog.String("host", rep.host),
			slog.Duration("from", old), slog.Duration("to", p999))
	}
}

// throttleChanged reports, at Info, that the host's client-side throttle
// probability moved from old to p.
func (rep *reporter) throttleChanged(old, p float64) {
	ctx := context.Background()
	if l := rep.logger; l.Enabled(ctx, slog.LevelInfo) {
		l.LogAttrs(ctx, slog.LevelInfo, "bulwark: throttle probability changed",
			slog.String("upstream", rep.upstream), slog.String("host", rep.host),
			slog.Float64("from", old), slog.Float64("to", p))
	}
}

// retryReason is the bulwark.retry.reason of a retry after resp or err: a
// word from a small fixed set, so that a CheckRetry retrying odd statuses
// cannot grow the metric's cardinality.
func retryReason(resp *http.Response, err error) string {
	if err != nil {
		if errors.Is(err, ErrAttemptTimeout) {
			return "attempt_timeout"
		}
		return "transport_error"
	}
	switch resp.StatusCode {
	case http.StatusTooManyRequests:
		return "status_429"
	case http.StatusInternalServerError:
		return "status_500"
	case http.StatusBadGateway:
		return "status_502"
	case http.StatusServiceUnavailable:
		return "status_503"
	case http.StatusGatewayTimeout:
		return "status_504"
	}
	switch c := resp.StatusCode; {
	case c >= 500:
		return "status_5xx"
	case c >= 400:
		return "status_4xx"
	}
	return "status_other"
}

// callObs is the observation of one call, from the router's hand-off to
// its final outcome.
type callObs struct {
	rep  *reporter
	ctx  context.Context // the logical span's, nil when the caller has a span
	span trace.Span      // nil: not tracing the call
}

// begin starts the observation of a call, or returns nil when nothing is
// on (one atomic load).
func (rep *reporter) begin(req *http.Request) *callObs {
	o := rep.o
	state := o.state.Load()
	if state&(obsTracing|obsMetering) == 0 {
		return nil
	}
	c := &callObs{rep: rep}
	if state&obsTracing != 0 && !trace.SpanContextFromContext(req.Context()).IsValid() {
		c.ctx, c.span = o.tracer.Start(req.Context(), spanRequest,
			trace.WithSpanKind(trace.SpanKindInternal),
			trace.WithAttributes(methodAttr(req.Method), semconv.URLFullKey.String(redactURL(req.URL)), keyUpstream.String(rep.upstream)))
		if rep.route != "" {
			c.span.SetAttributes(keyRoute.String(rep.route))
		}
	}
	if state&obsMetering == 0 && c.span == nil {
		return nil
	}
	return c
}

// end records the call's final outcome, judged j by the call's
// classifier; the logical span ends with the response body.
func (c *callObs) end(req *http.Request, resp *http.Response, err error, j judged) {
	outcome := j.label()
	if c.rep.o.metering() {
		c.rep.o.requests.Add(req.Context(), 1, c.rep.labels(keyOutcome, outcome).add...)
	}
	if c.span == nil {
		return
	}
	c.span.SetAttributes(keyOutcome.String(outcome))
	if resp != nil {
		c.span.SetAttributes(semconv.HTTPResponseStatusCodeKey.Int(resp.StatusCode))
		if resp.StatusCode >= 400 {
			c.span.SetStatus(codes.Error, "")
		}
		onBodyEnd(resp, spanEnder{c.span})
	} else {
		c.span.SetStatus(codes.Error, safeError(err))
		c.span.End()
	}
}

// abort ends the logical span of a call that a layer below panicked out
// of, so that no span is left open; the panic itself goes on to the caller.
func (c *callObs) abort() {
	if c.span != nil {
		c.span.SetStatus(codes.Error, "panic")
		c.span.End()
	}
}

// spanEnder ends a span when a body is done.
type spanEnder struct{ span trace.Span }

func (s spanEnder) bodyEnd() { s.span.End() }

// safeError is err's text for a span status, with the URL that a
// *url.Error quotes redacted wherever it appears in the chain's message.
func safeError(err error) string {
	msg := err.Error()
	var ue *url.Error
	if errors.As(err, &ue) && ue.URL != "" {
		red := redactedMarker
		if u, perr := url.Parse(ue.URL); perr == nil {
			red = redactURL(u)
		}
		msg = strings.ReplaceAll(msg, ue.URL, red)
	}
	return msg
}

// spanName is the semantic conventions' span name without a route
// template: the method, or "HTTP" for a method they do not know.
func spanName(method string) string {
	switch method {
	case "":
		return http.MethodGet
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodDelete,
		http.MethodConnect, http.MethodOptions, http.MethodTrace, http.MethodPatch:
		return method
	}
	return "HTTP"
}

func methodAttr(method string) attribute.KeyValue {
	if n := spanName(method); n != "HTTP" {
		return semconv.HTTPRequestMethodKey.String(n)
	}
	return semconv.HTTPRequestMethodKey.String("_OTHER")
}

// redactURL is u for spans and logs: userinfo removed, every query value
// replaced by REDACTED (keys kept, since they name what was asked, not
// who asked), fragment dropped. Use it wherever a URL reaches a span
// attribute, a log line or an error message.
func redactURL(u *url.URL) string {
	if u == nil {
		return ""
	}
	var b strings.Builder
	if u.Scheme != "" {
		b.WriteString(u.Scheme)
		b.WriteString(":")
	}
	if u.Opaque != "" {
		// No authority or path to show safely: the opaque part may hold anything.
		b.WriteString(redactedMarker)
		return b.String()
	}
	if u.Host != "" || u.Scheme != "" {
		b.WriteString("//")
		b.WriteString(u.Host)
	}
	b.WriteString(u.EscapedPath())
	if u.RawQuery != "" || u.ForceQuery {
		b.WriteByte('?')
		for i, part := range strings.Split(u.RawQuery, "&") {
			if i > 0 {
				b.WriteByte('&')
			}
			key, _, hasValue := strings.Cut(part, "=")
			b.WriteString(key)
			if hasValue {
				b.WriteString("=" + redactedMarker)
			}
		}
	}
	return b.String()
}

// endpointEvent is an ejection or a return, queued under the balancer's
// lock and logged after it is released.
type endpointEvent struct {
	addr     string
	ejected  bool
	reason   string
	duration time.Duration
	times    int
}

func (ev endpointEvent) String() string {
	if ev.ejected {
		return fmt.Sprintf("ejected %s (%s) for %v", ev.addr, ev.reason, ev.duration)
	}
	return "returned " + ev.addr
}

var keyFault = attribute.Key("bulwark.fault")
