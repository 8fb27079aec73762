package debug

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bulwark-http/bulwark"
)

// mustNew is bulwark.New that fails the test on a config error.
func mustNew(t testing.TB, cfg bulwark.Config) *bulwark.Transport {
	t.Helper()
	tr, err := bulwark.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// only returns p with every layer off but the ones named ("timeout",
// "retry", "pushback", "breaker", "bulkhead").
func only(p bulwark.Policy, layers ...string) bulwark.Policy {
	keep := map[string]bool{}
	for _, l := range layers {
		keep[l] = true
	}
	p.Timeout.Disabled = !keep["timeout"]
	p.Retry.Disabled = !keep["retry"]
	p.Retry.NoPushback = !keep["pushback"]
	p.Breaker.Disabled = !keep["breaker"]
	p.Bulkhead.Disabled = !keep["bulkhead"]
	return p
}

// sendOnce sends one request through rt and reads its response to the end.
func sendOnce(t *testing.T, rt http.RoundTripper, method, url string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

// response is an answer of the given status with a small body.
func response(req *http.Request, status int) *http.Response {
	body := fmt.Sprintf("status %d", status)
	return &http.Response{
		StatusCode: status, Status: http.StatusText(status), Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{}, Body: io.NopCloser(strings.NewReader(body)), ContentLength: int64(len(body)), Request: req,
	}
}

// statusBase answers every attempt with its status, at once.
type statusBase int

func (s statusBase) RoundTrip(req *http.Request) (*http.Response, error) {
	return response(req, int(s)), nil
}

// debugBase is the in-memory upstreams of the debug page's tests:
// sick.test and failing.test fail, busy.test holds every request until release is closed,
// instance 10.0.0.2:80 of the balanced pool.test fails, and mid.test
// passes up a failure from a tier below it (a 503 marked
// bulwark.NoRetryFromBelow), as a service in a chain does.
type debugBase struct {
	entered chan struct{}
	release chan struct{}
}

func (b *debugBase) RoundTrip(req *http.Request) (*http.Response, error) {
	switch req.URL.Host {
	case "sick.test", "failing.test", "10.0.0.2:80":
		return response(req, http.StatusInternalServerError), nil
	case "mid.test":
		resp := response(req, http.StatusServiceUnavailable)
		resp.Header.Set(bulwark.NoRetryHeader, bulwark.NoRetryFromBelow)
		return resp, nil
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
// host failing every call but too few for its breaker's MinCalls
// (failing.test: 3 of 3 failed, breaker closed), a calm host (calm.test),
// a full bulkhead (which has refused one request) (busy.test, two of two slots held until the test ends),
// an ejected instance (10.0.0.2:80 of pool.test) and a host whose every
// answer passes up a failure from below (mid.test: 9 of them, one after
// the last step). sample, if not nil, is called between the steps, so a
// history sees the state build up.
func debugFixture(t *testing.T, sample func(*bulwark.Transport)) *bulwark.Transport {
	t.Helper()
	base := &debugBase{entered: make(chan struct{}), release: make(chan struct{})}
	p := only(bulwark.Policy{}, "breaker", "bulkhead", "pushback")
	p.Breaker = bulwark.Breaker{WindowCalls: 10, MinCalls: 5, OpenFor: time.Minute} // open for the whole test, however slow the machine
	p.Bulkhead = bulwark.Bulkhead{MaxConcurrent: 2}
	pool := bulwark.Policy{Breaker: bulwark.Breaker{Disabled: true}, Endpoints: bulwark.Endpoints{Addrs: []string{"10.0.0.1:80", "10.0.0.2:80"}}}
	tr := mustNew(t, bulwark.Config{Base: base, Default: p, Upstreams: map[string]bulwark.Policy{"pool.test": pool}})
	step := func() {
		if sample != nil {
			sample(tr)
		}
	}
	sendOnce(t, tr, "GET", "http://busy.test/ok") // busy.test has state from the start
	sendOnce(t, tr, "GET", "http://calm.test/")
	for range 3 {
		sendOnce(t, tr, "GET", "http://failing.test/")
	}
	// One call in three succeeds: the window fills with failures until the
	// breaker opens (and empties its window).
	for i := range 8 {
		url := "http://sick.test/"
		if i%3 == 2 {
			url = "http://pool.test/"
		}
		sendOnce(t, tr, "GET", url)
		sendOnce(t, tr, "GET", "http://mid.test/")
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
	sendOnce(t, tr, "GET", "http://busy.test/") // refused: the bulkhead is full
	// One more after the last step: the page's own sample, taken when it
	// is served, sees the pass-ups still growing however late that is.
	sendOnce(t, tr, "GET", "http://mid.test/")
	t.Cleanup(func() {
		close(base.release)
		wg.Wait()
	})
	return tr
}

// sampler returns a func that gives d a sample of tr's state each time it
// is called, a second apart (time as the sampler would have taken them),
// the first 11 s ago: the fixture's ten samples end before the page's own
// one, taken when it is served, and within the 10 s its rates look back.
func sampler(d *handler) func(*bulwark.Transport) {
	at := time.Now().Add(-12 * time.Second)
	return func(tr *bulwark.Transport) {
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

// TestDebugJSONRoundTrip: the JSON decodes into Page with no field left
// over, encodes back to the same bytes, has one History per host in the
// Snapshot's order, and says what the fixture set up.
func TestDebugJSONRoundTrip(t *testing.T) {
	d := newHandler(nil, time.Hour, 20)
	defer d.Close()
	tr := debugFixture(t, sampler(d))
	d.tr = tr
	for _, target := range []string{"/debug/bulwark/json", "/debug/bulwark/?format=json"} {
		rec := getDebug(t, d, target)
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s: Content-Type %q", target, ct)
		}
		raw := rec.Body.Bytes()
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		var page Page
		if err := dec.Decode(&page); err != nil {
			t.Fatalf("%s: decoding into Page: %v\n%s", target, err, raw)
		}
		again, err := json.MarshalIndent(page, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(append(again, '\n'), raw) {
			t.Errorf("%s: JSON does not round-trip through Page:\nserved %s\nagain  %s", target, raw, again)
		}
		if len(page.History) != len(page.Snapshot.Hosts) {
			t.Fatalf("%s: %d histories for %d hosts", target, len(page.History), len(page.Snapshot.Hosts))
		}
		hosts := map[string]bulwark.HostSnapshot{}
		for i, h := range page.Snapshot.Hosts {
			hosts[h.Host] = h
			hist := page.History[i]
			if hist.Host != h.Host || hist.Scheme != h.Scheme {
				t.Errorf("%s: History[%d] is of %s %s, want %s %s as Hosts[%d]", target, i, hist.Scheme, hist.Host, h.Scheme, h.Host, i)
			}
			if len(hist.Samples) < 2 {
				t.Errorf("%s: %d samples, want 10 (2 for pool.test, whose state came later)", h.Host, len(hist.Samples))
			}
		}
		if b := hosts["sick.test:80"].Breaker; b == nil || b.State != bulwark.CircuitOpen || b.OpenUntil.IsZero() || b.Failures == 0 && b.Trips != 1 {
			t.Errorf("sick.test breaker = %+v, want open with a next probe", b)
		}
		if !bytes.Contains(raw, []byte(`"State": "open"`)) {
			t.Errorf("%s: the JSON does not name the open breaker's state:\n%s", target, raw)
		}
		if b := hosts["busy.test:80"].Bulkhead; b == nil || b.InFlight != 2 || b.Limit != 2 {
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
	d := newHandler(mustNew(t, bulwark.Config{Base: statusBase(http.StatusOK)}), time.Hour, 10)
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
		tr := mustNew(t, bulwark.Config{Base: statusBase(http.StatusOK), Default: only(bulwark.Policy{}, "breaker")})
		sendOnce(t, tr, "GET", "http://a.test/")
		d := newHandler(tr, time.Second, 5)
		defer d.Close()
		getDebug(t, d, "/")
		time.Sleep(3500 * time.Millisecond)
		var page Page
		json.Unmarshal(getDebug(t, d, "/json").Body.Bytes(), &page)
		if n := len(page.History[0].Samples); n != 4 {
			t.Errorf("after 3.5 s: %d samples, want 4 (one at the first request, three ticks)", n)
		}
		time.Sleep(4 * time.Second)
		json.Unmarshal(getDebug(t, d, "/json").Body.Bytes(), &page)
		if n := len(page.History[0].Samples); n != 5 {
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
// live Transport with a tripped breaker, a host failing every call below
// its breaker's MinCalls, a full bulkhead, an ejected instance and a calm
// host, and checks what an on-call engineer must see: the open breaker and
// the failing host first and red, the countdown to the next probe, each
// host's state, a chart with data, the calm host folded. The screenshots
// go to $BULWARK_DEBUG_SHOTS if set (a directory), else to the test's
// temporary directory (go test -run Chromium -v prints where).
func TestDebugPageInChromium(t *testing.T) {
	const chromium = "/usr/bin/chromium"
	if _, err := os.Stat(chromium); err != nil {
		t.Skip("skipped: " + chromium + " not found, so the debug page was not checked in a browser")
	}
	d := newHandler(nil, sampleEvery, sampleKeep)
	defer d.Close()
	tr := debugFixture(t, sampler(d))
	d.tr = tr
	mux := http.NewServeMux()
	mux.Handle("/debug/bulwark/", d)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	url := srv.URL + "/debug/bulwark/"

	dir := os.Getenv("BULWARK_DEBUG_SHOTS")
	if dir == "" {
		dir = t.TempDir()
	}
	run := func(url string, args ...string) []byte {
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
	dom := string(run(url, "--dump-dom"))
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
		"sick.test:80": {"sick.test:80", "breaker", "open", "next probe in ", "trips in a row 1, 1 in all", "refused since start",
			"window at last trip5 calls: 5 failed, 0 slow · failure rate 100 % ≥ 50 %", "state changesclosed → open failure rate 100 % ≥ 50 %"},
		"failing.test:80": {"failing.test:80", "3 calls: 100 % failed (3)", "3 of 3 calls failed", "calls since start3: 0 succeeded · 3 failed · 0 timed out · 0 refused"},
		"busy.test:80":    {"busy.test:80", "2 / 2 in flight", "full"},
		"pool.test:80":    {"pool.test:80", "10.0.0.1:80", "10.0.0.2:80", "ejected for "},
		"mid.test:80": {"mid.test:80", "failures passed up from below", "passed up from below9 failures passed up from below since start · now ",
			"calls since start9: 0 succeeded · 0 failed · 0 timed out · 0 refused · 9 passed up from below",
			"not this host's fault", "not retried here, not counted by this host's breaker"},
	} {
		s := section(host)
		visible := html.UnescapeString(text.ReplaceAllString(s, ""))
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
	// Ranked by harm: the open breaker, then the host failing every call
	// (red though its breaker is closed and has no rate below MinCalls),
	// then the full bulkhead, all red; the ejected instance amber; the
	// calm host last, folded.
	var order []string
	for _, m := range regexp.MustCompile(`class="host (\w+)" data-host="([^"]+)"`).FindAllStringSubmatch(dom, -1) {
		order = append(order, m[2]+" "+m[1])
	}
	// The host passing failures up is amber, among the hosts in trouble
	// rather than folded with the calm ones, and never red: the fault is
	// below it.
	want := []string{"sick.test:80 bad", "failing.test:80 bad", "busy.test:80 bad", "mid.test:80 warn", "pool.test:80 warn", "calm.test:80 calm"}
	if !slices.Equal(order, want) {
		t.Errorf("hosts in the order %q, want %q", order, want)
	}
	if !strings.Contains(section("failing.test:80"), `<span class="share bad">100 % failed</span>`) {
		t.Errorf("failing.test's 100 %% failures are not shown red:\n%s", section("failing.test:80"))
	}
	if !regexp.MustCompile(`next probe in [0-9]+\.[0-9] s`).MatchString(text.ReplaceAllString(section("sick.test:80"), "")) {
		t.Errorf("sick.test shows no countdown to its next probe:\n%s", section("sick.test:80"))
	}
	// The refusals are counted, per layer that refused.
	for host, re := range map[string]string{"sick.test:80": `[1-9][0-9]* breaker open \([0-9]+\.[0-9]/s\)`, "busy.test:80": `1 bulkhead full \([0-9]+\.[0-9]/s\) · 0 pushback · now [0-9]+\.[0-9]/s in all`} {
		if !regexp.MustCompile(re).MatchString(text.ReplaceAllString(section(host), "")) {
			t.Errorf("%s does not show its refusals (%s):\n%s", host, re, text.ReplaceAllString(section(host), ""))
		}
	}
	if d := strings.Index(dom, `<details class="calm"`); d < 0 || d > strings.Index(dom, `data-host="calm.test:80"`) {
		t.Errorf("calm.test is not folded under <details>")
	}
	if d, m := strings.Index(dom, `<details class="calm"`), strings.Index(dom, `data-host="mid.test:80"`); m < 0 || m > d {
		t.Errorf("mid.test's pass-ups are folded with the calm hosts, out of sight")
	}
	// Its rate is read from the history: the failures passed up go on.
	if !regexp.MustCompile(`since start · now [0-9.]*[1-9][0-9.]*/s \(last [0-9]+ s\)`).MatchString(text.ReplaceAllString(section("mid.test:80"), "")) {
		t.Errorf("mid.test shows no rate of pass-ups above 0:\n%s", text.ReplaceAllString(section("mid.test:80"), ""))
	}

	for name, u := range map[string]string{"debug.png": url, "debug-calm-open.png": url + "?calm=open"} {
		shot := filepath.Join(dir, name)
		run(u, "--screenshot="+shot, "--window-size=1100,1400", "--hide-scrollbars")
		if fi, err := os.Stat(shot); err != nil || fi.Size() < 5000 {
			t.Fatalf("screenshot %s: %v (size %v)", shot, err, fi)
		}
		t.Logf("screenshot: %s", shot)
	}
}

// TestDebugHedgeAndThrottle: a host's hedging, throttle and fault counts
// reach the JSON and the page.
func TestDebugHedgeAndThrottle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := only(bulwark.Policy{Throttle: bulwark.Throttle{Enabled: true, Shadow: true}, Hedge: bulwark.Hedge{Delay: 10 * time.Millisecond},
			Fault: bulwark.Fault{Delay: time.Millisecond, DelayRate: 1}}, "timeout", "retry")
		tr := mustNew(t, bulwark.Config{Base: statusBase(http.StatusServiceUnavailable), Default: p})
		sendOnce(t, tr, "GET", "http://a.test/")
		d := newHandler(tr, time.Second, 5)
		defer d.Close()
		var page Page
		if err := json.Unmarshal(getDebug(t, d, "/json").Body.Bytes(), &page); err != nil {
			t.Fatal(err)
		}
		h := page.Snapshot.Hosts[0]
		if h.Hedge == nil || h.Throttle == nil || !h.Throttle.Shadow || h.Throttle.Requests == 0 {
			t.Fatalf("host = %+v %+v, want hedge and a shadow throttle with requests", h.Hedge, h.Throttle)
		}
		// The 503 was tried three times.
		if f := h.Fault; f == nil || *f != (bulwark.FaultSnapshot{Injected: bulwark.FaultCounts{Delays: 3}}) {
			t.Errorf("fault = %+v, want a delay for each of three attempts", f)
		}
		html := getDebug(t, d, "/").Body.String()
		if !strings.Contains(html, "hedging") || !strings.Contains(html, "throttle") || !strings.Contains(html, "3 delays") {
			t.Errorf("page has no hedging, throttle or fault row")
		}
	})
}

// TestDebugShowsNoSecrets sends requests with userinfo, a query, a
// credential header and a hostile host name through a live Transport, and
// checks that neither the page nor the JSON carries the secrets, and that
// the hostile host reaches the page only escaped.
func TestDebugShowsNoSecrets(t *testing.T) {
	tr := mustNew(t, bulwark.Config{Base: statusBase(http.StatusInternalServerError), Default: only(bulwark.Policy{}, "breaker", "bulkhead")})
	for _, u := range []string{"http://user:pa55word@a.test/orders?token=s3cret", `http://x"><script>alert(1)<.test/p?token=s3cret`} {
		req, err := http.NewRequestWithContext(t.Context(), "GET", u, nil)
		if err != nil {
			t.Fatalf("%s: %v", u, err)
		}
		req.Header.Set("Authorization", "Bearer h3ader")
		if resp, err := tr.RoundTrip(req); err == nil {
			resp.Body.Close()
		}
	}
	d := newHandler(tr, time.Hour, 10)
	defer d.Close()
	for _, target := range []string{"/", "/json"} {
		body := getDebug(t, d, target).Body.String()
		for _, secret := range []string{"pa55word", "user:", "s3cret", "h3ader", "/orders", "<script"} {
			if strings.Contains(body, secret) {
				t.Errorf("%s carries %q", target, secret)
			}
		}
		if !strings.Contains(body, "a.test:80") {
			t.Errorf("%s does not show a.test:80", target)
		}
	}
	if html := getDebug(t, d, "/").Body.String(); !strings.Contains(html, "x&#34;&gt;&lt;script&gt;alert(1)&lt;.test:80") {
		t.Errorf("the hostile host is not shown escaped:\n%s", html)
	}
}

// TestDebugLearned: a host's learned latency and the bounds in force, with
// where each comes from, reach the JSON and the page.
func TestDebugLearned(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := mustNew(t, bulwark.Config{Base: statusBase(http.StatusOK)})
		sendOnce(t, tr, "GET", "http://a.test/")
		d := newHandler(tr, time.Second, 5)
		defer d.Close()
		var page Page
		if err := json.Unmarshal(getDebug(t, d, "/json").Body.Bytes(), &page); err != nil {
			t.Fatal(err)
		}
		l := page.Snapshot.Hosts[0].Learned
		const coldStart = 10 * time.Second // the attempt timeout's ceiling (Timeout.Attempt)
		if l == nil || l.AttemptFrom != bulwark.FromColdStart || l.AttemptTimeout != coldStart {
			t.Fatalf("learned = %+v, want the cold start's %v", l, coldStart)
		}
		// A calm host is one folded row, which names the timeout in force
		// and where it comes from; a host in trouble has the whole
		// learned-latency row (TestPageRanksByHarm's hosts).
		html := getDebug(t, d, "/").Body.String()
		if !strings.Contains(html, "attempt timeout 10000.0 ms, cold start") {
			t.Errorf("page does not show the attempt timeout in force:\n%s", html)
		}
	})
}
