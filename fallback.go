package bulwark

import (
	"bytes"
	"cmp"
	"container/list"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// FallbackHeader is the response header that marks an answer bulwark made
// up locally instead of getting it from the upstream. Its value says which
// fallback answered: "stale", "constant" or "func".
const FallbackHeader = "Bulwark-Fallback"

// Package defaults for StaleCache, applied when StaleCache.MaxAge is set.
const (
	defaultStaleEntries    = 1000
	defaultStaleBytes      = 16 << 20
	defaultStaleEntryBytes = 256 << 10
)

// Fallback answers a call that has finally failed from something local, so
// that a sick dependency degrades a feature instead of failing it. It runs
// on the call's final outcome only, after the retries: an error (breaker
// open, bulkhead full, pushback, retry budget spent, bulwark's attempt or
// total timeout, a transport error) or a final 5xx (other than 501) or 429
// response, which is then drained and closed. It never runs when the
// caller's own context has ended: nobody would read the answer.
//
// The fallbacks are tried in order, Stale, Func, Constant; the first that
// has an answer gives it, and when none has, the caller gets the original
// outcome untouched. Every answer carries the FallbackHeader. In a service
// under the server half, a failure it answered (with a status other than
// a 5xx or 429) is not noted in the request's CallRecord: the service's
// own failure after it is not passed up as one from below.
//
// A fallback never makes a network call of its own: it must be cheaper and
// more reliable than what it replaces, and a second network call is a
// second dependency, with no breaker around it, failing at the very moment
// the first one did. So the built-ins read memory only, and a Func should
// too.
//
// The zero Fallback has no fallback at all.
type Fallback struct {
	// Stale serves the last successful response to the same GET. Zero
	// MaxAge inherits from Default, then means no stale cache.
	Stale StaleCache

	// Func is asked for an answer when there is no stale one. cause is the
	// final error, or an *UpstreamStatusError for a final failing response.
	// It returns a response to serve, an error to return instead of the
	// original, or (nil, nil) to decline. It runs for every method, so it
	// must decide itself what an unsafe method's degraded answer is. Nil
	// inherits from Default, then means no function.
	Func func(req *http.Request, cause error) (*http.Response, error)

	// Constant answers GET and HEAD requests when nothing before it did.
	// Other methods never get it: a made-up "200 OK" to a POST would tell
	// the caller that something happened that did not. Nil inherits from
	// Default, then means no constant.
	Constant *ConstantResponse

	// Disabled turns every fallback off for this upstream. An upstream
	// inherits Disabled from Default unless it sets Enabled.
	Disabled bool

	// Enabled turns fallbacks back on for an upstream whose Default set
	// Disabled. Setting both is an error.
	Enabled bool
}

// StaleCache configures the stale cache: per host, it keeps the last 2xx
// response (other than 206) to each GET URL that was read in full, and
// serves it, marked "Bulwark-Fallback: stale" and with an Age header (the
// upstream's Age plus the seconds bulwark has held it, RFC 9111), when a
// later GET to that URL finally fails.
//
// It is a shared cache, so it keeps and serves only what RFC 9111 lets a
// shared cache share, and never one caller's personal answer:
//
//   - requests carrying Cookie or Range, or Cache-Control no-store or
//     no-cache, are neither stored nor served;
//   - a request carrying Authorization is stored or served only when the
//     response says Cache-Control public, s-maxage or must-revalidate
//     (RFC 9111 §3.5);
//   - responses with Cache-Control no-store, private or no-cache, with
//     Vary: *, or with Set-Cookie and no Cache-Control public, are not
//     stored;
//   - a response that forbids being served stale (must-revalidate,
//     proxy-revalidate or s-maxage) is served only while it is fresh by
//     its s-maxage, max-age or Expires, never past;
//   - a stored response is served only to requests whose headers named by
//     its Vary match the stored request's.
//
// The body is copied as the caller reads it, never slowing a stream down,
// and kept only if read to the end within MaxEntryBytes.
type StaleCache struct {
	// MaxAge is how long after receiving a response it may still be served;
	// never beyond. Zero inherits from Default, then means no stale cache.
	MaxAge time.Duration

	// MaxEntries caps the URLs kept per host, least recently stored dropped
	// first. Zero inherits from Default, then 1,000.
	MaxEntries int

	// MaxBytes caps the bytes (bodies, headers and URLs) kept per host.
	// Zero inherits from Default, then 16 MiB.
	MaxBytes int64

	// MaxEntryBytes caps one response's body; a larger one is not kept.
	// Zero inherits from Default, then 256 KiB, capped at MaxBytes.
	MaxEntryBytes int64
}

// ConstantResponse is a fixed answer. Its fields are copied when New
// builds a host's stack; changing them afterwards has no effect.
type ConstantResponse struct {
	// StatusCode is the answer's status, 200..599. Zero means 200.
	StatusCode int
	// Header is the answer's header, copied for every answer; nil means
	// none besides the FallbackHeader.
	Header http.Header
	// Body is the answer's body; nil means empty.
	Body []byte
}

// UpstreamStatusError is the cause a Fallback.Func gets for a call whose
// final response had a failing status (5xx other than 501, or 429).
type UpstreamStatusError struct {
	Host       string // "host:port"
	StatusCode int
}

func (e *UpstreamStatusError) Error() string {
	return "bulwark: " + e.Host + " answered " + strconv.Itoa(e.StatusCode) + " " + http.StatusText(e.StatusCode)
}

func (f Fallback) inherit(parent Fallback) Fallback {
	f.Stale = f.Stale.inherit(parent.Stale)
	if f.Func == nil {
		f.Func = parent.Func
	}
	if f.Constant == nil {
		f.Constant = parent.Constant
	}
	f.Disabled = inheritOff(f.Disabled, f.Enabled, parent.Disabled)
	return f
}

func (s StaleCache) inherit(parent StaleCache) StaleCache {
	s.MaxAge = cmp.Or(s.MaxAge, parent.MaxAge)
	s.MaxEntries = cmp.Or(s.MaxEntries, parent.MaxEntries)
	s.MaxBytes = cmp.Or(s.MaxBytes, parent.MaxBytes)
	s.MaxEntryBytes = cmp.Or(s.MaxEntryBytes, parent.MaxEntryBytes)
	return s
}

func (f Fallback) withDefaults() Fallback {
	if f.Stale.MaxAge > 0 {
		if f.Stale.MaxEntries == 0 {
			f.Stale.MaxEntries = defaultStaleEntries
		}
		if f.Stale.MaxBytes == 0 {
			f.Stale.MaxBytes = defaultStaleBytes
		}
		if f.Stale.MaxEntryBytes == 0 {
			f.Stale.MaxEntryBytes = min(defaultStaleEntryBytes, f.Stale.MaxBytes)
		}
	}
	return f
}

func (f Fallback) validate() error {
	s := f.Stale
	switch {
	case s.MaxAge < 0:
		return fieldError("Fallback.Stale.MaxAge", s.MaxAge, "must be ≥ 0")
	case s.MaxEntries < 0:
		return fieldError("Fallback.Stale.MaxEntries", s.MaxEntries, "must be ≥ 0")
	case s.MaxBytes < 0:
		return fieldError("Fallback.Stale.MaxBytes", s.MaxBytes, "must be ≥ 0")
	case s.MaxEntryBytes < 0:
		return fieldError("Fallback.Stale.MaxEntryBytes", s.MaxEntryBytes, "must be ≥ 0")
	case s.MaxBytes > 0 && s.MaxEntryBytes > s.MaxBytes:
		return fieldError("Fallback.Stale.MaxEntryBytes", s.MaxEntryBytes, "must not exceed Fallback.Stale.MaxBytes")
	}
	if c := f.Constant; c != nil && c.StatusCode != 0 && (c.StatusCode < 200 || c.StatusCode > 599) {
		return fieldError("Fallback.Constant.StatusCode", c.StatusCode, "must be 200..599")
	}
	return nil
}

// enabled reports whether the policy has any fallback to run.
func (f Fallback) enabled() bool {
	return !f.Disabled && (f.Stale.MaxAge > 0 || f.Func != nil || f.Constant != nil)
}

// fallbackLayer is the outermost of a host's layers: it sees the call's
// final outcome, records good GET answers for the stale cache and answers
// failed calls from a fallback.
type fallbackLayer struct {
	next     layer
	e        env
	stale    *staleCache // nil: no stale cache
	fn       func(*http.Request, error) (*http.Response, error)
	constant *ConstantResponse // a private copy; nil: none
	served   atomic.Uint64     // answers given, since the stack was built
}

// FallbackSnapshot is the fallback layer's state.
type FallbackSnapshot struct {
	// Served is how many final failures it has answered (stale, constant
	// or func) since the host's policy was last set: an Update starts it
	// again.
	Served uint64
	// StaleEntries and StaleBytes are what the stale cache holds now (see
	// StaleCache.MaxEntries and MaxBytes), and StaleOldest when the
	// oldest of it was received (zero when empty): all zero without a
	// stale cache. An entry past MaxAge is counted until a request for
	// its URL drops it.
	StaleEntries int
	StaleBytes   int64
	StaleOldest  time.Time
}

// snapshot is the fallback's piece of Snapshot.
func (f *fallbackLayer) snapshot() *FallbackSnapshot {
	s := &FallbackSnapshot{Served: f.served.Load()}
	if c := f.stale; c != nil {
		s.StaleEntries, s.StaleBytes, s.StaleOldest = c.size()
	}
	return s
}

func newFallback(next layer, p Fallback, e env) *fallbackLayer {
	f := &fallbackLayer{next: next, e: e, fn: p.Func}
	if p.Stale.MaxAge > 0 {
		f.stale = newStaleCache(p.Stale)
	}
	if c := p.Constant; c != nil {
		cc := &ConstantResponse{StatusCode: c.StatusCode, Header: c.Header.Clone(), Body: bytes.Clone(c.Body)}
		if cc.StatusCode == 0 {
			cc.StatusCode = http.StatusOK
		}
		if cc.Header == nil {
			cc.Header = make(http.Header, 1)
		}
		cc.Header.Set(FallbackHeader, "constant")
		f.constant = cc
	}
	return f
}

func (f *fallbackLayer) roundTrip(req *http.Request, c call) (*http.Response, error) {
	// The notes for the incoming request's CallRecord (retried and still
	// failed, refused by the budget) wait for the outcome: a failure this
	// layer answers for is not passed up as one from below.
	held := heldNotesPool.Get().(*heldNotes)
	c.below = held
	resp, err := f.next.roundTrip(req, c)
	notes := held.what
	held.what = 0
	heldNotesPool.Put(held)
	fb, ferr := f.final(req, c, resp, err)
	if notes != 0 && (ferr != nil || fb.StatusCode >= 500 || fb.StatusCode == http.StatusTooManyRequests) {
		// The call failed all the same, as the record counts a failure
		// (Transport.RoundTrip notes by the same statuses).
		noteBelow(req.Context(), notes)
	}
	return fb, ferr
}

// final is the call's outcome: the host's, or the fallbacks' answer for a
// failure.
func (f *fallbackLayer) final(req *http.Request, c call, resp *http.Response, err error) (*http.Response, error) {
	j := c.judge(resp, err)
	if !j.failed() || req.Context().Err() != nil {
		// Served, what the classifier ignores (by default a wrong
		// request), or the caller gave up: nobody needs an answer from
		// memory. Only a status below 400 judged a success is kept.
		if j.k == kindSuccess && j.v.Outcome == OutcomeSuccess && f.stale != nil {
			f.stale.watch(req, resp, time.Now())
		}
		return resp, err
	}
	cause := err
	if err == nil {
		cause = &UpstreamStatusError{Host: f.e.host, StatusCode: resp.StatusCode}
	}
	fb, ferr := f.answer(req, cause)
	if fb == nil && ferr == nil {
		return resp, err
	}
	discard(resp)
	if fb != nil {
		f.served.Add(1)
		f.e.rep.fallbackServed(req.Context(), fb.Header.Get(FallbackHeader))
	}
	return fb, ferr
}

// answer asks the fallbacks in order; (nil, nil) means none had an answer.
func (f *fallbackLayer) answer(req *http.Request, cause error) (*http.Response, error) {
	if f.stale != nil {
		if resp := f.stale.serve(req, time.Now()); resp != nil {
			return resp, nil
		}
	}
	if f.fn != nil {
		resp, err := f.fn(req, cause)
		if err != nil {
			if resp != nil && resp.Body != nil {
				// The RoundTripper contract forbids both; the error wins.
				_ = resp.Body.Close()
			}
			return nil, err
		}
		if resp != nil {
			if resp.Header == nil {
				resp.Header = make(http.Header, 1)
			}
			resp.Header.Set(FallbackHeader, "func")
			if resp.Body == nil {
				resp.Body = http.NoBody
			}
			if resp.Request == nil {
				resp.Request = req
			}
			return resp, nil
		}
	}
	if c := f.constant; c != nil && (req.Method == http.MethodGet || req.Method == http.MethodHead) {
		body := c.Body
		if req.Method == http.MethodHead {
			body = nil
		}
		return localResponse(req, c.StatusCode, c.Header.Clone(), body), nil
	}
	return nil, nil
}

// localResponse builds a response served from memory.
func localResponse(req *http.Request, code int, h http.Header, body []byte) *http.Response {
	var rc io.ReadCloser = http.NoBody
	if len(body) > 0 {
		rc = io.NopCloser(bytes.NewReader(body))
	}
	return &http.Response{
		Status: strconv.Itoa(code) + " " + http.StatusText(code), StatusCode: code,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Body: rc, ContentLength: int64(len(body)), Request: req,
	}
}

// staleCache is one host's stale responses: a map by URL and a list in
// storing order (front newest) for eviction, under one mutex.
type staleCache struct {
	cfg StaleCache

	mu      sync.Mutex
	entries map[string]*list.Element // of *staleEntry
	order   list.List
	bytes   int64
}

type staleEntry struct {
	key      string
	status   int
	header   http.Header
	body     []byte
	received time.Time     // when the response headers arrived
	age      time.Duration // the upstream's own Age header
	vary     []string      // canonical header names from Vary
	varyVals []string      // the stored request's values for them
	size     int64
}

func newStaleCache(cfg StaleCache) *staleCache {
	return &staleCache{cfg: cfg, entries: make(map[string]*list.Element)}
}

// shareable is the stale cache's one rule for what it may share between
// callers: whether a response with this status and header, to req, may be
// stored, or (with a stored response's status and header) served to req,
// by a shared cache's rules (RFC 9111 §3, §3.5, §4.2.4, §5.2) and two of
// bulwark's own: only full answers to a GET without cookies.
//
// fresh is how long after the response was generated (at Age zero) it may
// be served: negative for as long as StaleCache.MaxAge allows, or, for a
// response that forbids serving it stale, its freshness lifetime (positive
// whenever ok).
func shareable(req *http.Request, status int, h http.Header) (ok bool, fresh time.Duration) {
	if req.Method != http.MethodGet || req.URL == nil || status < 200 || status > 299 || status == http.StatusPartialContent {
		return false, 0
	}
	// Cookies make an answer personal whatever the server says; a range
	// is part of an answer.
	for _, name := range [...]string{"Cookie", "Range"} {
		if _, ok := req.Header[name]; ok {
			return false, 0
		}
	}
	// The caller asked that nothing be kept (no-store) or that nothing
	// stored answer it unchecked (no-cache), RFC 9111 §5.2.1.
	if rq := parseCacheControl(req.Header["Cache-Control"]); rq.noStore || rq.noCache {
		return false, 0
	}
	cc := parseCacheControl(h["Cache-Control"])
	if cc.noStore || cc.private || cc.noCache {
		return false, 0
	}
	for _, v := range h["Vary"] {
		for name := range strings.SplitSeq(v, ",") {
			if trimOWS(name) == "*" {
				return false, 0
			}
		}
	}
	// A cookie being set is one caller's; only an explicit public says the
	// server meant the answer for everyone anyway.
	if _, ok := h["Set-Cookie"]; ok && !cc.public {
		return false, 0
	}
	if _, ok := req.Header["Authorization"]; ok && !cc.public && cc.sMaxAge < 0 && !cc.mustRevalidate {
		return false, 0
	}
	if !cc.mustRevalidate && !cc.proxyRevalidate && cc.sMaxAge < 0 {
		return true, -1
	}
	// Serving stale is forbidden (RFC 9111 §4.2.4): serve only while fresh,
	// by the shared cache's lifetime first (§4.2.1).
	switch {
	case cc.sMaxAge >= 0:
		fresh = cc.sMaxAge
	case cc.maxAge >= 0:
		fresh = cc.maxAge
	default:
		exp, err1 := http.ParseTime(h.Get("Expires"))
		date, err2 := http.ParseTime(h.Get("Date"))
		if err1 == nil && err2 == nil {
			fresh = exp.Sub(date)
		}
	}
	return fresh > 0, max(fresh, 0)
}

// cacheControl is what shareable reads of a Cache-Control header. maxAge
// and sMaxAge are negative when absent.
type cacheControl struct {
	noStore, noCache, private, public, mustRevalidate, proxyRevalidate bool
	maxAge, sMaxAge                                                    time.Duration
}

// parseCacheControl reads Cache-Control field lines (RFC 9111 §5.2):
// comma-separated directives, names in any case, values plain or quoted.
// A comma inside a quoted value does not split it, so a quoted "public"
// is never read as the directive. A qualified private or no-cache (with
// field names) counts as unqualified: refusing the whole response is the
// safe reading. Of a repeated directive the first counts; a max-age that is
// not delta-seconds is zero (stale), as §4.2.1 asks, and a huge one is
// capped at 2^31 seconds (§1.2.2).
func parseCacheControl(lines []string) cacheControl {
	cc := cacheControl{maxAge: -1, sMaxAge: -1}
	for _, line := range lines {
		for line != "" {
			var d string
			d, line = nextDirective(line)
			name, val, _ := strings.Cut(d, "=")
			name = trimOWS(name)
			switch {
			case strings.EqualFold(name, "no-store"):
				cc.noStore = true
			case strings.EqualFold(name, "no-cache"):
				cc.noCache = true
			case strings.EqualFold(name, "private"):
				cc.private = true
			case strings.EqualFold(name, "public"):
				cc.public = true
			case strings.EqualFold(name, "must-revalidate"):
				cc.mustRevalidate = true
			case strings.EqualFold(name, "proxy-revalidate"):
				cc.proxyRevalidate = true
			case strings.EqualFold(name, "max-age"):
				if cc.maxAge < 0 {
					cc.maxAge = deltaSeconds(val)
				}
			case strings.EqualFold(name, "s-maxage"):
				if cc.sMaxAge < 0 {
					cc.sMaxAge = deltaSeconds(val)
				}
			}
		}
	}
	return cc
}

// nextDirective splits s at its first comma outside a quoted string.
func nextDirective(s string) (d, rest string) {
	quoted := false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\' && quoted:
			i++ // the escaped character, whatever it is
		case c == '"':
			quoted = !quoted
		case c == ',' && !quoted:
			return s[:i], s[i+1:]
		}
	}
	return s, ""
}

