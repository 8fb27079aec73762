package server

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/bulwark-http/bulwark/internal/version"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// findMetric returns the metric called name, from the Shedder's meter.
// Every point must come from the server package's own instrumentation
// scope, with the module's version.
func findMetric(t *testing.T, rm metricdata.ResourceMetrics, name string) *metricdata.Metrics {
	t.Helper()
	for _, sm := range rm.ScopeMetrics {
		for i := range sm.Metrics {
			if sm.Metrics[i].Name == name {
				if sm.Scope.Name != "github.com/bulwark-http/bulwark/server" || sm.Scope.Version != version.Module() {
					t.Errorf("%s: instrumentation scope %q version %q, want the server package's path and %q", name, sm.Scope.Name, sm.Scope.Version, version.Module())
				}
				return &sm.Metrics[i]
			}
		}
	}
	return nil
}

// counter returns the value of counter name at exactly the attributes kv.
func counter(t *testing.T, rm metricdata.ResourceMetrics, name string, kv ...attribute.KeyValue) int64 {
	t.Helper()
	m := findMetric(t, rm, name)
	if m == nil {
		return 0
	}
	want := attribute.NewSet(kv...)
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		if dp.Attributes.Equals(&want) {
			return dp.Value
		}
	}
	return 0
}

// checkShedMetrics insists that a collection from reader matches Stats()
// point for point.
func checkShedMetrics(t *testing.T, reader *sdkmetric.ManualReader, s *Shedder) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	for p := range numPriorities {
		prio := keyShedPriority.String(bulwark.Priority(p).String())
		if got := counter(t, rm, "bulwark.shed.served", prio); uint64(got) != st.Served[p] {
			t.Errorf("bulwark.shed.served{%s} = %d, Stats says %d", bulwark.Priority(p), got, st.Served[p])
		}
		for r := range numShedReasons {
			reason := keyShedReason.String(ShedReason(r).String())
			if got := counter(t, rm, "bulwark.shed.refused", reason, prio); uint64(got) != st.Shed[r][p] {
				t.Errorf("bulwark.shed.refused{%s, %s} = %d, Stats says %d", ShedReason(r), bulwark.Priority(p), got, st.Shed[r][p])
			}
		}
	}
	if n := len(findMetric(t, rm, "bulwark.shed.refused").Data.(metricdata.Sum[int64]).DataPoints); n != numShedReasons*numPriorities {
		t.Errorf("bulwark.shed.refused has %d series, want %d", n, numShedReasons*numPriorities)
	}
	for name, want := range map[string]int{"bulwark.shed.in_flight": st.InFlight, "bulwark.shed.queued": st.Queued, "bulwark.shed.workers": st.Workers} {
		m := findMetric(t, rm, name)
		if m == nil {
			t.Errorf("no %s", name)
			continue
		}
		pts := m.Data.(metricdata.Gauge[int64]).DataPoints
		if len(pts) != 1 || pts[0].Value != int64(want) {
			t.Errorf("%s = %+v, Stats says %d", name, pts, want)
		}
	}
}

