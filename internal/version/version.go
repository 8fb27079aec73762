// Package version reports which version of the bulwark module a program was
// built with, for the instrumentation scopes that both halves (the client and
// the server package) report their telemetry under. The module has no version
// constant to keep in step by hand: the Go toolchain records every module's
// version in the binary, and runtime/debug reads it back.
package version

import "runtime/debug"

// modulePath is the module whose version Module reports.
const modulePath = "github.com/bulwark-http/bulwark"

// Module returns the bulwark module's version as the build recorded it: a
// tag ("v1.4.0") or a pseudo-version when bulwark is a dependency, the
// version the toolchain stamped when bulwark is the main module, and ""
// when the build records none: "(devel)", as in bulwark's own tests or
// under a replace directive to a directory, names no version.
func Module() string {
	return of(debug.ReadBuildInfo())
}

// of is Module on a given build's information.
func of(bi *debug.BuildInfo, ok bool) string {
	if !ok || bi == nil {
		return ""
	}
	v := ""
	if bi.Main.Path == modulePath {
		v = bi.Main.Version
	} else {
		for _, d := range bi.Deps {
			if d.Path != modulePath {
				continue
			}
			v = d.Version
			// What was built is the replacement: another module's version,
			// or a directory's code, which has none ("(devel)"), whatever
			// version the requirement named.
			if d.Replace != nil {
				v = d.Replace.Version
			}
			break
		}
	}
	if v == "(devel)" {
		return ""
	}
	return v
}
