package config

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/hashicorp/go-retryablehttp"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"pgregory.net/rapid"
)

type nameResolver string

func (nameResolver) Resolve(context.Context, string) ([]string, error) { return nil, nil }

type nameBase struct{ name string }

func (*nameBase) RoundTrip(*http.Request) (*http.Response, error) { return nil, http.ErrHandlerTimeout }

type nameFleet struct{ name string }

func (*nameFleet) Publish(context.Context, bulwark.FleetUpdate) error { return nil }
func (*nameFleet) Receive(ctx context.Context, _ *bulwark.FleetSink) error {
	<-ctx.Done()
	return nil
}

// fullRegistry holds two values of every code-only type, so a generated
// Config can name each and Marshal must tell them apart.
func fullRegistry() Registry {
	return Registry{
		Classifiers: map[string]bulwark.Classifier{"default": bulwark.DefaultClassify,
			"never": func(*http.Response, error) bulwark.Verdict { return bulwark.Verdict{} }},
		Fallbacks: map[string]func(*http.Request, error) (*http.Response, error){
			"a": func(*http.Request, error) (*http.Response, error) { return nil, nil },
			"b": func(*http.Request, error) (*http.Response, error) { return nil, http.ErrAbortHandler },
		},
		CheckRetry: map[string]retryablehttp.CheckRetry{"default": retryablehttp.DefaultRetryPolicy, "errors": retryablehttp.ErrorPropagatedRetryPolicy},
		Backoffs:   map[string]retryablehttp.Backoff{"default": retryablehttp.DefaultBackoff, "linear": retryablehttp.LinearJitterBackoff},
		OnRetry: map[string]func(*http.Request, bulwark.RetryEvent){
			"a": func(*http.Request, bulwark.RetryEvent) {}, "b": func(*http.Request, bulwark.RetryEvent) { println() },
		},
		PrepareRetry: map[string]func(*http.Request) error{
			"a": func(*http.Request) error { return nil }, "b": func(*http.Request) error { return http.ErrAbortHandler },
		},
		ReadyToTrip: map[string]func(bulwark.BreakerCounts) bool{
			"a": func(bulwark.BreakerCounts) bool { return false }, "b": func(c bulwark.BreakerCounts) bool { return c.Failures > 0 },
		},
		OnStateChange: map[string]func(string, bulwark.CircuitState, bulwark.CircuitState){
			"a": func(string, bulwark.CircuitState, bulwark.CircuitState) {}, "b": func(string, bulwark.CircuitState, bulwark.CircuitState) { println() },
		},
		Resolvers:       map[string]bulwark.Resolver{"dns": nameResolver("dns"), "consul": nameResolver("consul")},
		Bases:           map[string]http.RoundTripper{"a": &nameBase{"a"}, "b": &nameBase{"b"}},
		TracerProviders: map[string]trace.TracerProvider{"noop": tracenoop.NewTracerProvider()},
		MeterProviders:  map[string]metric.MeterProvider{"noop": metricnoop.NewMeterProvider()},
		Propagators:     map[string]propagation.TextMapPropagator{"tc": propagation.TraceContext{}, "baggage": propagation.Baggage{}},
		Loggers:         map[string]*slog.Logger{"a": slog.New(slog.DiscardHandler), "b": slog.New(slog.DiscardHandler)},
		Fleets:          map[string]bulwark.Fleet{"a": &nameFleet{"a"}, "b": &nameFleet{"b"}},
	}
}

// TestRegistryCoversConfig: every code-only type in Config has a map in
// Registry, so a hook added to Policy fails here, not in a user's file.
func TestRegistryCoversConfig(t *testing.T) {
	var walk func(t reflect.Type, path string)
	seen := map[reflect.Type]bool{}
	walk = func(typ reflect.Type, path string) {
		if seen[typ] {
			return
		}
		seen[typ] = true
		switch kindOf(typ) {
		case kindStruct:
			for _, f := range fieldsOf(typ) {
				walk(f.sf.Type, path+"."+f.sf.Name)
			}
		case kindPointer, kindMap, kindSlice:
			walk(typ.Elem(), path)
		case kindCode:
			if registryField(typ) == "" {
				t.Errorf("%s: no Registry map for %v", path, typ)
			}
		case kindUnsupported:
			t.Errorf("%s: the format has no spelling for %v", path, typ)
		}
	}
	walk(configType, "Config")
}

