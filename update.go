package bulwark

import "time"

// Update replaces the Transport's policies with cfg's while it runs:
// Default, Upstreams, Routes, MaxHosts and HostIdle. The rest of a Config
// (Base, BaseIgnoresContext, Fleet, the providers, Propagator, Logger) is
// New's and Update ignores it, so the Config given to New can be edited and
// passed again. cfg is validated as New validates it, a Bulkhead.FleetRate
// against the Transport's own Fleet; on error (a *ConfigError) nothing
// changes. cfg.Version and cfg.Source go to Snapshot.Config: as applied, or
// with the error as the last rejected.
//
// Each host's stack is built anew, without blocking requests, and swapped
// in; a request already past the router finishes in the stack it started
// in. A layer keeps its state when its own policy's shape is unchanged
// (a host's routes too, route by route); a change to
//
//	Breaker.Window, WindowCalls, HalfOpenCalls, OpenFor    → a new breaker, closed, with an empty window
//	Bulkhead.*, Timeout.*, Fault.*                         → a new bulkhead (the old one's requests keep their slots)
//	Endpoints.*, Bulkhead.*, Timeout.* of a balanced host  → a new balancer: instances re-resolved, ejections forgotten
//	Retry.Budget.*, Throttle.*, Fallback.Stale.*           → a new, full retry budget; new throttle counts; an empty stale cache
//	a host's upstream key                                  → all of the host's state anew, its pushback pauses aside
//
// Pushback pauses always survive: they are the host's word, not bulwark's.
// A kept breaker takes its new thresholds in place, for the requests still
// in the old stack too. A layer built anew counts its refusals and trips
// from zero. Policy.Classify rebuilds nothing. Equal means reflect.DeepEqual, under which a func is
// never equal. Concurrent Updates are applied one after another.
func (t *Transport) Update(cfg Config) error {
	rs, err := compileFor(cfg, t.fleet.leasing() != nil)
	if err != nil {
		if cfg.Version != "" || cfg.Source != "" {
			t.config.rejected(cfg.Version, cfg.Source, err, time.Now())
		}
		return err
	}
	t.updateMu.Lock()
	defer t.updateMu.Unlock()

	// New hosts get the new policies from here on.
	t.mu.Lock()
	t.policies = *rs
	old := make([]*hostState, 0, len(t.hosts))
	for _, hs := range t.hosts {
		old = append(old, hs)
	}
	t.mu.Unlock()

	// Build the replacements outside the lock: requests to every host go on
	// meanwhile, through the old stacks.
	next := make([]*hostState, len(old))
	for i, prev := range old {
		next[i] = t.rebuild(prev)
	}
	if t.updateBuilt != nil {
		t.updateBuilt()
	}

	dropped := t.swap(old, next)
	// A balancer not kept has transports of its own: their idle
	// connections go now, and those its requests in flight still use go
	// idle after them and are closed by the transport's IdleConnTimeout.
	for _, c := range dropped {
		c.closeIdle()
	}
	t.obs.refresh()
	t.config.applied(cfg.Version, cfg.Source, time.Now())
	return nil
}

// swap puts each host of next in the place of the host of old it was
// built from, unless that one was evicted meanwhile, and returns the
// layers with connections of their own that the new hosts do not keep.
func (t *Transport) swap(old, next []*hostState) []idleCloser {
	var dropped []idleCloser
	t.mu.Lock()
	for i, prev := range old {
		if t.hosts[prev.key] != prev {
			continue // evicted meanwhile; or replaced, which only Update does
		}
		dropped = append(dropped, replacedClosers(prev, next[i])...)
		hs := next[i]
		t.hosts[prev.key] = hs
		// A lookup that found prev just before will store it in t.last
		// after this: gone makes the fast path skip it.
		prev.gone.Store(true)
		t.last.CompareAndSwap(prev, nil)
		// ControlBreaker may have set a control since hs was built: the map
		// is what holds, under this lock.
		if c, ok := t.controls[hs.name]; ok {
			hs.controlBreaker(c)
		}
	}
	if len(t.hosts) > t.maxHosts {
		t.evictLocked(time.Now().UnixNano(), 0)
	}
	t.mu.Unlock()
	return dropped
}

// RejectConfig records in Snapshot.Config that a configuration was refused
// before it reached Update, by a loader that could not read it (a file that
// does not parse, names an unknown field or is too large): its version and
// source as the loader knows them, and err. The running configuration does
// not change.
func (t *Transport) RejectConfig(version, source string, err error) {
	t.config.rejected(version, source, err, time.Now())
}

// replacedClosers is the layers of prev with connections of their own that
// hs does not keep.
func replacedClosers(prev, hs *hostState) []idleCloser {
	var out []idleCloser
	for _, p := range prev.parts {
		c, ok := p.(idleCloser)
		if !ok {
			continue
		}
		kept := false
		for _, q := range hs.parts {
			if q == p {
				kept = true
			}
		}
		if !kept {
			out = append(out, c)
		}
	}
	return out
}

// rebuild is prev's host under the current policies: its state anew,
// keeping what prev's may keep (newHost).
func (t *Transport) rebuild(prev *hostState) *hostState {
	t.mu.RLock()
	c, table := t.forHost(prev.key.host, prev.key.port), t.table
	t.mu.RUnlock()
	return t.newHost(prev.key, prev.rawScheme, prev.rawHost, c, table, prev)
}
