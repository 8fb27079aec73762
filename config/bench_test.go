package config

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/bulwark-http/bulwark"
)

type okRT struct{}

func (okRT) RoundTrip(req *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: 200, Body: http.NoBody, Header: http.Header{}, Request: req}, nil
}

// BenchmarkRequest is the paired benchmark of the cost of a loaded config
// on the request path: the same policy written in Go (code) and read from
// a file (file). A file gives the same Config, so the same stack; the
// version recorded for Snapshot is not read on the request path.
func BenchmarkRequest(b *testing.B) {
	file := []byte("upstreams:\n  pay.internal:\n    timeout: {total: 1s, attempt: 150ms}\n    retry: {maxAttempts: 2, base: 10ms}\n    breaker: {minCalls: 20}\n")
	fromFile, err := Parse(file, "p.yaml", Registry{})
	if err != nil {
		b.Fatal(err)
	}
	fromCode := bulwark.Config{Upstreams: map[string]bulwark.Policy{"pay.internal": {
		Timeout: bulwark.Timeout{Total: time.Second, Attempt: 150 * time.Millisecond},
		Retry:   bulwark.Retry{MaxAttempts: 2, Base: 10 * time.Millisecond},
		Breaker: bulwark.Breaker{MinCalls: 20},
	}}}
	for _, bc := range []struct {
		name string
		cfg  bulwark.Config
	}{{"code", fromCode}, {"file", fromFile}} {
		b.Run(bc.name, func(b *testing.B) {
			bc.cfg.Base = okRT{}
			tr, err := bulwark.New(bc.cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer tr.Close()
			req, _ := http.NewRequest(http.MethodGet, "http://pay.internal/v1", nil)
			b.ReportAllocs()
			for b.Loop() {
				resp, err := tr.RoundTrip(req)
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
}
