package bulwark

import (
	"sync"
	"time"
)

// ConfigSnapshot is which configuration a Transport runs and which it last
// refused, as Snapshot reports it: the Version and Source of the Config
// given to New or to the last Update that applied, and the last one refused
// by Update or recorded with Transport.RejectConfig. A loader that reads
// policies from a file or from a fleet's store sets Config.Version and
// Config.Source, so an operator sees from Snapshot, or the debug page,
// which version each process runs and why a newer one did not take.
type ConfigSnapshot struct {
	// Version and Source are the applied Config's; either may be empty.
	Version string
	Source  string
	// Applied is when New or Update applied it.
	Applied time.Time
	// Rejected is the last configuration refused, kept after a later one
	// applies so the reason stays in view; nil when none was.
	Rejected *RejectedConfig
}

// RejectedConfig is a configuration a Transport refused: its Version and
// Source as given, the error's text, and when.
type RejectedConfig struct {
	Version string
	Source  string
	Error   string
	At      time.Time
}

// configRecord keeps the ConfigSnapshot of a Transport, for Snapshot. It is
// nil-free: the zero value records nothing yet.
type configRecord struct {
	mu  sync.Mutex
	set bool // something was recorded: Snapshot.Config is not nil
	s   ConfigSnapshot
}

// applied records the version in force.
func (r *configRecord) applied(version, source string, now time.Time) {
	if version == "" && source == "" && !r.isSet() {
		return // a Transport configured in code only: Snapshot.Config stays nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.set = true
	r.s.Version, r.s.Source, r.s.Applied = version, source, now.Round(0) // wall clock only: it is data, read on a page and through JSON
}

// rejected records a refused configuration and why.
func (r *configRecord) rejected(version, source string, err error, now time.Time) {
	msg := "refused"
	if err != nil {
		msg = err.Error()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.set = true
	r.s.Rejected = &RejectedConfig{Version: version, Source: source, Error: msg, At: now.Round(0)}
}

func (r *configRecord) isSet() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.set
}

// snapshot is the record as Snapshot.Config: nil until a Config with a
// Version or Source was applied or one was refused.
func (r *configRecord) snapshot() *ConfigSnapshot {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.set {
		return nil
	}
	s := r.s
	if s.Rejected != nil {
		rej := *s.Rejected
		s.Rejected = &rej
	}
	return &s
}
