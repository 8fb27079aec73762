// Package redisfleet shares bulwark's per-host state (breaker counts and
// verdicts, pushback pauses, retry budgets, and rate-limit quotas by
// leases) between processes through Redis: a bulwark.Fleet and
// bulwark.FleetLeaser for Config.Fleet. It takes a redis.UniversalClient, so a single node,
// Sentinel and Cluster all work.
//
// Every Redis call runs on the Transport's two fleet goroutines, never on a
// request, each bounded by Options.Timeout. Each hold (an open verdict, a
// pause) is written once, with one script after a read of its key: the
// key of its state (the longest hold wins, as the decoder reads what is
// there; the key expires when the hold ends, so keys never accumulate)
// and a PUBLISH on one channel. A breaker's counts, stale in
// seconds, are only published; so is a breaker's close, with a script that
// deletes the key of the hold it ends when that is still the closing
// process's own. Other processes get it by pub/sub rather than polling: a
// trip reaches them in about a round trip, where polling would trade that
// delay against a read per process per interval whether or not anything
// happened. A process that was disconnected reads the keys again when it
// resubscribes, so nothing that is still in force is missed for longer
// than the reconnection takes; a heartbeat it publishes to itself tells it
// when a subscription that still answers no longer hears what is
// published (heartbeatEvery).
//
// What is read from Redis is untrusted: a value that does not parse, names
// an unknown version or kind, or is too long is ignored and counted
// (bulwark's FleetSnapshot.Ignored), and the Transport caps every hold by
// its own policy.
//
// The fleet's configuration travels the same way (configpush.go): PushConfig
// stores a file in config's format, for every process or a canary share of
// them (InCanary), and publishes that it changed; a ConfigFollower in each
// process reads it and applies it with config.Apply, so with
// Transport.Update, and records in Redis the version it runs or the error
// it refused it with (ConfigStatus; the command cmd/bulwarkctl shows it).
// The module requires the config module, not the other way round: the
// format knows nothing of Redis, and a program that reads its policies from
// a file has no Redis client in its build.
package redisfleet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/redis/go-redis/v9"
)

// Defaults for Options.
const (
	DefaultPrefix  = "bulwark:fleet:"
	DefaultTimeout = 200 * time.Millisecond
)

// Options configures a Fleet. The zero value is usable.
type Options struct {
	// Prefix namespaces every key and the channel, so that several fleets
	// (or environments) can share one Redis. Empty means DefaultPrefix.
	Prefix string
	// ID names this process in what it publishes, so it can skip its own
	// updates. Empty means a random one. At most 64 bytes, without '|'.
	ID string
	// Timeout bounds each Redis call. Zero means DefaultTimeout.
	Timeout time.Duration
}

// Fleet is a bulwark.Fleet over Redis. It is safe for concurrent use.
type Fleet struct {
	c       redis.UniversalClient
	prefix  string
	channel string
	id      string
	timeout time.Duration
}

