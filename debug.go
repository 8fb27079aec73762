package bulwark

import (
	"cmp"
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// DebugHandler returns a read-only page of t's live state, in the style of
// net/http/pprof and expvar: per host, the breaker's state, window and next
// probe, the bulkhead's slots and queue, the retry budget left, pushback
// pauses (the host's and each priority tier's), a balanced upstream's
// instances with their ejections, the shadow-mode counts, and a sparkline
// of the last five minutes (requests in flight and the breaker window's
// failure share). The page is one self-contained HTML document, with no
// script and nothing loaded from elsewhere, that reloads itself every two
// seconds.
//
// The same data is served as JSON, in the schema of DebugPage, for a
// request whose path ends in "/json" or whose query has format=json:
//
//	mux.Handle("/debug/bulwark/", bulwark.DebugHandler(tr))
//	// HTML: GET /debug/bulwark/    JSON: GET /debug/bulwark/json or /debug/bulwark/?format=json
//
// The handler only reads (any method but GET and HEAD is refused with 405)
// and shows hosts as "host:port", never a URL, path or query. It still
// tells whoever reads it which hosts the process talks to and how they
// fare: do not expose it publicly. Mount it on an internal listener or
// behind your own authentication, as you would net/http/pprof.
//
// The sparklines come from a bounded history the handler keeps: a sample
// of every host each 5 s, 60 per host, taken by a goroutine the handler
// starts at its first request and that stops on its own once the page has
// not been served for five minutes (a later request starts it again). The
// handler is also an io.Closer: Close stops that goroutine now, for a
// program or a test (goleak) that wants none left. Nothing runs on the
// request path: each sample is one Transport.Snapshot, and the handler's
// cost is paid only while it samples or is served.
func DebugHandler(t *Transport) http.Handler {
	return newDebug(t, debugEvery, debugKeep)
}

// The history of the debug page: a sample every debugEvery, debugKeep
// samples per host.
const (
	debugEvery = 5 * time.Second
	debugKeep  = 60
)

// DebugPage is the JSON the DebugHandler serves. Its fields are stable: new
// ones may be added, none will be renamed or change meaning. Times are
// RFC 3339; a zero time is left out.
type DebugPage struct {
	// Time is when the page was taken.
	Time time.Time `json:"time"`
	// SampleEvery is the interval between History samples, in seconds.
	SampleEvery float64 `json:"sample_every_seconds"`
	// RetryAfterIgnored is Snapshot.RetryAfterIgnored.
	RetryAfterIgnored uint64 `json:"retry_after_ignored"`
	// Hosts has one entry per live host, sorted by host then scheme.
	Hosts []DebugHost `json:"hosts"`
}

// DebugHost is one host's state on the DebugPage. A layer the host's
// policy disables is left out.
type DebugHost struct {
	// Host is the "host:port", Scheme the URL scheme, Upstream the
	// Config.Upstreams key whose policy it uses, or "default".
	Host     string `json:"host"`
	Scheme   string `json:"scheme"`
	Upstream string `json:"upstream"`

	Breaker  *DebugBreaker  `json:"breaker,omitempty"`
	Bulkhead *DebugBulkhead `json:"bulkhead,omitempty"` // left out for a balanced upstream: see Endpoints
	Budget   *DebugBudget   `json:"budget,omitempty"`
	Pushback *DebugPushback `json:"pushback,omitempty"`
	Hedge    *DebugHedge    `json:"hedge,omitempty"`
	Throttle *DebugThrottle `json:"throttle,omitempty"`
	Fault    *DebugFault    `json:"fault,omitempty"`
	// Endpoints are a balanced upstream's instances.
	Endpoints []DebugEndpoint `json:"endpoints,omitempty"`
	// History is the host's samples, oldest first: what the sparkline
	// draws.
	History []DebugSample `json:"history,omitempty"`
}

// DebugBreaker is a breaker's state (BreakerSnapshot).
type DebugBreaker struct {
	// State is "closed", "half-open" or "open" (CircuitState.String); a
	// forced control shows as the state it forces.
	State string `json:"state"`
	// Control is "auto", "force-open" or "force-closed".
	Control string `json:"control"`
	// Calls, Failures and Slow are what the window holds now.
	Calls    int64 `json:"calls"`
	Failures int64 `json:"failures"`
	Slow     int64 `json:"slow"`
	// NextProbe is when an open breaker lets probes through.
	NextProbe time.Time `json:"next_probe,omitzero"`
	// Trips is how many times in a row it has opened.
	Trips int `json:"trips"`
	// Shadow is shadow mode (Breaker.Shadow); WouldReject counts the
	// requests it would have refused and sent.
	Shadow      bool   `json:"shadow"`
	WouldReject uint64 `json:"would_reject"`
}

// DebugBulkhead is a bulkhead's state (BulkheadSnapshot).
type DebugBulkhead struct {
	InFlight      int    `json:"in_flight"`      // slots held
	Queued        int    `json:"queued"`         // requests waiting for one
	MaxConcurrent int    `json:"max_concurrent"` // the limit
	MaxQueue      int    `json:"max_queue"`      // the queue's bound
	Shadow        bool   `json:"shadow"`         // Bulkhead.Shadow
	WouldReject   uint64 `json:"would_reject"`   // refusals it let through in shadow mode
}

// DebugHedge is a host's hedging (HedgeSnapshot).
type DebugHedge struct {
	// Sent is the hedges sent, Won those whose answer the caller got, and
	// Skipped those due but not sent (budget, deadline, breaker, pause,
	// bulkhead, throttle, summed).
	Sent    uint64 `json:"sent"`
	Won     uint64 `json:"won"`
	Skipped uint64 `json:"skipped"`
	// DelayMs is the delay a hedge would wait now, in milliseconds; zero
	// while a quantile delay has too few samples.
	DelayMs float64 `json:"delay_ms"`
}

// DebugThrottle is a host's client-side throttle (ThrottleSnapshot).
type DebugThrottle struct {
	// Requests and Accepts are the counts over the window; Probability
	// the chance a request is refused now, in [0, 1].
	Requests    int64   `json:"requests"`
	Accepts     int64   `json:"accepts"`
	Probability float64 `json:"probability"`
	// Shadow is shadow mode (Throttle.Shadow); WouldReject counts the
	// requests it would have refused and sent.
	Shadow      bool   `json:"shadow"`
	WouldReject uint64 `json:"would_reject"`
}

// DebugFault is what fault injection did on a host (FaultSnapshot).
type DebugFault struct {
	// Delays, Aborts and Resets are the faults injected; FromHeaders how
	// many of them a Bulwark-Fault-* header asked for (all kinds summed);
	// HeadersRefused the attempts whose headers were ignored.
	Delays         uint64 `json:"delays"`
	Aborts         uint64 `json:"aborts"`
	Resets         uint64 `json:"resets"`
	FromHeaders    uint64 `json:"from_headers"`
	HeadersRefused uint64 `json:"headers_refused"`
}

// DebugBudget is a retry budget's state (BudgetSnapshot).
type DebugBudget struct {
	Calls     int64 `json:"calls"`     // calls in the window
	Retries   int64 `json:"retries"`   // retries in the window
	Remaining int64 `json:"remaining"` // retries it would allow now
}

// DebugPushback is a host's pushback (PushbackSnapshot), with only the
// pauses in force when the page was taken.
type DebugPushback struct {
	// Until is the end of a pause of the whole host.
	Until time.Time `json:"until,omitzero"`
	// Tiers maps a priority's name (Priority.String: "critical",
	// "normal", …) to the end of the pause a Shedder's refusal of it
	// asked for.
	Tiers map[string]time.Time `json:"tiers,omitempty"`
}

// DebugEndpoint is one instance of a balanced upstream (EndpointState).
type DebugEndpoint struct {
	Addr                string         `json:"addr"` // "host:port"
	Ejected             bool           `json:"ejected"`
	EjectedUntil        time.Time      `json:"ejected_until,omitzero"`
	Ejections           int            `json:"ejections"` // ejections in a row
	InFlight            int            `json:"in_flight"`
	ConsecutiveFailures int            `json:"consecutive_failures"`
	Requests            uint64         `json:"requests"` // attempts sent to it
	Bulkhead            *DebugBulkhead `json:"bulkhead,omitempty"`
}

// DebugSample is one point of a host's history.
type DebugSample struct {
	Time time.Time `json:"time"`
	// InFlight is the slots held in the host's bulkheads (all instances').
	InFlight int `json:"in_flight"`
	// Failures and Calls are the breaker window's, zero without a breaker.
	Calls    int64 `json:"calls"`
	Failures int64 `json:"failures"`
	// State is the breaker's, "" without one.
	State string `json:"state,omitempty"`
}

// debugHandler is DebugHandler's handler: the Transport, and the history
// its sampler keeps.
type debugHandler struct {
	t     *Transport
	every time.Duration
	keep  int

	mu         sync.Mutex
	hist       map[string][]DebugSample // by host and scheme; at most keep each
	lastSample time.Time
	lastServed time.Time
	stop       chan struct{} // nil when no sampler runs
	done       chan struct{}
}

func newDebug(t *Transport, every time.Duration, keep int) *debugHandler {
	return &debugHandler{t: t, every: every, keep: keep, hist: make(map[string][]DebugSample)}
}

func (d *debugHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "read-only", http.StatusMethodNotAllowed)
		return
	}
	page := d.serve(time.Now())
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if r.URL.Query().Get("format") == "json" || strings.HasSuffix(r.URL.Path, "/json") {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(page)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	// The page has no script, and loads nothing.
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
	_ = debugTemplate.Execute(w, page)
}

