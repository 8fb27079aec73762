package bulwark

import (
	"context"
	"errors"
	"math"
	"net/http"
	"syscall"
	"testing"
	"testing/synctest"
	"time"
)

// TestFaultRates checks that over a fixed-seed run each kind of fault is
// injected at its rate, within binomial bounds (five standard deviations:
// a seed that fails them would be a one in millions draw, or a bug).
func TestFaultRates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &statusBase{codes: []int{200}}
		p := only(Policy{Fault: Fault{
			Delay: 10 * time.Millisecond, DelayRate: 0.3,
			AbortStatus: 503, AbortRate: 0.2,
			ResetRate: 0.1,
			Seed:      42,
		}})
		tr := mustNew(t, Config{Base: base, Default: p})
		const n = 4000
		var delays, aborts, resets int
		for range n {
			start := time.Now()
			code, err := sendOnce(t, tr, "GET", "http://api.example.com/")
			if time.Since(start) >= 10*time.Millisecond {
				delays++
			}
			switch {
			case errors.Is(err, syscall.ECONNRESET):
				resets++
			case err != nil:
				t.Fatalf("unexpected error %v", err)
			case code == 503:
				aborts++
			}
		}
		// A reset is drawn first and wins over an abort drawn with it; a
		// delay comes before either.
		for _, c := range []struct {
			kind string
			got  int
			rate float64
		}{{"delay", delays, 0.3}, {"abort", aborts, 0.2 * 0.9}, {"reset", resets, 0.1}} {
			mean, sd := n*c.rate, math.Sqrt(n*c.rate*(1-c.rate))
			if math.Abs(float64(c.got)-mean) > 5*sd {
				t.Errorf("%s: %d of %d attempts, want %.0f ± %.0f", c.kind, c.got, n, mean, 5*sd)
			}
		}
		if sent, want := len(base.reqs), n-aborts-resets; sent != want {
			t.Errorf("base saw %d requests, want %d: injected aborts and resets are never sent", sent, want)
		}
		want := FaultSnapshot{Injected: FaultCounts{Delays: uint64(delays), Aborts: uint64(aborts), Resets: uint64(resets)}}
		if got := tr.Snapshot().Hosts[0].Fault; got == nil || *got != want {
			t.Errorf("Snapshot's Fault = %+v, want %+v", got, want)
		}
	})
}

// TestFaultHeaders checks that the Bulwark-Fault-* headers trigger faults
// only when the policy allows them, are counted as refused otherwise, and
// never reach the upstream.
func TestFaultHeaders(t *testing.T) {
	send := func(t *testing.T, tr *Transport, h http.Header) (*http.Response, error) {
		req, err := http.NewRequestWithContext(t.Context(), "GET", "http://api.example.com/", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header = h
		return tr.RoundTrip(req)
	}
	trigger := http.Header{"Bulwark-Fault-Abort": {"503"}}

	t.Run("refused", func(t *testing.T) {
		k := newOtelKit(t)
		base := &statusBase{codes: []int{200}}
		cfg := k.config(base)
		// A rate that never fires puts the layer in the stack.
		cfg.Default.Fault = Fault{AbortStatus: 500, AbortRate: 1e-12, Seed: 1}
		tr := mustNew(t, cfg)
		resp, err := send(t, tr, trigger.Clone())
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("refused trigger: %v, %v; want the upstream's 200", resp, err)
		}
		resp.Body.Close()
		if got := counter(t, k.collect(t), "bulwark.faults", keyUpstream.String("default"), keyFault.String(faultRefused)); got != 1 {
			t.Errorf("bulwark.faults{refused} = %d, want 1", got)
		}
		if h := base.reqs[0].Header; h.Get(faultAbortHeader) != "" {
			t.Errorf("upstream saw %s: %q", faultAbortHeader, h.Get(faultAbortHeader))
		}
		if got := tr.Snapshot().Hosts[0].Fault; got == nil || *got != (FaultSnapshot{HeadersRefused: 1}) {
			t.Errorf("Snapshot's Fault = %+v, want one refused trigger and nothing injected", got)
		}
	})

	t.Run("off", func(t *testing.T) {
		base := &statusBase{codes: []int{200}}
		tr := mustNew(t, Config{Base: base})
		resp, err := send(t, tr, trigger.Clone())
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("trigger with Fault off: %v, %v; want the upstream's 200", resp, err)
		}
		resp.Body.Close()
		if f := tr.Snapshot().Hosts[0].Fault; f != nil {
			t.Errorf("Snapshot's Fault = %+v with Fault off, want nil", f)
		}
	})

	t.Run("allowed", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			k := newOtelKit(t)
			base := &statusBase{codes: []int{200}}
			cfg := k.config(base)
			cfg.Default.Fault = Fault{AllowHeaders: true}
			tr := mustNew(t, cfg)

			resp, err := send(t, tr, trigger.Clone())
			if err != nil || resp.StatusCode != 503 || resp.Header.Get(FaultHeader) != "abort" {
				t.Fatalf("abort trigger: %v, %v; want an injected 503", resp, err)
			}
			resp.Body.Close()

			start := time.Now()
			resp, err = send(t, tr, http.Header{"Bulwark-Fault-Delay": {"250ms"}})
			if err != nil || resp.StatusCode != 200 || time.Since(start) != 250*time.Millisecond {
				t.Fatalf("delay trigger: %v, %v after %v; want 200 after 250ms", resp, err, time.Since(start))
			}
			resp.Body.Close()

			_, err = send(t, tr, http.Header{"Bulwark-Fault-Reset": {"1"}})
			if !errors.Is(err, syscall.ECONNRESET) || classify(nil, err) != kindTransient {
				t.Fatalf("reset trigger: %v; want a transient ECONNRESET", err)
			}
			if len(base.reqs) != 1 {
				t.Errorf("base saw %d requests, want 1 (the delayed one)", len(base.reqs))
			}
			if h := base.reqs[0].Header; h.Get(faultDelayHeader) != "" {
				t.Errorf("upstream saw %s", faultDelayHeader)
			}

			rm := k.collect(t)
			for _, kind := range []string{faultAbort, faultDelay, faultReset} {
				if got := counter(t, rm, "bulwark.faults", keyUpstream.String("default"), keyFault.String(kind)); got != 1 {
					t.Errorf("bulwark.faults{%s} = %d, want 1", kind, got)
				}
			}
			spans := spansNamed(k.sr, "GET")
			if len(spans) != 3 {
				t.Fatalf("%d attempt spans, want 3", len(spans))
			}
			for i, kind := range []string{faultAbort, faultDelay, faultReset} {
				wantAttr(t, spans[i], keyFault, kind)
			}
			one := FaultCounts{Delays: 1, Aborts: 1, Resets: 1}
			if got := tr.Snapshot().Hosts[0].Fault; got == nil || *got != (FaultSnapshot{Injected: one, FromHeaders: one}) {
				t.Errorf("Snapshot's Fault = %+v, want one of each kind, all from headers", got)
			}
		})
	})
}

