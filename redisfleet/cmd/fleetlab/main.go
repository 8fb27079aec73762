// Command fleetlab measures what sharing breaker verdicts through Redis
// buys a fleet: it starts a redis-server of its own on 127.0.0.1 (no
// persistence, a temporary directory), a sick upstream on 127.0.0.1 that
// fails every request, and N child processes of itself, each a bulwark
// Transport calling the upstream at the same rate. It runs the fleet twice,
// each process deciding alone (local) and sharing through Redis (shared),
// and reports the requests the upstream received before every process had
// stopped calling it, and the time from the first process's trip until the
// last one was open; then, after the fleet has run on for a few open
// times, the calls the upstream received in all, probes included. It does so for two loads: every process calling at
// the same rate (the hardest case for sharing a verdict, since every
// process is about as close to tripping as the first), and skewed, process
// i calling at 1/(i+1) of the first one's rate.
//
//	cd redisfleet && go run ./cmd/fleetlab            # 8 processes
//	cd redisfleet && go run ./cmd/fleetlab -procs 8 -runs 5
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/bulwark-http/bulwark/redisfleet"
	"github.com/redis/go-redis/v9"
)

var (
	procs     = flag.Int("procs", 8, "child processes")
	runs      = flag.Int("runs", 3, "runs of each mode of the sick-upstream scenario")
	minCalls  = flag.Int("mincalls", 20, "each breaker's MinCalls (and WindowCalls)")
	interval  = flag.Duration("interval", 2*time.Millisecond, "pause between one process's requests (sick upstream)")
	openFor   = flag.Duration("openfor", time.Second, "each breaker's OpenFor (MaxOpenFor 4×)")
	after     = flag.Duration("after", 3*time.Second, "how long the fleet runs on once every process is open, probing")
	quota     = flag.Float64("quota", 100, "the third party's quota, requests a second (quota scenario)")
	offered   = flag.Float64("offered", 400, "requests a second the processes offer together (quota scenario)")
	quotaDur  = flag.Duration("quota-duration", 10*time.Second, "how long each mode of the quota scenario runs")
	outage    = flag.Duration("outage", 5*time.Second, "how long Redis is down in the outage scenario")
	loads     = flag.String("loads", "equal,skewed", "the sick-upstream scenario's loads, comma-separated")
	scenarios = flag.String("scenarios", "breaker,quota,outage", "which scenarios to run, comma-separated: breaker, quota, outage, push")
	markdown  = flag.Bool("markdown", false, "write a Markdown section for BENCHMARKS.md to stdout (progress goes to stderr)")
	costFile  = flag.String("cost", "", "redisfleet's go test -bench output, rendered into the Markdown section")

	child     = flag.Bool("child", false, "internal: run as one process of the fleet")
	kind      = flag.String("kind", "breaker", "internal: the child's scenario")
	redisURL  = flag.String("redis", "", "internal: Redis address, empty for local only")
	target    = flag.String("upstream", "", "internal: the upstream's URL")
	dur       = flag.Duration("dur", 0, "internal: how long a quota child offers its load")
	localRate = flag.Float64("rate", 0, "internal: a quota child's Bulkhead.Rate")
	fleetRate = flag.Float64("fleetrate", 0, "internal: a quota child's Bulkhead.FleetRate")
	podID     = flag.String("id", "", "internal: a push child's process ID")
)

