package config

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bulwark-http/bulwark"
)

// reloadWithin is the figure: a change is in force within a second.
const reloadWithin = time.Second

// logCount counts the records logged at Warn and above.
type logCount struct {
	mu    sync.Mutex
	warns []string
}

func (l *logCount) Enabled(context.Context, slog.Level) bool { return true }
func (l *logCount) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		var b strings.Builder
		b.WriteString(r.Message)
		r.Attrs(func(a slog.Attr) bool { b.WriteString(" " + a.String()); return true })
		l.mu.Lock()
		l.warns = append(l.warns, b.String())
		l.mu.Unlock()
	}
	return nil
}
func (l *logCount) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logCount) WithGroup(string) slog.Handler      { return l }
func (l *logCount) Warns() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.warns...)
}

func policyFile(attempts int) []byte {
	return []byte("upstreams:\n  pay:\n    retry:\n      maxAttempts: " + string(rune('0'+attempts)) + "\n")
}

// startWatch loads path, builds a Transport from it and watches it until
// the test ends.
func startWatch(t *testing.T, path string) (*bulwark.Transport, *logCount) {
	t.Helper()
	cfg, err := Load(path, Registry{})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := bulwark.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	logs := &logCount{}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	ready := make(chan struct{})
	go func() { done <- Watch(ctx, path, tr, Registry{}, WatchOptions{Logger: slog.New(logs), ready: ready}) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Watch = %v, want nil after ctx is done", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Watch did not return within 5s of ctx being done")
		}
	})
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("Watch = %v before it was ready", err)
	}
	return tr, logs
}

// waitFor polls tr's Snapshot until cond holds, for at most 5s, and
// returns how long that took.
func waitFor(t *testing.T, tr *bulwark.Transport, what string, cond func(*bulwark.ConfigSnapshot) bool) time.Duration {
	t.Helper()
	start := time.Now()
	for deadline := start.Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if c := tr.Snapshot().Config; c != nil && cond(c) {
			return time.Since(start)
		}
	}
	t.Fatalf("%s: not seen within 5s; Snapshot().Config = %+v", what, tr.Snapshot().Config)
	return 0
}

func inForce(version string) func(*bulwark.ConfigSnapshot) bool {
	return func(c *bulwark.ConfigSnapshot) bool { return c.Version == version }
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestWatchReloads changes the watched file the three ways files change
// in production, and sees each change in force within reloadWithin.
func TestWatchReloads(t *testing.T) {
	for _, tc := range []struct {
		name string
		// setup writes the first version and returns the path to watch;
		// change writes the next.
		setup  func(t *testing.T, dir string, data []byte) string
		change func(t *testing.T, dir, path string, data []byte, n int)
	}{
		{"write in place", func(t *testing.T, dir string, data []byte) string {
			p := filepath.Join(dir, "policies.yaml")
			writeFile(t, p, data)
			return p
		}, func(t *testing.T, dir, path string, data []byte, n int) {
			writeFile(t, path, data)
		}},
		{"atomic rename", func(t *testing.T, dir string, data []byte) string {
			p := filepath.Join(dir, "policies.yaml")
			writeFile(t, p, data)
			return p
		}, func(t *testing.T, dir, path string, data []byte, n int) {
			tmp := filepath.Join(dir, ".policies.yaml.swp")
			writeFile(t, tmp, data)
			if err := os.Rename(tmp, path); err != nil {
				t.Fatal(err)
			}
		}},
		{"ConfigMap symlink swap", func(t *testing.T, dir string, data []byte) string {
			// Kubernetes' layout: policies.yaml → ..data/policies.yaml,
			// ..data → ..<timestamp>, swapped by renaming a new link
			// over ..data.
			ts := filepath.Join(dir, "..2026_12_03_0")
			if err := os.Mkdir(ts, 0o755); err != nil {
				t.Fatal(err)
			}
			writeFile(t, filepath.Join(ts, "policies.yaml"), data)
			if err := os.Symlink(filepath.Base(ts), filepath.Join(dir, "..data")); err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(dir, "policies.yaml")
			if err := os.Symlink(filepath.Join("..data", "policies.yaml"), p); err != nil {
				t.Fatal(err)
			}
			return p
		}, func(t *testing.T, dir, path string, data []byte, n int) {
			old, err := os.Readlink(filepath.Join(dir, "..data"))
			if err != nil {
				t.Fatal(err)
			}
			ts := filepath.Join(dir, "..2026_12_03_"+string(rune('0'+n)))
			if err := os.Mkdir(ts, 0o755); err != nil {
				t.Fatal(err)
			}
			writeFile(t, filepath.Join(ts, "policies.yaml"), data)
			tmp := filepath.Join(dir, "..data_tmp")
			if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
				t.Fatal(err)
			}
			if err := os.RemoveAll(filepath.Join(dir, old)); err != nil {
				t.Fatal(err)
			}
		}},
		{"symlink into another directory, target edited", func(t *testing.T, dir string, data []byte) string {
			other := filepath.Join(dir, "other")
			if err := os.Mkdir(other, 0o755); err != nil {
				t.Fatal(err)
			}
			writeFile(t, filepath.Join(other, "real.yaml"), data)
			link := filepath.Join(dir, "etc")
			if err := os.Mkdir(link, 0o755); err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(link, "policies.yaml")
			if err := os.Symlink(filepath.Join(other, "real.yaml"), p); err != nil {
				t.Fatal(err)
			}
			return p
		}, func(t *testing.T, dir, path string, data []byte, n int) {
			writeFile(t, filepath.Join(dir, "other", "real.yaml"), data)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := tc.setup(t, dir, policyFile(1))
			tr, logs := startWatch(t, path)
			if c := tr.Snapshot().Config; c == nil || c.Version != Version(policyFile(1)) || c.Source != path {
				t.Fatalf("Snapshot().Config = %+v, want version %s from %s", c, Version(policyFile(1)), path)
			}
			for n := 2; n <= 4; n++ {
				data := policyFile(n)
				tc.change(t, dir, path, data, n)
				took := waitFor(t, tr, "version "+Version(data), inForce(Version(data)))
				t.Logf("change %d in force after %v", n, took)
				if took > reloadWithin {
					t.Errorf("change %d took %v to be in force, want ≤ %v", n, took, reloadWithin)
				}
			}
			if w := logs.Warns(); len(w) > 0 {
				t.Errorf("warnings logged: %q", w)
			}
		})
	}
}

