package bulwark

import (
	"io"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"testing/synctest"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// eventAttr returns the value of key on ev.
func eventAttr(ev sdktrace.Event, key attribute.Key) (attribute.Value, bool) {
	for _, kv := range ev.Attributes {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// callerEvents returns, per ended "caller" span that has an event called
// name, the span's X-Call number and the event.
func callerEvents(k *otelKit, name string) map[string]sdktrace.Event {
	out := map[string]sdktrace.Event{}
	for _, s := range spansNamed(k.sr, "caller") {
		call, _ := attr(s, "test.call")
		for _, ev := range s.Events() {
			if ev.Name == name {
				out[call.AsString()] = ev
			}
		}
	}
	return out
}

// TestObserveOutlier: an instance ejected after its consecutive 5xx shows
// as an event on the span of the request whose failure ejected it, a count
// by instance and the ejected gauge; its return as an event and a count.
func TestObserveOutlier(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const sick = 3
		f := newFleet(t, 5, "tax.internal", func(i int) int {
			if i == sick {
				return http.StatusInternalServerError
			}
			return http.StatusOK
		})
		k := newOtelKit(t)
		cfg := k.config(f.transport())
		cfg.Upstreams = map[string]Policy{"tax.internal": {Endpoints: Endpoints{Addrs: f.addrs}}}
		tr := mustNew(t, cfg)
		clk := newFakeClock()
		t.Cleanup(tr.CloseIdleConnections)
		c := &http.Client{Transport: tr}

		call := 0
		get := func() {
			t.Helper()
			call++
			id := strconv.Itoa(call)
			ctx, span := k.caller(t.Context())
			span.SetAttributes(attribute.String("test.call", id))
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://tax.internal/rate", nil)
			req.Header.Set("X-Call", id)
			resp, err := c.Do(req)
			if err != nil {
				t.Fatalf("call %s: %v", id, err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			span.End()
		}
		for i := 0; i < 200 && f.hits[sick].Load() < defaultConsecutiveFailures; i++ {
			get()
		}
		if n := f.hits[sick].Load(); n != defaultConsecutiveFailures {
			t.Fatalf("sick instance served %d, want %d", n, defaultConsecutiveFailures)
		}
		s := stateOf(t, tr, f.addrs[sick])
		if !s.Ejected {
			t.Fatalf("sick instance not ejected: %+v", s)
		}

		evs := callerEvents(k, eventEjected)
		if len(evs) != 1 {
			t.Fatalf("%d caller spans with %s, want 1", len(evs), eventEjected)
		}
		for id, ev := range evs {
			f.mu.Lock()
			served := f.calls[id]
			f.mu.Unlock()
			if len(served) != 1 || served[0] != sick {
				t.Errorf("event on call %s, which instances %v served; want the sick one's fifth failure", id, served)
			}
			want := map[attribute.Key]any{
				keyInstance:      f.addrs[sick],
				keyOutlierReason: "consecutive failures",
				keyEjectionTime:  defaultBaseEjection.Seconds(),
				keyEjections:     int64(1),
			}
			for key, w := range want {
				if v, ok := eventAttr(ev, key); !ok || v.AsInterface() != w {
					t.Errorf("event %s = %v (present %v), want %v", key, v.AsInterface(), ok, w)
				}
			}
		}

		up, inst := keyUpstream.String("tax.internal"), keyInstance.String(f.addrs[sick])
		rm := k.collect(t)
		if got := counter(t, rm, "bulwark.outlier.ejections", up, inst); got != 1 {
			t.Errorf("bulwark.outlier.ejections{sick} = %d, want 1", got)
		}
		if got, ok := gaugeValue(t, rm, "bulwark.outlier.ejected", "tax.internal"); !ok || got != 1 {
			t.Errorf("bulwark.outlier.ejected = %d (present %v), want 1", got, ok)
		}

		// Its time served, the next request returns it.
		clk.advance(defaultBaseEjection)
		get()
		ret := callerEvents(k, eventReturned)
		if ev, ok := ret[strconv.Itoa(call)]; len(ret) != 1 || !ok {
			t.Fatalf("returned events on calls %v, want only on call %d", ret, call)
		} else if v, _ := eventAttr(ev, keyInstance); v.AsString() != f.addrs[sick] {
			t.Errorf("returned event names %q, want %q", v.AsString(), f.addrs[sick])
		}
		rm = k.collect(t)
		if got := counter(t, rm, "bulwark.outlier.returns", up, inst); got != 1 {
			t.Errorf("bulwark.outlier.returns{sick} = %d, want 1", got)
		}
		if got, _ := gaugeValue(t, rm, "bulwark.outlier.ejected", "tax.internal"); got != 0 {
			t.Errorf("bulwark.outlier.ejected = %d after the return, want 0", got)
		}
	})
}

// TestObserveOutlierInstanceCap: past maxLabelValues distinct instances a
// host reports "other", in metrics and events alike.
func TestObserveOutlierInstanceCap(t *testing.T) {
	k := newOtelKit(t)
	cfg := k.config(&stubBase{})
	tr := mustNew(t, cfg)
	u, _ := url.Parse("http://tax.internal/rate")
	hs := tr.lookup(u)
	ctx, span := k.caller(t.Context())
	for i := 0; i < maxLabelValues+5; i++ {
		hs.rep.endpointChanged(ctx, endpointEvent{addr: "10.0.0." + strconv.Itoa(i) + ":80", ejected: true, reason: "consecutive failures", times: 1})
	}
	span.End()
	rm := k.collect(t)
	m := findMetric(rm, "bulwark.outlier.ejections")
	if m == nil {
		t.Fatal("no bulwark.outlier.ejections")
	}
	seen := map[string]bool{}
	var other int64
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		v, _ := dp.Attributes.Value(keyInstance)
		seen[v.AsString()] = true
		if v.AsString() == otherLabel {
			other = dp.Value
		}
	}
	if len(seen) != maxLabelValues+1 || other != 5 {
		t.Errorf("%d instance values (other = %d), want %d and 5", len(seen), other, maxLabelValues+1)
	}
	n := 0
	for _, ev := range eventsNamed(t, k.sr, "caller", eventEjected) {
		if v, _ := eventAttr(ev, keyInstance); v.AsString() == otherLabel {
			n++
		}
	}
	if n != 5 {
		t.Errorf("%d events name %q, want 5", n, otherLabel)
	}
}