// serve takes the page at now, starting the sampler if none runs, and
// samples too when the last sample is older than the interval, so the
// first view already has a point.
func (d *debugHandler) serve(now time.Time) DebugPage {
	s := d.t.Snapshot()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.lastServed = now
	if d.stop == nil {
		d.stop, d.done = make(chan struct{}), make(chan struct{})
		go d.sampler(d.stop, d.done)
	}
	if now.Sub(d.lastSample) >= d.every {
		d.recordLocked(s, now)
	}
	page := DebugPage{Time: now, SampleEvery: d.every.Seconds(), RetryAfterIgnored: s.RetryAfterIgnored}
	for _, h := range s.Hosts {
		dh := debugHost(h, now)
		dh.History = append([]DebugSample(nil), d.hist[h.Scheme+"://"+h.Host]...)
		page.Hosts = append(page.Hosts, dh)
	}
	return page
}

// sampler samples every d.every until stop is closed or the page has gone
// unserved for a whole history's span.
func (d *debugHandler) sampler(stop, done chan struct{}) {
	defer close(done)
	tk := time.NewTicker(d.every)
	defer tk.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-tk.C:
			s := d.t.Snapshot()
			d.mu.Lock()
			if d.stop != stop {
				d.mu.Unlock()
				return
			}
			if now.Sub(d.lastServed) > time.Duration(d.keep)*d.every {
				// Nobody looks: stop, and let the next request start again.
				d.stop, d.done = nil, nil
				d.mu.Unlock()
				return
			}
			d.recordLocked(s, now)
			d.mu.Unlock()
		}
	}
}

