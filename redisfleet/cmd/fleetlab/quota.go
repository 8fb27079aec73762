package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/bulwark-http/bulwark"
	"golang.org/x/time/rate"
)

// thirdParty stands in for an API with an account quota: a token bucket
// of quota a second holding a second's worth (so at most quota requests
// in any second after a quiet one, and quota a second sustained); past
// it, 429 with Retry-After. It notes every arrival and its status.
type thirdParty struct {
	lim  *rate.Limiter
	mu   sync.Mutex
	hits []hit
}

type hit struct {
	at   int64 // unix nanoseconds
	code int
}

func newThirdParty(quota float64) *thirdParty {
	return &thirdParty{lim: rate.NewLimiter(rate.Limit(quota), int(quota))}
}

func (u *thirdParty) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	code := http.StatusOK
	if !u.lim.AllowN(now, 1) {
		code = http.StatusTooManyRequests
		w.Header().Set("Retry-After", "1")
	}
	u.mu.Lock()
	u.hits = append(u.hits, hit{now.UnixNano(), code})
	u.mu.Unlock()
	w.WriteHeader(code)
}

// window counts the arrivals, and the 429s among them, in [from, to).
func (u *thirdParty) window(from, to time.Time) (arrivals, rejected int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, h := range u.hits {
		if h.at >= from.UnixNano() && h.at < to.UnixNano() {
			arrivals++
			if h.code == http.StatusTooManyRequests {
				rejected++
			}
		}
	}
	return arrivals, rejected
}

// busiestSecond is the most arrivals in any whole second from from to to,
// counted from from.
func (u *thirdParty) busiestSecond(from, to time.Time) int {
	most := 0
	for s := from; s.Add(time.Second).Compare(to) <= 0; s = s.Add(time.Second) {
		n, _ := u.window(s, s.Add(time.Second))
		most = max(most, n)
	}
	return most
}

// childStat is one STAT line of a quota child: its counts so far.
type childStat struct {
	at                                    time.Time
	sent, got429, refused, paused, others int64
	local                                 bool
	leases                                uint64
}

func parseStat(line string) (childStat, bool) {
	f := strings.Fields(line)
	if len(f) != 9 || (f[0] != "STAT" && f[0] != "DONE") {
		return childStat{}, false
	}
	var n [8]int64
	for i := range n {
		v, err := strconv.ParseInt(f[i+1], 10, 64)
		if err != nil {
			return childStat{}, false
		}
		n[i] = v
	}
	return childStat{at: time.Unix(0, n[0]), sent: n[1], got429: n[2], refused: n[3], paused: n[4], others: n[5],
		local: n[6] == 1, leases: uint64(n[7])}, true
}

// quotaMode is one way the fleet limits itself against the quota.
type quotaMode struct {
	name, what string
	localRate  float64 // Bulkhead.Rate of each process
	shared     bool    // Bulkhead.FleetRate = the quota, through Redis
}

// quotaRun is what one run of the quota scenario measured.
type quotaRun struct {
	mode                      quotaMode
	dur                       time.Duration
	reachPerSec, okPerSec     float64 // after the first second
	busiest                   int     // most arrivals in one second, after the first
	rejectedAfter1s, rejected int     // 429s
	refused, paused, others   int64   // the children's own counts
	phases                    []phase // the outage scenario's
}

// phase is a stretch of the outage scenario.
type phase struct {
	name                string
	reachPerSec         float64
	rejected            int
	others              int64
	localProcs, leasing int // processes answering locally / whose leases grew, at the phase's end
}

// runQuotaFleet starts the children against up, lets them offer their
// load for dur, and collects their STAT lines; during, if not nil, runs
// alongside (the outage).
func runQuotaFleet(up *thirdParty, url, redisAddr, prefix string, m quotaMode, dur time.Duration, during func(start time.Time)) (time.Time, [][]childStat, error) {
	kids, stop, err := startKids(prefix, func(int) []string {
		args := []string{"-child", "-kind", "quota", "-upstream", url, "-interval", quotaEvery().String(), "-dur", dur.String(),
			"-rate", strconv.FormatFloat(m.localRate, 'g', -1, 64)}
		if m.shared {
			args = append(args, "-redis", redisAddr, "-fleetrate", strconv.FormatFloat(*quota, 'g', -1, 64))
		}
		return args
	})
	if err != nil {
		return time.Time{}, nil, err
	}
	defer stop()
	start := time.Now()
	for _, k := range kids {
		_, _ = io.WriteString(k.stdin, "GO\n")
	}
	if during != nil {
		go during(start)
	}
	stats := make([][]childStat, len(kids))
	var wg sync.WaitGroup
	for i, k := range kids {
		wg.Go(func() {
			for k.out.Scan() {
				if s, ok := parseStat(k.out.Text()); ok {
					stats[i] = append(stats[i], s)
					if strings.HasPrefix(k.out.Text(), "DONE") {
						return
					}
				}
			}
		})
	}
	wg.Wait()
	for i, s := range stats {
		if len(s) == 0 {
			return time.Time{}, nil, fmt.Errorf("child %d reported nothing", i)
		}
	}
	return start, stats, nil
}

