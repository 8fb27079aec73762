package bulwark

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// debugBase is the in-memory upstreams of the debug page's tests:
// sick.test fails, busy.test holds every request until release is closed,
// and instance 10.0.0.2:80 of the balanced pool.test fails.
type debugBase struct {
	entered chan struct{}
	release chan struct{}
}

func (b *debugBase) RoundTrip(req *http.Request) (*http.Response, error) {
	switch req.URL.Host {
	case "sick.test", "10.0.0.2:80":
		return response(req, http.StatusInternalServerError), nil
	case "busy.test":
		if req.URL.Path == "/ok" {
			break
		}
		b.entered <- struct{}{}
		<-b.release
	}
	return response(req, http.StatusOK), nil
}

// debugFixture is a live Transport with a tripped breaker (sick.test), a
// full bulkhead (busy.test, two of two slots held until the test ends) and
// an ejected instance (10.0.0.2:80 of pool.test). sample, if not nil, is
// called between the steps, so a history sees the state build up.
func debugFixture(t *testing.T, sample func(*Transport)) *Transport {
	t.Helper()
	base := &debugBase{entered: make(chan struct{}), release: make(chan struct{})}
	p := only(Policy{}, "breaker", "bulkhead", "pushback")
	p.Breaker = Breaker{WindowCalls: 10, MinCalls: 5}
	p.Bulkhead = Bulkhead{MaxConcurrent: 2}
	pool := Policy{Breaker: Breaker{Disabled: true}, Endpoints: Endpoints{Addrs: []string{"10.0.0.1:80", "10.0.0.2:80"}}}
	tr := mustNew(t, Config{Base: base, Default: p, Upstreams: map[string]Policy{"pool.test": pool}})
	step := func() {
		if sample != nil {
			sample(tr)
		}
	}
	sendOnce(t, tr, "GET", "http://busy.test/ok") // busy.test has state from the start
	// One call in three succeeds: the window fills with failures until the
	// breaker opens (and empties its window).
	for i := range 8 {
		url := "http://sick.test/"
		if i%3 == 2 {
			url = "http://pool.test/"
		}
		sendOnce(t, tr, "GET", url)
		step()
	}
	for range 40 {
		sendOnce(t, tr, "GET", "http://pool.test/")
	}
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { sendOnce(t, tr, "GET", "http://busy.test/") })
		<-base.entered
		step()
	}
	t.Cleanup(func() {
		close(base.release)
		wg.Wait()
	})
	return tr
}

// sampler returns a func that gives d a sample of tr's state each time it
// is called, a second apart (time as the sampler would have taken them).
func sampler(d *debugHandler) func(*Transport) {
	at := time.Now().Add(-time.Minute)
	return func(tr *Transport) {
		at = at.Add(time.Second)
		d.mu.Lock()
		d.recordLocked(tr.Snapshot(), at)
		d.mu.Unlock()
	}
}

func getDebug(t *testing.T, h http.Handler, target string) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", target, nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", target, rec.Code, rec.Body)
	}
	return rec
}

