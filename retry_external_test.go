package bulwark_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/bulwark-http/bulwark"
	"github.com/bulwark-http/bulwark/bulwarktest"
	"github.com/hashicorp/go-retryablehttp"
)

// TestRetryDrainsDiscarded: a retried response is drained and closed, so its
// connection is reused: three attempts, one connection.
func TestRetryDrainsDiscarded(t *testing.T) {
	u := bulwarktest.NewUpstream(map[string]bulwarktest.Script{"/": {
		{Status: 503, Body: strings.Repeat("x", 2000), Times: 2},
		{Status: 200, Body: "ok"},
	}})
	srv := u.Start(t)
	base := &http.Transport{}
	defer base.CloseIdleConnections()
	tr, err := bulwark.New(bulwark.Config{Base: base, Default: bulwark.Policy{Retry: bulwark.Retry{Backoff: noWait}}})
	if err != nil {
		t.Fatal(err)
	}
	var newConns, reused atomic.Int32
	ctx := httptrace.WithClientTrace(t.Context(), &httptrace.ClientTrace{GotConn: func(ci httptrace.GotConnInfo) {
		if ci.Reused {
			reused.Add(1)
		} else {
			newConns.Add(1)
		}
	}})
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/", nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if got := u.Attempts("/"); string(b) != "ok" || !slices.Equal(got, []int{1, 2, 3}) {
		t.Fatalf("body %q after attempts %v, want ok after [1 2 3]", b, got)
	}
	if newConns.Load() != 1 || reused.Load() != 2 {
		t.Errorf("new connections %d, reused %d; want 1 and 2", newConns.Load(), reused.Load())
	}
}

// TestCheckRetryRetryablehttpPolicies: go-retryablehttp's own policies mean
// in bulwark what they mean in go-retryablehttp. ErrorPropagatedRetryPolicy
// against an always-500 server retries until the attempts run out and
// then returns its error; DefaultRetryPolicy sees an untrusted certificate
// through the *url.Error http.Client would wrap it in, and does not retry.
// The policy is handed exactly that *url.Error.
func TestCheckRetryRetryablehttpPolicies(t *testing.T) {
	srv, hits := countingServer(t, 500)
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	tr := seamNew(t, bulwark.Config{Base: base, Default: bulwark.Policy{Retry: bulwark.Retry{
		CheckRetry: retryablehttp.ErrorPropagatedRetryPolicy, Backoff: noWait}}})
	_, err := seamSend(t, tr, "GET", srv.URL+"/")
	var re *bulwark.RetryError
	if !errors.As(err, &re) || re.Attempts != 3 || hits.Load() != 3 || !strings.Contains(err.Error(), "unexpected HTTP status") {
		t.Fatalf("ErrorPropagatedRetryPolicy on 500s: %v after %d requests; want its error after 3", err, hits.Load())
	}

	tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(tlsSrv.Close)
	untrusting := &http.Transport{TLSClientConfig: &tls.Config{}}
	t.Cleanup(untrusting.CloseIdleConnections)
	var asked atomic.Int32
	trTLS := seamNew(t, bulwark.Config{Base: untrusting, Default: bulwark.Policy{Retry: bulwark.Retry{
		Backoff: noWait,
		CheckRetry: func(ctx context.Context, resp *http.Response, err error) (bool, error) {
			asked.Add(1)
			if ue, ok := err.(*url.Error); !ok || ue.Op != "Get" || ue.URL != tlsSrv.URL+"/" {
				t.Errorf("CheckRetry handed %#v; want a *url.Error as http.Client makes", err)
			}
			return retryablehttp.DefaultRetryPolicy(ctx, resp, err)
		}}}})
	_, err = seamSend(t, trTLS, "GET", tlsSrv.URL+"/")
	// DefaultRetryPolicy returns no error of its own: the caller gets the
	// transport's, bare, as from any RoundTripper (http.Client wraps it).
	var ce *tls.CertificateVerificationError
	if asked.Load() != 1 || !errors.As(err, &ce) {
		t.Fatalf("DefaultRetryPolicy on an untrusted certificate: asked %d times, %v; want asked once, the certificate error", asked.Load(), err)
	}
}

// TestPrepareRetryError: an error from Retry.PrepareRetry ends the call
// before the retry is sent, and the caller can check for it.
func TestPrepareRetryError(t *testing.T) {
	srv, hits := countingServer(t, 503)
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	errExpired := errors.New("credentials expired")
	tr := seamNew(t, bulwark.Config{Base: base, Default: bulwark.Policy{Retry: bulwark.Retry{Backoff: noWait,
		PrepareRetry: func(*http.Request) error { return errExpired }}}})
	_, err := seamSend(t, tr, "GET", srv.URL+"/")
	var re *bulwark.RetryError
	if !errors.Is(err, errExpired) || !errors.As(err, &re) || re.Attempts != 1 || hits.Load() != 1 {
		t.Fatalf("PrepareRetry error: %v after %d requests; want a RetryError wrapping it after 1", err, hits.Load())
	}
}
