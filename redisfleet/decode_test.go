package redisfleet

import (
	"strconv"
	"testing"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/redis/go-redis/v9"
)

// TestEncodeDecode: what a Fleet writes reads back the same, and every
// malformed value is refused.
func TestEncodeDecode(t *testing.T) {
	now := time.Now()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer c.Close()
	f, err := New(c, Options{ID: "pod-1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []bulwark.FleetUpdate{
		{Kind: bulwark.FleetBreakerOpen, Host: "api.test:443", Until: now.Add(time.Minute).Truncate(time.Millisecond), Generation: 3},
		{Kind: bulwark.FleetPushback, Host: "[::1]:8080", Until: now.Add(time.Second).Truncate(time.Millisecond), Shed: true, Priority: bulwark.PriorityLow},
		{Kind: bulwark.FleetBreakerClosed, Host: "api.test:443", Until: now.Add(5 * time.Second).Truncate(time.Millisecond), Generation: 2},
	} {
		got, id, err := decode(f.encode(u), now)
		if err != nil || id != "pod-1" || !got.Until.Equal(u.Until) {
			t.Fatalf("decode(encode(%+v)) = %+v, %q, %v", u, got, id, err)
		}
		got.Until = u.Until
		if got.From != "pod-1" {
			t.Fatalf("From %q, want the publisher's ID", got.From)
		}
		got.From = ""
		if got != u {
			t.Fatalf("decode(encode(%+v)) = %+v", u, got)
		}
	}
	ms := strconv.FormatInt(now.Add(time.Minute).UnixMilli(), 10)
	ok := "1|3|" + ms + "|0|0|0|10,5,1|id|h:80"
	if u, id, err := decode(ok, now); err != nil || id != "id" || u.From != "id" || u.Calls != 10 || u.Failures != 5 || u.Slow != 1 {
		t.Fatalf("decode(%q) = %+v, %q, %v", ok, u, id, err)
	}
	budget := bulwark.FleetUpdate{Kind: bulwark.FleetBudgetCounts, Host: "h:80", Until: now.Add(time.Second), Calls: 10, Retries: 25}
	if u, _, err := decode(f.encode(budget), now); err != nil || u.Kind != bulwark.FleetBudgetCounts || u.Calls != 10 || u.Retries != 25 {
		t.Fatalf("budget counts round trip: %+v, %v", u, err)
	}
	pre := "1|1|" + ms + "|1|0|0|0,0,0|"
	for _, v := range []string{
		"", "1", "garbage", "1|1|" + ms + "|1|0|0|0,0,0|id",
		"0|1|" + ms + "|1|0|0|0,0,0|id|h:80", "1|6|" + ms + "|1|0|0|0,0,0|id|h:80", "1|0|" + ms + "|1|0|0|0,0,0|id|h:80", "1|1|-1|1|0|0|0,0,0|id|h:80",
		"1|1|" + ms + "|x|0|0|0,0,0|id|h:80", "1|1|" + ms + "|1|2|0|0,0,0|id|h:80", "1|1|" + ms + "|1|0|5|0,0,0|id|h:80",
		pre + "|h:80", pre + "id|h", pre + "id|:80", pre + "id|h:", pre + "id|h|x:80", pre + "id|h x:80",
		"1|1|" + strconv.FormatInt(now.Add(25*time.Hour).UnixMilli(), 10) + "|1|0|0|0,0,0|id|h:80",
		"1|1|99999999999999|1|0|0|0,0,0|id|h:80", "1|1| " + ms + "|1|0|0|0,0,0|id|h:80",
		"1|3|" + ms + "|0|0|0|10,11,0|id|h:80", "1|3|" + ms + "|0|0|0|10,1,11|id|h:80",
		"1|3|" + ms + "|0|0|0|10,1|id|h:80", "1|3|" + ms + "|0|0|0|-1,0,0|id|h:80",
		"1|3|" + ms + "|0|0|0|999999999,0,0|id|h:80", "1|4|" + ms + "|0|0|0|1,0,0,999999999|id|h:80",
		"1|4|" + ms + "|0|0|0|1,0,0,x|id|h:80", "1|4|" + ms + "|0|0|0|1,0,0,1,1|id|h:80", "1|3|" + ms + "|0|0|0|1,0,0,0|id|h:80",
	} {
		if u, _, err := decode(v, now); err == nil {
			t.Errorf("decode(%q) = %+v, want an error", v, u)
		}
	}
}
