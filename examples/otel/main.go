// Command otel prints the OpenTelemetry trace of calls made through bulwark:
// an application span ("checkout") around two calls to a server of its own
// on 127.0.0.1. The server answers the first request 503 and every later one
// 200, so the first call is retried once: it has two attempt spans, children
// of checkout, the second with http.request.resend_count 1, and a
// bulwark.retry event on checkout says when and why; each attempt carries its
// own trace context to the server. The second call has too little time left
// to be worth sending: bulwark refuses it and records a bulwark.rejected
// event on checkout instead of a span; that refusal is what the example
// demonstrates, not a failure. It prints a guided reading of the trace
// (which span is the retry, where the deadline was too short); -json adds
// the raw spans from the stdout exporter after it. The program stops by itself.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/bulwark-http/bulwark"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

func main() {
	rawJSON := flag.Bool("json", false, "also print the raw spans as JSON (the stdout exporter's output), after the guided reading")
	flag.Parse()

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

	// The spans are kept in memory for the guided reading; with -json the
	// stdout exporter prints them too. A syncer exports each span as it
	// ends, so both are complete when the program reaches Shutdown.
	mem := tracetest.NewInMemoryExporter()
	opts := []sdktrace.TracerProviderOption{sdktrace.WithSyncer(mem)}
	var raw bytes.Buffer // the JSON, printed after the guided reading
	if *rawJSON {
		exp, err := stdouttrace.New(stdouttrace.WithPrettyPrint(), stdouttrace.WithWriter(&raw))
		if err != nil {
			log.Fatal(err)
		}
		opts = append(opts, sdktrace.WithSyncer(exp))
	}
	tp := sdktrace.NewTracerProvider(opts...)

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
		fmt.Fprintf(os.Stderr, "client: %v (expected: this is what the example demonstrates)\n", err)
	}
	cancel()

	span.End()
	spans := mem.GetSpans() // before Shutdown, which empties the exporter
	if err := tp.Shutdown(context.Background()); err != nil {
		log.Print(err)
	}
	guide(os.Stdout, spans, *rawJSON)
	if *rawJSON {
		fmt.Printf("\nThe raw spans, as the stdout exporter writes them:\n\n")
		_, _ = raw.WriteTo(os.Stdout)
	}
}

// guide prints a short reading of the trace: the span tree, then what
// to look for in it, found in the spans themselves.
func guide(w io.Writer, spans tracetest.SpanStubs, rawJSON bool) {
	sort.Slice(spans, func(i, j int) bool { return spans[i].StartTime.Before(spans[j].StartTime) })
	var root *tracetest.SpanStub
	for i := range spans {
		if !spans[i].Parent.IsValid() {
			root = &spans[i]
		}
	}
	if root == nil {
		fmt.Fprintln(w, "no root span recorded")
		return
	}
	t0 := root.StartTime
	at := func(t time.Time) string { return fmt.Sprintf("+%.1f ms", float64(t.Sub(t0))/float64(time.Millisecond)) }
	fmt.Fprintf(w, "\nThe trace, read for you (%d spans, trace %s):\n\n", len(spans), root.SpanContext.TraceID())
	fmt.Fprintf(w, "  %-34s %s, the application's span\n", root.Name, at(root.StartTime))
	var retrySpan, retryEvent, rejected string
	for _, s := range spans {
		if s.Parent.SpanID() != root.SpanContext.SpanID() {
			continue
		}
		var attrs []string
		resend := ""
		for _, a := range s.Attributes {
			switch a.Key {
			case "http.response.status_code", "http.request.method":
				attrs = append(attrs, fmt.Sprintf("%s=%s", a.Key, a.Value.String()))
			case "http.request.resend_count":
				resend = a.Value.String()
				attrs = append(attrs, fmt.Sprintf("%s=%s", a.Key, resend))
			}
		}
		fmt.Fprintf(w, "  └ %-32s %s, %s, child of %s: %s\n", s.Name, at(s.StartTime), s.SpanKind, root.Name, strings.Join(attrs, " "))
		if resend != "" && retrySpan == "" {
			retrySpan = fmt.Sprintf("the %q span at %s with http.request.resend_count=%s", s.Name, at(s.StartTime), resend)
		}
	}
	for _, e := range root.Events {
		var attrs []string
		for _, a := range e.Attributes {
			attrs = append(attrs, fmt.Sprintf("%s=%s", a.Key, a.Value.String()))
		}
		fmt.Fprintf(w, "  • event %-26s %s on %s: %s\n", e.Name, at(e.Time), root.Name, strings.Join(attrs, " "))
		switch e.Name {
		case "bulwark.retry":
			if retryEvent == "" {
				retryEvent = fmt.Sprintf("the bulwark.retry event at %s (%s)", at(e.Time), strings.Join(attrs, " "))
			}
		case "bulwark.rejected":
			rejected = fmt.Sprintf("the bulwark.rejected event at %s (%s)", at(e.Time), strings.Join(attrs, " "))
		}
	}
	fmt.Fprintf(w, "\nWhat to look for:\n")
	if retrySpan != "" {
		fmt.Fprintf(w, "  1. The retry is %s: the second attempt of the first call, after the server's 503. %s says why bulwark retried and how long it waited first.\n", retrySpan, upper(retryEvent))
	} else {
		fmt.Fprintf(w, "  1. No attempt span carries http.request.resend_count: the first call was not retried this time.\n")
	}
	if rejected != "" {
		fmt.Fprintf(w, "  2. The deadline was too short for the second call: it had 8 ms left, less than bulwark's minimum worth sending, so bulwark refused it before sending (no attempt span; %s). That refusal is what this example demonstrates, not a failure.\n", rejected)
	} else {
		fmt.Fprintf(w, "  2. No bulwark.rejected event: the second call was sent after all (a slow machine can take the 8 ms before bulwark looks).\n")
	}
	if !rawJSON {
		fmt.Fprintf(w, "\nThe raw spans as JSON: go run ./otel -json\n")
	}
}

func upper(s string) string {
	if s == "" {
		return "No bulwark.retry event"
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
