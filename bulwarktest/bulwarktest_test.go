package bulwarktest_test

import (
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/bulwark-http/bulwark"
	"github.com/bulwark-http/bulwark/bulwarktest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func get(t *testing.T, rt http.RoundTripper, url string) (*http.Response, string, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), "GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return nil, "", err
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b), nil
}

// TestScriptInBubble plays "503 twice with Retry-After: 1, then 200 after
// 50 ms" in memory, in fake time, and checks what bulwark did: three
// attempts, two retries that waited the server's second, and a pushback
// pause while it lasted.
func TestScriptInBubble(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := bulwarktest.NewUpstream(map[string]bulwarktest.Script{
			"/pay": {
				{Status: 503, Header: http.Header{"Retry-After": {"1"}}, Times: 2},
				{Status: 200, Body: "paid", Delay: 50 * time.Millisecond},
			},
		})
		var rec bulwarktest.Recorder
		tr, err := bulwark.New(bulwark.Config{Base: u.Transport(), Default: rec.Hook(bulwark.Policy{})})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		resp, body, err := get(t, tr, "http://api.test/pay")
		if err != nil || resp.StatusCode != 200 || body != "paid" {
			t.Fatalf("got %v %q %v, want 200 paid", resp, body, err)
		}
		if d := time.Since(start); d != 2*time.Second+50*time.Millisecond {
			t.Errorf("call took %v, want 2.05s (two Retry-After seconds and the delay)", d)
		}
		if got := u.Attempts("/pay"); !slices.Equal(got, []int{1, 2, 3}) {
			t.Errorf("attempts = %v, want [1 2 3]", got)
		}
		if got := rec.Waits(); !slices.Equal(got, []time.Duration{time.Second, time.Second}) {
			t.Errorf("retry waits = %v, want [1s 1s]", got)
		}
		for _, ev := range rec.Retries() {
			if !ev.FromRetryAfter || ev.StatusCode != 503 {
				t.Errorf("retry %+v, want one from a 503's Retry-After", ev)
			}
		}
		if _, paused := bulwarktest.PausedUntil(tr, "api.test:80"); paused {
			t.Errorf("host still paused after the pause ended")
		}
		if s, ok := bulwarktest.BreakerState(tr, "api.test:80"); !ok || s != bulwark.CircuitClosed {
			t.Errorf("breaker = %v, %v; want closed", s, ok)
		}
	})
}

// TestPushbackAndBreaker checks the helpers that read Snapshot and the
// breaker hook: a 503 with Retry-After pauses the host, and failures open
// the breaker.
func TestPushbackAndBreaker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := bulwarktest.NewUpstream(map[string]bulwarktest.Script{
			"/busy": {{Status: 503, Header: http.Header{"Retry-After": {"30"}}}},
			"/down": {{Status: 500}},
		})
		var rec bulwarktest.Recorder
		p := rec.Hook(bulwark.Policy{Retry: bulwark.Retry{Disabled: true},
			Breaker: bulwark.Breaker{MinCalls: 5, FailureRate: 0.5}})
		tr, err := bulwark.New(bulwark.Config{Base: u.Transport(), Default: p})
		if err != nil {
			t.Fatal(err)
		}
		get(t, tr, "http://busy.test/busy")
		if until, ok := bulwarktest.PausedUntil(tr, "busy.test:80"); !ok || time.Until(until) != 30*time.Second {
			t.Errorf("pause = %v, %v; want 30s from now", until, ok)
		}
		for range 5 {
			get(t, tr, "http://down.test/down")
		}
		if s, _ := bulwarktest.BreakerState(tr, "down.test:80"); s != bulwark.CircuitOpen {
			t.Errorf("breaker = %v, want open after five failures", s)
		}
		want := []bulwarktest.Transition{{Host: "down.test:80", From: bulwark.CircuitClosed, To: bulwark.CircuitOpen}}
		if got := rec.Transitions(); !slices.Equal(got, want) {
			t.Errorf("transitions = %v, want %v", got, want)
		}
	})
}

// TestServerRecords checks the socket mode: requests are recorded with
// their method, header and body; a path without a script is a 404; a
// step's delay ends when the client gives up.
func TestServerRecords(t *testing.T) {
	u := bulwarktest.NewUpstream(map[string]bulwarktest.Script{
		"/echo": {{Status: 201, Body: "made"}},
		"/slow": {{Delay: time.Hour}},
	})
	srv := u.Start(t)
	req, _ := http.NewRequestWithContext(t.Context(), "POST", srv.URL+"/echo", strings.NewReader("order"))
	req.Header.Set("X-Test", "1")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 201 || string(b) != "made" {
		t.Errorf("got %d %q, want 201 made", resp.StatusCode, b)
	}
	if resp, _, err := get(t, srv.Client().Transport, srv.URL+"/none"); err != nil || resp.StatusCode != 404 {
		t.Errorf("unscripted path: %v, %v; want 404", resp, err)
	}
	r := u.RequestsTo("/echo")
	if len(r) != 1 || r[0].Method != "POST" || r[0].Body != "order" || r[0].Header.Get("X-Test") != "1" {
		t.Errorf("recorded %+v, want the POST with its body and header", r)
	}
	if len(u.Requests()) != 2 {
		t.Errorf("recorded %d requests, want 2", len(u.Requests()))
	}
	srv.Client().CloseIdleConnections()
}

