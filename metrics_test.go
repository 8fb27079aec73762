package bulwark_test

// The names, units and values of bulwark's metrics, read through the
// OpenTelemetry SDK as an exporter would read them.

import (
	"context"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/bulwark-http/bulwark/internal/version"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// instrumentLog is a MeterProvider that records each instrument made from
// it (kind, name, unit) and otherwise does nothing, so that every
// instrument is seen, also those that never record.
type instrumentLog struct {
	metricnoop.MeterProvider
	m *loggedMeter
}

func (p instrumentLog) Meter(string, ...metric.MeterOption) metric.Meter { return p.m }

type loggedMeter struct {
	metricnoop.Meter
	mu  sync.Mutex
	got []string // "kind name unit"
}

func (m *loggedMeter) log(kind, name, unit string) {
	m.mu.Lock()
	m.got = append(m.got, kind+" "+name+" "+unit)
	m.mu.Unlock()
}

func (m *loggedMeter) Int64Counter(name string, opts ...metric.Int64CounterOption) (metric.Int64Counter, error) {
	m.log("counter", name, metric.NewInt64CounterConfig(opts...).Unit())
	return m.Meter.Int64Counter(name, opts...)
}

func (m *loggedMeter) Float64Histogram(name string, opts ...metric.Float64HistogramOption) (metric.Float64Histogram, error) {
	m.log("histogram", name, metric.NewFloat64HistogramConfig(opts...).Unit())
	return m.Meter.Float64Histogram(name, opts...)
}

func (m *loggedMeter) Int64ObservableGauge(name string, opts ...metric.Int64ObservableGaugeOption) (metric.Int64ObservableGauge, error) {
	m.log("int64 gauge", name, metric.NewInt64ObservableGaugeConfig(opts...).Unit())
	return m.Meter.Int64ObservableGauge(name, opts...)
}

func (m *loggedMeter) Float64ObservableGauge(name string, opts ...metric.Float64ObservableGaugeOption) (metric.Float64ObservableGauge, error) {
	m.log("float64 gauge", name, metric.NewFloat64ObservableGaugeConfig(opts...).Unit())
	return m.Meter.Float64ObservableGauge(name, opts...)
}

func (m *loggedMeter) Int64ObservableUpDownCounter(name string, opts ...metric.Int64ObservableUpDownCounterOption) (metric.Int64ObservableUpDownCounter, error) {
	m.log("int64 updowncounter", name, metric.NewInt64ObservableUpDownCounterConfig(opts...).Unit())
	return m.Meter.Int64ObservableUpDownCounter(name, opts...)
}

// Every instrument bulwark's client makes, with its kind and unit: a count
// is a singular annotation ({request}), a share is the ratio 1, a time is
// seconds, and a breaker's state is one series per state.
func TestMetricInstruments(t *testing.T) {
	m := &loggedMeter{}
	tr, err := bulwark.New(bulwark.Config{Base: http.NewFileTransport(http.Dir(t.TempDir())), MeterProvider: instrumentLog{m: m}})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	want := []string{
		"counter bulwark.requests {request}",
		"counter bulwark.retries {retry}",
		"counter bulwark.hedges {hedge}",
		"counter bulwark.rejections {attempt}",
		"counter bulwark.shadow.rejections {attempt}",
		"counter bulwark.fallbacks {request}",
		"counter bulwark.breaker.transitions {transition}",
		"counter bulwark.outlier.ejections {instance}",
		"counter bulwark.outlier.returns {instance}",
		"counter bulwark.faults {fault}",
		"histogram bulwark.attempt.duration s",
		"histogram bulwark.retry.delay s",
		"int64 gauge bulwark.bulkhead.in_flight {request}",
		"int64 gauge bulwark.bulkhead.queued {request}",
		"int64 gauge bulwark.bulkhead.limit {request}",
		"float64 gauge bulwark.throttle.probability 1",
		"int64 gauge bulwark.retry.budget.remaining {retry}",
		"int64 gauge bulwark.outlier.ejected {instance}",
		"int64 updowncounter bulwark.breaker.state {breaker}",
		"float64 gauge bulwark.breaker.failure.rate 1",
		"float64 gauge bulwark.breaker.slow_call.rate 1",
	}
	m.mu.Lock()
	got := append([]string(nil), m.got...)
	m.mu.Unlock()
	sort.Strings(got)
	sort.Strings(want)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("instruments:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, g := range got {
		if unit := g[strings.LastIndexByte(g, ' ')+1:]; strings.HasPrefix(unit, "{") && strings.HasSuffix(unit, "s}") {
			t.Errorf("%s: a plural annotation", g)
		}
	}
}

// metricKit is an SDK MeterProvider read by hand.
type metricKit struct {
	reader *sdkmetric.ManualReader
	mp     *sdkmetric.MeterProvider
}

func newMetricKit(t *testing.T) *metricKit {
	k := &metricKit{reader: sdkmetric.NewManualReader()}
	k.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(k.reader))
	t.Cleanup(func() { _ = k.mp.Shutdown(context.Background()) })
	return k
}

