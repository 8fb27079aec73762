package redisfleet

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/bulwark-http/bulwark/config"
	"github.com/redis/go-redis/v9"
)

// A fleet's configuration lives in one Redis hash, Prefix+"config", so
// that a push, a promotion and a rollback are each one script, atomic on a
// single node and on a Cluster alike. Its fields:
//
//	epoch                          random, set by the first push into an empty store
//	seq                            bumped by every change; epoch:seq names a state
//	stable.version, stable.data    what every process outside a canary runs
//	canary.version, canary.data    what the canary's processes run, if any
//	canary.share                   the canary's share, in basis points (1-9999)
//	previous.version, previous.data  the stable configuration a rollback returns to
//
// Each change publishes epoch:seq on Prefix+"config:push"; a process that
// hears it (or notices seq moved when it reads again, see
// FollowOptions.Resync) reads the hash again. The epoch tells apart two
// states with one seq: a Redis that restarted empty counts from 1 again.
//
// What each process runs or refused is in the hash Prefix+"config:{acks}",
// one JSON value (an ack) per process ID, with the sorted set
// Prefix+"config:{acks}:seen" of when each process last wrote: an entry
// not refreshed for ackStale is dropped by the next write, so the IDs of
// processes long gone do not accumulate. The two share a hash tag, so a
// script may touch both on a Cluster.

// Limits on the configuration store, on what is read from it as on what is
// written.
const (
	maxConfigVersion = 256 // bytes of a version; config versions are dates, tags, hashes
	maxAck           = 2048
	maxAckError      = 1024 // bytes of an error kept in an ack
	maxAcks          = 4096 // processes read by ConfigStatus
	// ackRefresh is how often a following process writes its ack again when
	// nothing changed, so that a status shows which processes are alive;
	// ackStale is when an ack not refreshed is dropped.
	ackRefresh = 30 * time.Second
	ackStale   = 10 * time.Minute
)

// Canary shares are stored in basis points: 10000 is the whole fleet.
const shareScale = 10000

// ErrNoConfig is returned by PromoteConfig when no canary is in progress
// and by RollbackConfig when there is nothing to roll back to.
var ErrNoConfig = errors.New("redisfleet: no configuration to promote or roll back to")

// ErrCanaryShare is returned by PushConfig for a PushOptions.Canary that
// is not a canary share of the fleet: outside [0.0001, 0.9999] (one basis
// point to all but one), or not a number; and for a canary smaller than
// the fleet's first canary while that runs (see PushConfig). Nothing is
// stored.
var ErrCanaryShare = errors.New("redisfleet: canary share out of range")

func (f *Fleet) configKey() string         { return f.prefix + "config" }
func (f *Fleet) configChannel() string     { return f.prefix + "config:push" }
func (f *Fleet) ackKeys() []string         { k := f.prefix + "config:{acks}"; return []string{k, k + ":seen"} }
func (f *Fleet) isConfigKey(k string) bool { return strings.HasPrefix(k, f.prefix+"config") }

// InCanary reports whether the process named id is in a canary of the given
// share of the fleet (0 to 1). The choice is deterministic, so an operator
// can tell beforehand which processes a canary reaches, and monotonic: a
// process in a canary of 10 % is in every larger one. A process is in when
// the first 8 bytes of SHA-256(id), read as a big-endian number, modulo
// 10000, are below share × 10000 (rounded down, once float error is
// rounded away: 0.29 is 2900 basis points); a share of NaN or 0 takes no
// process, 1 or more every one. Processes whose Options.ID
// is random change places at each start: name them (a pod's name) for a
// canary that reaches the same processes every time.
func InCanary(id string, share float64) bool {
	return inCanary(id, shareBP(share))
}

func inCanary(id string, bp int) bool {
	sum := sha256.Sum256([]byte(id))
	return int(binary.BigEndian.Uint64(sum[:8])%shareScale) < bp
}

// shareBP is a share in basis points; a share of 1 or more is the whole
// fleet, one that is not above 0 (or not a number) none of it. The product
// is rounded down after adding a millionth of a basis point (shareSlack):
// a share written in decimal, as 0.29, is a binary float a hair below it
// (0.29 × 10000 is 2899.9999999999995), and is meant as 2900.
func shareBP(share float64) int {
	if !(share > 0) {
		return 0
	}
	if share >= 1 {
		return shareScale
	}
	return min(int(math.Floor(share*shareScale+shareSlack)), shareScale)
}