// TestMemoryDelayCanceled checks that in memory a delay ends with the
// request's context, with the context's error.
func TestMemoryDelayCanceled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := bulwarktest.NewUpstream(map[string]bulwarktest.Script{"/slow": {{Delay: time.Hour}}})
		tr, err := bulwark.New(bulwark.Config{Base: u.Transport(),
			Default: bulwark.Policy{Timeout: bulwark.Timeout{Attempt: time.Second}, Retry: bulwark.Retry{Disabled: true}}})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if _, _, err := get(t, tr, "http://slow.test/slow"); err == nil || time.Since(start) != time.Second {
			t.Errorf("err = %v after %v, want a timeout after 1s", err, time.Since(start))
		}
	})
}

// TestHedgeHelpers, in fake time: a first attempt that never answers gets
// a hedge after the delay, the hedge wins and the first is cancelled; the
// helpers see it from the Snapshot and from the upstream's records. Then
// a hedge that falls due while the breaker is forced open is skipped, and
// counted under "breaker".
func TestHedgeHelpers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		u := bulwarktest.NewUpstream(map[string]bulwarktest.Script{
			"/quote": {{Delay: time.Hour}, {Body: "fast"}},
			"/slow":  {{Body: "late", Delay: 30 * time.Millisecond}},
		})
		p := bulwark.Policy{Hedge: bulwark.Hedge{Delay: 10 * time.Millisecond}}
		tr, err := bulwark.New(bulwark.Config{Base: u.Transport(), Default: p})
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := bulwarktest.Hedges(tr, "fx.test:80"); ok {
			t.Errorf("hedge counts for a host never reached")
		}
		start := time.Now()
		resp, body, err := get(t, tr, "http://fx.test/quote")
		if err != nil || resp.StatusCode != 200 || body != "fast" {
			t.Fatalf("got %v %q %v, want the hedge's 200 fast", resp, body, err)
		}
		if d := time.Since(start); d != 10*time.Millisecond {
			t.Errorf("call took %v, want the 10ms hedge delay", d)
		}
		h, ok := bulwarktest.Hedges(tr, "fx.test:80")
		if !ok || h.Sent != 1 || h.Won != 1 || h.Delay != 10*time.Millisecond {
			t.Errorf("hedges = %+v, %v; want one sent and won, delay 10ms", h, ok)
		}
		if s := bulwarktest.HedgesSkipped(tr, "fx.test:80"); s != nil {
			t.Errorf("skipped = %v, want none", s)
		}
		reqs := u.RequestsTo("/quote")
		if len(reqs) != 2 || reqs[0].Attempt != 1 || reqs[1].Attempt != 2 {
			t.Fatalf("requests = %+v, want attempts 1 and 2", reqs)
		}
		if !reqs[0].Canceled || reqs[1].Canceled || reqs[0].InFlight != 0 || reqs[1].InFlight != 1 {
			t.Errorf("first: canceled %v in flight %d; hedge: canceled %v in flight %d; want the loser cancelled and the hedge beside it",
				reqs[0].Canceled, reqs[0].InFlight, reqs[1].Canceled, reqs[1].InFlight)
		}
		if n := u.MaxInFlight("/quote"); n != 2 {
			t.Errorf("max in flight = %d, want 2", n)
		}

		done := make(chan error, 1)
		go func() {
			_, _, err := get(t, tr, "http://rates.test/slow")
			done <- err
		}()
		time.Sleep(time.Millisecond)
		if err := tr.ControlBreaker("rates.test:80", bulwark.BreakerForceOpen); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if s := bulwarktest.HedgesSkipped(tr, "rates.test:80"); len(s) != 1 || s["breaker"] != 1 {
			t.Errorf("skipped = %v, want one for the breaker", s)
		}
		if h, _ := bulwarktest.Hedges(tr, "rates.test:80"); h.Sent != 0 {
			t.Errorf("sent %d hedges into an open breaker", h.Sent)
		}
		if n := u.MaxInFlight("/slow"); n != 1 {
			t.Errorf("max in flight = %d, want no hedge", n)
		}
	})
}
