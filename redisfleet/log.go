package redisfleet

import (
	"context"
	"fmt"
	"log/slog"
)

// DebugLog is a logger for go-redis (redis.SetLogger) that writes
// go-redis's own messages to Logger at slog.LevelDebug. go-redis prints
// to stderr by default, a line for every dial that fails: while Redis is
// down the fleet's goroutines redial, and the lab's 8 pods printed 176
// lines in a 5 s outage. The Transport already
// logs the outage once, at Warn, and its end at Info (Config.Logger), and
// Snapshot().Fleet shows the last error, so go-redis's lines are detail
// for when Debug is on:
//
//	redis.SetLogger(redisfleet.DebugLog{Logger: logger})
//
// go-redis has one logger per process, so this is the program's choice,
// made once in main; redisfleet never sets it. logging.Disable (package
// github.com/redis/go-redis/v9/logging) drops go-redis's lines instead.
type DebugLog struct {
	// Logger receives the messages. Nil means slog.Default().
	Logger *slog.Logger
}

// Printf implements go-redis's logger.
func (d DebugLog) Printf(ctx context.Context, format string, v ...any) {
	l := d.Logger
	if l == nil {
		l = slog.Default()
	}
	if !l.Enabled(ctx, slog.LevelDebug) {
		return // no formatting for a line nobody reads
	}
	l.DebugContext(ctx, fmt.Sprintf(format, v...), "from", "go-redis")
}