// collect returns the metric called name, failing the test if none.
func (k *metricKit) collect(t *testing.T, name string) (metricdata.Metrics, metricdata.ResourceMetrics) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := k.reader.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				if sm.Scope.Name != "github.com/bulwark-http/bulwark" || sm.Scope.Version != version.Module() {
					t.Errorf("%s: scope %q version %q, want the root package's path and %q", name, sm.Scope.Name, sm.Scope.Version, version.Module())
				}
				return m, rm
			}
		}
	}
	t.Fatalf("no metric %s collected", name)
	return metricdata.Metrics{}, rm
}

// points are a metric's points as "attr=value,…" (sorted) → value.
func points[N int64 | float64](t *testing.T, m metricdata.Metrics) map[string]N {
	t.Helper()
	out := map[string]N{}
	add := func(set attribute.Set, v N) {
		var kv []string
		for _, a := range set.ToSlice() {
			kv = append(kv, string(a.Key)+"="+a.Value.String())
		}
		sort.Strings(kv)
		k := strings.Join(kv, ",")
		if _, dup := out[k]; dup {
			t.Errorf("%s: two points at %s", m.Name, k)
		}
		out[k] = v
	}
	switch d := m.Data.(type) {
	case metricdata.Gauge[N]:
		for _, p := range d.DataPoints {
			add(p.Attributes, p.Value)
		}
	case metricdata.Sum[N]:
		for _, p := range d.DataPoints {
			add(p.Attributes, p.Value)
		}
	default:
		t.Fatalf("%s is a %T", m.Name, m.Data)
	}
	return out
}

// hostKey is the attributes of a host's series, sorted, with more.
func hostKey(host string, more ...string) string {
	kv := append([]string{"bulwark.upstream=default", "server.address=" + host, "server.port=80", "url.scheme=http"}, more...)
	sort.Strings(kv)
	return strings.Join(kv, ",")
}

// wantStates checks the bulwark.breaker.state series of the series key
// (hostKey) in p: 1 for state, 0 for the two others.
func wantStates(t *testing.T, p map[string]int64, state string, key func(state string) string) {
	t.Helper()
	for _, s := range []string{"closed", "half_open", "open"} {
		want := int64(0)
		if s == state {
			want = 1
		}
		if v, ok := p[key(s)]; !ok || v != want {
			t.Errorf("bulwark.breaker.state{%s} = %d (present %v), want %d", key(s), v, ok, want)
		}
	}
}

func stateKey(host string, more ...string) func(string) string {
	return func(s string) string { return hostKey(host, append(more, "bulwark.breaker.state="+s)...) }
}

// A breaker's state is one series per state, per host and per route on
// it; its failure and slow-call rates are its window's, from the least
// calls it judges on, and absent before.
func TestMetricBreakerSeries(t *testing.T) {
	synctest.Test(t, testMetricBreakerSeries)
}