// deltaSeconds reads a directive's delta-seconds value (RFC 9111 §1.2.2),
// quoted or not: zero when it is not one, capped at 2^31 seconds.
func deltaSeconds(v string) time.Duration {
	v = trimOWS(v)
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		v = v[1 : len(v)-1]
	}
	if !allDigits(v) {
		return 0
	}
	const most = 1 << 31
	if len(v) > 10 {
		return most * time.Second
	}
	n, _ := strconv.ParseInt(v, 10, 64)
	return time.Duration(min(n, most)) * time.Second
}

// watch arranges for resp to be stored once the caller has read it all.
func (c *staleCache) watch(req *http.Request, resp *http.Response, now time.Time) {
	if ok, _ := shareable(req, resp.StatusCode, resp.Header); !ok || resp.ContentLength > c.cfg.MaxEntryBytes {
		return
	}
	e := &staleEntry{key: req.URL.String(), status: resp.StatusCode, header: resp.Header.Clone(), received: now}
	if a, err := strconv.ParseInt(strings.TrimSpace(resp.Header.Get("Age")), 10, 64); err == nil && a > 0 {
		e.age = time.Duration(a) * time.Second
	}
	for _, v := range resp.Header.Values("Vary") {
		for name := range strings.SplitSeq(v, ",") {
			if name = strings.TrimSpace(name); name != "" { // never "*": shareable refused it
				name = http.CanonicalHeaderKey(name)
				e.vary = append(e.vary, name)
				e.varyVals = append(e.varyVals, strings.Join(req.Header.Values(name), ","))
			}
		}
	}
	if resp.Body == nil || resp.Body == http.NoBody {
		c.store(e)
		return
	}
	t := &teeBody{rc: resp.Body, c: c, e: e, limit: c.cfg.MaxEntryBytes}
	if resp.ContentLength > 0 {
		t.buf = make([]byte, 0, resp.ContentLength)
	}
	resp.Body = t
}

