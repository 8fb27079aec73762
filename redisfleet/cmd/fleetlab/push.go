package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/bulwark-http/bulwark/config"
	"github.com/bulwark-http/bulwark/redisfleet"
	"github.com/redis/go-redis/v9"
)

// The push scenario (issue 31): -procs processes follow the fleet's
// configuration (redisfleet.ConfigFollower) under steady traffic to a
// healthy upstream, each with a breaker whose window holds pushWindow
// calls. The parent changes one threshold by one push, pushes an invalid
// value (unchecked, as bulwarkctl push -unchecked would), and pushes while
// Redis is killed for -outage. It reports when each process applied or
// refused each push (the slowest one), when ConfigStatus (what bulwarkctl
// status shows) first showed all of them, the breaker windows after the
// threshold changed, and the requests that failed.

var pushInterval = 10 * time.Millisecond // between one process's requests

const pushWindow = 300 // breaker WindowCalls: full after 3 s at one request per 10 ms

// pushConfig is the fleet's configuration at version, one threshold
// (FailureRate) varying. It sets Timeout.Attempt: a learned one may be as
// short as 50 ms, which a request to the local upstream outlasts when the
// machine is overloaded (a dozen of 6,000 failed so at a load of 6 on 2
// cores), and the scenario counts the requests the push fails, not those.
func pushConfig(version string, rate string) string {
	return "version: " + version + "\ndefault:\n  retry: {disabled: true}\n  timeout: {attempt: 2s}\n  breaker: {failureRate: " + rate +
		", minCalls: 20, windowCalls: " + strconv.Itoa(pushWindow) + "}\n"
}

// pushEvent is one line a push child reported.
type pushEvent struct {
	kid     int
	word    string // APPLIED, REFUSED
	version string
	at      time.Time
	calls   int64 // the breaker's window right after, for APPLIED
}

// pushRun is what the scenario measured.
type pushRun struct {
	applyChange, showChange time.Duration // slowest process applied; status showed all
	minWindow               int64         // smallest breaker window right after the change
	refuseBad, showBad      time.Duration
	badError                string
	applyAfterOutage        time.Duration // from the restart of redis-server
	sent, failed            int64
}

