package bulwark_test

// Black-box tests of bulwark against bulwarktest's scripted upstream, over
// a real socket where connections matter and in memory, in a synctest
// bubble, where time does.

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/bulwark-http/bulwark/bulwarktest"
)

// noWait is a Backoff of no wait, for tests on a real server, which cannot
// run in a synctest bubble and would otherwise sleep.
func noWait(time.Duration, time.Duration, int, *http.Response) time.Duration { return 0 }

// The zero Config is a drop-in for http.DefaultClient.
func TestNewClientZeroConfig(t *testing.T) {
	u := bulwarktest.NewUpstream(map[string]bulwarktest.Script{"/orders": {{Body: "created"}}})
	srv := u.Start(t)
	c, err := bulwark.NewClient(bulwark.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseIdleConnections()
	resp, err := c.Post(srv.URL+"/orders", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "created" {
		t.Errorf("got %d %q, want 200 \"created\"", resp.StatusCode, b)
	}
	r := u.Requests()
	if len(r) != 1 || r[0].Method != "POST" || r[0].Body != "x" || r[0].Attempt != 1 {
		t.Errorf("upstream saw %+v, want one POST /orders with body x, attempt 1", r)
	}
}