// shareSlack is the float error, in basis points, a share may carry.
const shareSlack = 1e-6

// validShare reports whether a canary share is in [0.0001, 0.9999], up to
// shareSlack: 0.99999 is refused, not rounded down to 0.9999, and 99.99/100
// (a float a hair off 0.9999) is taken.
func validShare(share float64) bool {
	bp := share * shareScale
	return bp >= 1-shareSlack && bp <= shareScale-1+shareSlack
}

// PushOptions configures PushConfig. The zero value pushes to every
// process, after validating the bytes with an empty Registry.
type PushOptions struct {
	// Canary, when set, is the share of the processes that get the
	// configuration first, a fraction from 0.0001 (one basis point) to
	// 0.9999: 0.1 is a tenth (see InCanary); the others keep the stable one
	// until PromoteConfig. A share between basis points is rounded down.
	// Zero pushes to every process, making it the stable configuration and
	// the one it replaces the previous, for RollbackConfig. Any other value
	// is refused with ErrCanaryShare and nothing stored: 1 and more (10
	// meant as 10 %, or a whole fleet asked for as a canary), above 0.9999
	// (0.99999), under 0.0001, negative, NaN or an infinity.
	Canary float64
	// Registry validates the bytes as config.Parse does; the processes
	// validate them again with their own.
	Registry config.Registry
	// Unchecked skips that validation: for a file that names functions of
	// the programs' registries, which the pusher does not have. The
	// processes still validate, and refuse what they cannot apply (see
	// ConfigStatus). Only the size is checked then, and that the file
	// holds a Config: one with nothing but whitespace, a byte-order mark,
	// comments or a document marker, or whose document is not a mapping,
	// is refused, as every process would refuse it.
	Unchecked bool
}

// Pushed is the store's state after a change: its sequence number and the
// versions it holds.
type Pushed struct {
	Seq      int64
	Version  string // the version pushed, promoted, or rolled back to
	Canary   bool   // a canary holds it, not the stable configuration
	Previous string // the version a rollback would return to, if any
}

// PushConfig stores data, a configuration file's bytes in config's format,
// as the fleet's configuration and tells every following process (see
// FollowConfig); each applies it with Transport.Update, or refuses it, and
// records which in Redis (ConfigStatus). It is validated first, with
// o.Registry, unless o.Unchecked; a refusal there stores nothing. Its
// version is config.VersionOf's: the file's version field, also when the
// rest does not decode, or a hash of the bytes.
//
// A push to the whole fleet (o.Canary zero) replaces a canary in progress.
// So does a canary push, with one rule: while the fleet's first canary
// runs (no stable version was ever pushed), a canary may not reach fewer
// processes than it. The processes it would leave have no stable version
// to return to; they would keep running one the store no longer holds.
// Such a push is refused with ErrCanaryShare, nothing stored: push the
// same share or a larger one, promote the canary, or push to every
// process.
func (f *Fleet) PushConfig(ctx context.Context, data []byte, o PushOptions) (Pushed, error) {
	mode, bp := "full", shareScale
	if o.Canary != 0 {
		mode, bp = "canary", shareBP(o.Canary)
		if !validShare(o.Canary) {
			return Pushed{}, fmt.Errorf("%w: %v; want a fraction from 0.0001 (one basis point) to 0.9999, as 0.1 for a tenth of the processes; 0 pushes to all of them", ErrCanaryShare, o.Canary)
		}
	}
	if len(data) > config.MaxBytes {
		return Pushed{}, fmt.Errorf("redisfleet: configuration of %d bytes, more than config.MaxBytes (%d)", len(data), config.MaxBytes)
	}
	if len(bytes.TrimSpace(bytes.TrimPrefix(data, []byte("\ufeff")))) == 0 {
		return Pushed{}, errors.New("redisfleet: empty configuration")
	}
	if _, err := config.Parse(data, "push", o.Registry); err != nil && (!o.Unchecked || holdsNoConfig(err)) {
		return Pushed{}, err
	}
	// As the processes name it, also when they refuse it.
	version := config.VersionOf(data)
	if err := checkVersion(version); err != nil {
		return Pushed{}, err
	}
	return f.changeConfig(ctx, mode, version, data, bp)
}