// TestFaultDelayDeadline checks that an injected delay counts against the
// attempt's deadline and ends with it.
func TestFaultDelayDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &statusBase{codes: []int{200}}
		p := only(Policy{Timeout: Timeout{Attempt: 100 * time.Millisecond}, Fault: Fault{Delay: time.Hour, DelayRate: 1}}, "timeout")
		tr := mustNew(t, Config{Base: base, Default: p})
		start := time.Now()
		_, err := sendOnce(t, tr, "GET", "http://api.example.com/")
		if !errors.Is(err, ErrAttemptTimeout) || time.Since(start) != 100*time.Millisecond {
			t.Fatalf("err = %v after %v, want ErrAttemptTimeout after 100ms", err, time.Since(start))
		}
		ctx, cancel := context.WithCancel(t.Context())
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://api.example.com/", nil)
		go func() { time.Sleep(time.Millisecond); cancel() }()
		if _, err := tr.RoundTrip(req); !errors.Is(err, context.Canceled) {
			t.Fatalf("canceled during a delay: err = %v, want context.Canceled", err)
		}
		if len(base.reqs) != 0 {
			t.Errorf("base saw %d requests, want none", len(base.reqs))
		}
	})
}

// TestFaultRetried checks that the other layers react to injected faults
// as to real ones: injected resets are retried.
func TestFaultRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &statusBase{codes: []int{200}}
		var retries int
		p := Policy{Retry: Retry{MaxAttempts: 3, OnRetry: func(*http.Request, RetryEvent) { retries++ }},
			Breaker: Breaker{Disabled: true}, Fault: Fault{ResetRate: 1}}
		tr := mustNew(t, Config{Base: base, Default: p})
		if _, err := sendOnce(t, tr, "GET", "http://api.example.com/"); !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("err = %v, want the injected reset after the retries", err)
		}
		if retries != 2 {
			t.Errorf("retries = %d, want 2", retries)
		}
	})
}

