package bulwarktest

import (
	"net/http"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/bulwark-http/bulwark"
)

// Transition is one breaker state change, as Breaker.OnStateChange
// reports it.
type Transition struct {
	Host     string
	From, To bulwark.CircuitState
}

// Recorder collects what bulwark's hooks report: each retry scheduled
// (Retry.OnRetry) and each breaker transition (Breaker.OnStateChange).
// Install it with Hook. It is safe for concurrent use.
type Recorder struct {
	mu          sync.Mutex
	retries     []bulwark.RetryEvent
	transitions []Transition
}

// Hook returns p with the recorder's hooks installed. A hook p already has
// is still called, after the recorder's.
func (r *Recorder) Hook(p bulwark.Policy) bulwark.Policy {
	onRetry, onChange := p.Retry.OnRetry, p.Breaker.OnStateChange
	p.Retry.OnRetry = func(req *http.Request, ev bulwark.RetryEvent) {
		r.mu.Lock()
		r.retries = append(r.retries, ev)
		r.mu.Unlock()
		if onRetry != nil {
			onRetry(req, ev)
		}
	}
	p.Breaker.OnStateChange = func(host string, from, to bulwark.CircuitState) {
		r.mu.Lock()
		r.transitions = append(r.transitions, Transition{host, from, to})
		r.mu.Unlock()
		if onChange != nil {
			onChange(host, from, to)
		}
	}
	return p
}

// Retries returns the retries scheduled so far, in order.
func (r *Recorder) Retries() []bulwark.RetryEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]bulwark.RetryEvent(nil), r.retries...)
}

// Waits returns the wait of each retry scheduled so far, in order.
func (r *Recorder) Waits() []time.Duration {
	var out []time.Duration
	for _, ev := range r.Retries() {
		out = append(out, ev.Wait)
	}
	return out
}

// Transitions returns the breaker transitions so far, in order.
func (r *Recorder) Transitions() []Transition {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Transition(nil), r.transitions...)
}

// Host returns the state tr keeps for host ("host:port"; the port is
// required) over the first scheme it was reached by, from tr.Snapshot;
// false when tr has none.
func Host(tr *bulwark.Transport, host string) (bulwark.HostSnapshot, bool) {
	hs := tr.Snapshot().Host(host)
	if len(hs) == 0 {
		return bulwark.HostSnapshot{}, false
	}
	return hs[0], true
}

// BreakerState returns the state of host's breaker in tr, false when the
// host has no state or no breaker.
func BreakerState(tr *bulwark.Transport, host string) (bulwark.CircuitState, bool) {
	h, ok := Host(tr, host)
	if !ok || h.Breaker == nil {
		return 0, false
	}
	return h.Breaker.State, true
}

// PausedUntil returns when the pushback pause of host in tr (the one a
// Retry-After asked for, for every request) ends; false when no pause is
// in force now.
func PausedUntil(tr *bulwark.Transport, host string) (time.Time, bool) {
	h, ok := Host(tr, host)
	if !ok || h.Pushback == nil || !h.Pushback.Until.After(time.Now()) {
		return time.Time{}, false
	}
	return h.Pushback.Until, true
}

// Hedges returns the hedging counts of host in tr (sent, won, skipped by
// reason: see bulwark.HedgeSnapshot), from tr.Snapshot; false when the
// host has no state or its policy does not hedge. Hedges have no hook of
// their own: the counts are the Transport's, and the Upstream's records
// show the hedges it received (Request.InFlight) and the losers bulwark
// cancelled (Request.Canceled).
func Hedges(tr *bulwark.Transport, host string) (bulwark.HedgeSnapshot, bool) {
	h, ok := Host(tr, host)
	if !ok || h.Hedge == nil {
		return bulwark.HedgeSnapshot{}, false
	}
	return *h.Hedge, true
}

// HedgesSkipped returns how many hedges of host in tr were due but not
// sent, by reason: the bulwark.HedgeSkips field in lower case ("breaker",
// "bulkhead", "budget", "deadline", "pushback", "throttle"), with only
// the reasons that occurred; nil when none was skipped or the host does
// not hedge. It reads the fields by reflection, so a reason bulwark adds
// is reported without a change here.
func HedgesSkipped(tr *bulwark.Transport, host string) map[string]uint64 {
	h, ok := Hedges(tr, host)
	if !ok {
		return nil
	}
	var out map[string]uint64
	v := reflect.ValueOf(h.Skipped)
	for i := range v.NumField() {
		f := v.Field(i)
		if f.Kind() != reflect.Uint64 || f.Uint() == 0 {
			continue
		}
		if out == nil {
			out = make(map[string]uint64)
		}
		out[strings.ToLower(v.Type().Field(i).Name)] = f.Uint()
	}
	return out
}