// TestWatchKeepsOnBadFile writes a file that does not validate and one
// that does not parse: the running version stays, Snapshot shows each
// refusal with its error, each is logged once however many events it
// makes, and a good file after them applies.
func TestWatchKeepsOnBadFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "policies.yaml")
	writeFile(t, path, policyFile(2))
	tr, logs := startWatch(t, path)
	good := Version(policyFile(2))

	for i, bad := range []struct {
		data []byte
		want string
	}{
		{[]byte("upstreams:\n  pay:\n    retry:\n      maxAttempts: -1\n"), `policies.yaml:4:20: upstream "pay": retry.maxAttempts: value -1`},
		{[]byte("upstreams:\n  pay:\n    retry:\n      maxAttemps: 3\n"), `policies.yaml:4:7: upstream "pay": retry.maxAttemps: unknown field`},
		{[]byte("upstreams:\n  pay: [\n"), `policies.yaml:`},
	} {
		writeFile(t, path, bad.data)
		waitFor(t, tr, "the refusal", func(c *bulwark.ConfigSnapshot) bool {
			return c.Rejected != nil && c.Rejected.Version == Version(bad.data)
		})
		// The same bytes again, twice, the second time by a rename.
		writeFile(t, path, bad.data)
		writeFile(t, path+".tmp", bad.data)
		if err := os.Rename(path+".tmp", path); err != nil {
			t.Fatal(err)
		}
		c := tr.Snapshot().Config
		if c.Version != good {
			t.Fatalf("bad file %d: version in force %q, want %q kept", i, c.Version, good)
		}
		if !strings.Contains(c.Rejected.Error, bad.want) || c.Rejected.Source != path {
			t.Errorf("bad file %d: Snapshot().Config.Rejected = %+v, want an error containing %q from %s", i, c.Rejected, bad.want, path)
		}
	}
	// A good file after: in force, and the events above all handled.
	writeFile(t, path, policyFile(3))
	waitFor(t, tr, "the good file", inForce(Version(policyFile(3))))
	w := logs.Warns()
	if len(w) != 3 {
		t.Fatalf("logged %d warnings, want 3, one per bad version:\n%s", len(w), strings.Join(w, "\n"))
	}
	for _, line := range w {
		if !strings.Contains(line, "policies.yaml:") {
			t.Errorf("warning %q does not name the file and line", line)
		}
	}
}

// TestWatchMissingDir: Watch refuses a path whose directory cannot be
// watched, at once.
func TestWatchMissingDir(t *testing.T) {
	tr, err := bulwark.New(bulwark.Config{})
	if err != nil {
		t.Fatal(err)
	}
	err = Watch(t.Context(), filepath.Join(t.TempDir(), "nope", "policies.yaml"), tr, Registry{}, WatchOptions{})
	if err == nil {
		t.Fatal("Watch of a missing directory = nil, want an error")
	}
}