// TestFaultOffNotInStack checks that without a Fault policy the layer is
// not there: the attempt span sits on the base.
func TestFaultOffNotInStack(t *testing.T) {
	tr := mustNew(t, Config{Base: &statusBase{codes: []int{200}}})
	p := Policy{}.withDefaults()
	s := tr.attemptStack(&p, env{rep: tr.obs.reporter("default", "h:80", "80")}, tr.base, new(faultCounts))
	o := s.(*attemptLayer).next.(*spanLayer)
	if _, ok := o.next.(baseLayer); !ok {
		t.Errorf("below the attempt span: %T, want baseLayer", o.next)
	}
	p.Fault = Fault{ResetRate: 0.5}
	s = tr.attemptStack(&p, env{rep: tr.obs.reporter("default", "h:80", "80")}, tr.base, new(faultCounts))
	if _, ok := s.(*attemptLayer).next.(*spanLayer).next.(*faultLayer); !ok {
		t.Errorf("with a Fault policy, no fault layer under the attempt span")
	}
}

func TestFaultConfig(t *testing.T) {
	for _, f := range []Fault{
		{AbortRate: 0.5},
		{AbortStatus: 99, AbortRate: 0.5},
		{ResetRate: 1.5},
		{DelayRate: math.NaN()},
		{Delay: -1, DelayRate: 0.1},
	} {
		if _, err := New(Config{Default: Policy{Fault: f}}); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("New with Fault %+v = %v, want a ConfigError", f, err)
		}
	}
}

func TestFaultContract(t *testing.T) {
	runContract(t, func(base http.RoundTripper) http.RoundTripper {
		// Delays and resets (an abort's empty body is not the contract's
		// "hello"), with the attempt layers and retries over them.
		return mustNew(t, Config{Base: base, Default: Policy{
			Breaker: Breaker{Disabled: true},
			Fault:   Fault{Delay: time.Millisecond, DelayRate: 0.5, ResetRate: 0.2, Seed: 7},
		}})
	})
}

// TestFaultSnapshotShared checks that a host's FaultSnapshot sums every
// fault layer of the host: its own, a route's (which starts counting
// when the route is first used), and a balanced upstream's instances'.
func TestFaultSnapshotShared(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &statusBase{codes: []int{200}}
		tr := mustNew(t, Config{Base: base,
			Default: Policy{Retry: Retry{Disabled: true}, Breaker: Breaker{Disabled: true}},
			Routes:  map[string]Policy{"/chaos/": {Fault: Fault{AbortStatus: 503, AbortRate: 1}}},
			Upstreams: map[string]Policy{"lb.test": {Fault: Fault{ResetRate: 1},
				Endpoints: Endpoints{Addrs: []string{"10.0.0.1:80", "10.0.0.2:80"}}}},
		})
		fault := func(host string) *FaultSnapshot {
			for _, h := range tr.Snapshot().Host(host) {
				return h.Fault
			}
			t.Fatalf("no state for %s", host)
			return nil
		}
		if _, err := sendOnce(t, tr, "GET", "http://api.test/calm"); err != nil {
			t.Fatal(err)
		}
		if f := fault("api.test:80"); f != nil {
			t.Errorf("Fault = %+v before the fault route was used, want nil", f)
		}
		for range 3 {
			if code, err := sendOnce(t, tr, "GET", "http://api.test/chaos/x"); err != nil || code != 503 {
				t.Fatalf("route with an abort rate of 1: %d, %v", code, err)
			}
		}
		if f := fault("api.test:80"); f == nil || *f != (FaultSnapshot{Injected: FaultCounts{Aborts: 3}}) {
			t.Errorf("Fault = %+v, want the route's 3 aborts", f)
		}
		for range 4 {
			if _, err := sendOnce(t, tr, "GET", "http://lb.test/"); !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("balanced upstream with a reset rate of 1: %v", err)
			}
		}
		if f := fault("lb.test:80"); f == nil || *f != (FaultSnapshot{Injected: FaultCounts{Resets: 4}}) {
			t.Errorf("Fault = %+v, want 4 resets over the instances", f)
		}
	})
}

// TestFaultSnapshotUpdate: a host's fault counts outlive an Update that
// changes its Fault policy, as its pushback pauses do.
func TestFaultSnapshotUpdate(t *testing.T) {
	cfg := Config{Base: &statusBase{codes: []int{200}}, Default: only(Policy{Fault: Fault{ResetRate: 1}})}
	tr := mustNew(t, cfg)
	sendOnce(t, tr, "GET", "http://api.test/")
	cfg.Default.Fault = Fault{AbortStatus: 503, AbortRate: 1}
	if err := tr.Update(cfg); err != nil {
		t.Fatal(err)
	}
	if code, err := sendOnce(t, tr, "GET", "http://api.test/"); err != nil || code != 503 {
		t.Fatalf("after Update: %d, %v; want the injected 503", code, err)
	}
	if f := tr.Snapshot().Hosts[0].Fault; f == nil || *f != (FaultSnapshot{Injected: FaultCounts{Resets: 1, Aborts: 1}}) {
		t.Errorf("Fault = %+v, want the reset from before the Update and the abort after", f)
	}
}
