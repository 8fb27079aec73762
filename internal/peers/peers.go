// Package peers keeps what the other processes of a fleet last said of
// their own rolling windows for one host: each process's latest counts,
// until they go stale. A breaker or a retry budget adds them to its own
// window's sums, so that the fleet decides as if it had one window.
package peers

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/bulwark-http/bulwark/internal/window"
)

// Max bounds the processes whose counts a Table keeps.
const Max = 256

// Table is the latest counts of each other process, by its name, each
// until a time its sender chose. It is safe for concurrent use; the zero
// Table is empty and ready to use.
type Table struct {
	any atomic.Bool // m may hold counts: a check that costs one atomic load
	mu  sync.Mutex
	m   map[string]entry // at most Max
}

type entry struct {
	c     window.Counts
	until time.Time
}

// Set keeps the counts c of process from until until (the caller caps
// it). A process not yet kept is refused, and Set reports false, when Max
// others with fresh counts are.
func (p *Table) Set(from string, c window.Counts, until, now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = make(map[string]entry)
	}
	if _, ok := p.m[from]; !ok && len(p.m) >= Max {
		p.expire(now)
		if len(p.m) >= Max {
			return false
		}
	}
	p.m[from] = entry{c: c, until: until}
	p.any.Store(true)
	return true
}

// Add returns s plus the counts of every process whose counts are fresh
// at now.
func (p *Table) Add(s window.Counts, now time.Time) window.Counts {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.m) == 0 {
		return s
	}
	p.expire(now)
	for _, pc := range p.m {
		for i := range s {
			s[i] += pc.c[i]
		}
	}
	return s
}

// Any reports whether the table may hold counts: false means Add would
// add nothing. One atomic load.
func (p *Table) Any() bool { return p.any.Load() }

func (p *Table) expire(now time.Time) {
	for k, pc := range p.m {
		if !pc.until.After(now) {
			delete(p.m, k)
		}
	}
	if len(p.m) == 0 {
		p.any.Store(false)
	}
}

// Match reports whether the fresh counts at now of some process other
// than except satisfy ok.
func (p *Table) Match(except string, now time.Time, ok func(window.Counts) bool) bool {
	if !p.any.Load() {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.expire(now)
	for from, pc := range p.m {
		if from != except && ok(pc.c) {
			return true
		}
	}
	return false
}

// ResetExcept forgets every process's counts but those keep accepts: a
// verdict has been reached on the others.
func (p *Table) ResetExcept(keep func(window.Counts) bool) {
	p.mu.Lock()
	for k, pc := range p.m {
		if !keep(pc.c) {
			delete(p.m, k)
		}
	}
	p.any.Store(len(p.m) > 0)
	p.mu.Unlock()
}