func testMetricBreakerSeries(t *testing.T) {
	k := newMetricKit(t)
	statuses := []int{200, 503, 200, 200, 503, 503}
	base := &seamBase{answer: func(n int, req *http.Request) (*http.Response, error) {
		return seamAnswer(req, 0, statuses[min(n, len(statuses))-1])
	}}
	tr := seamNew(t, bulwark.Config{Base: base, MeterProvider: k.mp,
		Default: bulwark.Policy{Retry: bulwark.Retry{Disabled: true}, Breaker: bulwark.Breaker{MinCalls: 4, WindowCalls: 10}},
		Routes:  map[string]bulwark.Policy{"GET /slow": {}}})
	const host = "api.test"
	send := func(n int, path string) {
		for range n {
			_, _ = seamSend(t, tr, "GET", "http://"+host+path)
		}
	}

	send(3, "/") // 200, 503, 200: below MinCalls
	m, _ := k.collect(t, "bulwark.breaker.state")
	if m.Unit != "{breaker}" {
		t.Errorf("bulwark.breaker.state unit %q, want {breaker}", m.Unit)
	}
	wantStates(t, points[int64](t, m), "closed", stateKey(host))
	if p := ratePoints(t, k, "bulwark.breaker.failure.rate"); len(p) != 0 {
		t.Errorf("bulwark.breaker.failure.rate with 3 calls of MinCalls 4: %v, want no point", p)
	}

	send(1, "/") // 200: four calls, one failed
	b := seamHost(t, tr, host+":80").Breaker
	if b.Calls != 4 || b.Failures != 1 || b.MinCalls != 4 {
		t.Fatalf("window %d calls, %d failures, MinCalls %d; want 4, 1, 4", b.Calls, b.Failures, b.MinCalls)
	}
	for name, want := range map[string]float64{
		"bulwark.breaker.failure.rate":   float64(b.Failures) / float64(b.Calls),
		"bulwark.breaker.slow_call.rate": float64(b.Slow) / float64(b.Calls),
	} {
		p := ratePoints(t, k, name)
		if v, ok := p[hostKey(host)]; !ok || v != want || len(p) != 1 {
			t.Errorf("%s = %v, want %v at %s alone", name, p, want, hostKey(host))
		}
	}

	send(2, "/") // 503, 503: 3 of 6 failed, at FailureRate 50 %: trips
	if s := seamHost(t, tr, host+":80").Breaker.State; s != bulwark.CircuitOpen {
		t.Fatalf("breaker %v after 3 failures in 6, want open", s)
	}
	send(1, "/slow") // the route's own breaker, closed: 503 (the last status) is one failure
	m, _ = k.collect(t, "bulwark.breaker.state")
	p := points[int64](t, m)
	wantStates(t, p, "open", stateKey(host))
	wantStates(t, p, "closed", stateKey(host, "bulwark.route=GET /slow"))
	if len(p) != 6 {
		t.Errorf("%d state series, want 6 (3 states × host and route): %v", len(p), p)
	}
	// The window empties on a trip: no rate until it holds MinCalls again.
	if p := ratePoints(t, k, "bulwark.breaker.failure.rate"); len(p) != 0 {
		t.Errorf("bulwark.breaker.failure.rate after the trip: %v, want no point", p)
	}
	time.Sleep(2 * time.Second) // past the open time (1 s, less up to 20 %): half-open
	m, _ = k.collect(t, "bulwark.breaker.state")
	wantStates(t, points[int64](t, m), "half_open", stateKey(host))
	send(1, "/") // a probe, 503: open again
	m, _ = k.collect(t, "bulwark.breaker.state")
	wantStates(t, points[int64](t, m), "open", stateKey(host))
	// The transitions counter names the states as the series do.
	m, _ = k.collect(t, "bulwark.breaker.transitions")
	tr2 := points[int64](t, m)
	for state, want := range map[string]int64{"open": 2, "half_open": 1} {
		if v := tr2["bulwark.breaker.state="+state+",bulwark.upstream=default"]; v != want {
			t.Errorf("bulwark.breaker.transitions{%s} = %d, want %d: %v", state, v, want, tr2)
		}
	}
}

// ratePoints are a float gauge's points, none when it has no point at all.
func ratePoints(t *testing.T, k *metricKit, name string) map[string]float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := k.reader.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				if m.Unit != "1" {
					t.Errorf("%s unit %q, want 1", name, m.Unit)
				}
				return points[float64](t, m)
			}
		}
	}
	return nil
}

