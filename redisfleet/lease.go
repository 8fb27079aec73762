package redisfleet

import (
	"context"
	"errors"
	"math"
	"strconv"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/redis/go-redis/v9"
)

// quotaKeys are where a host's fleet quota lives: its token bucket (a
// hash: tokens, ts) and the processes that asked lately (a sorted set by
// the time of their last ask). The host is a hash tag, so on a Cluster
// both keys are in one slot and one script may touch them.
func (f *Fleet) quotaKeys(host string) []string {
	k := f.prefix + "quota:{" + host + "}"
	return []string{k, k + ":pods"}
}

// quotaPodsFor is how long a process counts among a quota's processes
// after its last ask: a few renewals, so a process that stopped asking
// soon leaves its share to the others.
const quotaPodsFor = time.Second

// maxQuotaPods bounds a quota's set of processes, whatever writes there.
const maxQuotaPods = 1024

// leaseScript is one lease, atomically: refill the bucket at ARGV[1]
// tokens a second since its last use, up to ARGV[2]; note the asking
// process (ARGV[4]) among the quota's processes; grant ARGV[3] tokens at
// most, and at most a fair share of two refills (so that the first to
// ask after a quiet spell cannot take the whole burst from the others);
// return {granted, processes}. Time is Redis's own (TIME), so the
// processes' clocks do not matter. What the keys hold is untrusted: a key
// of the wrong type is replaced, a count that does not parse or is out
// of range is read as an empty bucket (it refills within a burst's time),
// a time in the future as now. Every process writes its ask at Redis's
// now, so an ask dated later than now plus its lifetime (podsFor) was
// written by something else and is dropped; asks a little ahead of now
// are kept (a replica promoted with its clock behind reads its
// predecessor's asks so), but when the set is over its cap they go first,
// before the oldest asks. Both keys expire once the bucket would be
// full again and the process set stale, so a quota nobody uses leaves
// nothing behind.
var leaseScript = redis.NewScript(`
local rate, burst, want = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local podsFor, maxPods = tonumber(ARGV[5]), tonumber(ARGV[6])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then redis.call('DEL', KEYS[1]) end
if redis.call('TYPE', KEYS[2]).ok ~= 'zset' then redis.call('DEL', KEYS[2]) end
local v = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens, ts = tonumber(v[1]), tonumber(v[2])
if v[1] == false and v[2] == false then
	tokens, ts = burst, now
end
if tokens == nil or tokens ~= tokens or tokens < 0 then tokens = 0 end
if tokens > burst then tokens = burst end
if ts == nil or ts ~= ts or ts > now then ts = now end
tokens = math.min(burst, tokens + (now - ts) * rate / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - podsFor)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '(' .. (now + podsFor), '+inf')
redis.call('ZADD', KEYS[2], now, ARGV[4])
local pods = redis.call('ZCARD', KEYS[2])
if pods > maxPods then
	redis.call('ZREMRANGEBYSCORE', KEYS[2], '(' .. now, '+inf')
	pods = redis.call('ZCARD', KEYS[2])
end
if pods > maxPods then
	redis.call('ZREMRANGEBYRANK', KEYS[2], 0, pods - maxPods - 1)
	pods = maxPods
end
local share = math.max(1, math.ceil(burst / pods))
local grant = math.floor(math.min(want, tokens, share))
if grant < 0 then grant = 0 end
tokens = tokens - grant
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ts', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + podsFor)
redis.call('PEXPIRE', KEYS[2], podsFor * 2)
return {grant, pods}
`)

// Lease implements bulwark.FleetLeaser: one script run, bounded by
// Timeout. The reply is checked (two integers, in range) before it is
// believed, and the Transport clamps it again.
func (f *Fleet) Lease(ctx context.Context, r bulwark.LeaseRequest) (bulwark.LeaseGrant, error) {
	switch {
	case !(r.Rate > 0) || math.IsInf(r.Rate, 0) || r.Burst < 1 || r.Want < 0 || len(r.Host) > maxHost:
		return bulwark.LeaseGrant{}, errors.New("redisfleet: invalid lease request")
	}
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	res, err := leaseScript.Run(ctx, f.c, f.quotaKeys(r.Host),
		strconv.FormatFloat(r.Rate, 'g', -1, 64), r.Burst, r.Want, f.id,
		quotaPodsFor.Milliseconds(), maxQuotaPods).Int64Slice()
	if err != nil {
		f.reloadOnError(err)
		return bulwark.LeaseGrant{}, err
	}
	if len(res) != 2 || res[0] < 0 || res[0] > r.Want || res[1] < 1 || res[1] > maxQuotaPods {
		return bulwark.LeaseGrant{}, errCorrupt
	}
	return bulwark.LeaseGrant{Tokens: res[0], Pods: int(res[1])}, nil
}
