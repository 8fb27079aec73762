// Command lab is bulwark's resilience lab: it replays well-known outages
// (from Michael Nygard's Release It!, Google's Site Reliability
// Engineering book, the AWS Builders' Library, Dean and Barroso's "The
// Tail at Scale") on 127.0.0.1 with real HTTP servers and clients,
// measures what happens with a plain client and with bulwark, prints
// per-second tables and sparklines, and writes a self-contained HTML
// report.
//
// The scenarios are the registry in registry.go, one file each: "tuesday"
// (a slow tax service drains checkout's worker pool), "storm" (a 2 s blip
// turns into a retry storm), "deadlines" (5 % of calls never complete),
// "outlier" (3 of 20 instances sick, without and with outlier ejection),
// "tail" (1 % of attempts take a second: hedging), "capacity" (a service
// loses three quarters of its cores: the adaptive concurrency limit) and
// "throttle" (callers offer five times what a backend accepts: adaptive
// throttling). Each sums itself up in one computed "Verdict:" line. Time
// is scaled (-scale) so the whole lab finishes in about a minute and a
// half; every run is bounded and stops by itself. The fleet (redisfleet)
// has a lab of its own, which needs redis-server (fleetPointer).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"time"
)

func main() {
	if err := mainErr(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "lab:", err)
			os.Exit(1)
		}
	}
}

func mainErr(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("lab", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		which    = fs.String("scenario", "all", "which scenario to run: all, "+keys())
		duration = fs.Duration("duration", 0, "length of each run (0: each scenario's default: tuesday 9s, storm 4.4s (grows with -scale), deadlines 5s, outlier 5s, tail 6s, capacity 10s, throttle 4s, chain 9s)")
		load     = fs.Float64("load", 400, "requests per second offered in each run (10..5000)")
		scale    = fs.Float64("scale", 0.25, "time scale: every duration of the scenarios (40 ms, 10 s, a 2 s blip, 100 s) is multiplied by it (0.05..2)")
		report   = fs.String("out", "", "where to write the HTML report (default: bulwark-lab-<date>-<time>.html in the working directory, named on the output; \"-\": none)")
	)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: go run ./lab [flags]\n\nThe resilience lab replays well-known outages on 127.0.0.1 and\nmeasures a plain http.Client against bulwark:\n\n")
		for _, sp := range scenarios {
			fmt.Fprintf(fs.Output(), "  %-10s %s\n", sp.key, sp.blurb)
		}
		fmt.Fprintf(fs.Output(), "\nTime is scaled (-scale). The defaults finish in about a minute and a half on two cores.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	set := settings{scale: *scale, load: *load, duration: *duration}
	switch {
	case !(set.scale >= 0.05 && set.scale <= 2):
		return fmt.Errorf("-scale %g: must be within 0.05..2", set.scale)
	case !(set.load >= 10 && set.load <= 5000):
		return fmt.Errorf("-load %g: must be within 10..5000", set.load)
	case set.duration < 0 || set.duration > 2*time.Minute:
		return fmt.Errorf("-duration %v: must be within 0..2m", set.duration)
	case set.duration > 0 && set.duration < time.Second:
		return fmt.Errorf("-duration %v: must be at least 1s", set.duration)
	}
	specs, err := pick(*which)
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	// A hard bound on the whole lab, whatever the flags.
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()

	path := *report
	if path == "" {
		path = defaultReport(time.Now())
	}
	// The detail of each scenario is held until every scenario has run, so
	// that the output opens with all the verdicts, one line each: what a
	// reader wants first. Progress goes to stderr meanwhile.
	l := &lab{set: set, progress: stderr, tty: isTerminal(stderr)}
	scs, runErr := l.runAll(ctx, specs)
	if len(scs) == 0 {
		return runErr
	}
	abs := ""
	if path != "-" {
		var err error
		if abs, err = writeReport(path, set, scs); err != nil {
			return errors.Join(runErr, err)
		}
	}
	fmt.Fprintf(stdout, "bulwark resilience lab: real HTTP on 127.0.0.1, time scaled ×%g, %.0f req/s offered per run\n\n", set.scale, set.load)
	for _, sc := range scs {
		fmt.Fprintf(stdout, "%s [%s]\n", verdictLine(sc), sc.key)
	}
	if abs != "" {
		fmt.Fprintf(stdout, "\nHTML report: %s\n", abs)
	}
	fmt.Fprintf(stdout, "\nThe detail of each scenario follows.\n")
	for _, sc := range scs {
		l.render(stdout, sc)
	}
	if len(scs) > 1 {
		fmt.Fprintf(stdout, "\n%s\n", fleetPointer)
	}
	if abs != "" {
		fmt.Fprintf(stdout, "\nHTML report: %s\n", abs)
	}
	return runErr
}

// defaultReport is the report's path when -out is not given: a file in
// the working directory, where a user looks, named for the instant the run
// ended so that two runs do not overwrite each other.
func defaultReport(now time.Time) string {
	return "bulwark-lab-" + now.Format("20060102-150405") + ".html"
}

// writeReport writes the HTML report of scs to path and returns the
// path made absolute, as printed.
func writeReport(path string, set settings, scs []*scenario) (string, error) {
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	if err := writeHTML(f, set, scs, time.Now()); err != nil {
		f.Close()
		return "", err
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	return filepath.Abs(path)
}

// isTerminal reports whether w is a terminal (a character device), where
// a progress line redrawn with carriage returns is welcome; in a pipe or a
// file it would be one long line of log.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// runAll runs the scenarios in order and returns those that finished (all
// of them unless it returns an error). Away from a terminal, progress is
// one line per scenario.
func (l *lab) runAll(ctx context.Context, specs []spec) ([]*scenario, error) {
	var scs []*scenario
	for k, sp := range specs {
		l.k, l.n = k+1, len(specs)
		t0 := time.Now()
		if !l.tty && l.progress != io.Discard {
			fmt.Fprintf(l.progress, "scenario %d of %d: %s\n", l.k, l.n, sp.key)
		}
		longestStall.Store(0)
		sc, err := sp.run(l, ctx)
		if err != nil {
			return scs, err
		}
		if n := stallNote(); n != "" {
			sc.explain = append(sc.explain, n)
		}
		if err := ctx.Err(); err != nil {
			return scs, fmt.Errorf("interrupted: %w", err)
		}
		sc.key, sc.title = sp.key, sp.title
		sc.verdict = sp.verdict(sc)
		sc.took = time.Since(t0)
		scs = append(scs, sc)
	}
	return scs, nil
}
