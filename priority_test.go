package bulwark

import (
	"context"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// TestPushbackSendsWithPriority: the priority WithPriority sets goes
// upstream as PriorityHeader on a copy of the request, only when the caller
// set no such header of its own, and the caller's request is never changed.
func TestPushbackSendsWithPriority(t *testing.T) {
	var got []string
	base := &scriptBase{step: func(_ int, req *http.Request) (*http.Response, error) {
		got = append(got, strings.Join(req.Header[PriorityHeader], ","))
		return response(req, 200), nil
	}}
	tr, _, _ := newTestTransport(t, base, Policy{})
	for _, tc := range []struct {
		name   string
		ctx    bool     // WithPriority(PriorityCritical)
		header []string // the caller's PriorityHeader
		want   string
	}{
		{"context only", true, nil, "critical"},
		{"header wins", true, []string{"low"}, "low"},
		{"unreadable header kept", true, []string{"urgent"}, "urgent"},
		{"empty header kept", true, []string{""}, ""},
		{"neither", false, nil, ""},
	} {
		got = nil
		ctx := t.Context()
		if tc.ctx {
			ctx = WithPriority(ctx, PriorityCritical)
		}
		req := testRequest(t, ctx, "GET", "http://a.test/", noBody, "")
		if tc.header != nil {
			req.Header[PriorityHeader] = slices.Clone(tc.header)
		}
		before := req.Header.Clone()
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		resp.Body.Close()
		if len(got) != 1 || got[0] != tc.want {
			t.Errorf("%s: upstream saw %s %q, want %q", tc.name, PriorityHeader, got, tc.want)
		}
		if !reflect.DeepEqual(req.Header, before) {
			t.Errorf("%s: caller's header changed to %v, was %v", tc.name, req.Header, before)
		}
	}
	// The copy keeps the RoundTripper contract: the caller's request
	// unchanged, its body closed, whatever the method and body.
	for _, cr := range contractRequests {
		var bs bodies
		req := newContractRequest(t, WithPriority(t.Context(), PriorityLow), "http://a.test/c", cr, &bs)
		if st, _, err := checkContract(t, tr, req, &bs); err != nil || st != 200 {
			t.Errorf("%s: %d, %v; want 200", cr.name, st, err)
		}
	}
}

// TestRequestPriority: the client and the Shedder read a request's
// priority alike: its header, then WithPriority, then its method.
func TestRequestPriority(t *testing.T) {
	ctx := WithPriority(t.Context(), PriorityLow)
	for _, tc := range []struct {
		ctx     context.Context
		method  string
		header  string
		want    Priority
		fromCtx bool
	}{
		{t.Context(), "GET", "", PriorityNormal, false},
		{t.Context(), "POST", "", PriorityHigh, false},
		{ctx, "POST", "", PriorityLow, true},
		{ctx, "GET", "Critical", PriorityCritical, false},
		{ctx, "GET", "urgent", PriorityLow, true},
		{WithPriority(t.Context(), 200), "GET", "", PriorityTest, true}, // out of range: the least
	} {
		req := httptest.NewRequestWithContext(tc.ctx, tc.method, "/", nil)
		if tc.header != "" {
			req.Header.Set(PriorityHeader, tc.header)
		}
		if p, fromCtx := requestPriority(req); p != tc.want || fromCtx != tc.fromCtx || RequestPriority(req) != tc.want {
			t.Errorf("requestPriority(%s, %q) = %v, %v; want %v, %v", tc.method, tc.header, p, fromCtx, tc.want, tc.fromCtx)
		}
	}
}