func runPush(rs *redisProc, out io.Writer) (pushRun, error) {
	var r pushRun
	// The pusher redials while Redis is down: go-redis's line per failed
	// dial at Debug (README).
	redis.SetLogger(redisfleet.DebugLog{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return r, err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {})}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	url := "http://" + ln.Addr().String() + "/"
	const prefix = "fleetlab:push:"
	kids, stop, err := startKids("push", func(i int) []string {
		return []string{"-child", "-kind", "push", "-redis", rs.addr(), "-upstream", url, "-id", "pod-" + strconv.Itoa(i)}
	})
	if err != nil {
		return r, err
	}
	stopped := false
	defer func() {
		if !stopped {
			stop()
		}
	}()
	var mu sync.Mutex
	var events []pushEvent
	done := make([][2]int64, len(kids))
	var readers sync.WaitGroup
	for i, k := range kids {
		_, _ = io.WriteString(k.stdin, "GO\n")
		readers.Go(func() {
			for k.out.Scan() {
				f := strings.Fields(k.out.Text())
				mu.Lock()
				switch {
				case len(f) == 5 && (f[0] == "APPLIED" || f[0] == "REFUSED"):
					ns, _ := strconv.ParseInt(f[2], 10, 64)
					calls, _ := strconv.ParseInt(f[3], 10, 64)
					events = append(events, pushEvent{kid: i, word: f[0], version: f[1], at: time.Unix(0, ns), calls: calls})
				case len(f) == 3 && f[0] == "DONE":
					done[i][0], _ = strconv.ParseInt(f[1], 10, 64)
					done[i][1], _ = strconv.ParseInt(f[2], 10, 64)
				}
				mu.Unlock()
			}
		})
	}
	// waitAll waits, for at most 20 s, until every process reported word
	// for version, and returns the latest report.
	waitAll := func(word, version string) ([]pushEvent, error) {
		for range 2000 {
			mu.Lock()
			var got []pushEvent
			seen := map[int]bool{}
			for _, e := range events {
				if e.word == word && e.version == version && !seen[e.kid] {
					seen[e.kid] = true
					got = append(got, e)
				}
			}
			mu.Unlock()
			if len(got) == len(kids) {
				return got, nil
			}
			time.Sleep(10 * time.Millisecond)
		}
		return nil, fmt.Errorf("not every process %s %s within 20 s", strings.ToLower(word), version)
	}
	slowest := func(ev []pushEvent, from time.Time) time.Duration {
		var d time.Duration
		for _, e := range ev {
			d = max(d, e.at.Sub(from))
		}
		return d
	}
	rc := redis.NewClient(&redis.Options{Addr: rs.addr(), DialTimeout: 200 * time.Millisecond,
		ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond, MaxRetries: -1})
	defer rc.Close()
	ctl, err := redisfleet.New(rc, redisfleet.Options{Prefix: prefix, ID: "fleetlab"})
	if err != nil {
		return r, err
	}
	ctx := context.Background()
	// statusShows polls ConfigStatus until every process's ack of seq
	// passes ok, for at most 20 s, and returns how long from since.
	statusShows := func(seq int64, since time.Time, ok func(redisfleet.ProcessConfig) bool) (time.Duration, redisfleet.ConfigStatus, error) {
		var st redisfleet.ConfigStatus
		for range 4000 {
			var err error
			st, err = ctl.ConfigStatus(ctx)
			n := 0
			for _, p := range st.Processes {
				if p.Seq == seq && ok(p) {
					n++
				}
			}
			if err == nil && n == len(kids) {
				return time.Since(since), st, nil
			}
			time.Sleep(5 * time.Millisecond)
		}
		return 0, st, fmt.Errorf("status did not show all %d processes at seq %d within 20 s: %+v", len(kids), seq, st)
	}

	// v1, the baseline; then the windows fill.
	p, err := ctl.PushConfig(ctx, []byte(pushConfig("v1", "0.5")), redisfleet.PushOptions{})
	if err != nil {
		return r, err
	}
	if _, err := waitAll("APPLIED", "v1"); err != nil {
		return r, err
	}
	if _, _, err := statusShows(p.Seq, time.Now(), func(p redisfleet.ProcessConfig) bool { return p.Running == "v1" }); err != nil {
		return r, err
	}
	time.Sleep(time.Duration(pushWindow)*pushInterval + time.Second)

	// One threshold changed by one push.
	start := time.Now()
	if p, err = ctl.PushConfig(ctx, []byte(pushConfig("v2", "0.4")), redisfleet.PushOptions{}); err != nil {
		return r, err
	}
	ev, err := waitAll("APPLIED", "v2")
	if err != nil {
		return r, err
	}
	r.applyChange = slowest(ev, start)
	if r.showChange, _, err = statusShows(p.Seq, start, func(p redisfleet.ProcessConfig) bool { return p.Running == "v2" }); err != nil {
		return r, err
	}
	r.minWindow = slices.MinFunc(ev, func(a, b pushEvent) int { return int(a.calls - b.calls) }).calls

	// An invalid value, pushed unchecked: every process refuses it.
	start = time.Now()
	bad := []byte(pushConfig("bad-1", "2"))
	if p, err = ctl.PushConfig(ctx, bad, redisfleet.PushOptions{Unchecked: true}); err != nil {
		return r, err
	}
	if ev, err = waitAll("REFUSED", "bad-1"); err != nil {
		return r, err
	}
	r.refuseBad = slowest(ev, start)
	var st redisfleet.ConfigStatus
	if r.showBad, st, err = statusShows(p.Seq, start, func(p redisfleet.ProcessConfig) bool {
		return p.Refused == "bad-1" && p.Running == "v2" && p.Error != ""
	}); err != nil {
		return r, err
	}
	r.badError = st.Processes[0].Error
	if _, err := ctl.RollbackConfig(ctx); err != nil {
		return r, err
	}
	if _, err := waitAll("APPLIED", "v2"); err != nil { // the rollback re-applies v2's bytes
		return r, err
	}

	// Redis killed; v3 pushed (retried) meanwhile; restarted after -outage.
	rs.kill()
	// Retried as an operator reruns bulwarkctl: a new client each try, so
	// go-redis's pool of a client whose dials all failed (it dials again
	// only once a second) does not hold the push back.
	pushed := make(chan error, 1)
	go func() {
		var err error
		for range 1000 { // bounded: about 50 s
			c := redis.NewClient(&redis.Options{Addr: rs.addr(), DialTimeout: 200 * time.Millisecond, MaxRetries: -1})
			var pusher *redisfleet.Fleet
			if pusher, err = redisfleet.New(c, redisfleet.Options{Prefix: prefix, ID: "fleetlab"}); err == nil {
				_, err = pusher.PushConfig(ctx, []byte(pushConfig("v3", "0.45")), redisfleet.PushOptions{})
			}
			_ = c.Close()
			if err == nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		pushed <- err
	}()
	time.Sleep(*outage)
	back := time.Now() // before the restart: the figure includes redis-server's start
	if err := rs.start(); err != nil {
		return r, err
	}
	if err := <-pushed; err != nil {
		return r, err
	}
	if ev, err = waitAll("APPLIED", "v3"); err != nil {
		return r, err
	}
	r.applyAfterOutage = slowest(ev, back)

	// Closing their stdins stops the processes, which report their counts
	// and exit; their outputs are read to the end before Wait closes them.
	for _, k := range kids {
		_ = k.stdin.Close()
	}
	readers.Wait()
	stop()
	stopped = true
	for _, d := range done {
		r.sent += d[0]
		r.failed += d[1]
	}
	fmt.Fprintf(out, "push: %d processes following the fleet's configuration, one request per %v each to a healthy upstream\n", len(kids), pushInterval)
	fmt.Fprintf(out, "target (issue 31): every process applies a push within 1 s; 8 refusals shown within 1 s; the latest applied within 1 s of Redis's return; 0 failed requests\n")
	fmt.Fprintf(out, "%-50s %14s %17s\n", "push", "slowest apply", "status shows all")
	fmt.Fprintf(out, "%-50s %14v %17v\n", "one threshold (failureRate 0.5 → 0.4)", r.applyChange.Round(time.Millisecond), r.showChange.Round(time.Millisecond))
	fmt.Fprintf(out, "%-50s %14v %17v\n", "an invalid value (failureRate 2), refused", r.refuseBad.Round(time.Millisecond), r.showBad.Round(time.Millisecond))
	fmt.Fprintf(out, "%-50s %14v %17s\n", "during a "+outage.String()+" outage, from redis-server's restart", r.applyAfterOutage.Round(time.Millisecond), "")
	fmt.Fprintf(out, "breaker windows right after the threshold changed: at least %d calls of %d (kept by Update)\n", r.minWindow, pushWindow)
	fmt.Fprintf(out, "the refusal as status shows it: %s\n", r.badError)
	fmt.Fprintf(out, "requests: %d sent, %d failed\n\n", r.sent, r.failed)
	return r, nil
}

// runPushChild is one process of the push scenario: a Transport sharing
// through Redis, following the fleet's configuration as -id, calling the
// upstream every pushInterval until the parent closes stdin; it reports
// each version applied or refused, and at the end its counts.
func runPushChild() error {
	redis.SetLogger(redisfleet.DebugLog{})
	rc := redis.NewClient(&redis.Options{Addr: *redisURL, DialTimeout: 200 * time.Millisecond,
		ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond, MaxRetries: -1})
	defer rc.Close()
	f, err := redisfleet.New(rc, redisfleet.Options{Prefix: "fleetlab:push:", ID: *podID})
	if err != nil {
		return err
	}
	p := bulwark.Policy{}
	p.Retry.Disabled = true
	p.Timeout.Attempt = 2 * time.Second // as pushConfig, for the same reason
	quiet := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	tr, err := bulwark.New(bulwark.Config{Default: p, Fleet: f, Logger: quiet})
	if err != nil {
		return err
	}
	defer tr.Close()
	host := strings.TrimSuffix(strings.TrimPrefix(*target, "http://"), "/")
	var outMu sync.Mutex
	fl := f.ConfigFollower(tr, redisfleet.FollowOptions{Registry: config.Registry{}, Logger: quiet,
		Applied: func(version string, err error) {
			now := time.Now().UnixNano()
			var calls int64
			if h := tr.Snapshot().Host(host); len(h) == 1 {
				calls = h[0].Breaker.Calls
			}
			word := "APPLIED"
			if err != nil {
				word = "REFUSED"
			}
			outMu.Lock()
			fmt.Println(word, version, now, calls, "-")
			outMu.Unlock()
		}})
	ctx, cancel := context.WithCancel(context.Background())
	followed := make(chan struct{})
	go func() { defer close(followed); _ = fl.Run(ctx) }()
	defer func() { cancel(); <-followed }()
	for i := 0; !fl.Stats().Connected; i++ {
		if i > 500 {
			return errors.New("never followed the configuration")
		}
		time.Sleep(10 * time.Millisecond)
	}
	outMu.Lock()
	fmt.Println("READY")
	outMu.Unlock()
	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() || in.Text() != "GO" {
		return nil
	}
	var stop atomic.Bool
	go func() {
		for in.Scan() {
		}
		stop.Store(true)
	}()
	client := &http.Client{Transport: tr}
	var sent, failed int64
	reported := false
	for i := 0; i < 100000 && !stop.Load(); i++ { // bounded: about 17 minutes
		sent++
		resp, err := client.Get(*target)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		if err != nil || resp.StatusCode != http.StatusOK {
			failed++
			if !reported {
				fmt.Fprintln(os.Stderr, "fleetlab push child: request failed:", err)
				reported = true
			}
		}
		time.Sleep(pushInterval)
	}
	outMu.Lock()
	fmt.Println("DONE", sent, failed)
	outMu.Unlock()
	return nil
}
