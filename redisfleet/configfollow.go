package redisfleet

import (
	"context"
	"crypto/sha256"
	"errors"
	"log/slog"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/bulwark-http/bulwark/config"
	"github.com/redis/go-redis/v9"
)

// FollowOptions configures a ConfigFollower. The zero value is usable.
type FollowOptions struct {
	// Registry resolves the names of functions a pushed file refers to, as
	// for config.Parse. A file naming one it does not hold is refused.
	Registry config.Registry
	// Logger receives a line per version applied (Info) or refused (Warn),
	// and one when Redis is lost (Warn) and found again (Info). Nil means
	// slog.Default().
	Logger *slog.Logger
	// Resync is how often the follower reads the store's sequence number
	// even when no push was heard, in case a message was lost (a
	// subscription that no longer hears the channel). Zero means 5s: a
	// read of a few bytes a process every 5 s.
	Resync time.Duration
	// Applied, if set, is called after each version applied (err nil) or
	// refused; for tests and metrics.
	Applied func(version string, err error)
}

// ConfigFollower keeps a Transport running the fleet's configuration as
// PushConfig, PromoteConfig and RollbackConfig change it. Its Run is one
// goroutine; Stats may be called from any.
type ConfigFollower struct {
	f       *Fleet
	tr      *bulwark.Transport
	o       FollowOptions
	log     *slog.Logger
	running atomic.Bool

	connected                 atomic.Bool
	applied, refused, ignored atomic.Uint64

	// Run's own state.
	known    string   // the store's epoch:seq last read whole
	last     [32]byte // SHA-256 of the bytes last applied or refused
	haveLast bool
	ack      ack
	ackAt    time.Time // when the ack was last written
	badStore string    // the corrupt store's error last logged
}

// FollowerStats counts what a ConfigFollower did.
type FollowerStats struct {
	Connected bool   // subscribed, and the store read since
	Applied   uint64 // versions applied
	Refused   uint64 // versions refused: they did not parse or validate
	Ignored   uint64 // reads of a store that did not decode, and messages that were not a push's (hostile or corrupt values)
}

// ConfigFollower returns a follower of the fleet's configuration for tr:
// run it with Run. The process is named in the store by Options.ID, and
// its ack is that ID's: run one follower per ID, or their acks overwrite
// each other's.
func (f *Fleet) ConfigFollower(tr *bulwark.Transport, o FollowOptions) *ConfigFollower {
	if o.Resync <= 0 {
		o.Resync = 5 * time.Second
	}
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	return &ConfigFollower{f: f, tr: tr, o: o, log: log}
}

// Stats returns the follower's counts.
func (c *ConfigFollower) Stats() FollowerStats {
	return FollowerStats{Connected: c.connected.Load(), Applied: c.applied.Load(), Refused: c.refused.Load(), Ignored: c.ignored.Load()}
}

// Reconnection waits: a dial to a Redis that is down fails at once, so the
// follower tries again soon, and its Transport runs the latest version
// within about followMaxWait of Redis coming back; each wait is drawn in
// its upper half so that a fleet does not redial in step.
const (
	followMinWait = 50 * time.Millisecond
	followMaxWait = 400 * time.Millisecond
	// readRetry and readTries: the first read of the store after
	// subscribing is tried again every readRetry, readTries times (past
	// go-redis's prober's second).
	readRetry = 25 * time.Millisecond
	readTries = 60
)

// Run subscribes to the fleet's configuration channel and applies, at once
// and then at each change, the version this process is to run: the
// canary's when a canary is in progress and the process is in its share
// (InCanary), else the stable one. Each is applied with config.Apply,
// that is with Transport.Update: a version that does not parse or
// validate leaves the Transport as it was, is recorded in its
// Snapshot.Config, logged and counted, and the process goes on. After
// each, the process records in Redis the version it runs, or the one it
// refused and why (see Fleet.ConfigStatus).
//
// While Redis is unreachable the Transport keeps what it runs; Run tries
// again every few hundred milliseconds and, once connected, reads the
// store whole and applies its latest version: within about a second of
// Redis's return at worst, as go-redis's pool, once every dial failed,
// dials again only once a second (a few hundred milliseconds in
// TestConfigPushRedisDown and the fleet lab). A store that is empty (a
// Redis restarted without persistence) changes nothing. Nothing here is on
// the request path.
//
// Run returns nil when ctx is done. Cancel ctx before closing the
// Transport. A second Run while one runs returns an error.
func (c *ConfigFollower) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("redisfleet: ConfigFollower already running")
	}
	defer c.running.Store(false)
	wait := followMinWait
	lost := false
	for {
		wasConnected, err := c.session(ctx)
		c.connected.Store(false)
		if ctx.Err() != nil {
			return nil
		}
		if wasConnected {
			wait, lost = followMinWait, false
		}
		if !lost {
			lost = true
			c.log.Warn("bulwark config: lost the fleet's configuration store; the running configuration stays", "err", err)
		}
		t := time.NewTimer(wait/2 + rand.N(wait/2+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		wait = min(2*wait, followMaxWait)
	}
}

// session is one subscription: it reads the store whole, then again at
// each message and at each Resync, until the connection fails.
// connected is whether it got as far as reading the store.
func (c *ConfigFollower) session(ctx context.Context) (connected bool, err error) {
	ps := c.f.c.Subscribe(ctx)
	defer ps.Close()
	stop := context.AfterFunc(ctx, func() { _ = ps.Close() })
	defer stop()
	sctx, cancel := context.WithTimeout(ctx, c.f.timeout)
	err = ps.Subscribe(sctx, c.f.configChannel())
	if err == nil {
		_, err = ps.ReceiveTimeout(sctx, c.f.timeout) // the confirmation
	}
	cancel()
	if err != nil {
		c.f.reloadOnError(err)
		return false, err
	}
	c.known = "" // Redis may have restarted: read the store whole
	// The subscription's connection is dialled on its own, the read goes
	// through the client's pool; after an outage go-redis's pool, once
	// every dial failed, fails at once until a prober it runs once a
	// second dials again. Redis answers (the subscription says so), so the
	// read is tried again soon, while the subscription is held, rather
	// than at the next reconnection.
	for i := 0; ; i++ {
		err := c.sync(ctx)
		if err == nil {
			break
		}
		if i >= readTries || ctx.Err() != nil {
			return false, err
		}
		t := time.NewTimer(readRetry)
		select {
		case <-ctx.Done():
			t.Stop()
			return false, ctx.Err()
		case <-t.C:
		}
	}
	if !c.connected.Swap(true) {
		c.log.Info("bulwark config: following the fleet's configuration", "store", c.f.configKey(), "version", c.ack.Running)
	}
	next := time.Now().Add(c.o.Resync)
	for {
		msg, err := ps.ReceiveTimeout(ctx, max(time.Until(next), time.Millisecond))
		if ctx.Err() != nil {
			return true, ctx.Err()
		}
		if err != nil {
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				c.f.reloadOnError(err)
				return true, err
			}
		}
		// A message's payload is only a hint that the store changed: what
		// is applied is what the store holds, read again. A payload that
		// is not a state (epoch:seq) is not a push's (ignored, counted,
		// and no read: a flood of garbage costs Redis nothing more), and
		// one naming the state already read needs no read.
		hint := false
		if m, ok := msg.(*redis.Message); ok {
			switch {
			case !isState(m.Payload):
				c.ignored.Add(1)
			case m.Payload != c.known:
				hint = true
			}
		}
		if hint || time.Until(next) <= 0 {
			next = time.Now().Add(c.o.Resync)
			if err := c.sync(ctx); err != nil {
				return true, err
			}
		}
	}
}

