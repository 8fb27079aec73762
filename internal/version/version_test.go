package version

import (
	"runtime/debug"
	"testing"
)

func TestOf(t *testing.T) {
	dep := func(path, v string, replace *debug.Module) *debug.Module {
		return &debug.Module{Path: path, Version: v, Replace: replace}
	}
	for _, c := range []struct {
		name string
		bi   *debug.BuildInfo
		ok   bool
		want string
	}{
		{"no build information", nil, false, ""},
		{"a dependency at a tag", &debug.BuildInfo{Main: debug.Module{Path: "example.com/app", Version: "(devel)"},
			Deps: []*debug.Module{dep("github.com/sony/gobreaker/v2", "v2.4.0", nil), dep(modulePath, "v1.4.0", nil)}}, true, "v1.4.0"},
		{"a dependency at a commit", &debug.BuildInfo{Main: debug.Module{Path: "example.com/app"},
			Deps: []*debug.Module{dep(modulePath, "v1.4.1-0.20261201120000-abcdefabcdef", nil)}}, true, "v1.4.1-0.20261201120000-abcdefabcdef"},
		{"replaced by another version", &debug.BuildInfo{Main: debug.Module{Path: "example.com/app"},
			Deps: []*debug.Module{dep(modulePath, "v1.4.0", dep("example.com/fork", "v1.4.2", nil))}}, true, "v1.4.2"},
		{"replaced by a directory", &debug.BuildInfo{Main: debug.Module{Path: "example.com/app"},
			Deps: []*debug.Module{dep(modulePath, "v1.9.9", dep("../bulwark", "(devel)", nil))}}, true, ""},
		{"the main module, stamped", &debug.BuildInfo{Main: debug.Module{Path: modulePath, Version: "v1.5.0"}}, true, "v1.5.0"},
		{"the main module, unstamped", &debug.BuildInfo{Main: debug.Module{Path: modulePath, Version: "(devel)"}}, true, ""},
		{"not linked in", &debug.BuildInfo{Main: debug.Module{Path: "example.com/app", Version: "v2.0.0"}}, true, ""},
	} {
		if got := of(c.bi, c.ok); got != c.want {
			t.Errorf("%s: of = %q, want %q", c.name, got, c.want)
		}
	}
}

// In this package's own test binary bulwark is the main module, built
// without a stamped version.
func TestModuleInOwnTests(t *testing.T) {
	if got := Module(); got != "" {
		t.Errorf("Module() = %q in bulwark's own tests, want \"\" for (devel)", got)
	}
}
