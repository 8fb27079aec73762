// Package debug serves a live page of a bulwark.Transport's state, as HTML
// for a person and as JSON for a program, in the manner of net/http/pprof
// beside net/http: it reads only the Transport's public Snapshot, and
// bulwark does not import it.
//
// Mount its Handler on an internal mux:
//
//	mux.Handle("/debug/bulwark/", debug.Handler(tr))
//	// HTML: GET /debug/bulwark/    JSON: GET /debug/bulwark/json or /debug/bulwark/?format=json
//
// The JSON is a Page: the bulwark.Snapshot itself, with its Go field names
// and in its order (by host), plus when it was taken and the history the
// page's charts draw. It has no schema of its own: the ranking, shares and
// colours of the HTML are derived from it and are not in it. A field added
// to a layer's snapshot type reaches the JSON with no change here, and
// reaches the HTML with a line in page.html.
package debug

import (
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/bulwark-http/bulwark"
)

// Handler returns a read-only page of tr's live state, in the style of
// net/http/pprof and expvar, ranked by harm: hosts in trouble first, red
// (an open breaker, then at least half the breaker window failed or slow,
// a full bulkhead, a pause the upstream asked for) before amber (half-open,
// 5 % failed or 10 % slow, queued, throttled, an instance ejected, failures
// passed up from below in the last 10 s), and the calm hosts last, folded
// (?calm=open unfolds them). Per host in trouble it shows every layer's
// state, refusals and rates, latency, the fleet's view, and a chart of the
// last five minutes. The page is one self-contained HTML document, with no
// script, that reloads itself every two seconds; the same data is served
// as JSON, in the schema of Page, for a path ending in "/json" or a query
// with format=json.
//
// The handler only reads (methods other than GET and HEAD get 405), names
// hosts as "host:port" and routes by pattern, never a URL, query, userinfo
// or header, and escapes what it prints. It still tells whoever reads it
// which hosts the process talks to: mount it on an internal listener or
// behind your own authentication, as you would net/http/pprof.
//
// The charts come from a bounded history (300 samples a host, some 43 KB)
// taken each second by a goroutine the handler starts at its first request
// and that stops once the page has not been served for five minutes. The
// handler is also an io.Closer: Close stops that goroutine now (for goleak).
// Nothing runs on tr's request path: each sample is one Transport.Snapshot.
func Handler(tr *bulwark.Transport) http.Handler {
	return newHandler(tr, sampleEvery, sampleKeep)
}

// The history of the page: a sample every sampleEvery, sampleKeep samples
// per host, so five minutes of it.
const (
	sampleEvery = time.Second
	sampleKeep  = 300
)

// Page is what the Handler serves, and the schema of its JSON. Its fields,
// and bulwark.Snapshot's within it, are encoded under their Go names with
// no tags, so the JSON changes only when the Go API does. Times are
// RFC 3339 (a zero time is "0001-01-01T00:00:00Z"), durations are
// nanoseconds, a layer the host's policy disables is null, and breaker
// states and controls are their names ("open", "force-closed").
type Page struct {
	// Time is when the Snapshot was taken. A pause in the Snapshot (a
	// PushbackSnapshot's Until and Tiers) is in force if it ends after
	// Time.
	Time time.Time
	// SampleEvery is the interval between two samples of a History.
	SampleEvery time.Duration
	// Snapshot is Transport.Snapshot at Time.
	Snapshot bulwark.Snapshot
	// History has one entry per host of Snapshot.Hosts, in the same
	// order.
	History []History
}

// History is one host's samples, oldest first: what its sparkline draws.
// A host that has just appeared has none yet.
type History struct {
	// Host and Scheme are those of the HostSnapshot it goes with.
	Host, Scheme string
	// Samples holds at most five minutes of them.
	Samples []Sample
}

// Sample is one point of a host's History.
type Sample struct {
	// Time is when it was taken.
	Time time.Time
	// InFlight is the slots held in the host's bulkheads (all instances'
	// for a balanced upstream).
	InFlight int
	// Calls and Failures are the breaker window's, zero without a
	// breaker.
	Calls, Failures int64
	// State is the breaker's state, nil without a breaker.
	State *bulwark.CircuitState
	// Refused is the requests the host's layers had refused since its
	// state was made (every layer's count added up, its routes' and
	// instances' included), and Served the final failures its fallback
	// had answered: counts that only grow, so two samples give a rate.
	Refused, Served uint64
	// Requests and Succeeded are the host's calls since its state was
	// made, all and those that succeeded (bulwark.CallCounts).
	Requests, Succeeded uint64
	// RefusedBy is Refused by the layer that refused, for each layer's
	// rate.
	RefusedBy Refusals
	// PassedUp is the host's answers that passed a failure up from a
	// tier below it (bulwark.HostSnapshot.PassedUp).
	PassedUp uint64
}