// teeBody copies a response body as the caller reads it and stores the
// response when the caller reaches EOF. A body closed early, failing, or
// longer than limit is not stored. It never reads ahead of the caller, so
// a stream flows exactly as it would without the cache.
type teeBody struct {
	rc    io.ReadCloser
	c     *staleCache
	e     *staleEntry
	buf   []byte
	limit int64
	over  bool // longer than limit, or already stored: keep nothing more
}

func (t *teeBody) Read(p []byte) (int, error) {
	n, err := t.rc.Read(p)
	if !t.over {
		if int64(len(t.buf)+n) > t.limit {
			t.over, t.buf = true, nil
		} else {
			t.buf = append(t.buf, p[:n]...)
		}
		if err == io.EOF && !t.over {
			t.e.body = t.buf
			t.over, t.buf = true, nil
			t.c.store(t.e)
		}
	}
	return n, err
}

// Close closes the body. Whatever was read so far is dropped unless the
// caller had already reached EOF. It touches nothing Read uses, since
// net/http allows Close to be called while a Read is under way.
func (t *teeBody) Close() error { return t.rc.Close() }

// store adds e, replacing any entry for its URL, then evicts the oldest
// entries until the caps hold.
func (c *staleCache) store(e *staleEntry) {
	e.size = int64(len(e.key) + len(e.body))
	for k, vv := range e.header {
		e.size += int64(len(k))
		for _, v := range vv {
			e.size += int64(len(v))
		}
	}
	if e.size > c.cfg.MaxBytes {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.entries[e.key]; ok {
		c.removeLocked(old)
	}
	c.entries[e.key] = c.order.PushFront(e)
	c.bytes += e.size
	for len(c.entries) > c.cfg.MaxEntries || c.bytes > c.cfg.MaxBytes {
		c.removeLocked(c.order.Back())
	}
}

// size is what the cache holds: entries, bytes, and when the oldest was
// received (zero when empty). Entries are stored at the front as they
// arrive, so the oldest is at the back: one lock and no walk.
func (c *staleCache) size() (entries int, bytes int64, oldest time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	entries, bytes = len(c.entries), c.bytes
	if el := c.order.Back(); el != nil {
		oldest = el.Value.(*staleEntry).received
	}
	return entries, bytes, oldest
}

func (c *staleCache) removeLocked(el *list.Element) {
	e := c.order.Remove(el).(*staleEntry)
	delete(c.entries, e.key)
	c.bytes -= e.size
}

// serve returns the stored answer to req, or nil when there is none within
// MaxAge and its freshness limit (an entry past them is dropped), shareable
// refuses it to req, or it does not match req's Vary headers.
func (c *staleCache) serve(req *http.Request, now time.Time) *http.Response {
	if req.Method != http.MethodGet || req.URL == nil {
		return nil // shareable would refuse it; this spares the lock
	}
	key := req.URL.String()
	c.mu.Lock()
	el, ok := c.entries[key]
	if !ok {
		c.mu.Unlock()
		return nil
	}
	e := el.Value.(*staleEntry)
	held := now.Sub(e.received)
	// e is never changed once stored, so it can be read without the lock.
	ok, fresh := shareable(req, e.status, e.header)
	if held > c.cfg.MaxAge || (ok && fresh >= 0 && e.age+max(held, 0) >= fresh) {
		c.removeLocked(el) // it will never be served again
		c.mu.Unlock()
		return nil
	}
	c.mu.Unlock()
	if !ok {
		return nil
	}
	for i, name := range e.vary {
		if strings.Join(req.Header.Values(name), ",") != e.varyVals[i] {
			return nil
		}
	}
	h := e.header.Clone()
	if h == nil {
		h = make(http.Header, 2)
	}
	h.Set(FallbackHeader, "stale")
	h.Set("Age", strconv.FormatInt(int64((e.age+max(held, 0))/time.Second), 10))
	return localResponse(req, e.status, h, e.body)
}

// keepFrom takes the stale cache of prev, the old stack's fallback (nil:
// none), when it was built for the same Fallback.Stale.
func (f *fallbackLayer) keepFrom(prev *fallbackLayer) {
	if prev != nil && prev.stale != nil && f.stale != nil && reflect.DeepEqual(prev.stale.cfg, f.stale.cfg) {
		f.stale = prev.stale
	}
}

// show hands Snapshot the fallback's state (shower).
func (f *fallbackLayer) show(put func(any)) { put(f.snapshot()) }
