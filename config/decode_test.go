package config

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/bulwark-http/bulwark"
)

// TestParseRefuses feeds Parse bad files: each is refused with an *Error
// whose text names the file, the line and column, the upstream and the
// field.
func TestParseRefuses(t *testing.T) {
	reg := Registry{Classifiers: map[string]bulwark.Classifier{"strict": bulwark.DefaultClassify}}
	deep := "default:\n  fallback:\n    constant:\n      header:\n        X: " + strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth) + "\n"
	for _, tc := range []struct {
		name, file string
		want       string // the error's text starts with this
	}{
		{"bad value", "upstreams:\n  pay:\n    retry:\n      maxAttempts: -1\n",
			`p.yaml:4:20: upstream "pay": retry.maxAttempts: value -1: must be ≥ 1`},
		{"bad value in default", "default:\n  breaker:\n    failureRate: 1.5\n",
			`p.yaml:3:18: default: breaker.failureRate: value 1.5`},
		{"bad value in a route", "routes:\n  GET /slow:\n    retry:\n      maxAttempts: -2\n",
			`p.yaml:4:20: route "GET /slow": retry.maxAttempts: value -2`},
		{"conflicting switches", "upstreams:\n  pay:\n    hedge:\n      disabled: true\n      enabled: true\n",
			`p.yaml:5:16: upstream "pay": hedge.enabled: value true: conflicts with Hedge.Disabled`},
		{"bad top-level value", "maxHosts: -4\n", `p.yaml:1:11: maxHosts: value -4`},
		{"unknown field", "upstreams:\n  pay:\n    retry:\n      maxAttemps: 3\n",
			`p.yaml:4:7: upstream "pay": retry.maxAttemps: unknown field "maxAttemps"; Retry has maxAttempts, `},
		{"unknown top-level field", "upstream: {}\n", `p.yaml:1:1: upstream: unknown field "upstream"`},
		{"Go's field name", "Default: {}\n", `p.yaml:1:1: Default: unknown field "Default"`},
		{"source is the loader's", "source: x\n", `p.yaml:1:1: source: unknown field "source"`},
		{"duration as a number", "upstreams:\n  pay:\n    timeout:\n      attempt: 150\n",
			`p.yaml:4:16: upstream "pay": timeout.attempt: want a duration such as "150ms", got the integer 150`},
		{"bad duration", "default:\n  timeout:\n    total: 3 seconds\n", `p.yaml:3:12: default: timeout.total: want a duration`},
		{"string for an int", "default:\n  retry:\n    maxAttempts: \"3\"\n", `p.yaml:3:18: default: retry.maxAttempts: want an integer, got the string "3"`},
		{"int overflow", "default:\n  fault:\n    abortStatus: 99999999999999999999\n", `p.yaml:3:18: default: fault.abortStatus: want an integer`},
		{"negative uint", "default:\n  fault:\n    seed: -1\n", `p.yaml:3:11: default: fault.seed: the integer -1 is out of range`},
		{"bool as a string", "default:\n  breaker:\n    shadow: \"yes\"\n", `p.yaml:3:13: default: breaker.shadow: want true or false`},
		{"mapping for a scalar", "default:\n  retry: 3\n", `p.yaml:2:10: default: retry: want a mapping of Retry's fields, got the integer 3`},
		{"unknown jitter", "default:\n  retry:\n    jitter: wild\n", `p.yaml:3:13: default: retry.jitter: want one of decorrelated, equal, full, none, got "wild"`},
		{"unknown function name", "upstreams:\n  pay:\n    classify: lenient\n",
			`p.yaml:3:15: upstream "pay": classify: unknown name "lenient": Registry.Classifiers holds "strict"`},
		{"a name no registry map holds", "default:\n  fallback:\n    func: cached\n", `p.yaml:3:11: default: fallback.func: unknown name "cached": Registry.Fallbacks holds none`},
		{"duplicate upstream", "upstreams:\n  pay: {}\n  pay: {}\n", `p.yaml:3:3: upstreams.pay: duplicate key "pay" (first at line 2, column 3)`},
		{"duplicate field", "upstreams:\n  pay:\n    retry: {}\n    retry: {}\n", `p.yaml:4:5: upstream "pay": retry: duplicate key "retry" (first at line 3, column 5)`},
		{"alias", "default: &d {}\nupstreams:\n  pay: *d\n", `p.yaml:3:8: YAML aliases are not allowed`},
		{"too deep", deep, `p.yaml:5:`},
		{"too large", "maxHosts: 1\n" + strings.Repeat("#", MaxBytes), `p.yaml: 1048588 bytes, more than the 1048576 allowed`},
		{"empty", "", `p.yaml: empty file`},
		{"comments only", "# nothing\n", `p.yaml: empty file`},
		{"two documents", "{}\n---\n{}\n", `p.yaml:2:1: a second document`},
		{"not a mapping", "- a\n", `p.yaml:1:1: want a mapping of Config's fields, got a sequence`},
		{"syntax", "default:\n  retry: {maxAttempts: 3\n", `p.yaml:`},
		{"json: bad value", "{\n\t\"upstreams\": {\n\t\t\"pay\": {\"retry\": {\"maxAttempts\": -1}}\n\t}\n}\n",
			`p.yaml:3:36: upstream "pay": retry.maxAttempts: value -1`},
		{"json: unknown field", `{"default": {"retri": {}}}`, `p.yaml:1:14: default: retri: unknown field "retri"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse([]byte(tc.file), "p.yaml", reg)
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("Parse = %+v, %v; want an *Error", cfg, err)
			}
			if !strings.HasPrefix(err.Error(), tc.want) {
				t.Errorf("Parse error:\n got %s\nwant %s…", err, tc.want)
			}
		})
	}
}

// TestParseBulwarkError checks that a value bulwark refuses keeps its
// *bulwark.ConfigError underneath.
func TestParseBulwarkError(t *testing.T) {
	_, err := Parse([]byte("upstreams:\n  pay:\n    retry:\n      maxAttempts: -1\n"), "p.yaml", Registry{})
	var ce *bulwark.ConfigError
	if !errors.Is(err, bulwark.ErrInvalidConfig) || !errors.As(err, &ce) || ce.Upstream != "pay" || ce.Field != "Retry.MaxAttempts" {
		t.Fatalf("Parse error %v: want a *bulwark.ConfigError for upstream pay, Retry.MaxAttempts", err)
	}
	var e *Error
	if !errors.As(err, &e) || e.Line != 4 || e.Column != 20 || e.Upstream != "pay" || e.Field != "retry.maxAttempts" {
		t.Fatalf("Parse error %+v: want line 4, column 20, upstream pay, field retry.maxAttempts", e)
	}
}

// TestParseNamesAndVersion resolves names through the Registry and gives
// the version: the file's, or its bytes' hash.
func TestParseNamesAndVersion(t *testing.T) {
	called := false
	reg := Registry{Fallbacks: map[string]func(*http.Request, error) (*http.Response, error){
		"teapot": func(*http.Request, error) (*http.Response, error) { called = true; return nil, nil },
	}}
	file := []byte("upstreams:\n  pay:\n    fallback:\n      func: teapot\n")
	cfg, err := Parse(file, "p.yaml", reg)
	if err != nil {
		t.Fatal(err)
	}
	if _, _ = cfg.Upstreams["pay"].Fallback.Func(nil, nil); !called {
		t.Error("Fallback.Func is not the Registry's teapot")
	}
	if cfg.Version != Version(file) || !strings.HasPrefix(cfg.Version, "sha256:") || cfg.Source != "p.yaml" {
		t.Errorf("Version, Source = %q, %q; want %q, p.yaml", cfg.Version, cfg.Source, Version(file))
	}
	cfg, err = Parse([]byte("version: \"2026-12-03.1\"\n"), "p.yaml", reg)
	if err != nil || cfg.Version != "2026-12-03.1" {
		t.Errorf("Parse(version: 2026-12-03.1) = Version %q, %v", cfg.Version, err)
	}
}

type leaserFleet struct{ nameFleet }

func (*leaserFleet) Lease(context.Context, bulwark.LeaseRequest) (bulwark.LeaseGrant, error) {
	return bulwark.LeaseGrant{}, nil
}

// TestParseFleetRate validates Bulkhead.FleetRate as New would with the
// file's Fleet: accepted when the Registry's Fleet leases quota, refused
// at the value when it does not. Validation starts no goroutine that
// outlives it (goleak, in TestMain).
func TestParseFleetRate(t *testing.T) {
	reg := Registry{Fleets: map[string]bulwark.Fleet{"leases": &leaserFleet{}, "plain": &nameFleet{}}}
	file := "fleet: %s\nupstreams:\n  pay:\n    bulkhead: {fleetRate: 100}\n"
	cfg, err := Parse(fmt.Appendf(nil, file, "leases"), "p.yaml", reg)
	if err != nil || cfg.Fleet != reg.Fleets["leases"] {
		t.Fatalf("Parse with a leasing Fleet = %v (Fleet %v)", err, cfg.Fleet)
	}
	_, err = Parse(fmt.Appendf(nil, file, "plain"), "p.yaml", reg)
	if want := `p.yaml:4:27: upstream "pay": bulkhead.fleetRate: value 100: needs a Config.Fleet that implements FleetLeaser`; err == nil || err.Error() != want {
		t.Fatalf("Parse with a Fleet that does not lease:\n got %v\nwant %s", err, want)
	}
	// A file that names no Fleet leaves it to the program: New checks
	// the Fleet set in code.
	cfg, err = Parse([]byte("upstreams:\n  pay:\n    bulkhead: {fleetRate: 100}\n"), "p.yaml", reg)
	if err != nil {
		t.Fatalf("Parse with no Fleet named = %v, want the check left to New", err)
	}
	if _, err := bulwark.New(cfg); !errors.Is(err, bulwark.ErrInvalidConfig) {
		t.Fatalf("New with no Fleet = %v, want it to refuse the FleetRate", err)
	}
	cfg.Fleet = &leaserFleet{}
	tr, err := bulwark.New(cfg)
	if err != nil {
		t.Fatalf("New with a leasing Fleet set in code = %v", err)
	}
	_ = tr.Close()
}

// TestVersionOf: a file is named by its version field, read as Parse reads
// it, also when the rest is refused; by Version(data) when it has none
// that reads as a string.
func TestVersionOf(t *testing.T) {
	for _, tc := range []struct {
		file string
		want string // "" for Version(data)
	}{
		{"version: v7\ndefault: {retry: {maxAttempts: 2}}\n", "v7"},
		{"version: v7\nbogus: 1\n", "v7"},
		{"version: v7\ndefault: {retry: {maxAttempts: two}}\n", "v7"},
		{"version: v7\ndefault: {retry: {maxAttempts: -2}}\n", "v7"},
		{`{"version": "v7", "bogus": 1}`, "v7"},
		{"bogus: 1\nversion: 'v 7'\n", "v 7"},
		{"version: 7\n", ""},
		{"version: [v7]\n", ""},
		{"version: ''\n", ""},
		{"version: v7\nversion: v8\n", ""},
		{"version: v7\ndefault: [\n", ""},
		{"- version: v7\n", ""},
		{"default: {}\n", ""},
		{"", ""},
	} {
		want := tc.want
		if want == "" {
			want = Version([]byte(tc.file))
		}
		if got := VersionOf([]byte(tc.file)); got != want {
			t.Errorf("VersionOf(%q) = %q, want %q", tc.file, got, want)
		}
		if cfg, err := Parse([]byte(tc.file), "p.yaml", Registry{}); err == nil && cfg.Version != want {
			t.Errorf("Parse(%q).Version = %q, VersionOf says %q", tc.file, cfg.Version, want)
		}
	}
}