// PromoteConfig makes the canary in progress the stable configuration, so
// every process runs it; the stable one becomes the previous. It returns
// ErrNoConfig when no canary is in progress.
func (f *Fleet) PromoteConfig(ctx context.Context) (Pushed, error) {
	return f.changeConfig(ctx, "promote", "", nil, 0)
}

// RollbackConfig ends a canary in progress, its processes returning to the
// stable configuration; with no canary, it makes the previous
// configuration the stable one again, once (the one rolled back from is
// dropped). It returns ErrNoConfig when there is nothing to roll back to,
// changing nothing: also for a canary that is the fleet's first
// configuration, whose processes have no pushed version to return to (a
// process never returns to the configuration it was built with: the store
// does not hold it). Push a version to every process to replace it.
func (f *Fleet) RollbackConfig(ctx context.Context) (Pushed, error) {
	return f.changeConfig(ctx, "rollback", "", nil, 0)
}

// holdsNoConfig reports whether config.Parse refused a file for holding
// no Config at all: only comments or a document marker (config's "empty
// file"), or a document that is not a mapping (null, a list, a number).
// Every process refuses such a file whatever its Registry, so an
// unchecked push does too. These are config's own messages for the file
// as a whole, matched rather than decoded twice; TestPushNoConfig holds
// them.
func holdsNoConfig(err error) bool {
	var ce *config.Error
	return errors.As(err, &ce) && ce.Field == "" &&
		(strings.HasPrefix(ce.Msg, "empty file") || strings.HasPrefix(ce.Msg, "want a mapping of Config's fields"))
}

func checkVersion(v string) error {
	if v == "" || len(v) > maxConfigVersion || !utf8.ValidString(v) || strings.ContainsFunc(v, func(r rune) bool { return r < ' ' || r == 0x7f }) {
		return fmt.Errorf("redisfleet: version %.40q: want 1 to %d bytes of printable UTF-8", v, maxConfigVersion)
	}
	return nil
}

// changeScript is one change of the store, atomically: ARGV[1] is the mode
// (full, canary, promote, rollback), ARGV[2] and ARGV[3] the version and
// bytes, ARGV[4] the canary share, ARGV[5] the channel, ARGV[6] an epoch
// for a store that has none (or one it did not make). A key of another
// type is replaced. It returns
// {seq, version, canary (0/1), previous version}, or an error reply
// "NOCONFIG" when a promotion or rollback has nothing to act on, or
// "NOSTABLE <canary's version>" when a rollback would end a canary with
// no stable configuration for its processes to return to, or
// "SHRINK <share> <canary's version>" when a canary push, with no stable
// configuration, would reach fewer processes than the canary it replaces.
var changeScript = redis.NewScript(`
local k = KEYS[1]
local t = redis.call('TYPE', k).ok
if t ~= 'hash' and t ~= 'none' then redis.call('DEL', k) end
local function get(f) return redis.call('HGET', k, f) end
local function move(from, to)
	local v, d = get(from .. '.version'), get(from .. '.data')
	if v and d then
		redis.call('HSET', k, to .. '.version', v, to .. '.data', d)
	else
		redis.call('HDEL', k, to .. '.version', to .. '.data')
	end
end
local function drop(s) redis.call('HDEL', k, s .. '.version', s .. '.data', s .. '.share') end
local mode, version, canary = ARGV[1], ARGV[2], 0
if mode == 'full' then
	-- The same bytes again keep the previous version to roll back to.
	if get('stable.data') ~= ARGV[3] then move('stable', 'previous') end
	redis.call('HSET', k, 'stable.version', ARGV[2], 'stable.data', ARGV[3])
	drop('canary')
elseif mode == 'canary' then
	local old = tonumber(get('canary.share'))
	if old and tonumber(ARGV[4]) < old and get('canary.version') and not get('stable.version') then
		return redis.error_reply('SHRINK ' .. get('canary.share') .. ' ' .. get('canary.version'))
	end
	redis.call('HSET', k, 'canary.version', ARGV[2], 'canary.data', ARGV[3], 'canary.share', ARGV[4])
	canary = 1
elseif mode == 'promote' then
	if not (get('canary.version') and get('canary.data')) then return redis.error_reply('NOCONFIG') end
	move('stable', 'previous')
	move('canary', 'stable')
	drop('canary')
	version = get('stable.version')
elseif mode == 'rollback' then
	if get('canary.version') or get('canary.data') then
		if not (get('stable.version') and get('stable.data')) then
			return redis.error_reply('NOSTABLE ' .. (get('canary.version') or ''))
		end
		drop('canary')
	elseif get('previous.version') and get('previous.data') then
		move('previous', 'stable')
		drop('previous')
	else
		return redis.error_reply('NOCONFIG')
	end
	version = get('stable.version') or ''
else
	return redis.error_reply('unknown mode')
end
local e = get('epoch')
if not e or #e > 32 or not string.match(e, '^[0-9a-f]+$') then
	-- None yet, or not one of ours: a hint naming it would be ignored.
	redis.call('HSET', k, 'epoch', ARGV[6])
end
local seq = (tonumber(get('seq')) or 0)
if seq ~= seq or seq < 0 or seq >= 1e15 then seq = 0 end
seq = math.floor(seq) + 1
redis.call('HSET', k, 'seq', tostring(seq))
redis.call('PUBLISH', ARGV[5], (get('epoch') or '') .. ':' .. tostring(seq))
return {seq, version, canary, get('previous.version') or ''}
`)