// New returns a Fleet over c. It does not close c.
func New(c redis.UniversalClient, o Options) (*Fleet, error) {
	if c == nil {
		return nil, errors.New("redisfleet: nil client")
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if o.ID == "" {
		var b [8]byte
		_, _ = rand.Read(b[:])
		o.ID = hex.EncodeToString(b[:])
	}
	if len(o.ID) > maxID || strings.ContainsAny(o.ID, "|\r\n") {
		return nil, errors.New("redisfleet: ID must be at most 64 bytes, without '|' or line breaks")
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	return &Fleet{c: c, prefix: o.Prefix, channel: o.Prefix + "updates", id: o.ID, timeout: o.Timeout}, nil
}

// Limits on what is read from Redis.
const (
	maxValue   = 512
	maxID      = 64
	maxHost    = 300
	maxCatchUp = 4096 // keys read when (re)subscribing
	maxHold    = 24 * time.Hour
	// heartbeatEvery is how often a subscribed process publishes a
	// heartbeat, by the command connections, on a channel of its own that
	// its subscription listens to as well; a heartbeat not heard back when
	// the next is due ends the subscription. It tests the whole path a
	// trip takes, so a partitioned server, and a subscription left on a
	// node that no longer gets what is published (a master demoted by a
	// Sentinel failover still answers PING), are noticed within about two
	// of these. It costs one PUBLISH a second a process, heard by that
	// process alone.
	heartbeatEvery = time.Second
)

// key is where the state an update describes lives.
func (f *Fleet) key(u bulwark.FleetUpdate) string {
	switch {
	case u.Kind == bulwark.FleetBreakerOpen || u.Kind == bulwark.FleetBreakerClosed:
		return f.prefix + "breaker:" + u.Host
	case u.Shed:
		return f.prefix + "pause:" + u.Priority.String() + ":" + u.Host
	}
	return f.prefix + "pause:" + u.Host
}

// encode writes an update as
// "1|kind|until-ms|generation|shed|priority|calls,failures,slow|id|host",
// with a fourth count, retries, for budget counts:
// the host last, since it is the only field that could hold a '|'.
func (f *Fleet) encode(u bulwark.FleetUpdate) string {
	shed := "0"
	if u.Shed {
		shed = "1"
	}
	counts := strconv.FormatInt(u.Calls, 10) + "," + strconv.FormatInt(u.Failures, 10) + "," + strconv.FormatInt(u.Slow, 10)
	if u.Kind == bulwark.FleetBudgetCounts {
		counts += "," + strconv.FormatInt(u.Retries, 10) // a fourth count, for this kind only
	}
	return strings.Join([]string{"1", strconv.Itoa(int(u.Kind)), strconv.FormatInt(u.Until.UnixMilli(), 10),
		strconv.FormatUint(u.Generation, 10), shed, strconv.Itoa(int(u.Priority)), counts, f.id, u.Host}, "|")
}

var errCorrupt = errors.New("redisfleet: corrupt value")

// decode parses and validates a value read from Redis; it returns the
// publisher's ID too.
func decode(s string, now time.Time) (bulwark.FleetUpdate, string, error) {
	var u bulwark.FleetUpdate
	if len(s) > maxValue {
		return u, "", errCorrupt
	}
	p := strings.SplitN(s, "|", 9)
	if len(p) != 9 || p[0] != "1" {
		return u, "", errCorrupt
	}
	c := strings.Split(p[6], ",")
	if len(c) != 3 && len(c) != 4 {
		return u, "", errCorrupt
	}
	calls, errC := smallUint(c[0], 8)
	fails, errF := smallUint(c[1], 8)
	slow, errS := smallUint(c[2], 8)
	var retries uint64
	var errR error
	if len(c) == 4 {
		retries, errR = smallUint(c[3], 8)
		if p[1] != strconv.Itoa(int(bulwark.FleetBudgetCounts)) {
			errR = errCorrupt // a fourth count belongs to budget counts only
		}
	}
	if errors.Join(errC, errF, errS, errR) != nil || fails > calls || slow > calls {
		return u, "", errCorrupt
	}
	u.Calls, u.Failures, u.Slow, u.Retries = int64(calls), int64(fails), int64(slow), int64(retries)
	p = append(p[:6], p[7:]...)
	kind, err1 := smallUint(p[1], 1)
	until, err2 := smallUint(p[2], 13)
	gen, err3 := smallUint(p[3], 19)
	prio, err4 := smallUint(p[5], 1)
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return u, "", errCorrupt
	}
	u.Kind, u.Generation, u.Priority = bulwark.FleetKind(kind), gen, bulwark.Priority(prio)
	u.Until = time.UnixMilli(int64(until))
	switch {
	case u.Kind != bulwark.FleetBreakerOpen && u.Kind != bulwark.FleetPushback && u.Kind != bulwark.FleetBreakerCounts &&
		u.Kind != bulwark.FleetBudgetCounts && u.Kind != bulwark.FleetBreakerClosed:
		return u, "", errCorrupt
	case p[4] != "0" && p[4] != "1":
		return u, "", errCorrupt
	case u.Priority >= bulwark.NumPriorities:
		return u, "", errCorrupt
	case u.Until.After(now.Add(maxHold)):
		return u, "", errCorrupt
	case p[6] == "" || len(p[6]) > maxID:
		return u, "", errCorrupt
	}
	u.Shed = p[4] == "1"
	u.Host, u.From = p[7], p[6]
	if len(u.Host) > maxHost || strings.ContainsAny(u.Host, " \t\r\n|/") {
		return u, "", errCorrupt
	}
	if h, port, err := net.SplitHostPort(u.Host); err != nil || h == "" || port == "" {
		return u, "", errCorrupt
	}
	return u, p[6], nil
}

// smallUint parses up to digits decimal digits, nothing else.
func smallUint(s string, digits int) (uint64, error) {
	if s == "" || len(s) > digits {
		return 0, errCorrupt
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, errCorrupt
		}
	}
	return strconv.ParseUint(s, 10, 64)
}

