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
	procs    = flag.Int("procs", 8, "child processes")
	runs     = flag.Int("runs", 3, "runs of each mode")
	minCalls = flag.Int("mincalls", 20, "each breaker's MinCalls (and WindowCalls)")
	interval = flag.Duration("interval", 2*time.Millisecond, "pause between one process's requests")
	openFor  = flag.Duration("openfor", time.Second, "each breaker's OpenFor (MaxOpenFor 4×)")
	after    = flag.Duration("after", 3*time.Second, "how long the fleet runs on once every process is open, probing")
	child    = flag.Bool("child", false, "internal: run as one process of the fleet")
	redisURL = flag.String("redis", "", "internal: Redis address, empty for local only")
	target   = flag.String("upstream", "", "internal: the upstream's URL")
)

func main() {
	flag.Parse()
	if *child {
		if err := runChild(); err != nil {
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
	rs := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir, "--loglevel", "warning")
	if err := rs.Start(); err != nil {
		return err
	}
	defer func() { _ = rs.Process.Kill(); _ = rs.Wait() }()
	addr := "127.0.0.1:" + strconv.Itoa(port)
	rc := redis.NewClient(&redis.Options{Addr: addr})
	defer rc.Close()
	for i := 0; rc.Ping(context.Background()).Err() != nil; i++ {
		if i > 200 {
			return errors.New("redis-server did not start")
		}
		time.Sleep(20 * time.Millisecond)
	}

	up := &sickUpstream{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: up}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	url := "http://" + ln.Addr().String() + "/"

	fmt.Printf("fleetlab: %d processes, breaker MinCalls %d, one request per %v each, redis-server on %s\n",
		*procs, *minCalls, *interval, addr)
	fmt.Printf("target (issue 19): shared ≤ 1.2 × MinCalls = %.0f plus probes; about %d × MinCalls = %d locally; first trip to all open ≤ 250 ms\n\n",
		1.2*float64(*minCalls), *procs, *procs**minCalls)
	for _, skew := range []bool{false, true} {
		if skew {
			fmt.Println("load: skewed, process i calls at 1/(i+1) of the rate")
		} else {
			fmt.Println("load: every process at the same rate")
		}
		if err := runModes(up, url, addr, rc, skew); err != nil {
			return err
		}
	}
	return nil
}

func runModes(up *sickUpstream, url, addr string, rc *redis.Client, skew bool) error {
	fmt.Printf("%-7s %4s %18s %22s %24s\n", "mode", "run", "calls before stop", "first trip → all open", "calls in all, +"+after.String())
	for _, mode := range []string{"local", "shared"} {
		var calls, totals []int
		var spans []time.Duration
		for r := range *runs {
			ra := ""
			if mode == "shared" {
				ra = addr
				_ = rc.FlushAll(context.Background()).Err()
			}
			n, span, total, err := runFleet(up, url, ra, mode+strconv.Itoa(r)+strconv.FormatBool(skew), skew)
			if err != nil {
				return err
			}
			calls, spans, totals = append(calls, n), append(spans, span), append(totals, total)
			fmt.Printf("%-7s %4d %18d %22v %24d\n", mode, r+1, n, span.Round(time.Millisecond), total)
		}
		fmt.Printf("%-7s %4s %18d %22v %24d\n\n", mode, "med", medianInt(calls), medianDur(spans).Round(time.Millisecond), medianInt(totals))
	}
	return nil
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

// runFleet starts the children, lets them go together, and waits for
// each to report the time its breaker first refused.
func runFleet(up *sickUpstream, url, redisAddr, prefix string, skew bool) (int, time.Duration, int, error) {
	up.reset()
	exe, err := os.Executable()
	if err != nil {
		return 0, 0, 0, err
	}
	type kid struct {
		cmd   *exec.Cmd
		stdin io.WriteCloser
		out   *bufio.Scanner
	}
	kids := make([]kid, *procs)
	for i := range kids {
		every := *interval
		if skew {
			every *= time.Duration(i + 1)
		}
		cmd := exec.Command(exe, "-child", "-redis", redisAddr, "-upstream", url,
			"-mincalls", strconv.Itoa(*minCalls), "-interval", every.String(), "-openfor", openFor.String())
		cmd.Env = append(os.Environ(), "FLEETLAB_PREFIX="+prefix)
		cmd.Stderr = os.Stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			return 0, 0, 0, err
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return 0, 0, 0, err
		}
		if err := cmd.Start(); err != nil {
			return 0, 0, 0, err
		}
		kids[i] = kid{cmd, in, bufio.NewScanner(out)}
	}
	defer func() {
		for _, k := range kids {
			_ = k.stdin.Close()
			_ = k.cmd.Wait()
		}
	}()
	for i, k := range kids {
		if !k.out.Scan() || k.out.Text() != "READY" {
			return 0, 0, 0, fmt.Errorf("child %d did not get ready", i)
		}
	}
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
	cfg := bulwark.Config{Default: p}
	if *redisURL != "" {
		rc := redis.NewClient(&redis.Options{Addr: *redisURL, DialTimeout: 200 * time.Millisecond,
			ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond, MaxRetries: -1})
		defer rc.Close()
		f, err := redisfleet.New(rc, redisfleet.Options{Prefix: "fleetlab:" + os.Getenv("FLEETLAB_PREFIX") + ":"})
		if err != nil {
			return err
		}
		cfg.Fleet = f
	}
	tr, err := bulwark.New(cfg)
	if err != nil {
		return err
	}
	defer tr.Close()
	if cfg.Fleet != nil {
		for i := 0; !tr.Snapshot().Fleet.Connected; i++ {
			if i > 500 {
				return errors.New("fleet never connected")
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	fmt.Println("READY")
	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() || in.Text() != "GO" {
		return nil
	}
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