// recordLocked adds a sample of s per host, drops the history of hosts no
// longer there, and keeps at most d.keep per host. Under d.mu.
func (d *debugHandler) recordLocked(s Snapshot, now time.Time) {
	d.lastSample = now
	live := make(map[string]bool, len(s.Hosts))
	for _, h := range s.Hosts {
		k := h.Scheme + "://" + h.Host
		live[k] = true
		sm := DebugSample{Time: now}
		for _, b := range h.bulkheads() {
			sm.InFlight += b.InFlight
		}
		if b := h.Breaker; b != nil {
			sm.Calls, sm.Failures, sm.State = b.Calls, b.Failures, b.State.String()
		}
		hs := append(d.hist[k], sm)
		if len(hs) > d.keep {
			hs = append(hs[:0], hs[len(hs)-d.keep:]...)
		}
		d.hist[k] = hs
	}
	for k := range d.hist {
		if !live[k] {
			delete(d.hist, k)
		}
	}
}

// Close stops the sampler, if it runs, and waits for it. The handler may
// still be served after: it starts a new one.
func (d *debugHandler) Close() error {
	d.mu.Lock()
	stop, done := d.stop, d.done
	d.stop, d.done = nil, nil
	d.mu.Unlock()
	if stop != nil {
		close(stop)
		<-done
	}
	return nil
}

var _ io.Closer = (*debugHandler)(nil)

