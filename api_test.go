package bulwark

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// statusBase answers each attempt with the next status of its script (the
// last one repeats), counting what it was sent.
type statusBase struct {
	mu     sync.Mutex
	codes  []int
	header http.Header // added to every response
	reqs   []*http.Request
	closed int // response bodies closed
}

func (b *statusBase) RoundTrip(req *http.Request) (*http.Response, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	i := min(len(b.reqs), len(b.codes)-1)
	b.reqs = append(b.reqs, req)
	h := http.Header{}
	for k, v := range b.header {
		h[k] = v
	}
	return &http.Response{StatusCode: b.codes[i], Header: h, Request: req,
		Body: &closeCountBody{Reader: strings.NewReader("body"), closed: &b.closed, mu: &b.mu}}, nil
}

func (b *statusBase) sent() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.reqs)
}

type closeCountBody struct {
	io.Reader
	mu     *sync.Mutex
	closed *int
}

func (c *closeCountBody) Close() error {
	c.mu.Lock()
	*c.closed++
	c.mu.Unlock()
	return nil
}

func sendOnce(t *testing.T, rt http.RoundTripper, method, url string) (int, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}