// publishScript sets KEYS[1] to ARGV[1], expiring in ARGV[2] ms, and
// publishes it on ARGV[3], if the key still holds what Publish read there:
// ARGV[4] is "w" when that was not a string (it is replaced, as the lease
// script replaces keys of the wrong type), or "s" when it was the string
// whose first ARGV[5]+1 bytes are ARGV[6] (no key reads as ""). It returns
// 1, or 0 when the key changed meanwhile. Whether what the key holds is a
// longer hold to keep is the Go decoder's decision, taken in Publish, not
// a second parser here that could accept what the decoder rejects.
var publishScript = redis.NewScript(`
local t = redis.call('TYPE', KEYS[1]).ok
if ARGV[4] == 'w' then
	if t == 'string' or t == 'none' then return 0 end
elseif (t ~= 'string' and t ~= 'none') or redis.call('GETRANGE', KEYS[1], 0, ARGV[5]) ~= ARGV[6] then
	return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('PUBLISH', ARGV[3], ARGV[1])
return 1
`)

// publishTries bounds the reads and writes of one Publish when other pods
// change the key in between.
const publishTries = 3

// Publish implements bulwark.Fleet: for a hold, a read of its key and one
// script run, bounded by Timeout. The longest hold wins: a hold the key
// already holds until later is kept, and anything else there (nothing,
// a shorter hold, a value that does not decode, a key of another type) is
// overwritten. A breaker's close (bulwark.FleetBreakerClosed) is a read
// and a script run too: it deletes the host's breaker key only when that
// holds this process's own hold of the closed generation, and is
// published whatever the key holds (see publishClosed). Counts are only
// published.
func (f *Fleet) Publish(ctx context.Context, u bulwark.FleetUpdate) (err error) {
	ttl := time.Until(u.Until).Milliseconds()
	if ttl <= 0 {
		return nil // over already: nothing to tell
	}
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	defer func() { f.reloadOnError(err) }()
	v := f.encode(u)
	if u.Kind == bulwark.FleetBreakerCounts || u.Kind == bulwark.FleetBudgetCounts {
		// Counts go stale within seconds: published, not kept.
		return f.c.Publish(ctx, f.channel, v).Err()
	}
	if u.Kind == bulwark.FleetBreakerClosed {
		return f.publishClosed(ctx, u, v)
	}
	key := f.key(u)
	for range publishTries {
		// At most maxValue+1 bytes: a longer value is corrupt whatever
		// follows, and a hostile one may be large.
		cur, err := f.c.GetRange(ctx, key, 0, maxValue).Result()
		held := "s"
		switch {
		case isWrongType(err):
			held = "w"
		case err != nil:
			return err
		default:
			if old, _, derr := decode(cur, time.Now()); derr == nil && old.Kind == u.Kind && f.key(old) == key &&
				old.Until.UnixMilli() >= u.Until.UnixMilli() {
				return nil // a hold at least as long is in force
			}
		}
		done, err := publishScript.Run(ctx, f.c, []string{key}, v, ttl, f.channel, held, maxValue, cur).Int()
		if err != nil || done == 1 {
			return err
		}
	}
	return errors.New("redisfleet: hold changed by others during each of " + strconv.Itoa(publishTries) + " tries")
}

