package bulwark

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"
)

// New validates cfg and builds a Transport. Every invalid value is a
// *ConfigError (matching ErrInvalidConfig) naming the upstream and field.
func New(cfg Config) (*Transport, error) {
	_, leases := cfg.Fleet.(FleetLeaser)
	rs, err := compileFor(cfg, leases)
	if err != nil {
		return nil, err
	}
	t := &Transport{
		stackBuilder: stackBuilder{base: cfg.Base, abandon: cfg.BaseIgnoresContext},
		logger:       cfg.Logger,
		policies:     *rs,
		hosts:        make(map[hostKey]*hostState),
		controls:     make(map[string]BreakerControl),
	}
	if t.base == nil {
		if dt, ok := http.DefaultTransport.(*http.Transport); ok {
			t.base, t.ownBase = dt.Clone(), true
		} else {
			t.base = http.DefaultTransport
		}
	}
	if t.logger == nil {
		t.logger = slog.New(slog.DiscardHandler)
	}
	t.breakerControls.apply = t.applyControl
	t.obs = newObserver(cfg.TracerProvider, cfg.Propagator, cfg.MeterProvider, t.logger)
	t.registerGauges()
	t.config.applied(cfg.Version, cfg.Source, time.Now())
	// Last, so that a refused configuration starts no goroutine.
	t.fleet = newFleetLink(cfg.Fleet, t.logger, t)
	return t, nil
}

// Close stops the Transport's background work: the goroutines that publish
// to and receive from Config.Fleet. It does not close the Fleet, nor idle
// connections. After Close the Transport still sends requests, with local
// state only. It returns nil; calling it again does nothing.
func (t *Transport) Close() error {
	t.fleet.close()
	return nil
}

// NewClient returns an *http.Client whose Transport is New(cfg): a drop-in
// for http.DefaultClient. The client's own Timeout is left at zero, since
// Timeout.Total bounds each call (each redirect hop is a call of its own);
// redirects and cookies behave as with a zero http.Client.
func NewClient(cfg Config) (*http.Client, error) {
	t, err := New(cfg)
	if err != nil {
		return nil, err
	}
	return &http.Client{Transport: t}, nil
}

// RoundTrip sends req through the stack for its host. It implements
// http.RoundTripper: it never modifies req, always closes req.Body, and
// returns either a response or an error.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	return t.roundTrip(req, nil)
}

// roundTrip is RoundTrip with each attempt sent to via (call.via); nil is
// the base.
func (t *Transport) roundTrip(req *http.Request, via http.RoundTripper) (*http.Response, error) {
	// A request that cannot be written is refused before any layer sees
	// it: its fault is its own, and no layer may count it against the
	// host nor retry it.
	if err := invalidRequest(req, t.ownBase); err != nil {
		closeBody(req)
		return nil, err
	}
	if err := req.Context().Err(); err != nil {
		closeBody(req)
		return nil, doneError(req.Context())
	}
	now := time.Now()
	hs := t.lookupAt(req.URL, now.UnixNano())
	rt, rep, c := hs.rt, hs.rep, call{start: now, classify: hs.policy.Classify, above: retriedAbove(req.Header, &t.ignoredRA), via: via}
	if hs.table != nil {
		if r := t.routeStack(hs, req); r != nil {
			rt, rep, c.classify = r.rt, r.rep, r.classify
		}
	}
	resp, err := t.send(rep, rt, req, c)
	if err != nil || resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests {
		noteFailure(req.Context(), resp, err)
	}
	if err == nil {
		watchBody(req.Context(), resp)
	}
	return resp, err
}

// noteFailure notes a call that failed in the record of the incoming
// request its context carries, if any (CallRecord): a local refusal, or an
// answer that said don't retry (a pass-up from further down included). A
// call that was retried and still failed is noted by the retry layer,
// which knows.
func noteFailure(ctx context.Context, resp *http.Response, err error) {
	// A call with no record (no server half above it) reads nothing more.
	r, ok := ctx.Value(recordKey{}).(*CallRecord)
	if !ok {
		return
	}
	switch {
	case err != nil:
		// Refused here on purpose (breaker, bulkhead, pushback, throttle,
		// budget): the layer above retrying would meet the same refusal.
		// errors.Is, not classify, whose errors.As would allocate on a
		// refusal, which allocates nothing.
		if errors.Is(err, ErrBreakerOpen) || errors.Is(err, ErrBulkheadFull) || errors.Is(err, ErrPushback) ||
			errors.Is(err, ErrThrottled) || errors.Is(err, ErrRetryBudget) {
			r.notes.Or(noteRefused)
		}
	default:
		if stop, _, _ := noRetry(resp.Header); stop {
			r.notes.Or(noteNoRetry)
		}
	}
}

// CloseIdleConnections closes the base's idle connections, when the base
// can, as http.Client.CloseIdleConnections expects of a transport.
func (t *Transport) CloseIdleConnections() {
	type closeIdler interface{ CloseIdleConnections() }
	if ci, ok := t.base.(closeIdler); ok {
		ci.CloseIdleConnections()
	}
	// Balanced upstreams have a transport of their own per instance.
	t.eachHost(func(hs *hostState) {
		for _, p := range hs.parts {
			if c, ok := p.(idleCloser); ok {
				c.closeIdle()
			}
		}
	})
}

// send is the router's hand-off to a host's stack (or its route's, rt,
// with the route's reporter rep), with the call's state c: it counts the
// call's final outcome (in rep.calls, and in the metrics if on) and, when the caller's context has no span, wraps
// the call in a logical span so that its attempts share one trace.
func (t *Transport) send(rep *reporter, rt layer, req *http.Request, c call) (*http.Response, error) {
	o := rep.begin(req)
	if o == nil {
		resp, err := rt.roundTrip(req, c)
		rep.calls.count(c.judge(resp, err))
		return resp, err
	}
	if o.ctx != nil {
		req = req.WithContext(o.ctx)
	}
	returned := false
	defer func() {
		if !returned {
			// A layer below panicked: the logical span ends with it.
			o.abort()
		}
	}()
	resp, err := rt.roundTrip(req, c)
	returned = true
	j := c.judge(resp, err)
	rep.calls.count(j)
	o.end(req, resp, err, j)
	return resp, err
}
