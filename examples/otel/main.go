// Command otel prints the OpenTelemetry trace of calls made through bulwark:
// an application span ("checkout") around two calls to a server of its own
// on 127.0.0.1. The server answers the first request 503 and every later one
// 200, so the first call is retried once: it has two attempt spans, children
// of checkout, the second with http.request.resend_count 1, and a
// bulwark.retry event on checkout says when and why; each attempt carries its
// own trace context to the server. The second call has too little time left
// to be worth sending: bulwark refuses it and records a bulwark.rejected
// event on checkout instead of a span. The spans go to stdout with the
// stdout exporter; the program stops by itself.
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"time"

	"github.com/bulwark-http/bulwark"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

func main() {
	var calls atomic.Int32
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		fmt.Fprintf(os.Stderr, "upstream: request %d, traceparent %s\n", n, r.Header.Get("Traceparent"))
		if n == 1 {
			http.Error(w, "warming up", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "rate: 8.625%\n")
	}))
	defer upstream.Close()

	exp, err := stdouttrace.New(stdouttrace.WithPrettyPrint())
	if err != nil {
		log.Fatal(err)
	}
	// A syncer exports each span as it ends, so the output is complete
	// when the program reaches Shutdown.
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer func() {
		if err := tp.Shutdown(context.Background()); err != nil {
			log.Print(err)
		}
	}()

	client, err := bulwark.NewClient(bulwark.Config{
		TracerProvider: tp,
		Propagator:     propagation.TraceContext{},
		// A short backoff, so the retry comes quickly.
		Default: bulwark.Policy{Retry: bulwark.Retry{Base: 10 * time.Millisecond}},
	})
	if err != nil {
		log.Fatal(err)
	}

	ctx, span := tp.Tracer("example").Start(context.Background(), "checkout")

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, upstream.URL+"/rate?zip=94103&key=s3cret", nil)
	if err != nil {
		log.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close() // the second attempt's span ends here
	fmt.Fprintf(os.Stderr, "client: %s %s", resp.Status, body)

	// Less time left than bulwark's minimum worth sending.
	short, cancel := context.WithTimeout(ctx, 8*time.Millisecond)
	req, _ = http.NewRequestWithContext(short, http.MethodGet, upstream.URL+"/rate", nil)
	if _, err := client.Do(req); err != nil {
		fmt.Fprintf(os.Stderr, "client: %v\n", err)
	}
	cancel()

	span.End()
}
