package bulwark

import (
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"testing/synctest"
	"time"
)

// Per authority: two ports of one host are two hosts with two states.
func TestHostStatePerAuthority(t *testing.T) {
	tr, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := url.Parse("http://127.0.0.1:8080/x")
	b, _ := url.Parse("http://127.0.0.1:9090/x")
	a2, _ := url.Parse("http://127.0.0.1:8080/y?q=1")
	c, _ := url.Parse("https://127.0.0.1:8080/x")
	if tr.lookup(a) == tr.lookup(b) {
		t.Error("127.0.0.1:8080 and 127.0.0.1:9090 share state")
	}
	if tr.lookup(a) != tr.lookup(a2) {
		t.Error("two URLs of one authority got two states")
	}
	if tr.lookup(a) == tr.lookup(c) {
		t.Error("http and https on one host:port share state")
	}
	if n := tr.hostCount(); n != 3 {
		t.Errorf("hostCount = %d, want 3", n)
	}
}

func TestHostStateBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, err := New(Config{MaxHosts: 64, HostIdle: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		hot, _ := url.Parse("http://hot.internal/")
		hotState := tr.lookup(hot)
		for i := 0; i < 10_000; i++ {
			// A churn of one new host per millisecond, while the hot host is
			// used every 20 ms.
			time.Sleep(time.Millisecond)
			tr.lookup(&url.URL{Scheme: "http", Host: "h" + strconv.Itoa(i) + ".example:80"})
			if i%20 == 0 {
				if tr.lookup(hot) != hotState {
					t.Fatalf("after %d hosts, a host in steady use lost its state to the churn", i+1)
				}
			}
			if n := tr.hostCount(); n > 64 {
				t.Fatalf("after %d hosts, hostCount = %d > MaxHosts 64", i+1, n)
			}
		}
		// Fill to the cap exactly; then, after HostIdle with no requests, one new
		// host clears every idle one instead of the least recently used alone.
		for i := 0; tr.hostCount() < 64; i++ {
			tr.lookup(&url.URL{Scheme: "http", Host: "fill" + strconv.Itoa(i) + ".example"})
		}
		time.Sleep(2 * time.Minute)
		tr.lookup(&url.URL{Scheme: "http", Host: "fresh.example"})
		if n := tr.hostCount(); n != 1 {
			t.Errorf("after HostIdle at the cap, hostCount = %d, want 1 (the new host only)", n)
		}
	})
}

// TestLastHostFastPath: the last-host shortcut in lookup gives the same
// state as the map for every spelling of a host, and never an evicted one.
func TestLastHostFastPath(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr, err := New(Config{MaxHosts: 8, HostIdle: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		a := &url.URL{Scheme: "http", Host: "a.example"}
		hs := tr.lookup(a)
		if tr.last.Load() != hs {
			t.Fatal("the host just looked up is not the last one")
		}
		for _, u := range []*url.URL{
			{Scheme: "http", Host: "A.EXAMPLE"},
			{Scheme: "HTTP", Host: "a.example:80"},
			{Scheme: "http", Host: "a.example"},
		} {
			if got := tr.lookup(u); got != hs {
				t.Errorf("%s://%s: another state than a.example's", u.Scheme, u.Host)
			}
		}
		if tr.last.Load() != hs {
			t.Error("other spellings displaced the state's own from the fast path")
		}
		// Seven more hosts fill the map; a.example, looked up last again, then
		// idles past HostIdle, and the next new host evicts every idle one:
		// the next request for a.example must get a fresh state, not the
		// evicted one.
		for i := 0; i < 7; i++ {
			tr.lookup(&url.URL{Scheme: "http", Host: "h" + strconv.Itoa(i) + ".example"})
		}
		if tr.lookup(a) != hs || tr.hostCount() != 8 {
			t.Fatalf("a.example lost its state before the map was full (%d hosts)", tr.hostCount())
		}
		time.Sleep(2 * time.Minute)
		tr.lookup(&url.URL{Scheme: "http", Host: "new.example"})
		// A lookup that found a.example in the map just before the eviction
		// may store it on the fast path just after.
		tr.last.Store(hs)
		if got := tr.lookup(a); got == hs {
			t.Error("a.example got its evicted state back")
		}
	})
}

// Eviction spares a host whose requests still hold bulkhead slots, so its
// next request does not get a second bulkhead beside the first.
func TestEvictionSparesBusyHosts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := &stubBase{}
		tr, err := New(Config{Base: base, MaxHosts: 16, HostIdle: time.Minute, Default: Policy{Timeout: Timeout{Disabled: true}}})
		if err != nil {
			t.Fatal(err)
		}
		busyURL, _ := url.Parse("http://busy.internal/")
		req, _ := http.NewRequest("GET", busyURL.String(), nil)
		resp, err := tr.RoundTrip(req) // holds a slot until the body is closed
		if err != nil {
			t.Fatal(err)
		}
		busy := tr.lookup(busyURL)
		time.Sleep(2 * time.Minute) // idle by the clock, but busy
		for i := 0; i < 200; i++ {
			time.Sleep(time.Millisecond)
			tr.lookup(&url.URL{Scheme: "http", Host: "churn" + strconv.Itoa(i) + ".example"})
		}
		if tr.lookup(busyURL) != busy {
			t.Error("a host with a slot held was evicted")
		}
		if in, _, _ := bulkheadStats(tr, "busy.internal:80"); in != 1 {
			t.Errorf("in flight = %d, want 1", in)
		}
		resp.Body.Close()
	})
}
