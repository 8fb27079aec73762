package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// settings are what the flags choose. Every duration of the scenarios, as
// their sources tell them (40 ms, 10 s, a 2 s blip, 100 s deadlines), is
// multiplied by scale.
type settings struct {
	scale    float64       // scenario time × scale = lab time
	load     float64       // requests per second offered in each run
	duration time.Duration // length of each run; zero: each scenario's default
}

// ref converts one of the scenarios' unscaled durations to lab time.
func (s settings) ref(d time.Duration) time.Duration {
	return time.Duration(float64(d) * s.scale)
}

// runLen is the length of a run: the -duration flag or the scenario's own.
func (s settings) runLen(def time.Duration) time.Duration {
	if s.duration > 0 {
		return s.duration
	}
	return def
}

// mark is a span of a run worth shading on a chart (a sickness, a blip).
type mark struct {
	from, to time.Duration
	label    string
}

// run is the measured outcome of one configuration of a scenario.
type run struct {
	name     string
	short    string // column label in the terminal table
	tl       *timeline
	headline []stat
	notes    []string           // said under the headline, e.g. what is not measured yet
	metrics  map[string]float64 // headline numbers for the tests
}

type stat struct{ label, value string }

// scenario is one of the lab's experiments, after it ran.
type scenario struct {
	key, title string
	verdict    string // the key figure, plain against bulwark (spec.verdict)
	intro      []string
	// explain are sentences under the charts that say why a result looks
	// the way it does, with the run's own figures.
	explain []string
	// headings names the charts: series name → a heading a person would
	// write; a series without one is headed by its name.
	headings map[string]string
	took     time.Duration // wall time of the scenario
	marks    []mark
	runs     []*run
	length   time.Duration // the arrivals' span; buckets after it are drain
}

// lab is one invocation: where its output goes and what it measured.
type lab struct {
	set      settings
	progress io.Writer // the progress indicator; io.Discard in tests
	tty      bool      // progress is a terminal: redraw one line in place
	k, n     int       // scenario k of n, for the progress line
}

// server is an HTTP server of the lab's own on 127.0.0.1. stop is closed
// when it shuts down, so handlers that wait (a sick upstream, a hung call)
// return and no goroutine outlives the scenario.
type server struct {
	url  string
	host string // host:port
	srv  *http.Server
	stop chan struct{}
	ctx  context.Context // ends at shutdown
	end  context.CancelFunc
}

func startServer(h func(s *server) http.Handler) (*server, error) {
	var ln net.Listener
	if inMemory != nil {
		ln = inMemory.listen()
	} else {
		var err error
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			return nil, err
		}
	}
	s := &server{stop: make(chan struct{}), host: ln.Addr().String()}
	s.url = "http://" + s.host
	s.ctx, s.end = context.WithCancel(context.Background())
	s.srv = &http.Server{Handler: h(s), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

func (s *server) close() {
	close(s.stop)
	s.end()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.srv.Shutdown(ctx); err != nil {
		_ = s.srv.Close()
	}
}

// sleep waits d or until the server stops, whichever is first.
func (s *server) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
	case <-s.stop:
	}
	return false
}

// loopbackTransport is the base every lab client sends through: the
// standard transport with an idle pool large enough for the lab's
// concurrency, so connection churn does not blur the comparison.
func loopbackTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 2048
	t.MaxIdleConnsPerHost = 1024
	t.Proxy = nil // loopback only, whatever the environment says
	if inMemory != nil {
		t.DialContext = inMemory.dial
	}
	return t
}

// send sends one request and returns its status and (at most 4 KiB of)
// its body, closing the body so the connection is reused.
func send(ctx context.Context, c *http.Client, method, url string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	return resp.StatusCode, b, err
}

// openLoop offers rate requests per second for d, evenly spaced, each in
// its own goroutine, whatever happens to the earlier ones: offered load
// that does not slow down when the service does, like users. At most
// maxInFlight run at once; an arrival beyond that is passed to fire with
// dropped set, and fire must record it as failed without sending. It
// returns when every request has finished.
func openLoop(ctx context.Context, rate float64, d time.Duration, maxInFlight int, fire func(ctx context.Context, i int, at time.Time, dropped bool)) {
	total := int(rate * d.Seconds())
	var (
		wg       sync.WaitGroup
		inFlight atomic.Int64
	)
	start := time.Now()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	prev := start
	for i := 0; i < total; {
		select {
		case <-ctx.Done():
			i = total
			continue
		case <-tick.C:
		}
		now := time.Now()
		noteStall(now.Sub(prev))
		prev = now
		due := min(total, int(time.Since(start).Seconds()*rate)+1)
		for ; i < due; i++ {
			at := time.Now()
			if inFlight.Load() >= int64(maxInFlight) {
				fire(ctx, i, at, true)
				continue
			}
			inFlight.Add(1)
			n := i // i is shared by the loops; each arrival keeps its own number
			wg.Go(func() {
				defer inFlight.Add(-1)
				fire(ctx, n, at, false)
			})
		}
	}
	wg.Wait()
}