// TestDebugJSONRoundTrip: the JSON decodes into DebugPage with no field
// left over, encodes back to the same bytes, and says what the fixture
// set up.
func TestDebugJSONRoundTrip(t *testing.T) {
	d := newDebug(nil, time.Hour, 20)
	defer d.Close()
	tr := debugFixture(t, sampler(d))
	d.t = tr
	for _, target := range []string{"/debug/bulwark/json", "/debug/bulwark/?format=json"} {
		rec := getDebug(t, d, target)
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s: Content-Type %q", target, ct)
		}
		raw := rec.Body.Bytes()
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		var page DebugPage
		if err := dec.Decode(&page); err != nil {
			t.Fatalf("%s: decoding into DebugPage: %v\n%s", target, err, raw)
		}
		again, err := json.MarshalIndent(page, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(append(again, '\n'), raw) {
			t.Errorf("%s: JSON does not round-trip through DebugPage:\nserved %s\nagain  %s", target, raw, again)
		}
		hosts := map[string]DebugHost{}
		for _, h := range page.Hosts {
			hosts[h.Host] = h
			if len(h.History) < 2 {
				t.Errorf("%s: %d samples, want 10 (2 for pool.test, whose state came later)", h.Host, len(h.History))
			}
		}
		if b := hosts["sick.test:80"].Breaker; b == nil || b.State != "open" || b.NextProbe.IsZero() || b.Failures == 0 && b.Trips != 1 {
			t.Errorf("sick.test breaker = %+v, want open with a next probe", b)
		}
		if b := hosts["busy.test:80"].Bulkhead; b == nil || b.InFlight != 2 || b.MaxConcurrent != 2 {
			t.Errorf("busy.test bulkhead = %+v, want 2 of 2 in flight", b)
		}
		ejected := 0
		for _, e := range hosts["pool.test:80"].Endpoints {
			if e.Ejected {
				ejected++
				if e.Addr != "10.0.0.2:80" || e.EjectedUntil.IsZero() {
					t.Errorf("ejected endpoint = %+v", e)
				}
			}
		}
		if ejected != 1 {
			t.Errorf("pool.test has %d ejected endpoints, want 1: %+v", ejected, hosts["pool.test:80"].Endpoints)
		}
		if strings.Contains(string(raw), "http://") {
			t.Errorf("%s: the JSON carries a URL:\n%s", target, raw)
		}
	}
}

// TestDebugReadOnly: the handler refuses every method that is not a read.
func TestDebugReadOnly(t *testing.T) {
	d := newDebug(mustNew(t, Config{Base: okBase{}}), time.Hour, 10)
	defer d.Close()
	for _, m := range []string{"POST", "PUT", "DELETE", "PATCH"} {
		rec := httptest.NewRecorder()
		d.ServeHTTP(rec, httptest.NewRequest(m, "/", strings.NewReader("x")))
		if rec.Code != http.StatusMethodNotAllowed {
			t.Errorf("%s: %d, want 405", m, rec.Code)
		}
	}
}

// TestDebugHistory: the sampler starts with the first request, keeps at
// most keep samples per host, forgets hosts that are gone, stops on its own
// once nobody has looked for a whole history's span, and starts again.
func TestDebugHistory(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, Config{Base: okBase{}, Default: only(Policy{}, "breaker")})
		sendOnce(t, tr, "GET", "http://a.test/")
		d := newDebug(tr, time.Second, 5)
		defer d.Close()
		getDebug(t, d, "/")
		time.Sleep(3500 * time.Millisecond)
		var page DebugPage
		json.Unmarshal(getDebug(t, d, "/json").Body.Bytes(), &page)
		if n := len(page.Hosts[0].History); n != 4 {
			t.Errorf("after 3.5 s: %d samples, want 4 (one at the first request, three ticks)", n)
		}
		time.Sleep(4 * time.Second)
		json.Unmarshal(getDebug(t, d, "/json").Body.Bytes(), &page)
		if n := len(page.Hosts[0].History); n != 5 {
			t.Errorf("after 7.5 s: %d samples, want the cap of 5", n)
		}
		time.Sleep(10 * time.Second)
		synctest.Wait()
		d.mu.Lock()
		running := d.stop != nil
		d.mu.Unlock()
		if running {
			t.Error("the sampler still runs 10 s after the page was last served (history span 5 s)")
		}
		getDebug(t, d, "/")
		d.mu.Lock()
		running = d.stop != nil
		d.mu.Unlock()
		if !running {
			t.Error("a request did not start the sampler again")
		}
	})
}