func main() {
	flag.Parse()
	if *child {
		run := runChild
		switch *kind {
		case "quota":
			run = runQuotaChild
		case "push":
			run = runPushChild
		}
		if err := run(); err != nil {
			fmt.Fprintln(os.Stderr, "fleetlab child:", err)
			os.Exit(1)
		}
		return
	}
	if err := runParent(); err != nil {
		fmt.Fprintln(os.Stderr, "fleetlab:", err)
		os.Exit(1)
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// redisProc is the lab's redis-server: no persistence, a temporary
// directory, 127.0.0.1, a port of its own; the outage kills and restarts
// it on the same port, empty.
type redisProc struct {
	port int
	dir  string
	cmd  *exec.Cmd
}

func (r *redisProc) addr() string { return "127.0.0.1:" + strconv.Itoa(r.port) }

func (r *redisProc) start() error {
	r.cmd = exec.Command("redis-server", "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", r.dir, "--loglevel", "warning")
	if err := r.cmd.Start(); err != nil {
		return err
	}
	rc := redis.NewClient(&redis.Options{Addr: r.addr(), MaxRetries: -1})
	defer rc.Close()
	for i := 0; rc.Ping(context.Background()).Err() != nil; i++ {
		if i > 200 {
			return errors.New("redis-server did not start")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

func (r *redisProc) kill() {
	if r.cmd != nil {
		_ = r.cmd.Process.Kill()
		_ = r.cmd.Wait()
		r.cmd = nil
	}
}

func runParent() error {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return errors.New("redis-server not installed (apt-get install redis-server)")
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "fleetlab")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	rs := &redisProc{port: port, dir: dir}
	if err := rs.start(); err != nil {
		return err
	}
	defer rs.kill()
	addr := rs.addr()
	rc := redis.NewClient(&redis.Options{Addr: addr})
	defer rc.Close()

	var out io.Writer = os.Stdout
	if *markdown {
		out = os.Stderr
	}
	want := map[string]bool{}
	for _, s := range strings.Split(*scenarios, ",") {
		want[strings.TrimSpace(s)] = true
	}
	rep := &labReport{load0: loadAvg(), started: time.Now()}
	if want["breaker"] {
		up := &sickUpstream{}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		srv := &http.Server{Handler: up}
		go func() { _ = srv.Serve(ln) }()
		url := "http://" + ln.Addr().String() + "/"
		fmt.Fprintf(out, "fleetlab: %d processes, breaker MinCalls %d, one request per %v each, redis-server on %s\n",
			*procs, *minCalls, *interval, addr)
		fmt.Fprintf(out, "target (issue 19): shared ≤ 1.2 × MinCalls = %.0f plus probes; about %d × MinCalls = %d locally; first trip to all open ≤ 250 ms\n\n",
			1.2*float64(*minCalls), *procs, *procs**minCalls)
		for _, skew := range []bool{false, true} {
			if !strings.Contains(*loads, map[bool]string{false: "equal", true: "skewed"}[skew]) {
				continue
			}
			if skew {
				fmt.Fprintln(out, "load: skewed, process i calls at 1/(i+1) of the rate")
			} else {
				fmt.Fprintln(out, "load: every process at the same rate")
			}
			rows, err := runModes(up, url, addr, rc, skew, out)
			if err != nil {
				srv.Close()
				return err
			}
			rep.breaker = append(rep.breaker, rows...)
		}
		srv.Close()
	}
	if want["quota"] {
		if rep.quota, err = runQuota(addr, out); err != nil {
			return err
		}
	}
	if want["outage"] {
		o, err := runOutage(rs, out)
		if err != nil {
			return err
		}
		rep.outage = &o
	}
	if want["push"] {
		pr, err := runPush(rs, out)
		if err != nil {
			return err
		}
		rep.push = &pr
	}
	rep.load1 = loadAvg()
	if *markdown {
		return rep.write(os.Stdout)
	}
	return nil
}

// breakerRow is one mode of the sick-upstream scenario over its runs.
type breakerRow struct {
	skew               bool
	mode               string
	calls, totals      []int
	spans              []time.Duration
	medCalls, medTotal int
	medSpan            time.Duration
	met                int // runs within the target (shared)
	minCalls, maxCalls int
}

func runModes(up *sickUpstream, url, addr string, rc *redis.Client, skew bool, out io.Writer) ([]breakerRow, error) {
	fmt.Fprintf(out, "%-7s %4s %18s %22s %24s\n", "mode", "run", "calls before stop", "first trip → all open", "calls in all, +"+after.String())
	var rows []breakerRow
	for _, mode := range []string{"local", "shared"} {
		row := breakerRow{skew: skew, mode: mode}
		for r := range *runs {
			ra := ""
			if mode == "shared" {
				ra = addr
				_ = rc.FlushAll(context.Background()).Err()
			}
			n, span, total, err := runFleet(up, url, ra, mode+strconv.Itoa(r)+strconv.FormatBool(skew), skew)
			if err != nil {
				return nil, err
			}
			row.calls, row.spans, row.totals = append(row.calls, n), append(row.spans, span), append(row.totals, total)
			if float64(n) <= 1.2*float64(*minCalls) {
				row.met++
			}
			fmt.Fprintf(out, "%-7s %4d %18d %22v %24d\n", mode, r+1, n, span.Round(time.Millisecond), total)
		}
		row.medCalls, row.medSpan, row.medTotal = medianInt(row.calls), medianDur(row.spans), medianInt(row.totals)
		row.minCalls, row.maxCalls = slices.Min(row.calls), slices.Max(row.calls)
		fmt.Fprintf(out, "%-7s %4s %18d %22v %24d\n\n", mode, "med", row.medCalls, row.medSpan.Round(time.Millisecond), row.medTotal)
		rows = append(rows, row)
	}
	return rows, nil
}

// sickUpstream fails every request, noting when each arrived.
type sickUpstream struct {
	mu   sync.Mutex
	hits []int64 // unix nanoseconds
}

func (u *sickUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := time.Now().UnixNano()
	u.mu.Lock()
	u.hits = append(u.hits, now)
	u.mu.Unlock()
	w.WriteHeader(http.StatusInternalServerError)
}

func (u *sickUpstream) reset() {
	u.mu.Lock()
	u.hits = nil
	u.mu.Unlock()
}

func (u *sickUpstream) before(t int64) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := 0
	for _, h := range u.hits {
		if h <= t {
			n++
		}
	}
	return n
}

// kid is one child process, its stdin (closing it stops the child) and
// its stdout, line by line.
type kid struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Scanner
}

// startKids starts -procs children of this executable, child i with
// args(i), and waits until each says READY; stop closes their stdins and
// waits for them (also for those started when a later one failed).
func startKids(prefix string, args func(i int) []string) ([]kid, func(), error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, nil, err
	}
	var kids []kid
	stop := func() {
		for _, k := range kids {
			_ = k.stdin.Close()
			_ = k.cmd.Wait()
		}
	}
	fail := func(err error) ([]kid, func(), error) {
		stop()
		return nil, nil, err
	}
	for i := range *procs {
		cmd := exec.Command(exe, args(i)...)
		cmd.Env = append(os.Environ(), "FLEETLAB_PREFIX="+prefix)
		cmd.Stderr = os.Stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			return fail(err)
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return fail(err)
		}
		if err := cmd.Start(); err != nil {
			return fail(err)
		}
		kids = append(kids, kid{cmd, in, bufio.NewScanner(out)})
	}
	for i, k := range kids {
		if !k.out.Scan() || k.out.Text() != "READY" {
			return fail(fmt.Errorf("child %d did not get ready", i))
		}
	}
	return kids, stop, nil
}

