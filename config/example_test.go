package config_test

import (
	"fmt"
	"net/http"

	"github.com/bulwark-http/bulwark"
	"github.com/bulwark-http/bulwark/config"
)

func Example() {
	reg := config.Registry{
		Fallbacks: map[string]func(*http.Request, error) (*http.Response, error){
			"last-rate": func(*http.Request, error) (*http.Response, error) { return nil, nil },
		},
	}
	file := []byte(`
version: "2026-12-03.1"
upstreams:
  tax.internal:
    timeout: {total: 1s, attempt: 150ms}
    retry: {maxAttempts: 2, base: 10ms, jitter: equal}
    fallback: {func: last-rate}
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
	fmt.Println("attempt timeout:", tax.Timeout.Attempt, "retry jitter:", tax.Retry.Jitter)
	c := tr.Snapshot().Config
	fmt.Println("in force:", c.Version, "from", c.Source)

	// A bad value is refused with where it is; the Transport keeps its
	// configuration.
	_, err = config.Parse([]byte("upstreams:\n  tax.internal:\n    retry: {maxAttempts: 0.5}\n"), "policies.yaml", reg)
	fmt.Println(err)
	// Output:
	// attempt timeout: 150ms retry jitter: Equal
	// in force: 2026-12-03.1 from policies.yaml
	// policies.yaml:3:26: upstream "tax.internal": retry.maxAttempts: want an integer, got the number 0.5
}
