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
	} {
		got, id, err := decode(f.encode(u), now)
		if err != nil || id != "pod-1" || !got.Until.Equal(u.Until) {
			t.Fatalf("decode(encode(%+v)) = %+v, %q, %v", u, got, id, err)
		}
		got.Until = u.Until
		if got != u {
			t.Fatalf("decode(encode(%+v)) = %+v", u, got)
		}
	}
	ms := strconv.FormatInt(now.Add(time.Minute).UnixMilli(), 10)
	for _, v := range []string{
		"", "1", "garbage", "1|1|" + ms + "|1|0|0|id",
		"0|1|" + ms + "|1|0|0|id|h:80", "1|3|" + ms + "|1|0|0|id|h:80", "1|1|-1|1|0|0|id|h:80",
		"1|1|" + ms + "|x|0|0|id|h:80", "1|1|" + ms + "|1|2|0|id|h:80", "1|1|" + ms + "|1|0|5|id|h:80",
		"1|1|" + ms + "|1|0|0||h:80", "1|1|" + ms + "|1|0|0|id|h", "1|1|" + ms + "|1|0|0|id|:80",
		"1|1|" + ms + "|1|0|0|id|h:", "1|1|" + ms + "|1|0|0|id|h|x:80", "1|1|" + ms + "|1|0|0|id|h x:80",
		"1|1|" + strconv.FormatInt(now.Add(25*time.Hour).UnixMilli(), 10) + "|1|0|0|id|h:80",
		"1|1|99999999999999|1|0|0|id|h:80", "1|1| " + ms + "|1|0|0|id|h:80",
	} {
		if u, _, err := decode(v, now); err == nil {
			t.Errorf("decode(%q) = %+v, want an error", v, u)
		}
	}
}
