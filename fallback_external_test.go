package bulwark_test

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/bulwark-http/bulwark/bulwarktest"
)

// TestStaleNeverReplaysSetCookie: two callers of one bulwark client, over
// loopback. The first's answer sets a cookie; when the upstream fails, the
// second must not be handed that answer, cookie and all, as a stale one.
func TestStaleNeverReplaysSetCookie(t *testing.T) {
	u := bulwarktest.NewUpstream(map[string]bulwarktest.Script{"/home": {
		{Header: http.Header{"Set-Cookie": {"session=alice"}}, Body: "hello alice"},
		{Status: http.StatusServiceUnavailable, Body: "down"},
	}})
	srv := u.Start(t)
	client, err := bulwark.NewClient(bulwark.Config{Default: bulwark.Policy{
		Breaker:  bulwark.Breaker{Disabled: true},
		Retry:    bulwark.Retry{MaxAttempts: 1},
		Fallback: bulwark.Fallback{Stale: bulwark.StaleCache{MaxAge: time.Hour}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer client.CloseIdleConnections()
	call := func() (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL+"/home", nil)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	if resp, body := call(); resp.StatusCode != 200 || body != "hello alice" {
		t.Fatalf("first caller: %d %q", resp.StatusCode, body)
	}
	resp, body := call()
	if resp.Header.Get(bulwark.FallbackHeader) != "" || len(resp.Cookies()) != 0 {
		t.Fatalf("second caller got %d %q, %s %q, cookies %v; want the upstream's 503, not the first caller's answer",
			resp.StatusCode, body, bulwark.FallbackHeader, resp.Header.Get(bulwark.FallbackHeader), resp.Cookies())
	}
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("second caller: %d, want the 503", resp.StatusCode)
	}
}