// sync reads the store, applies what this process is to run if it
// changed, and records the outcome. It returns only the errors of the
// connection; a store that does not decode is counted and logged.
func (c *ConfigFollower) sync(ctx context.Context) error {
	s, err := c.f.readConfig(ctx, c.known)
	switch {
	case errors.Is(err, errCorrupt):
		c.ignored.Add(1)
		c.known = ""
		if err.Error() != c.badStore {
			c.badStore = err.Error()
			c.log.Warn("bulwark config: the fleet's configuration store does not decode; ignored", "err", err)
		}
		return c.record(ctx, c.ack.Seq, c.ack.Canary, true)
	case err != nil:
		return err
	case s.unmoved:
		return c.record(ctx, c.ack.Seq, c.ack.Canary, false)
	case s.empty:
		c.known = ""
		return c.record(ctx, 0, false, false)
	}
	c.badStore = ""
	c.known = s.state
	data, label, canary := s.stable, s.stableVersion, false
	if s.canaryShare > 0 && inCanary(c.f.id, s.canaryShare) {
		data, label, canary = s.canary, s.canaryVersion, true
	}
	changed := false
	if sum := sha256.Sum256(data); len(data) > 0 && (!c.haveLast || sum != c.last) {
		changed = true
		c.last, c.haveLast = sum, true
		source := c.f.configKey() + "@" + strconv.FormatInt(s.seq, 10)
		if canary {
			source += " (canary)"
		}
		version, err := config.Apply(c.tr, data, source, c.o.Registry)
		if err != nil {
			c.refused.Add(1)
			// The ack names it as the store does, as it was pushed; a
			// file that does not decode has no version of its own.
			c.ack.Refused, c.ack.Error = label, err.Error()
			c.log.Warn("bulwark config: refused; the running configuration stays", "source", source, "version", version, "err", err)
		} else {
			c.applied.Add(1)
			c.ack.Refused, c.ack.Error = "", ""
			c.log.Info("bulwark config: applied", "source", source, "version", version)
		}
		if c.o.Applied != nil {
			c.o.Applied(version, err)
		}
	}
	return c.record(ctx, s.seq, canary, changed || s.seq != c.ack.Seq)
}

// record writes the process's ack when it changed, when force is set, or
// when it was last written ackRefresh ago.
func (c *ConfigFollower) record(ctx context.Context, seq int64, canary, force bool) error {
	running := ""
	if s := c.tr.Snapshot().Config; s != nil {
		running = s.Version
	}
	if c.badStore != "" {
		c.ack.Error = "store: " + c.badStore
	} else if c.ack.Refused == "" {
		c.ack.Error = ""
	}
	changed := seq != c.ack.Seq || canary != c.ack.Canary || running != c.ack.Running
	if !force && !changed && !c.ackAt.IsZero() && time.Since(c.ackAt) < ackRefresh {
		return nil
	}
	c.ack.Seq, c.ack.Canary, c.ack.Running = seq, canary, running
	now := time.Now()
	c.ack.At = now.UnixMilli()
	if err := c.f.writeAck(ctx, c.ack); err != nil {
		c.ackAt = time.Time{} // written again at the next sync
		return err
	}
	c.ackAt = now
	return nil
}

// isState reports whether s is a store's state as a push publishes it:
// epoch (hex, as newEpoch makes it), ':', seq.
func isState(s string) bool {
	epoch, seq, ok := strings.Cut(s, ":")
	if !ok || epoch == "" || len(epoch) > 32 || strings.Trim(epoch, "0123456789abcdef") != "" {
		return false
	}
	_, err := smallUint(seq, 15)
	return err == nil
}