func (f *Fleet) changeConfig(ctx context.Context, mode, version string, data []byte, bp int) (Pushed, error) {
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	res, err := changeScript.Run(ctx, f.c, []string{f.configKey()}, mode, version, data, bp, f.configChannel(), newEpoch()).Slice()
	if err != nil {
		// Redis puts its own code (ERR) before a script's error reply.
		var re redis.Error
		if errors.As(err, &re) {
			if strings.Contains(re.Error(), "NOCONFIG") {
				return Pushed{}, ErrNoConfig
			}
			if _, canary, ok := strings.Cut(re.Error(), "NOSTABLE "); ok {
				return Pushed{}, fmt.Errorf("%w: the canary %.40q is the fleet's first configuration, with no stable one for its processes to return to; push a version to every process to replace it",
					ErrNoConfig, canary)
			}
			if _, shrink, ok := strings.Cut(re.Error(), "SHRINK "); ok {
				old, canary, _ := strings.Cut(shrink, " ")
				n, _ := smallUint(old, 4)
				return Pushed{}, fmt.Errorf("%w: the canary %.40q of %s is the fleet's first configuration, with no stable one: a canary of %s would leave processes running %.40q, which the store would no longer hold; push a canary of %s or more, promote it, or push to every process",
					ErrCanaryShare, canary, bpPercent(int(n)), bpPercent(bp), canary, bpPercent(int(n)))
			}
		}
		f.reloadOnError(err)
		return Pushed{}, err
	}
	if len(res) != 4 {
		return Pushed{}, errCorrupt
	}
	seq, _ := res[0].(int64)
	v, _ := res[1].(string)
	c, _ := res[2].(int64)
	prev, _ := res[3].(string)
	return Pushed{Seq: seq, Version: v, Canary: c == 1, Previous: prev}, nil
}

// bpPercent writes basis points as a percentage: 1050 is 10.5%.
func bpPercent(bp int) string {
	return strconv.FormatFloat(float64(bp)/100, 'f', -1, 64) + "%"
}

func newEpoch() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// readScript reads the store for a process: {} when there is none; only
// {state} when epoch:seq is still ARGV[1], what the process read last;
// else {state, stable.version, stable.data, canary.version, canary.data,
// canary.share}, each "" when absent. A field longer than its cap (ARGV[2]
// for the data, ARGV[3] for the rest) is an error reply, as is a key of
// another type: Redis never sends a process more than the caps.
var readScript = redis.NewScript(`
local k = KEYS[1]
local t = redis.call('TYPE', k).ok
if t == 'none' then return {} end
if t ~= 'hash' then return redis.error_reply('CORRUPT configuration store of type ' .. t) end
local small, big = tonumber(ARGV[3]), tonumber(ARGV[2])
for _, f in ipairs({'epoch', 'seq'}) do
	if redis.call('HSTRLEN', k, f) > small then return redis.error_reply('CORRUPT ' .. f .. ' too long') end
end
local state = (redis.call('HGET', k, 'epoch') or '') .. ':' .. (redis.call('HGET', k, 'seq') or '')
if state == ARGV[1] then return {state} end
local out = {state}
for _, f in ipairs({'stable.version', 'stable.data', 'canary.version', 'canary.data', 'canary.share'}) do
	local cap = small
	if string.sub(f, -5) == '.data' then cap = big end
	if redis.call('HSTRLEN', k, f) > cap then return redis.error_reply('CORRUPT ' .. f .. ' too long') end
	out[#out + 1] = redis.call('HGET', k, f) or ''
end
return out
`)