// debugHost converts a HostSnapshot to the page's schema at now.
func debugHost(h HostSnapshot, now time.Time) DebugHost {
	dh := DebugHost{Host: h.Host, Scheme: h.Scheme, Upstream: h.Upstream}
	if b := h.Breaker; b != nil {
		dh.Breaker = &DebugBreaker{State: b.State.String(), Control: b.Control.String(),
			Calls: b.Calls, Failures: b.Failures, Slow: b.Slow, NextProbe: b.OpenUntil, Trips: b.Trips,
			Shadow: b.Shadow, WouldReject: b.WouldReject}
	}
	dh.Bulkhead = debugBulkhead(h.Bulkhead)
	if b := h.Budget; b != nil {
		dh.Budget = &DebugBudget{Calls: b.Calls, Retries: b.Retries, Remaining: b.Remaining}
	}
	if p := h.Pushback; p != nil {
		dp := &DebugPushback{}
		if p.Until.After(now) {
			dp.Until = p.Until
		}
		for i, until := range p.Tiers {
			if until.After(now) {
				if dp.Tiers == nil {
					dp.Tiers = make(map[string]time.Time)
				}
				dp.Tiers[Priority(i).String()] = until
			}
		}
		dh.Pushback = dp
	}
	if hg := h.Hedge; hg != nil {
		sk := hg.Skipped
		dh.Hedge = &DebugHedge{Sent: hg.Sent, Won: hg.Won, DelayMs: float64(hg.Delay) / float64(time.Millisecond),
			Skipped: sk.Budget + sk.Deadline + sk.Breaker + sk.Pushback + sk.Bulkhead + sk.Throttle}
	}
	if th := h.Throttle; th != nil {
		dh.Throttle = &DebugThrottle{Requests: th.Requests, Accepts: th.Accepts, Probability: th.Probability,
			Shadow: th.Shadow, WouldReject: th.WouldReject}
	}
	if f := h.Fault; f != nil {
		fh := f.FromHeaders
		dh.Fault = &DebugFault{Delays: f.Injected.Delays, Aborts: f.Injected.Aborts, Resets: f.Injected.Resets,
			FromHeaders: fh.Delays + fh.Aborts + fh.Resets, HeadersRefused: f.HeadersRefused}
	}
	for _, e := range h.Endpoints {
		dh.Endpoints = append(dh.Endpoints, DebugEndpoint{Addr: e.Addr, Ejected: e.Ejected, EjectedUntil: e.EjectedUntil,
			Ejections: e.Ejections, InFlight: e.InFlight, ConsecutiveFailures: e.ConsecutiveFailures,
			Requests: e.Requests, Bulkhead: debugBulkhead(e.Bulkhead)})
	}
	return dh
}

func debugBulkhead(b *BulkheadSnapshot) *DebugBulkhead {
	if b == nil {
		return nil
	}
	// The limit in force: an adaptive limit's current value.
	return &DebugBulkhead{InFlight: b.InFlight, Queued: b.Queued, MaxConcurrent: cmp.Or(b.Limit, b.MaxConcurrent), MaxQueue: b.MaxQueue,
		Shadow: b.Shadow, WouldReject: b.WouldReject}
}

// The sparkline's size, in SVG user units.
const sparkW, sparkH = 240.0, 40.0

// sparkline draws a host's history: requests in flight (scaled to their
// peak, or the bulkhead's limit if larger) and the breaker window's failure
// share (scaled to 100 %, and "" without a breaker), as polyline point
// lists.
func sparkline(h DebugHost) (inflight, failures string) {
	n := len(h.History)
	if n == 0 {
		return "", ""
	}
	peak := 1
	if h.Bulkhead != nil {
		peak = max(peak, h.Bulkhead.MaxConcurrent)
	}
	for _, s := range h.History {
		peak = max(peak, s.InFlight)
	}
	var a, b strings.Builder
	for i, s := range h.History {
		x := sparkW
		if n > 1 {
			x = float64(i) * sparkW / float64(n-1)
		}
		fmt.Fprintf(&a, "%.1f,%.1f ", x, sparkY(float64(s.InFlight)/float64(peak)))
		share := 0.0
		if s.Calls > 0 {
			share = float64(s.Failures) / float64(s.Calls)
		}
		fmt.Fprintf(&b, "%.1f,%.1f ", x, sparkY(share))
	}
	if h.Breaker == nil {
		return strings.TrimSpace(a.String()), ""
	}
	return strings.TrimSpace(a.String()), strings.TrimSpace(b.String())
}

// sparkY is the height of a share (0 to 1) of the chart, 2 units in from
// each edge so a line at either bound is not hidden by the border.
func sparkY(share float64) float64 { return sparkH - 2 - share*(sparkH-4) }