// draw sets v, and every field under it, to a value drawn by rt, none zero:
// a field Marshal or Parse forgot would come back zero and fail the round
// trip. Code-only values are drawn from reg.
func draw(rt *rapid.T, v reflect.Value, reg Registry, path string) {
	t := v.Type()
	switch kindOf(t) {
	case kindStruct:
		for _, f := range fieldsOf(t) {
			draw(rt, v.Field(f.index), reg, path+"."+f.sf.Name)
		}
	case kindPointer:
		p := reflect.New(t.Elem())
		draw(rt, p.Elem(), reg, path)
		v.Set(p)
	case kindMap:
		n := rapid.IntRange(1, 2).Draw(rt, path+"#")
		m := reflect.MakeMap(t)
		for i := range n {
			k := rapid.StringMatching(`[a-z][a-z0-9.:/ -]{0,12}`).Draw(rt, fmt.Sprintf("%s[%d]", path, i))
			e := reflect.New(t.Elem()).Elem()
			draw(rt, e, reg, path+"["+k+"]")
			m.SetMapIndex(reflect.ValueOf(k).Convert(t.Key()), e)
		}
		v.Set(m)
	case kindSlice:
		n := rapid.IntRange(1, 2).Draw(rt, path+"#")
		s := reflect.MakeSlice(t, n, n)
		for i := range n {
			draw(rt, s.Index(i), reg, fmt.Sprintf("%s[%d]", path, i))
		}
		v.Set(s)
	case kindBytes:
		v.SetBytes(rapid.SliceOfN(rapid.Byte(), 1, 24).Draw(rt, path))
	case kindDuration:
		v.SetInt(rapid.Int64Range(1, int64(48*time.Hour)).Draw(rt, path))
	case kindJitter:
		v.SetUint(uint64(rapid.IntRange(1, len(jitterNames)).Draw(rt, path)))
	case kindCode:
		m, _ := reg.names(t)
		keys := m.MapKeys()
		i := rapid.IntRange(0, len(keys)-1).Draw(rt, path)
		v.Set(m.MapIndex(keys[i]))
	case kindString:
		v.SetString(rapid.StringN(1, 16, -1).Draw(rt, path))
	case kindBool:
		v.SetBool(true)
	case kindInt:
		v.SetInt(rapid.Int64Range(1, 1<<(t.Bits()-1)-1).Draw(rt, path))
	case kindUint:
		v.SetUint(rapid.Uint64Range(1, 1<<t.Bits()-1).Draw(rt, path))
	case kindFloat:
		f := rapid.Float64().Draw(rt, path)
		if f == 0 {
			f = 0.5
		}
		v.SetFloat(f)
	default:
		rt.Fatalf("%s: cannot draw %v", path, t)
	}
}

// sameConfig reports where a and b differ: code-only values by the name
// reg holds them under, the rest by reflect.DeepEqual.
func sameConfig(a, b reflect.Value, reg Registry, path string) string {
	t := a.Type()
	switch kindOf(t) {
	case kindStruct:
		for _, f := range fieldsOf(t) {
			if d := sameConfig(a.Field(f.index), b.Field(f.index), reg, path+"."+f.sf.Name); d != "" {
				return d
			}
		}
		return ""
	case kindPointer:
		if a.IsNil() || b.IsNil() {
			if a.IsNil() != b.IsNil() {
				return path + ": nil on one side"
			}
			return ""
		}
		return sameConfig(a.Elem(), b.Elem(), reg, path)
	case kindMap:
		if a.Len() != b.Len() || a.IsNil() != b.IsNil() {
			return fmt.Sprintf("%s: %d entries, want %d", path, b.Len(), a.Len())
		}
		for _, k := range a.MapKeys() {
			bv := b.MapIndex(k)
			if !bv.IsValid() {
				return fmt.Sprintf("%s[%v]: missing", path, k)
			}
			if d := sameConfig(a.MapIndex(k), bv, reg, fmt.Sprintf("%s[%v]", path, k)); d != "" {
				return d
			}
		}
		return ""
	case kindCode:
		an, _ := reg.nameOf(a)
		bn, _ := reg.nameOf(b)
		if a.IsNil() != b.IsNil() || an != bn {
			return fmt.Sprintf("%s: %q, want %q", path, bn, an)
		}
		return ""
	case kindFloat:
		if x, y := a.Float(), b.Float(); x != y && !(x != x && y != y) {
			return fmt.Sprintf("%s: %v, want %v", path, y, x)
		}
		return ""
	}
	if !reflect.DeepEqual(a.Interface(), b.Interface()) {
		return fmt.Sprintf("%s: %#v, want %#v", path, b.Interface(), a.Interface())
	}
	return ""
}