// storeState is the store as a process read it, validated.
type storeState struct {
	state          string // epoch:seq
	seq            int64
	stableVersion  string
	stable         []byte
	canaryVersion  string
	canary         []byte
	canaryShare    int // basis points; 0 without a canary
	empty, unmoved bool
}

// readConfig reads the store, unless it is still at known (epoch:seq).
func (f *Fleet) readConfig(ctx context.Context, known string) (storeState, error) {
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	res, err := readScript.Run(ctx, f.c, []string{f.configKey()}, known, config.MaxBytes, maxConfigVersion).StringSlice()
	if err != nil {
		var re redis.Error
		if errors.As(err, &re) && strings.HasPrefix(re.Error(), "CORRUPT") {
			return storeState{}, fmt.Errorf("%w: %s", errCorrupt, re.Error())
		}
		f.reloadOnError(err)
		return storeState{}, err
	}
	return parseStore(res, known)
}

// parseStore validates readScript's reply.
func parseStore(res []string, known string) (storeState, error) {
	var s storeState
	switch len(res) {
	case 0:
		s.empty = true
		return s, nil
	case 1:
		if res[0] != known {
			return s, errCorrupt
		}
		s.state, s.unmoved = known, true
		return s, nil
	case 6:
	default:
		return s, errCorrupt
	}
	s.state = res[0]
	epoch, seq, ok := strings.Cut(s.state, ":")
	n, err := smallUint(seq, 15)
	if !ok || epoch == "" || err != nil {
		return s, fmt.Errorf("%w: state %.40q", errCorrupt, s.state)
	}
	s.seq = int64(n)
	s.stableVersion, s.stable, s.canaryVersion, s.canary = res[1], []byte(res[2]), res[3], []byte(res[4])
	if (s.stableVersion == "") != (len(s.stable) == 0) || (s.stableVersion != "" && checkVersion(s.stableVersion) != nil) {
		return s, fmt.Errorf("%w: stable configuration", errCorrupt)
	}
	if s.canaryVersion != "" || len(s.canary) > 0 || res[5] != "" {
		bp, err := smallUint(res[5], 4)
		if err != nil || bp < 1 || bp >= shareScale || checkVersion(s.canaryVersion) != nil || len(s.canary) == 0 {
			return s, fmt.Errorf("%w: canary", errCorrupt)
		}
		s.canaryShare = int(bp)
	}
	return s, nil
}

// ack is what a following process records in Redis: the push it acted on
// (Seq), the version it runs, and the last version it refused, with why.
// JSON, since a version may hold any printable character.
type ack struct {
	Seq     int64  `json:"seq"`
	Running string `json:"running"`
	Canary  bool   `json:"canary,omitempty"`
	Refused string `json:"refused,omitempty"`
	Error   string `json:"error,omitempty"`
	At      int64  `json:"at"` // Unix ms when the process wrote it
}

// ackScript records ARGV[2] as the ack of process ARGV[1] and drops up to
// 64 acks not refreshed for ARGV[3] ms, by Redis's clock. Keys of another
// type are replaced.
var ackScript = redis.NewScript(`
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then redis.call('DEL', KEYS[1]) end
if redis.call('TYPE', KEYS[2]).ok ~= 'zset' then redis.call('DEL', KEYS[2]) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], now, ARGV[1])
local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[3]), 'LIMIT', 0, 64)
for _, id in ipairs(old) do
	redis.call('HDEL', KEYS[1], id)
	redis.call('ZREM', KEYS[2], id)
end
return 1
`)

func (f *Fleet) writeAck(ctx context.Context, a ack) error {
	if len(a.Error) > maxAckError {
		a.Error = truncate(a.Error, maxAckError)
	}
	v, err := json.Marshal(a)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	err = ackScript.Run(ctx, f.c, f.ackKeys(), f.id, v, ackStale.Milliseconds()).Err()
	f.reloadOnError(err)
	return err
}

// truncate cuts s to at most n bytes, on a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n-3]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "..."
}

