package config_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/bulwark-http/bulwark/config"
)

func Example() {
	reg := config.Registry{
		Fallbacks: map[string]func(*http.Request, error) (*http.Response, error){
			"last-rate": func(*http.Request, error) (*http.Response, error) { return nil, nil },
		},
	}
	// The README's "Policies in a file" YAML as written.
	file := []byte(`
version: "2026-12-03.1"
upstreams:
  tax.internal:
    timeout: {total: 1s, attempt: 150ms}
    breaker: {slowCall: 100ms, slowCallRate: 0.5, minCalls: 20}
    retry: {maxAttempts: 2, base: 10ms, jitter: equal}
    fallback: {func: last-rate}   # config.Registry{Fallbacks: {"last-rate": fn}}
`)
	cfg, err := config.Parse(file, "policies.yaml", reg)
	if err != nil {
		fmt.Println(err)
		return
	}
	tr, err := bulwark.New(cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer tr.Close()
	tax := cfg.Upstreams["tax.internal"]
	fmt.Println("attempt timeout:", tax.Timeout.Attempt, "slow call:", tax.Breaker.SlowCall, "retry jitter:", tax.Retry.Jitter)
	c := tr.Snapshot().Config
	fmt.Println("in force:", c.Version, "from", c.Source)

	// A bad value is refused with where it is; the Transport keeps its
	// configuration.
	_, err = config.Parse([]byte("upstreams:\n  tax.internal:\n    retry: {maxAttempts: 0.5}\n"), "policies.yaml", reg)
	fmt.Println(err)
	// Output:
	// attempt timeout: 150ms slow call: 100ms retry jitter: Equal
	// in force: 2026-12-03.1 from policies.yaml
	// policies.yaml:3:26: upstream "tax.internal": retry.maxAttempts: want an integer, got the number 0.5
}

// The README's "Policies in a file" as written: Load the file, build the
// Transport from it, and Watch the file for changes. Here the file is in
// a temporary directory, and an edit (written beside it and renamed over
// it, as an editor saves) is applied while the Transport runs.
func ExampleWatch() {
	dir, err := os.MkdirTemp("", "bulwark-config")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "policies.yaml")
	policies := func(version, attempt string) {
		tmp := path + ".tmp"
		file := "version: " + version + "\nupstreams:\n  tax.internal:\n    timeout: {total: 1s, attempt: " + attempt + "}\n    fallback: {func: last-rate}\n"
		if err := os.WriteFile(tmp, []byte(file), 0o644); err != nil {
			log.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			log.Fatal(err)
		}
	}
	policies("v1", "150ms")
	reg := config.Registry{Fallbacks: map[string]func(*http.Request, error) (*http.Response, error){
		"last-rate": func(*http.Request, error) (*http.Response, error) { return nil, errors.New("no rate cached") },
	}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// README "Policies in a file": begin
	cfg, err := config.Load(path, reg) // validated as New validates
	if err != nil {
		log.Fatal(err)
	}
	tr, err := bulwark.New(cfg)
	if err != nil {
		log.Fatal(err)
	}
	go config.Watch(ctx, path, tr, reg, config.WatchOptions{}) // until ctx is done
	// README "Policies in a file": end
	defer tr.Close()

	fmt.Println("in force:", tr.Snapshot().Config.Version)
	policies("v2", "200ms")
	// Watch applies it within about 100 ms; wait up to 10 s.
	for i := 0; i < 1000 && tr.Snapshot().Config.Version != "v2"; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println("in force:", tr.Snapshot().Config.Version)
	// Output:
	// in force: v1
	// in force: v2
}