// TestRoundTripEveryField is the round-trip property: a Config with every
// field set, to values drawn at random, is the same after Marshal and
// decode (Parse without bulwark's validation, which random values fail),
// and Marshal of that is the same bytes. Its Version is drawn too, or
// none (it comes back as the hash of the file, Version(file)), or that
// hash of the file written without one (not written, and read back the
// same).
func TestRoundTripEveryField(t *testing.T) {
	reg := fullRegistry()
	rapid.Check(t, func(rt *rapid.T) {
		var cfg bulwark.Config
		draw(rt, reflect.ValueOf(&cfg).Elem(), reg, "Config")
		cfg.Source = "" // the loader's, not the file's
		switch rapid.IntRange(0, 2).Draw(rt, "version") {
		case 1:
			cfg.Version = ""
		case 2:
			cfg.Version = ""
			plain, err := Marshal(cfg, reg)
			if err != nil {
				rt.Fatal(err)
			}
			cfg.Version = Version(plain)
		}
		file, err := Marshal(cfg, reg)
		if err != nil {
			rt.Fatal(err)
		}
		back, _, err := decode(file, "gen.yaml", reg)
		if err != nil {
			rt.Fatalf("decode(Marshal(cfg)): %v\n%s", err, file)
		}
		back.Source = ""
		want := cfg
		if want.Version == "" {
			want.Version = Version(file)
		}
		if d := sameConfig(reflect.ValueOf(want), reflect.ValueOf(back), reg, "Config"); d != "" {
			rt.Fatalf("file → Config differs at %s\n%s", d, file)
		}
		again, err := Marshal(back, reg)
		if err != nil {
			rt.Fatal(err)
		}
		if !bytes.Equal(file, again) {
			rt.Fatalf("Marshal(decode(file)) is not file:\n%s\n---\n%s", file, again)
		}
	})
}

// seamMarshalVersion: Parse(Marshal(cfg)) is cfg, and Marshal of that the
// same bytes, whatever cfg's Version: none (Parse gives the file's hash),
// one of the operator's, and one that looks like a hash but is not this
// file's.
func seamMarshalVersion(t *testing.T) {
	for _, version := range []string{"", "v7", "sha256:0123456789abcdef"} {
		cfg := bulwark.Config{Version: version, MaxHosts: 3}
		file, err := Marshal(cfg, Registry{})
		if err != nil {
			t.Fatal(err)
		}
		back, err := Parse(file, "p.yaml", Registry{})
		if err != nil {
			t.Fatal(err)
		}
		if want := cmp.Or(version, Version(file)); back.Version != want || back.MaxHosts != 3 {
			t.Errorf("Parse(Marshal(Version %q)) = Version %q, MaxHosts %d; want %q, 3", version, back.Version, back.MaxHosts, want)
		}
		if again, err := Marshal(back, Registry{}); err != nil || !bytes.Equal(again, file) {
			t.Errorf("Marshal(Parse(Marshal(Version %q))) = %q, %v; want %q", version, again, err, file)
		}
	}
}

// TestRoundTripExamples: every example file of the repository parses,
// validates, and survives Config → file → Config; a file written by
// Marshal is the same bytes when marshalled again.
func TestRoundTripExamples(t *testing.T) {
	files, err := filepath.Glob("testdata/*.*")
	if err != nil || len(files) == 0 {
		t.Fatalf("no example files: %v", err)
	}
	reg := exampleRegistry()
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			cfg, err := Load(f, reg)
			if err != nil {
				t.Fatal(err)
			}
			out, err := Marshal(cfg, reg)
			if err != nil {
				t.Fatal(err)
			}
			back, err := Parse(out, f, reg)
			if err != nil {
				t.Fatalf("Parse(Marshal): %v\n%s", err, out)
			}
			if d := sameConfig(reflect.ValueOf(cfg), reflect.ValueOf(back), reg, "Config"); d != "" {
				t.Fatalf("file → Config → file → Config differs at %s\n%s", d, out)
			}
			again, err := Marshal(back, reg)
			if err != nil || !bytes.Equal(out, again) {
				t.Fatalf("Marshal is not stable (%v):\n%s\n---\n%s", err, out, again)
			}
			if want, err := os.ReadFile(f); err == nil && filepath.Ext(f) == ".yaml" && bytes.HasPrefix(want, []byte("# canonical")) {
				if got := append([]byte("# canonical\n"), out...); !bytes.Equal(got, want) {
					t.Errorf("%s is canonical: Marshal should give it back unchanged, got\n%s", f, got)
				}
			}
		})
	}
}

// TestReadmeYAML: the README's YAML blocks are files Parse accepts.
func TestReadmeYAML(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, block := range strings.Split(string(readme), "```yaml\n")[1:] {
		body, _, ok := strings.Cut(block, "```")
		if !ok {
			t.Fatal("README: a yaml block is not closed")
		}
		n++
		if _, err := Parse([]byte(body), "README.md yaml block", exampleRegistry()); err != nil {
			t.Errorf("README's yaml block %d: %v\n%s", n, err, body)
		}
	}
	if n == 0 {
		t.Fatal("README has no yaml block")
	}
}

// exampleRegistry holds the names the example files use.
func exampleRegistry() Registry {
	return Registry{
		Classifiers: map[string]bulwark.Classifier{"default": bulwark.DefaultClassify},
		Fallbacks: map[string]func(*http.Request, error) (*http.Response, error){
			"empty-list": func(*http.Request, error) (*http.Response, error) { return nil, nil },
			"last-rate":  func(*http.Request, error) (*http.Response, error) { return nil, nil },
		},
		Resolvers: map[string]bulwark.Resolver{"dns": nameResolver("dns")},
	}
}