// TestApply applies bytes from elsewhere than a file, and records each
// outcome in Snapshot.Config.
func TestApply(t *testing.T) {
	tr, err := bulwark.New(bulwark.Config{})
	if err != nil {
		t.Fatal(err)
	}
	v, err := Apply(tr, []byte("version: v1\ndefault: {retry: {maxAttempts: 2}}\n"), "redis:bulwark:config", Registry{})
	if err != nil || v != "v1" {
		t.Fatalf("Apply(v1) = %q, %v", v, err)
	}
	bad := []byte("version: v2\ndefault: {retry: {maxAttempts: -2}}\n")
	v, err = Apply(tr, bad, "redis:bulwark:config", Registry{})
	if err == nil || v != "v2" {
		t.Fatalf("Apply(bad) = %q, %v; want v2 and an error", v, err)
	}
	c := tr.Snapshot().Config
	if c.Version != "v1" || c.Source != "redis:bulwark:config" || c.Rejected == nil || c.Rejected.Version != "v2" ||
		!strings.HasPrefix(c.Rejected.Error, "redis:bulwark:config:2:32: default: retry.maxAttempts: value -2") {
		t.Fatalf("Snapshot().Config = %+v, rejected %+v", c, c.Rejected)
	}
}

// seamApplyFleetRate: Bulkhead.FleetRate is checked against the running
// Transport's Fleet, the one that would lease its quota: applied, by Apply
// and by Watch, where that Fleet leases; refused, at its place in the
// file, in Snapshot.Config too, where the Transport has no Fleet.
func seamApplyFleetRate(t *testing.T) {
	rated := []byte("version: rated\nupstreams:\n  pay:\n    bulkhead: {fleetRate: 100}\n")
	dir := t.TempDir()
	path := filepath.Join(dir, "policies.yaml")
	writeFile(t, path, policyFile(2))
	cfg, err := Load(path, Registry{})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Fleet = &leaserFleet{}
	leasing, err := bulwark.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = leasing.Close() })
	if v, err := Apply(leasing, rated, "store", Registry{}); err != nil || v != "rated" {
		t.Fatalf("Apply(fleetRate) to a leasing Transport = %q, %v", v, err)
	}

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	ready := make(chan struct{})
	go func() {
		done <- Watch(ctx, path, leasing, Registry{}, WatchOptions{Logger: slog.New(&logCount{}), ready: ready})
	}()
	defer func() { cancel(); <-done }()
	<-ready
	waitFor(t, leasing, "the file in force as Watch starts", inForce(Version(policyFile(2))))
	writeFile(t, path, rated)
	waitFor(t, leasing, "the file with a fleetRate in force under Watch", inForce("rated"))

	plain, err := bulwark.New(bulwark.Config{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = Apply(plain, rated, "store", Registry{})
	want := `store:4:27: upstream "pay": bulkhead.fleetRate: value 100: needs a Config.Fleet that implements FleetLeaser`
	if err == nil || err.Error() != want {
		t.Fatalf("Apply(fleetRate) to a Transport with no Fleet:\n got %v\nwant %s", err, want)
	}
	if c := plain.Snapshot().Config; c == nil || c.Rejected == nil || c.Rejected.Version != "rated" || c.Rejected.Error != want {
		t.Fatalf("Snapshot().Config = %+v, want the refusal of rated as Apply words it", c)
	}
}

// seamApplyRefusalVersion: a file that declares its version is
// refused under it in Snapshot.Config, whatever refused it: an unknown
// field, a wrong type, a bad value.
func seamApplyRefusalVersion(t *testing.T) {
	tr, err := bulwark.New(bulwark.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{
		"version: v7\nbogus: 1\n",
		"version: v7\ndefault: {retry: {maxAttempts: two}}\n",
		"version: v7\ndefault: {retry: {maxAttempts: -2}}\n",
	} {
		v, err := Apply(tr, []byte(file), "store", Registry{})
		if err == nil || v != "v7" {
			t.Errorf("Apply(%q) = %q, %v; want v7 refused", file, v, err)
		}
		if c := tr.Snapshot().Config; c == nil || c.Rejected == nil || c.Rejected.Version != "v7" || c.Rejected.Error != err.Error() {
			t.Errorf("Apply(%q): Snapshot().Config.Rejected = %+v, want v7 with %v", file, c.Rejected, err)
		}
	}
}