// TestDebugPageInChromium loads the page in headless Chromium against a
// live Transport with a tripped breaker, a full bulkhead and an ejected
// instance, and checks what a person would see: each host, its state, and
// a chart with data. The screenshot is left in the test's temporary
// directory (go test -run Chromium -v prints where).
func TestDebugPageInChromium(t *testing.T) {
	const chromium = "/usr/bin/chromium"
	if _, err := os.Stat(chromium); err != nil {
		t.Skip("skipped: " + chromium + " not found, so the debug page was not checked in a browser")
	}
	d := newDebug(nil, time.Hour, 60)
	defer d.Close()
	tr := debugFixture(t, sampler(d))
	d.t = tr
	mux := http.NewServeMux()
	mux.Handle("/debug/bulwark/", d)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	url := srv.URL + "/debug/bulwark/"

	dir := t.TempDir()
	run := func(args ...string) []byte {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 40*time.Second)
		defer cancel()
		args = append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
			"--disable-background-networking", "--disable-component-update", "--disable-sync",
			"--user-data-dir=" + t.TempDir()}, args...)
		cmd := exec.CommandContext(ctx, chromium, append(args, url)...)
		cmd.WaitDelay = 5 * time.Second
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("chromium: %v\n%s", err, stderr.String())
		}
		return out
	}
	dom := string(run("--dump-dom"))
	section := func(host string) string {
		i := strings.Index(dom, `data-host="`+host+`"`)
		if i < 0 {
			t.Fatalf("the page shows no host %s:\n%.3000s", host, dom)
		}
		s := dom[i:]
		if j := strings.Index(s, "</section>"); j >= 0 {
			s = s[:j]
		}
		return s
	}
	text := regexp.MustCompile(`<[^>]*>`)
	for host, want := range map[string][]string{
		"sick.test:80": {"sick.test:80", "breaker", "open", "next probe"},
		"busy.test:80": {"busy.test:80", "2 / 2 in flight", "full"},
		"pool.test:80": {"pool.test:80", "10.0.0.1:80", "10.0.0.2:80", "ejected until"},
	} {
		s := section(host)
		visible := text.ReplaceAllString(s, "")
		for _, w := range want {
			if !strings.Contains(visible, w) {
				t.Errorf("%s: the page does not show %q:\n%s", host, w, visible)
			}
		}
		pts := regexp.MustCompile(`<polyline class="in" points="([^"]*)"`).FindStringSubmatch(s)
		if pts == nil || len(strings.Fields(pts[1])) < 2 {
			t.Errorf("%s: no sparkline with data: %v", host, pts)
		}
	}
	if !strings.Contains(section("sick.test:80"), `class="state open"`) {
		t.Error("sick.test's breaker state is not shown as open")
	}

	shot := filepath.Join(dir, "debug.png")
	run("--screenshot="+shot, "--window-size=1100,1000", "--hide-scrollbars")
	if fi, err := os.Stat(shot); err != nil || fi.Size() < 5000 {
		t.Fatalf("screenshot %s: %v (size %v)", shot, err, fi)
	}
	t.Logf("screenshot: %s", shot)
	if p := os.Getenv("BULWARK_DEBUG_SHOT"); p != "" {
		b, _ := os.ReadFile(shot)
		os.WriteFile(p, b, 0o644)
	}
}

// TestDebugHedgeAndThrottle: a host's hedging, throttle and fault counts
// reach the JSON and the page.
func TestDebugHedgeAndThrottle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := only(Policy{Throttle: Throttle{Enabled: true, Shadow: true}, Hedge: Hedge{Delay: 10 * time.Millisecond},
			Fault: Fault{Delay: time.Millisecond, DelayRate: 1}}, "timeout", "retry")
		tr := mustNew(t, Config{Base: &statusBase{codes: []int{503}}, Default: p})
		sendOnce(t, tr, "GET", "http://a.test/")
		d := newDebug(tr, time.Second, 5)
		defer d.Close()
		var page DebugPage
		if err := json.Unmarshal(getDebug(t, d, "/json").Body.Bytes(), &page); err != nil {
			t.Fatal(err)
		}
		h := page.Hosts[0]
		if h.Hedge == nil || h.Throttle == nil || !h.Throttle.Shadow || h.Throttle.Requests == 0 {
			t.Fatalf("host = %+v %+v, want hedge and a shadow throttle with requests", h.Hedge, h.Throttle)
		}
		if f := h.Fault; f == nil || *f != (DebugFault{Delays: 3}) { // the 503 tried three times
			t.Errorf("fault = %+v, want a delay for each of three attempts", f)
		}
		html := getDebug(t, d, "/").Body.String()
		if !strings.Contains(html, "hedging") || !strings.Contains(html, "throttle") || !strings.Contains(html, "3 delays") {
			t.Errorf("page has no hedging, throttle or fault row")
		}
	})
}