// quotaEvery is each process's pause between requests: together they
// offer -offered requests a second.
func quotaEvery() time.Duration {
	return time.Duration(float64(time.Second) * float64(*procs) / *offered)
}

// lastBefore is a child's last STAT at or before t.
func lastBefore(s []childStat, t time.Time) childStat {
	var c childStat
	for _, x := range s {
		if x.at.After(t) {
			break
		}
		c = x
	}
	return c
}

func runQuota(redisAddr string, out io.Writer) ([]quotaRun, error) {
	modes := []quotaMode{
		{name: "local", what: "each process limits itself to the quota (Bulkhead.Rate " + fmtRate(*quota) + "): all a process alone knows", localRate: *quota},
		{name: "split", what: "each process limits itself to an eighth of it (Bulkhead.Rate " + fmtRate(*quota/float64(*procs)) + "): a static split", localRate: *quota / float64(*procs)},
		{name: "shared", what: "Bulkhead.FleetRate " + fmtRate(*quota) + " through redisfleet's leases", shared: true},
	}
	fmt.Fprintf(out, "quota: a third party allowing %s req/s (429 + Retry-After beyond), %d processes offering %s req/s together for %v\n",
		fmtRate(*quota), *procs, fmtRate(*offered), *quotaDur)
	fmt.Fprintf(out, "target (issue 19): shared ≤ 105 req/s reach it, no 429 after the first second\n")
	fmt.Fprintf(out, "%-7s %12s %10s %14s %12s %12s %10s %8s\n", "mode", "reach req/s", "ok req/s", "busiest second", "429 after 1s", "refused here", "paused", "errors")
	var runs []quotaRun
	for i, m := range modes {
		up, url, stop, err := serveThirdParty()
		if err != nil {
			return nil, err
		}
		start, stats, err := runQuotaFleet(up, url, redisAddr, "quota"+strconv.Itoa(i), m, *quotaDur, nil)
		stop()
		if err != nil {
			return nil, err
		}
		r := summarize(up, m, start, *quotaDur, stats)
		runs = append(runs, r)
		fmt.Fprintf(out, "%-7s %12.1f %10.1f %14d %12d %12d %10d %8d\n", m.name, r.reachPerSec, r.okPerSec, r.busiest, r.rejectedAfter1s, r.refused, r.paused, r.others)
	}
	fmt.Fprintln(out)
	return runs, nil
}

func summarize(up *thirdParty, m quotaMode, start time.Time, dur time.Duration, stats [][]childStat) quotaRun {
	r := quotaRun{mode: m, dur: dur}
	end := start.Add(dur)
	after := start.Add(time.Second)
	n, rej := up.window(after, end)
	r.reachPerSec = float64(n) / (dur - time.Second).Seconds()
	r.okPerSec = float64(n-rej) / (dur - time.Second).Seconds()
	r.rejectedAfter1s = rej
	_, r.rejected = up.window(start, end.Add(time.Second))
	r.busiest = up.busiestSecond(after, end)
	for _, s := range stats {
		last := s[len(s)-1]
		r.refused += last.refused
		r.paused += last.paused
		r.others += last.others
	}
	return r
}

func serveThirdParty() (*thirdParty, string, func(), error) {
	up := newThirdParty(*quota)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", nil, err
	}
	srv := &http.Server{Handler: up}
	go func() { _ = srv.Serve(ln) }()
	return up, "http://" + ln.Addr().String() + "/", func() { _ = srv.Close() }, nil
}