var debugTemplate = template.Must(template.New("debug").Funcs(template.FuncMap{
	"spark": func(h DebugHost) map[string]any {
		in, f := sparkline(h)
		return map[string]any{"In": in, "Fail": f, "N": len(h.History)}
	},
	"ts":  func(t time.Time) string { return t.UTC().Format("15:04:05.000") },
	"pct": func(p float64) float64 { return 100 * p },
}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="2">
<title>bulwark</title>
<style>
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}
h1{font-size:1.3em}
.host{background:#fff;border:1px solid #ddd;border-radius:6px;padding:.8em 1em;margin:0 0 1em;max-width:60em}
.host h2{font-size:1.1em;margin:0 0 .4em}
.muted{color:#777;font-weight:normal}
.state{display:inline-block;padding:.1em .6em;border-radius:1em;color:#fff;font-weight:bold}
.closed{background:#2e7d32}.open{background:#c62828}.half-open{background:#ef6c00}
.full{color:#c62828;font-weight:bold}
table{border-collapse:collapse;margin:.4em 0}td,th{padding:.15em .8em .15em 0;text-align:left}
svg{background:#f4f4f4;border:1px solid #e0e0e0}
.in{fill:none;stroke:#1565c0;stroke-width:1.5}.fail{fill:none;stroke:#c62828;stroke-width:1.5}
</style></head><body>
<h1>bulwark <span class="muted">at {{ts .Time}} UTC · {{len .Hosts}} hosts · Retry-After ignored: {{.RetryAfterIgnored}}</span></h1>
{{if not .Hosts}}<p>No host has state yet.</p>{{end}}
{{range .Hosts}}<section class="host" data-host="{{.Host}}">
<h2>{{.Host}} <span class="muted">{{.Scheme}} · upstream {{.Upstream}}</span></h2>
<table>
{{with .Breaker}}<tr><th>breaker</th><td><span class="state {{.State}}">{{.State}}</span>
 window {{.Calls}} calls, {{.Failures}} failed, {{.Slow}} slow · trips {{.Trips}}{{if not .NextProbe.IsZero}} · next probe {{ts .NextProbe}}{{end}}{{if ne .Control "auto"}} · control {{.Control}}{{end}}{{if .Shadow}} · shadow: would have rejected {{.WouldReject}}{{end}}</td></tr>{{end}}
{{with .Bulkhead}}<tr><th>bulkhead</th><td{{if ge .InFlight .MaxConcurrent}} class="full"{{end}}>{{.InFlight}} / {{.MaxConcurrent}} in flight · {{.Queued}} / {{.MaxQueue}} queued{{if ge .InFlight .MaxConcurrent}} · full{{end}}{{if .Shadow}} · shadow: would have rejected {{.WouldReject}}{{end}}</td></tr>{{end}}
{{with .Budget}}<tr><th>retry budget</th><td>{{.Remaining}} retries left · window {{.Calls}} calls, {{.Retries}} retries</td></tr>{{end}}
{{with .Hedge}}<tr><th>hedging</th><td>{{.Sent}} sent, {{.Won}} won, {{.Skipped}} skipped · delay {{printf "%.1f" .DelayMs}} ms</td></tr>{{end}}
{{with .Throttle}}<tr><th>throttle</th><td>refuses {{printf "%.0f" (pct .Probability)}} % now · window {{.Requests}} requests, {{.Accepts}} accepted{{if .Shadow}} · shadow: {{.WouldReject}} would have been refused{{end}}</td></tr>{{end}}
{{with .Fault}}<tr><th>faults injected</th><td>{{.Delays}} delays, {{.Aborts}} aborts, {{.Resets}} resets ({{.FromHeaders}} from headers) · {{.HeadersRefused}} header triggers refused</td></tr>{{end}}
{{with .Pushback}}<tr><th>pushback</th><td>{{if .Until.IsZero}}none{{else}}<span class="full">paused until {{ts .Until}}</span>{{end}}{{range $p, $u := .Tiers}} · {{$p}} and below until {{ts $u}}{{end}}</td></tr>{{end}}
</table>
{{with .Endpoints}}<table class="endpoints"><tr><th>instance</th><th>status</th><th>ejections</th><th>in flight</th><th>failures in a row</th><th>requests</th></tr>
{{range .}}<tr><td>{{.Addr}}</td><td>{{if .Ejected}}<span class="full">ejected until {{ts .EjectedUntil}}</span>{{else}}in{{end}}</td><td>{{.Ejections}}</td><td>{{.InFlight}}</td><td>{{.ConsecutiveFailures}}</td><td>{{.Requests}}</td></tr>
{{end}}</table>{{end}}
{{with spark .}}<svg class="spark" data-points="{{.N}}" width="240" height="40" viewBox="0 0 240 40" role="img" aria-label="in flight and failure share, last {{.N}} samples">
{{if .In}}<polyline class="in" points="{{.In}}"/>{{end}}{{if .Fail}}<polyline class="fail" points="{{.Fail}}"/>{{end}}
</svg> <span class="muted"><span style="color:#1565c0">in flight</span> · <span style="color:#c62828">failure share</span> · {{.N}} samples</span>{{end}}
</section>
{{end}}
<p class="muted">Read-only. Do not expose publicly. JSON: add ?format=json.</p>
</body></html>
`))
