package config

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzParse: no input makes Parse panic, and what it accepts Marshal writes
// back to a file it accepts again.
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob("testdata/*.*")
	for _, name := range files {
		if b, err := os.ReadFile(name); err == nil {
			f.Add(b)
		}
	}
	f.Add([]byte("upstreams:\n  pay: {retry: {maxAttempts: 3}}\n  pay: {}\n"))
	f.Add([]byte("default: &a {}\nroutes: {x: *a}\n"))
	reg := exampleRegistry()
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse(data, "f.yaml", reg)
		if err != nil {
			return
		}
		out, err := Marshal(cfg, reg)
		if err != nil {
			t.Fatalf("Marshal of a parsed file: %v", err)
		}
		if _, err := Parse(out, "f.yaml", reg); err != nil {
			t.Fatalf("Parse(Marshal(Parse(data))): %v\ndata:\n%s\nout:\n%s", err, data, out)
		}
	})
}