// runOutage runs the shared quota with Redis killed for -outage from the
// fifth second: the processes must fail no request because of it, keep
// the fleet near the quota on their last shares, and lease again after.
func runOutage(rs *redisProc, out io.Writer) (quotaRun, error) {
	m := quotaMode{name: "shared", what: "Bulkhead.FleetRate through redisfleet, Redis killed mid-run", shared: true}
	killAt := 5 * time.Second
	dur := killAt + *outage + 5*time.Second
	up, url, stop, err := serveThirdParty()
	if err != nil {
		return quotaRun{}, err
	}
	defer stop()
	var restartErr error
	done := make(chan struct{})
	start, stats, err := runQuotaFleet(up, url, rs.addr(), "outage", m, dur, func(start time.Time) {
		defer close(done)
		time.Sleep(time.Until(start.Add(killAt)))
		rs.kill()
		time.Sleep(time.Until(start.Add(killAt + *outage)))
		restartErr = rs.start()
	})
	<-done
	if err != nil {
		return quotaRun{}, err
	}
	if restartErr != nil {
		return quotaRun{}, restartErr
	}
	r := summarize(up, m, start, dur, stats)
	bounds := []struct {
		name     string
		from, to time.Duration
	}{{"before (1 s–5 s)", time.Second, killAt}, {"Redis down (" + outage.String() + ")", killAt, killAt + *outage},
		{"after (5 s)", killAt + *outage, dur}}
	for _, b := range bounds {
		from, to := start.Add(b.from), start.Add(b.to)
		n, rej := up.window(from, to)
		ph := phase{name: b.name, reachPerSec: float64(n) / (b.to - b.from).Seconds(), rejected: rej}
		for _, s := range stats {
			a, z := lastBefore(s, from), lastBefore(s, to)
			ph.others += z.others - a.others
			if z.local {
				ph.localProcs++
			}
			if z.leases > lastBefore(s, to.Add(-time.Second)).leases {
				ph.leasing++
			}
		}
		r.phases = append(r.phases, ph)
	}
	fmt.Fprintf(out, "outage: the shared quota, Redis killed %v after the start for %v\n", killAt, *outage)
	fmt.Fprintf(out, "target (issue 19): 0 requests failed because of it, sharing resumes after\n")
	fmt.Fprintf(out, "%-22s %12s %6s %8s %18s %16s\n", "phase", "reach req/s", "429s", "errors", "answering locally", "leasing (last s)")
	for _, ph := range r.phases {
		fmt.Fprintf(out, "%-22s %12.1f %6d %8d %18d %16d\n", ph.name, ph.reachPerSec, ph.rejected, ph.others, ph.localProcs, ph.leasing)
	}
	fmt.Fprintln(out)
	return r, nil
}

func fmtRate(r float64) string { return strconv.FormatFloat(r, 'f', -1, 64) }

// runQuotaChild is one process of the quota scenario: it offers a
// request every -interval for -dur, and reports its counts every 250 ms.
func runQuotaChild() error {
	p := bulwark.Policy{}
	p.Retry.Disabled = true // a 429 pauses (pushback), it is not retried
	p.Breaker.Disabled = true
	p.Bulkhead.MaxConcurrent = 100
	p.Bulkhead.Rate = *localRate
	p.Bulkhead.FleetRate = *fleetRate
	tr, _, done, err := childReady(p)
	if err != nil || tr == nil {
		return err
	}
	defer done()
	host := strings.TrimSuffix(strings.TrimPrefix(*target, "http://"), "/")
	var c childStat
	stat := func(word string) {
		c.at = time.Now()
		local, leases := 0, uint64(0)
		if h := tr.Snapshot().Host(host); len(h) == 1 && h[0].Quota != nil {
			if h[0].Quota.Local {
				local = 1
			}
			leases = h[0].Quota.Leases
		}
		fmt.Println(word, c.at.UnixNano(), c.sent, c.got429, c.refused, c.paused, c.others, local, leases)
	}
	client := &http.Client{Transport: tr}
	start := time.Now()
	nextStat := start.Add(250 * time.Millisecond)
	reported := false
	for i := 0; ; i++ {
		at := start.Add(time.Duration(i) * *interval)
		if !at.Before(start.Add(*dur)) {
			break
		}
		time.Sleep(time.Until(at))
		resp, err := client.Get(*target)
		switch {
		case err == nil:
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			c.sent++
			if resp.StatusCode == http.StatusTooManyRequests {
				c.got429++
			}
		case errors.Is(err, bulwark.ErrRateLimited):
			c.refused++
		case errors.Is(err, bulwark.ErrPushback):
			c.paused++
		default:
			c.others++
			if !reported {
				fmt.Fprintln(os.Stderr, "fleetlab child: request failed:", err)
				reported = true
			}
		}
		if time.Now().After(nextStat) {
			stat("STAT")
			nextStat = nextStat.Add(250 * time.Millisecond)
		}
	}
	stat("DONE")
	return nil
}