// closeScript publishes ARGV[1] on ARGV[2], and first deletes KEYS[1]
// when it is the string ARGV[3] (not empty): the hold Publish read there
// and found to be this process's own, of the generation that closed. A
// key changed meanwhile (another process's longer hold) is left alone.
var closeScript = redis.NewScript(`
if ARGV[3] ~= '' and redis.call('TYPE', KEYS[1]).ok == 'string' and
	redis.call('STRLEN', KEYS[1]) == #ARGV[3] and redis.call('GET', KEYS[1]) == ARGV[3] then
	redis.call('DEL', KEYS[1])
end
redis.call('PUBLISH', ARGV[2], ARGV[1])
return 1
`)

// publishClosed is Publish of a FleetBreakerClosed (encoded as v): a read
// of the host's breaker key and one script run. The key goes when it
// still holds this process's hold of the generation that closed, so a
// process that starts later does not adopt a hold that ended; another
// process's hold there (a later trip, a longer hold), a value the decoder
// rejects, or a key of another type, stays, as the sink would keep a hold
// from another process, and the readers of the garbage go on ignoring and
// counting it. The close is published either way: the receivers end only
// a hold adopted from this process's trip of that generation.
func (f *Fleet) publishClosed(ctx context.Context, u bulwark.FleetUpdate, v string) error {
	key := f.key(u)
	mine := ""
	cur, err := f.c.GetRange(ctx, key, 0, maxValue).Result()
	switch {
	case isWrongType(err):
	case err != nil:
		return err
	default:
		if old, id, derr := decode(cur, time.Now()); derr == nil && id == f.id && old.Kind == bulwark.FleetBreakerOpen &&
			f.key(old) == key && old.Generation == u.Generation {
			mine = cur
		}
	}
	return closeScript.Run(ctx, f.c, []string{key}, v, f.channel, mine).Err()
}

// reloadOnError has a Cluster client reload its map of the slots after a
// call failed. go-redis reloads it on its own only every
// ClusterStateReloadInterval (a minute by default) or on a MOVED reply, and
// a master that died answers nothing: without this, the subscription and
// the leases would keep asking the dead node until the next reload, though
// its replica took over seconds after. The reload runs in the background,
// coalesced, so calling this on every failure costs one at a time.
func (f *Fleet) reloadOnError(err error) {
	if err == nil {
		return
	}
	if cc, ok := f.c.(*redis.ClusterClient); ok {
		cc.ReloadState(context.Background())
	}
}

// isWrongType reports whether err is Redis's answer for a key of another
// type than the command's.
func isWrongType(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && strings.HasPrefix(re.Error(), "WRONGTYPE")
}