// ConfigStatus is the fleet's configuration as the store holds it, and
// what each process reported it runs.
type ConfigStatus struct {
	Seq      int64
	Stable   string  // the stable version, "" when none was pushed
	Canary   string  // the canary's version, "" when none is in progress
	Share    float64 // the canary's share, 0 to 1
	Previous string  // the version RollbackConfig returns to, "" when none
	// Processes are the acks of the processes that wrote one in the last
	// ten minutes, by ID.
	Processes []ProcessConfig
	// Ignored counts entries that did not decode or were too long.
	Ignored int
}

// ProcessConfig is what one process reported: the store's Seq it last
// acted on, the version it runs (Snapshot.Config.Version: "" when it runs
// a configuration given in code), whether it is in the canary, and the
// last version it refused, with the error, if any.
type ProcessConfig struct {
	ID      string
	Seq     int64
	Running string
	Canary  bool
	Refused string
	Error   string
	At      time.Time // when it wrote this, by its clock
}

// statusScript reads the store's summary: {seq, stable, canary, share,
// previous}, each capped at ARGV[1] bytes ("" when longer: the Go side
// calls it corrupt).
var statusScript = redis.NewScript(`
local k = KEYS[1]
local t = redis.call('TYPE', k).ok
if t == 'none' then return {} end
if t ~= 'hash' then return redis.error_reply('CORRUPT configuration store of type ' .. t) end
local out = {}
for _, f in ipairs({'seq', 'stable.version', 'canary.version', 'canary.share', 'previous.version'}) do
	if redis.call('HSTRLEN', k, f) > tonumber(ARGV[1]) then return redis.error_reply('CORRUPT ' .. f .. ' too long') end
	out[#out + 1] = redis.call('HGET', k, f) or ''
end
return out
`)

// ConfigStatus reads the store and the processes' acks: at most 4096 of
// them, each checked as any value read from Redis, an entry that does not
// decode counted in Ignored.
func (f *Fleet) ConfigStatus(ctx context.Context) (ConfigStatus, error) {
	var st ConfigStatus
	ctx, cancel := context.WithTimeout(ctx, 10*f.timeout)
	defer cancel()
	res, err := statusScript.Run(ctx, f.c, []string{f.configKey()}, maxConfigVersion).StringSlice()
	var re redis.Error
	switch {
	case errors.As(err, &re) && strings.HasPrefix(re.Error(), "CORRUPT"):
		st.Ignored++ // the processes' acks say what they made of it
	case err != nil:
		return st, err
	case len(res) == 5:
		seq, err := smallUint(res[0], 15)
		if err != nil {
			st.Ignored++
		}
		st.Seq = int64(seq)
		st.Stable, st.Canary, st.Previous = res[1], res[2], res[4]
		if bp, err := smallUint(res[3], 4); err == nil && bp < shareScale {
			st.Share = float64(bp) / shareScale
		}
	case len(res) != 0:
		st.Ignored++
	}
	var cursor uint64
	// Bounded twice: by the entries read, and by the calls, should a
	// cursor keep returning nothing.
	for calls := 0; calls < 4*maxAcks/256 && len(st.Processes)+st.Ignored < maxAcks; calls++ {
		kv, next, err := f.c.HScan(ctx, f.ackKeys()[0], cursor, "", 256).Result()
		if isWrongType(err) {
			st.Ignored++
			break
		}
		if err != nil {
			return st, err
		}
		for i := 0; i+1 < len(kv); i += 2 {
			p, err := decodeAck(kv[i], kv[i+1])
			if err != nil {
				st.Ignored++
				continue
			}
			st.Processes = append(st.Processes, p)
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	slices.SortFunc(st.Processes, func(a, b ProcessConfig) int { return strings.Compare(a.ID, b.ID) })
	return st, nil
}

func decodeAck(id, v string) (ProcessConfig, error) {
	if id == "" || len(id) > maxID || len(v) > maxAck {
		return ProcessConfig{}, errCorrupt
	}
	var a ack
	if err := json.Unmarshal([]byte(v), &a); err != nil {
		return ProcessConfig{}, errCorrupt
	}
	if a.Seq < 0 || len(a.Running) > maxConfigVersion || len(a.Refused) > maxConfigVersion || len(a.Error) > maxAckError {
		return ProcessConfig{}, errCorrupt
	}
	return ProcessConfig{ID: id, Seq: a.Seq, Running: a.Running, Canary: a.Canary, Refused: a.Refused, Error: a.Error,
		At: time.UnixMilli(a.At)}, nil
}