// runFleet starts the children, lets them go together, and waits for
// each to report the time its breaker first refused.
func runFleet(up *sickUpstream, url, redisAddr, prefix string, skew bool) (int, time.Duration, int, error) {
	up.reset()
	kids, stop, err := startKids(prefix, func(i int) []string {
		every := *interval
		if skew {
			every *= time.Duration(i + 1)
		}
		return []string{"-child", "-redis", redisAddr, "-upstream", url,
			"-mincalls", strconv.Itoa(*minCalls), "-interval", every.String(), "-openfor", openFor.String()}
	})
	if err != nil {
		return 0, 0, 0, err
	}
	defer stop()
	for _, k := range kids {
		_, _ = io.WriteString(k.stdin, "GO\n")
	}
	opens := make([]int64, len(kids))
	for i, k := range kids {
		if !k.out.Scan() {
			return 0, 0, 0, fmt.Errorf("child %d ended without opening", i)
		}
		f := strings.Fields(k.out.Text())
		if len(f) != 2 || f[0] != "OPEN" {
			return 0, 0, 0, fmt.Errorf("child %d said %q", i, k.out.Text())
		}
		opens[i], _ = strconv.ParseInt(f[1], 10, 64)
	}
	sort.Slice(opens, func(i, j int) bool { return opens[i] < opens[j] })
	first, last := opens[0], opens[len(opens)-1]
	time.Sleep(time.Until(time.Unix(0, last).Add(*after)))
	return up.before(last), time.Duration(last - first), up.before(time.Now().UnixNano()), nil
}