// Refusals are a host's refusals since its state was made, by the layer
// that refused: counts that only grow. A layer the host does not have
// counts 0.
type Refusals struct {
	// Breaker is the host's breaker's (BreakerSnapshot.Refused) and its
	// routes' breakers' added up.
	Breaker uint64
	// Bulkhead is the host's bulkhead's, or its instances' added up.
	Bulkhead uint64
	// Budget, Pushback and Throttle are those layers' Refused.
	Budget, Pushback, Throttle uint64
	// DeadlineTooShort is HostSnapshot.DeadlineTooShort.
	DeadlineTooShort uint64
}

// hostKey is a host's identity in a Snapshot: one host:port reached over
// two schemes is two hosts.
type hostKey struct{ host, scheme string }

// handler is the Handler: the Transport, and the history its sampler
// keeps.
type handler struct {
	tr    *bulwark.Transport
	every time.Duration
	keep  int

	mu         sync.Mutex
	hist       map[hostKey][]Sample // at most keep each
	lastSample time.Time
	lastServed time.Time
	stop       chan struct{} // nil when no sampler runs
	done       chan struct{}
}

var _ io.Closer = (*handler)(nil)

func newHandler(tr *bulwark.Transport, every time.Duration, keep int) *handler {
	return &handler{tr: tr, every: every, keep: keep, hist: make(map[hostKey][]Sample)}
}

func (d *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
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
	v := newView(page, time.Duration(d.keep)*d.every)
	v.CalmOpen = r.URL.Query().Get("calm") == "open"
	_ = pageTemplate.Execute(w, v)
}

// serve takes the page at now, starting the sampler if none runs, and
// samples too when the last sample is older than the interval, so the
// first view already has a point.
func (d *handler) serve(now time.Time) Page {
	s := d.tr.Snapshot()
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
	page := Page{Time: now, SampleEvery: d.every, Snapshot: s, History: make([]History, len(s.Hosts))}
	for i, h := range s.Hosts {
		// A copy: the sampler appends to the kept slice after the lock is
		// released.
		page.History[i] = History{Host: h.Host, Scheme: h.Scheme, Samples: slices.Clone(d.hist[hostKey{h.Host, h.Scheme}])}
	}
	return page
}

// sampler samples every d.every until stop is closed or the page has gone
// unserved for a whole history's span.
func (d *handler) sampler(stop, done chan struct{}) {
	defer close(done)
	tk := time.NewTicker(d.every)
	defer tk.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-tk.C:
			s := d.tr.Snapshot()
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
func (d *handler) recordLocked(s bulwark.Snapshot, now time.Time) {
	d.lastSample = now
	live := make(map[hostKey]bool, len(s.Hosts))
	for _, h := range s.Hosts {
		k := hostKey{h.Host, h.Scheme}
		live[k] = true
		hs := append(d.hist[k], sample(h, now))
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

// sample is h's point of history at now.
func sample(h bulwark.HostSnapshot, now time.Time) Sample {
	sm := Sample{Time: now}
	for _, b := range bulkheads(h) {
		sm.InFlight += b.InFlight
	}
	if b := h.Breaker; b != nil {
		st := b.State
		sm.Calls, sm.Failures, sm.State = b.Calls, b.Failures, &st
	}
	for _, r := range refusals(h) {
		sm.Refused += r.N
		*sm.RefusedBy.of(r.id) = r.N
	}
	sm.PassedUp = h.PassedUp
	if f := h.Fallback; f != nil {
		sm.Served = f.Served
	}
	sm.Requests, sm.Succeeded = h.Calls.Calls, h.Calls.Succeeded
	return sm
}

// bulkheads is every bulkhead of h: its own, or its instances' for a
// balanced upstream (which has none of its own).
func bulkheads(h bulwark.HostSnapshot) []*bulwark.BulkheadSnapshot {
	if h.Bulkhead != nil {
		return []*bulwark.BulkheadSnapshot{h.Bulkhead}
	}
	var out []*bulwark.BulkheadSnapshot
	for _, e := range h.Endpoints {
		if e.Bulkhead != nil {
			out = append(out, e.Bulkhead)
		}
	}
	return out
}

// Close stops the sampler, if it runs, and waits for it. The handler may
// still be served after: it starts a new one.
func (d *handler) Close() error {
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