// calibrate measures a healthy upstream's p99.9 latency with n calls from
// conc goroutines: the number a timeout is chosen from.
func calibrate(ctx context.Context, c *http.Client, url string, n, conc int) (time.Duration, error) {
	lat := make([]float64, n)
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		first error
		mu    sync.Mutex
	)
	for range conc {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				t0 := time.Now()
				code, _, err := send(ctx, c, http.MethodGet, url)
				if err == nil && code != http.StatusOK {
					err = fmt.Errorf("status %d", code)
				}
				if err != nil {
					mu.Lock()
					first = errors.Join(first, err)
					mu.Unlock()
					return
				}
				lat[i] = float64(time.Since(t0))
			}
		})
	}
	wg.Wait()
	if first != nil {
		return 0, fmt.Errorf("calibrating %s: %w", url, first)
	}
	return time.Duration(percentile(lat, 0.999)), nil
}

// showProgress redraws a one-line indicator on a terminal until the
// returned func is called; anywhere else it writes nothing (runAll writes
// one line per scenario). Elapsed time is clamped to total: a run that
// drains late shows a full bar, not 5.8s/5.0s.
func (l *lab) showProgress(what string, total time.Duration) func() {
	if l.progress == io.Discard || !l.tty {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	wg.Go(func() {
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			el := min(time.Since(start), total)
			n := min(30, int(30*el/max(total, 1)))
			fmt.Fprintf(l.progress, "\r  scenario %d of %d: %-40.40s [%-30s] %4.1fs/%.1fs ", l.k, l.n, what, bar(n), el.Seconds(), total.Seconds())
			select {
			case <-done:
				fmt.Fprintf(l.progress, "\r%110s\r", "")
				return
			case <-t.C:
			}
		}
	})
	return func() { close(done); wg.Wait() }
}

func bar(n int) string { return strings.Repeat("#", n) }

// roundUp rounds d up to a multiple of m: a timeout chosen from a measured
// percentile must not fall below it by rounding.
func roundUp(d, m time.Duration) time.Duration {
	if r := d % m; r != 0 {
		return d + m - r
	}
	return d
}

// sideBySide runs n configurations of a scenario at once, run(i) each,
// under one progress line, and returns the first error (errors.Join of
// them all). Side by side rather than one after the other: the runs see
// the same machine at the same moment, and the lab's total time stays
// within make demo's budget.
func (l *lab) sideBySide(what string, total time.Duration, n int, run func(i int) error) error {
	var wg sync.WaitGroup
	errs := make([]error, n)
	stop := l.showProgress(what, total)
	for i := range n {
		wg.Go(func() { errs[i] = run(i) })
	}
	wg.Wait()
	stop()
	return errors.Join(errs...)
}

// longestStall is the longest gap between two ticks of any open loop's
// 2 ms clock since the last reset: how long the machine (other processes,
// a GC pause) kept the lab from running at once. runAll resets it before
// each scenario and says so when it is long, since every latency figure of
// the scenario then includes such stalls.
var longestStall atomic.Int64

func noteStall(gap time.Duration) {
	for m := longestStall.Load(); int64(gap) > m && !longestStall.CompareAndSwap(m, int64(gap)); m = longestStall.Load() {
	}
}

// stallNote is the sentence runAll adds to a scenario that stalled for
// more than 100 ms at once; empty otherwise.
func stallNote() string {
	d := time.Duration(longestStall.Load())
	if d <= 100*time.Millisecond {
		return ""
	}
	return fmt.Sprintf("While this scenario ran, the machine kept the lab from running for up to %v at once (the arrivals' 2 ms clock fell that far behind: other processes, a GC pause); every latency above includes such stalls, so on a quieter machine the figures are cleaner.", d.Round(time.Millisecond))
}