// runChild is one process: it calls the upstream until its breaker
// refuses, reports when, and stops when the parent closes its stdin.
func runChild() error {
	p := bulwark.Policy{}
	p.Retry.Disabled = true
	p.Breaker.MinCalls, p.Breaker.WindowCalls = *minCalls, *minCalls
	p.Breaker.OpenFor, p.Breaker.MaxOpenFor = *openFor, 4**openFor
	tr, in, closeAll, err := childReady(p)
	if err != nil || tr == nil {
		return err
	}
	defer closeAll()
	var done atomic.Bool
	go func() {
		for in.Scan() {
		}
		done.Store(true)
	}()
	reported := false
	client := &http.Client{Transport: tr}
	for !done.Load() {
		resp, err := client.Get(*target)
		switch {
		case err == nil:
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		case errors.Is(err, bulwark.ErrBreakerOpen):
			if !reported {
				fmt.Println("OPEN", time.Now().UnixNano())
				reported = true
			}
		}
		time.Sleep(*interval)
	}
	return nil
}

// childReady builds a child's Transport for p, says READY and waits for
// the parent's GO; tr is nil when the parent ended first. done closes the
// Transport and its Redis client; in is the rest of stdin.
func childReady(p bulwark.Policy) (tr *bulwark.Transport, in *bufio.Scanner, done func(), err error) {
	tr, closeFleet, err := childTransport(p)
	if err != nil {
		return nil, nil, nil, err
	}
	done = func() { _ = tr.Close(); closeFleet() }
	fmt.Println("READY")
	in = bufio.NewScanner(os.Stdin)
	if !in.Scan() || in.Text() != "GO" {
		done()
		return nil, nil, nil, nil
	}
	return tr, in, done, nil
}

// childTransport is a child's Transport for p, sharing through the
// lab's Redis when -redis is set; close closes its Redis client.
func childTransport(p bulwark.Policy) (*bulwark.Transport, func(), error) {
	cfg := bulwark.Config{Default: p}
	closeFleet := func() {}
	if *redisURL != "" {
		// go-redis's line per failed dial, at Debug: the Transport logs
		// the outage once (README).
		redis.SetLogger(redisfleet.DebugLog{})
		rc := redis.NewClient(&redis.Options{Addr: *redisURL, DialTimeout: 200 * time.Millisecond,
			ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond, MaxRetries: -1})
		closeFleet = func() { _ = rc.Close() }
		f, err := redisfleet.New(rc, redisfleet.Options{Prefix: "fleetlab:" + os.Getenv("FLEETLAB_PREFIX") + ":"})
		if err != nil {
			closeFleet()
			return nil, nil, err
		}
		cfg.Fleet = f
	}
	tr, err := bulwark.New(cfg)
	if err != nil {
		closeFleet()
		return nil, nil, err
	}
	if cfg.Fleet != nil {
		for i := 0; !tr.Snapshot().Fleet.Connected; i++ {
			if i > 500 {
				_ = tr.Close()
				closeFleet()
				return nil, nil, errors.New("fleet never connected")
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return tr, closeFleet, nil
}

func medianInt(v []int) int {
	s := append([]int(nil), v...)
	sort.Ints(s)
	return s[len(s)/2]
}

func medianDur(v []time.Duration) time.Duration {
	s := append([]time.Duration(nil), v...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}