// A Shedder at twice its capacity exports what Stats reports: served by
// tier, refusals by reason and tier, in flight and queued.
func TestShedderMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reader := sdkmetric.NewManualReader()
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		t.Cleanup(func() { _ = mp.Shutdown(t.Context()) })
		g := newGate()
		s := mustShedder(t, g, ShedConfig{Workers: 2, Queue: 1, ReservedCritical: -1, MaxQueueWait: time.Hour, MeterProvider: mp})
		// 2 × (2 workers + 1 queued): GET 0 and 1 served, GET 2 queued,
		// GET 3 refused (queue full), POST 4 displaces GET 2, POST 5
		// refused (queue full, nothing less important to displace).
		methods := []string{"GET", "GET", "GET", "GET", "POST", "POST"}
		var chs []<-chan *httptest.ResponseRecorder
		for i, m := range methods {
			chs = append(chs, start(s, newReq(m, fmt.Sprintf("/%d", i), "")))
			synctest.Wait()
		}
		st := s.Stats()
		if st.InFlight != 2 || st.Queued != 1 || st.ShedTotal() != 3 ||
			st.Shed[ShedQueueFull][bulwark.PriorityNormal] != 1 || st.Shed[ShedDisplaced][bulwark.PriorityNormal] != 1 || st.Shed[ShedQueueFull][bulwark.PriorityHigh] != 1 {
			t.Fatalf("Stats() = %+v, want 2 in flight, 1 queued, 3 shed over two reasons and two tiers", st)
		}
		checkShedMetrics(t, reader, s)

		close(g.release)
		for _, i := range []int{0, 1, 4} {
			checkOK(t, fmt.Sprintf("request %d", i), <-chs[i])
		}
		for _, i := range []int{2, 3, 5} {
			<-chs[i]
		}
		if st := s.Stats(); st.Served[bulwark.PriorityNormal] != 2 || st.Served[bulwark.PriorityHigh] != 1 || st.InFlight != 0 {
			t.Fatalf("after release Stats() = %+v", st)
		}
		checkShedMetrics(t, reader, s)
	})
}

// A noop MeterProvider gets no instruments, and a Shedder with one works.
func TestShedderMetricsNoop(t *testing.T) {
	s := mustShedder(t, newGate(), ShedConfig{MeterProvider: noop.NewMeterProvider()})
	checkOK(t, "noop", serveNow(s, noBlock(newReq("GET", "/", ""))))
}

// BenchmarkShedderAdmittedSDK is BenchmarkShedderAdmitted/serial with an
// SDK MeterProvider: the instruments are observable, so the admitted path
// costs the same as without one.
func BenchmarkShedderAdmittedSDK(b *testing.B) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	b.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	noop := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	s := mustShedder(b, noop, ShedConfig{Workers: 1 << 16, MeterProvider: mp})
	w, r := &nopWriter{h: http.Header{}}, newReq("GET", "/", "")
	b.ReportAllocs()
	for b.Loop() {
		s.ServeHTTP(w, r)
	}
}

// Two named Shedders on one MeterProvider export apart: every point carries
// its Shedder's bulwark.shed.name.
func TestShedderMetricsNamed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reader := sdkmetric.NewManualReader()
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		t.Cleanup(func() { _ = mp.Shutdown(t.Context()) })
		ga, gb := newGate(), newGate()
		a := mustShedder(t, ga, ShedConfig{Workers: 2, Queue: 1, MeterProvider: mp, Name: "public"})
		mustShedder(t, gb, ShedConfig{Workers: 2, Queue: 1, MeterProvider: mp, Name: "admin"})
		ch := start(a, newReq("GET", "/a", "")) // one in a's handler, none in b's
		synctest.Wait()
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(t.Context(), &rm); err != nil {
			t.Fatal(err)
		}
		pts := findMetric(t, rm, "bulwark.shed.in_flight").Data.(metricdata.Gauge[int64]).DataPoints
		got := map[string]int64{}
		for _, p := range pts {
			v, _ := p.Attributes.Value(keyShedName)
			got[v.AsString()] = p.Value
		}
		if len(pts) != 2 || got["public"] != 1 || got["admin"] != 0 {
			t.Errorf("bulwark.shed.in_flight points %v, want public 1 and admin 0", got)
		}
		served := findMetric(t, rm, "bulwark.shed.served").Data.(metricdata.Sum[int64]).DataPoints
		for _, p := range served {
			if v, ok := p.Attributes.Value(keyShedName); !ok || (v.AsString() != "public" && v.AsString() != "admin") {
				t.Errorf("a bulwark.shed.served point without its Shedder's name: %v", p.Attributes)
			}
		}
		close(ga.release)
		close(gb.release)
		checkOK(t, "a", <-ch)
	})
}