// The throttle's probability is a ratio in [0, 1], the Snapshot's.
func TestMetricThrottleProbability(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newMetricKit(t)
		base := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) { return seamAnswer(req, 0, 503) }}
		tr := seamNew(t, bulwark.Config{Base: base, MeterProvider: k.mp, Default: bulwark.Policy{
			Retry: bulwark.Retry{Disabled: true}, Breaker: bulwark.Breaker{Disabled: true}, Throttle: bulwark.Throttle{Enabled: true, K: 1}}})
		for range 6 {
			_, _ = seamSend(t, tr, "GET", "http://api.test/")
		}
		want := seamHost(t, tr, "api.test:80").Throttle.Probability
		p := ratePoints(t, k, "bulwark.throttle.probability")
		if v, ok := p["bulwark.upstream=default"]; !ok || v != want || v <= 0 || v > 1 {
			t.Errorf("bulwark.throttle.probability = %v, want the Snapshot's %v, in (0, 1]", p, want)
		}
	})
}

// The breaker state series × Update, eviction and ControlBreaker: an
// Update that gives a host a new breaker moves its series to the new
// breaker's state, in place; a host evicted from the table has no series
// left; a forced state shows as the state it forces, and Auto gives the
// breaker's own back.
func seamBreakerSeriesUpdateEvict(t *testing.T) {
	k := newMetricKit(t)
	base := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) { return seamAnswer(req, 0, 503) }}
	cfg := bulwark.Config{Base: base, MeterProvider: k.mp, MaxHosts: 1,
		Default: bulwark.Policy{Retry: bulwark.Retry{Disabled: true}, Breaker: seamBreaker}}
	tr := seamNew(t, cfg)
	for range 5 {
		_, _ = seamSend(t, tr, "GET", "http://a.test/")
	}
	m, _ := k.collect(t, "bulwark.breaker.state")
	wantStates(t, points[int64](t, m), "open", stateKey("a.test"))

	cfg.Default.Breaker.WindowCalls = 20 // a new window: a new breaker, closed
	if err := tr.Update(cfg); err != nil {
		t.Fatal(err)
	}
	if s := seamHost(t, tr, "a.test:80").Breaker.State; s != bulwark.CircuitClosed {
		t.Fatalf("after the Update the breaker is %v, want a new one, closed", s)
	}
	m, _ = k.collect(t, "bulwark.breaker.state")
	p := points[int64](t, m)
	wantStates(t, p, "closed", stateKey("a.test"))
	if len(p) != 3 {
		t.Errorf("after the Update: %d series, want a.test's 3: %v", len(p), p)
	}

	_, _ = seamSend(t, tr, "GET", "http://b.test/") // MaxHosts 1: a.test goes
	if len(tr.Snapshot().Host("a.test:80")) != 0 {
		t.Fatal("a.test still has state after b.test's first call with MaxHosts 1")
	}
	m, _ = k.collect(t, "bulwark.breaker.state")
	p = points[int64](t, m)
	for key := range p {
		if strings.Contains(key, "server.address=a.test") {
			t.Errorf("evicted a.test still has a series: %s", key)
		}
	}
	wantStates(t, p, "closed", stateKey("b.test"))

	if err := tr.ControlBreaker("b.test:80", bulwark.BreakerForceOpen); err != nil {
		t.Fatal(err)
	}
	m, _ = k.collect(t, "bulwark.breaker.state")
	wantStates(t, points[int64](t, m), "open", stateKey("b.test"))
	if err := tr.ControlBreaker("b.test:80", bulwark.BreakerAuto); err != nil {
		t.Fatal(err)
	}
	m, _ = k.collect(t, "bulwark.breaker.state")
	wantStates(t, points[int64](t, m), "closed", stateKey("b.test"))
}

// BenchmarkMetricCollect is one collection of every bulwark metric with
// 100 hosts that each served a call: the gauges' callback and the SDK's
// export, as a periodic reader pays them.
func BenchmarkMetricCollect(b *testing.B) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	base := &seamBase{answer: func(_ int, req *http.Request) (*http.Response, error) { return seamAnswer(req, 0, 200) }}
	tr, err := bulwark.New(bulwark.Config{Base: base, MeterProvider: mp, Default: bulwark.Policy{Throttle: bulwark.Throttle{Enabled: true}}})
	if err != nil {
		b.Fatal(err)
	}
	defer tr.Close()
	for i := range 100 {
		req, _ := http.NewRequest("GET", "http://h"+strconv.Itoa(i)+".test/", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
	}
	var rm metricdata.ResourceMetrics
	b.ReportAllocs()
	for b.Loop() {
		if err := reader.Collect(context.Background(), &rm); err != nil {
			b.Fatal(err)
		}
	}
}