// Receive implements bulwark.Fleet: it subscribes to the channel, reads the
// state still held under the prefix, then hands the sink each update
// published, until ctx is done or the connection fails.
func (f *Fleet) Receive(ctx context.Context, sink *bulwark.FleetSink) (err error) {
	defer func() {
		if ctx.Err() == nil {
			f.reloadOnError(err)
		}
	}()
	ps := f.c.Subscribe(ctx)
	defer ps.Close()
	// A blocked read returns when ctx is done, not only at its timeout.
	stop := context.AfterFunc(ctx, func() { _ = ps.Close() })
	defer stop()
	heartbeats := f.prefix + "heartbeat:" + f.id
	sctx, cancel := context.WithTimeout(ctx, f.timeout)
	err = ps.Subscribe(sctx, f.channel, heartbeats)
	for range 2 { // the subscriptions' confirmations
		if err == nil {
			_, err = ps.ReceiveTimeout(sctx, f.timeout)
		}
	}
	cancel()
	if err != nil {
		return err
	}
	sink.Connected()
	if err := f.catchUp(ctx, sink); err != nil {
		return err
	}
	var beat uint64
	heard, next := true, time.Now()
	for {
		if time.Until(next) <= 0 {
			if !heard {
				return errors.New("redisfleet: own heartbeat not heard back: the subscription no longer gets what is published")
			}
			beat++
			heard, next = false, time.Now().Add(heartbeatEvery)
			pctx, cancel := context.WithTimeout(ctx, f.timeout)
			err := f.c.Publish(pctx, heartbeats, strconv.FormatUint(beat, 10)).Err()
			cancel()
			if err != nil {
				return err
			}
		}
		// At least a millisecond: a zero timeout would block.
		msg, err := ps.ReceiveTimeout(ctx, max(time.Until(next), time.Millisecond))
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				return err
			}
			continue
		}
		m, ok := msg.(*redis.Message)
		switch {
		case !ok:
		case m.Channel == heartbeats:
			heard = heard || m.Payload == strconv.FormatUint(beat, 10)
		default:
			f.deliver(m.Payload, sink, time.Now())
		}
	}
}

// deliver hands one value read from Redis to the sink, or counts it.
func (f *Fleet) deliver(v string, sink *bulwark.FleetSink, now time.Time) {
	u, id, err := decode(v, now)
	if err != nil {
		sink.Invalid(err)
		return
	}
	if id == f.id {
		return
	}
	sink.Apply(u)
}

// catchUp reads every key under the prefix (at most maxCatchUp per
// node), on every master of a Cluster. A value whose key does not match it
// is ignored.
func (f *Fleet) catchUp(ctx context.Context, sink *bulwark.FleetSink) error {
	ctx, cancel := context.WithTimeout(ctx, 10*f.timeout)
	defer cancel()
	scan := func(ctx context.Context, c redis.Cmdable) error {
		var cursor uint64
		read := 0
		for read < maxCatchUp {
			keys, next, err := c.Scan(ctx, cursor, f.prefix+"*", 256).Result()
			if err != nil {
				return err
			}
			keys = keys[:min(len(keys), maxCatchUp-read)]
			read += len(keys)
			// A quota's keys (lease.go) and the configuration's
			// (configpush.go) are no update to catch up on.
			keys = slices.DeleteFunc(keys, func(k string) bool {
				return strings.HasPrefix(k, f.prefix+"quota:") || f.isConfigKey(k)
			})
			if len(keys) > 0 {
				cmds := make([]*redis.StringCmd, len(keys))
				pipe := c.Pipeline()
				for i, k := range keys {
					cmds[i] = pipe.GetRange(ctx, k, 0, maxValue) // longer is corrupt
				}
				_, _ = pipe.Exec(ctx)
				now := time.Now()
				for i, cmd := range cmds {
					v, err := cmd.Result()
					if err == nil && v == "" {
						continue // expired meanwhile
					}
					if err != nil {
						if ctx.Err() != nil {
							return err
						}
						sink.Invalid(err) // not a string, for one
						continue
					}
					u, id, derr := decode(v, now)
					// A close is published, never kept under a key.
					if derr != nil || u.Kind == bulwark.FleetBreakerClosed || f.key(u) != keys[i] {
						sink.Invalid(errCorrupt)
						continue
					}
					if id != f.id {
						sink.Apply(u)
					}
				}
			}
			if cursor = next; cursor == 0 {
				return nil
			}
		}
		return nil
	}
	if cc, ok := f.c.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return scan(ctx, n) })
	}
	return scan(ctx, f.c)
}
