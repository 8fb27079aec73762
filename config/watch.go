package config

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/fsnotify/fsnotify"
)

// Load reads the file at path, at most MaxBytes of it, and Parses it with
// path as its source.
func Load(path string, reg Registry) (bulwark.Config, error) {
	data, err := readCapped(path)
	if err != nil {
		return bulwark.Config{}, err
	}
	return Parse(data, path, reg)
}

func readCapped(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, &Error{File: path, Msg: err.Error(), Err: err}
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxBytes+1))
	if err != nil {
		return nil, &Error{File: path, Msg: err.Error(), Err: err}
	}
	return data, nil
}

// Apply decodes data as Parse does and applies it to tr with Update, which
// validates it against tr as it runs: a Bulkhead.FleetRate is accepted
// when tr's own Fleet leases quota. Either way Snapshot.Config shows the
// outcome: the version in force, or this one as the last rejected, with
// the error as Parse words it, at its line in the file. version is
// VersionOf(data): the file's version field, also when the rest does not
// decode, or Version(data) when it has none. Watch applies each change of its file so; a configuration
// received from elsewhere (a fleet's store) can be applied the same way,
// with its own source.
func Apply(tr *bulwark.Transport, data []byte, source string, reg Registry) (version string, err error) {
	cfg, d, err := decode(data, source, reg)
	if err != nil {
		version = VersionOf(data)
		tr.RejectConfig(version, source, err)
		return version, err
	}
	// Update is all or nothing, and checks what depends on the running
	// Transport: no Transport is built to check cfg beforehand.
	if err := tr.Update(cfg); err != nil {
		err = d.place(err)
		tr.RejectConfig(cfg.Version, source, err) // Update's record, placed in the file
		return cfg.Version, err
	}
	return cfg.Version, nil
}

// WatchOptions tunes Watch. The zero value is ready to use.
type WatchOptions struct {
	// Logger receives one line per version applied (Info) and one per
	// version refused (Warn), with the error. Nil means slog.Default().
	Logger *slog.Logger
	// Debounce is how long the directory must be quiet after an event
	// before the file is read: an editor's save, or a ConfigMap's swap, is
	// several events. Zero means 100ms.
	Debounce time.Duration
	// Applied, if set, is called after each reload with the version read
	// and the error, nil when tr.Update applied it; for tests and metrics.
	Applied func(version string, err error)

	// ready, if set (by tests), is closed once the directory is watched
	// and the file read the first time.
	ready chan struct{}
}

// Watch keeps tr running the file at path: at start, and whenever the
// file's directory changes, it reads the file and, when its bytes' version
// differs from the last one read, Parses it and applies it with
// tr.Update. It watches the directory, not the file, so an editor that
// writes a new file and renames it over the old one, and a Kubernetes
// ConfigMap whose ..data symlink is swapped, are both seen; a symlinked
// file's target directory is watched too.
//
// A file that does not parse or validate leaves tr's configuration as it
// was: Watch records it with tr.RejectConfig (Update records a refusal of
// its own), so Snapshot.Config shows it, and logs it once, not again until
// the file changes. A file that is missing or unreadable is logged once
// and retried on the next event.
//
// Watch returns when ctx is done, with nil, having stopped everything it
// started; or at once with an error if the directory cannot be watched.
// Run it in a goroutine of its own.
//
// Update applies the policies and host limits; Base, the providers,
// Propagator, Logger and Fleet named in the file are New's, and a reload
// that changes them changes nothing of them (see bulwark.Transport.Update).
func Watch(ctx context.Context, path string, tr *bulwark.Transport, reg Registry, opts WatchOptions) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("config: watch %s: %w", path, err)
	}
	defer w.Close()
	dir := filepath.Dir(path)
	if err := w.Add(dir); err != nil {
		return fmt.Errorf("config: watch %s: %w", path, err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	debounce := opts.Debounce
	if debounce <= 0 {
		debounce = 100 * time.Millisecond
	}
	r := reloader{path: path, tr: tr, reg: reg, log: log, applied: opts.Applied, watcher: w, dirs: map[string]bool{dir: true}}
	if s := tr.Snapshot().Config; s != nil && s.Source == path {
		r.last = s.Version // what Load read, and New applied, is read again only if changed
	}
	r.reload()
	if opts.ready != nil {
		close(opts.ready)
	}

	timer := time.NewTimer(debounce)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-w.Events:
			if !ok {
				return nil
			}
			timer.Reset(debounce)
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			// An overflowed queue lost events: read the file anyway.
			log.Warn("bulwark config: watch error", "path", path, "err", err)
			timer.Reset(debounce)
		case <-timer.C:
			r.reload()
		}
	}
}

// reloader is Watch's state between events.
type reloader struct {
	path    string
	tr      *bulwark.Transport
	reg     Registry
	log     *slog.Logger
	applied func(string, error)
	watcher *fsnotify.Watcher
	dirs    map[string]bool // directories watched
	last    string          // the version last read, applied or refused
	lastErr string          // the read error last logged
}

// reload reads the file and applies it if its bytes changed.
func (r *reloader) reload() {
	r.follow()
	data, err := readCapped(r.path)
	if err != nil {
		if err.Error() != r.lastErr {
			r.lastErr = err.Error()
			r.log.Warn("bulwark config: cannot read; the running configuration stays", "path", r.path, "err", err)
		}
		return
	}
	r.lastErr = ""
	version := Version(data)
	if version == r.last {
		return // an event that did not change the bytes: a touch, a swap to the same content
	}
	r.last = version
	version, err = Apply(r.tr, data, r.path, r.reg)
	if err != nil {
		r.log.Warn("bulwark config: refused; the running configuration stays", "path", r.path, "version", version, "err", err)
	} else {
		r.log.Info("bulwark config: applied", "path", r.path, "version", version)
	}
	if r.applied != nil {
		r.applied(version, err)
	}
}

// follow watches the directory of the file's target too, when the path is
// a symlink into another directory, so an edit made there is seen; and
// stops watching a target directory it no longer points into (a ConfigMap
// swap removes the old one), so the set stays at two.
func (r *reloader) follow() {
	target, err := filepath.EvalSymlinks(r.path)
	if err != nil {
		return
	}
	want := filepath.Dir(target)
	base := filepath.Dir(r.path)
	for d := range r.dirs {
		if d != base && d != want {
			_ = r.watcher.Remove(d) // gone already, most often
			delete(r.dirs, d)
		}
	}
	if r.dirs[want] {
		return
	}
	if err := r.watcher.Add(want); err != nil {
		r.log.Warn("bulwark config: cannot watch", "dir", want, "err", err)
		return
	}
	r.dirs[want] = true
}
