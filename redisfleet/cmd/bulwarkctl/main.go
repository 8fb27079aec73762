// Command bulwarkctl pushes bulwark's configuration to a fleet through
// Redis and shows which process runs which version: the operator's side of
// redisfleet's ConfigFollower.
//
//	bulwarkctl validate policies.yaml                 # as the processes will, with an empty Registry
//	bulwarkctl push policies.yaml                     # to every process
//	bulwarkctl push -canary 10% -wait 2s policies.yaml  # to 10 % of them first, and wait for their acks
//	bulwarkctl promote                                # the canary to every process
//	bulwarkctl rollback                               # end the canary, or return to the previous version
//	bulwarkctl status                                 # who runs what, who refused what and why
//
// Global flags come before the command: -redis (host:port; several,
// comma-separated, for a Cluster, or the Sentinels with -master name),
// -prefix (the processes' redisfleet.Options.Prefix), -timeout.
//
// validate and push check the file with an empty Registry: a file that
// names the programs' functions (a fallback, a classifier) cannot be
// checked here; validate says so, and push -unchecked sends it for the
// processes to check with their own Registry (status shows their refusals).
//
// push -canary takes a percentage with its sign, 10% for a tenth of the
// processes, from 0.01% to 99.99%: a bare number is refused, so neither
// 0.1 (a tenth? a tenth of a percent?) nor 10 is read as the other.
// A flag or an argument a command does not take (rollback -canary 10%,
// promote FILE) is a misuse, as is a second -canary: nothing is done.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/bulwark-http/bulwark/config"
	"github.com/bulwark-http/bulwark/redisfleet"
	"github.com/redis/go-redis/v9"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `usage: bulwarkctl [-redis host:port[,host:port...]] [-master name] [-prefix p] [-timeout d] command [flags] [file]

commands:
  validate FILE                          check FILE as a process would (empty Registry)
  push [-canary N%] [-unchecked] [-wait d] FILE
                                         push FILE to the fleet, or first to N% of it
                                         (a percentage with its sign: 10% is a tenth)
  promote [-wait d]                      push the canary to every process
  rollback [-wait d]                     end the canary, or return to the previous version
  status                                 which process runs which version, or refused what
`

// run is the command, with its exit code: 0 done, 1 failed (or, with
// -wait, a process refused or did not answer in time), 2 misused.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	global := flag.NewFlagSet("bulwarkctl", flag.ContinueOnError)
	global.SetOutput(stderr)
	global.Usage = func() { fmt.Fprint(stderr, usage) }
	addr := global.String("redis", "127.0.0.1:6379", "Redis address, host:port; several, comma-separated, for a Cluster (or Sentinels with -master)")
	master := global.String("master", "", "the Sentinel master's name, with -redis naming the Sentinels")
	prefix := global.String("prefix", redisfleet.DefaultPrefix, "the fleet's redisfleet.Options.Prefix")
	timeout := global.Duration("timeout", time.Second, "bound on each Redis call")
	if err := global.Parse(args); err != nil {
		return 2
	}
	if global.NArg() == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmd, rest := global.Arg(0), global.Args()[1:]
	sub := flag.NewFlagSet("bulwarkctl "+cmd, flag.ContinueOnError)
	sub.SetOutput(stderr)
	var canary percent
	sub.Var(&canary, "canary", "push: the share of the processes that get it first, a percentage `N%` with its sign: 10% for a tenth (not 0.1, nor 10); without it, every process")
	unchecked := sub.Bool("unchecked", false, "push: skip the local check (a file naming the programs' functions)")
	wait := sub.Duration("wait", 0, "push, promote, rollback: wait this long for every process's ack, then show the status")
	if err := sub.Parse(rest); err != nil {
		return 2
	}
	if err := checkUse(cmd, sub); err != nil {
		fmt.Fprintf(stderr, "bulwarkctl %v\n%s", err, usage)
		return 2
	}

	if cmd == "validate" {
		cfg, err := config.Load(sub.Arg(0), config.Registry{})
		if err != nil {
			fmt.Fprintln(stderr, err)
			hintNames(stderr, err)
			return 1
		}
		fmt.Fprintf(stdout, "%s: valid, version %s\n", sub.Arg(0), cfg.Version)
		return 0
	}

	// One address is a single node, several a Cluster, a master name
	// Sentinels: go-redis's UniversalClient decides so.
	rc := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: strings.Split(*addr, ","), MasterName: *master,
		DialTimeout: *timeout, ReadTimeout: *timeout, WriteTimeout: *timeout, MaxRetries: -1})
	defer rc.Close()
	f, err := redisfleet.New(rc, redisfleet.Options{Prefix: *prefix, ID: "bulwarkctl", Timeout: *timeout})
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	var r redisfleet.Pushed
	switch cmd {
	case "push":
		data, err := readFile(sub.Arg(0))
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		r, err = f.PushConfig(ctx, data, redisfleet.PushOptions{Canary: canary.share, Unchecked: *unchecked})
		if err != nil {
			fmt.Fprintln(stderr, strings.Replace(err.Error(), "push:", sub.Arg(0)+":", 1))
			hintNames(stderr, err)
			return 1
		}
	case "promote":
		r, err = f.PromoteConfig(ctx)
	case "rollback":
		r, err = f.RollbackConfig(ctx)
	case "status":
		st, err := f.ConfigStatus(ctx)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		printStatus(stdout, st, time.Now())
		return 0
	default:
		fmt.Fprint(stderr, usage)
		return 2
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	what := "every process"
	if r.Canary {
		what = "the canary (" + canary.String() + " of the processes, by ID)"
	}
	fmt.Fprintf(stdout, "%s: version %s for %s, seq %d", cmd, r.Version, what, r.Seq)
	if r.Previous != "" {
		fmt.Fprintf(stdout, "; rollback returns to %s", r.Previous)
	}
	fmt.Fprintln(stdout)
	if *wait <= 0 {
		return 0
	}
	st, done := waitAcks(ctx, f, r.Seq, *wait)
	printStatus(stdout, st, time.Now())
	if !done {
		fmt.Fprintf(stderr, "not every process acknowledged seq %d within %v\n", r.Seq, *wait)
		return 1
	}
	for _, p := range st.Processes {
		if p.Refused != "" || p.Error != "" {
			return 1
		}
	}
	return 0
}

// commands are the flags each command takes and whether it takes a FILE.
var commands = map[string]struct {
	flags []string
	file  bool
}{
	"validate": {nil, true},
	"push":     {[]string{"canary", "unchecked", "wait"}, true},
	"promote":  {[]string{"wait"}, false},
	"rollback": {[]string{"wait"}, false},
	"status":   {nil, false},
}

// checkUse refuses what cmd would otherwise ignore: a flag of another
// command (rollback -canary 10% ends a canary, it pushes none) or an
// argument it takes none of.
func checkUse(cmd string, sub *flag.FlagSet) error {
	c, ok := commands[cmd]
	if !ok {
		return fmt.Errorf("%s: no such command", cmd)
	}
	var stray []string
	sub.Visit(func(fl *flag.Flag) {
		if !slices.Contains(c.flags, fl.Name) {
			stray = append(stray, "-"+fl.Name)
		}
	})
	switch {
	case len(stray) > 0:
		return fmt.Errorf("%s: %s does not apply to %s", cmd, strings.Join(stray, ", "), cmd)
	case c.file && sub.NArg() == 0:
		return fmt.Errorf("%s: %s takes one FILE, got none", cmd, cmd)
	case c.file && sub.NArg() > 1:
		return fmt.Errorf("%s: %s takes one FILE, got %d arguments: %q (flags go before the FILE)", cmd, cmd, sub.NArg(), sub.Args())
	case !c.file && sub.NArg() > 0:
		return fmt.Errorf("%s: %s takes no argument, got %q", cmd, cmd, sub.Arg(0))
	}
	return nil
}

// readFile reads at most config.MaxBytes+1 bytes: PushConfig refuses more.
func readFile(path string) ([]byte, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	return io.ReadAll(io.LimitReader(fh, config.MaxBytes+1))
}

// hintNames explains a refusal for a name the empty Registry lacks.
func hintNames(w io.Writer, err error) {
	var ce *config.Error
	if errors.As(err, &ce) && strings.HasPrefix(ce.Msg, "unknown name") {
		fmt.Fprintln(w, "bulwarkctl checks with an empty Registry: if the programs register that name, push -unchecked and read status for their verdicts")
	}
}

// staleAfter is when an ack is taken for a process gone: a following
// process writes its ack again every 30 s when nothing changes.
const staleAfter = 90 * time.Second

// waitAcks polls the status, every 20 ms, until every process that wrote
// an ack lately (staleAfter) has acknowledged seq, or for at most d.
func waitAcks(ctx context.Context, f *redisfleet.Fleet, seq int64, d time.Duration) (redisfleet.ConfigStatus, bool) {
	deadline := time.Now().Add(d)
	for {
		st, err := f.ConfigStatus(ctx)
		done := err == nil && len(st.Processes) > 0
		for _, p := range st.Processes {
			done = done && (p.Seq >= seq || time.Since(p.At) > staleAfter)
		}
		if done || time.Now().After(deadline) || ctx.Err() != nil {
			return st, done
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// printStatus writes the store's state, a line per process, and a summary.
func printStatus(w io.Writer, st redisfleet.ConfigStatus, now time.Time) {
	dash := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	fmt.Fprintf(w, "store: seq %d, stable %s", st.Seq, dash(st.Stable))
	if st.Canary != "" {
		fmt.Fprintf(w, ", canary %s (%s%%)", st.Canary, strconv.FormatFloat(st.Share*100, 'g', 4, 64))
	}
	fmt.Fprintf(w, ", previous %s\n", dash(st.Previous))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PROCESS\tCANARY\tSEQ\tRUNNING\tREFUSED\tAGE\tERROR")
	runs := map[string]int{}
	refused, behind := 0, 0
	for _, p := range st.Processes {
		c := "-"
		if p.Canary {
			c = "yes"
		}
		age := now.Sub(p.At).Round(time.Second).String()
		if now.Sub(p.At) > staleAfter {
			age += " (gone?)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", p.ID, c, p.Seq, dash(p.Running), dash(p.Refused),
			age, dash(p.Error))
		runs[dash(p.Running)]++
		if p.Refused != "" || p.Error != "" {
			refused++
		}
		if p.Seq < st.Seq {
			behind++
		}
	}
	tw.Flush()
	var parts []string
	for v, n := range runs {
		parts = append(parts, fmt.Sprintf("%d run %s", n, v))
	}
	slices.Sort(parts)
	fmt.Fprintf(w, "%d processes: %s; %d refused; %d not yet at seq %d", len(st.Processes), strings.Join(parts, ", "), refused, behind, st.Seq)
	if st.Ignored > 0 {
		fmt.Fprintf(w, "; %d entries in Redis ignored (did not decode)", st.Ignored)
	}
	fmt.Fprintln(w)
}

// percent is -canary's value: a percentage written with its sign, from
// 0.01% (one basis point, the finest share the store keeps) to 99.99%,
// held as the fraction PushOptions.Canary takes. Only digits and one
// decimal point are read, so NaN%, Inf% and 1e1% are refused as
// strconv.ParseFloat alone would not refuse them.
type percent struct {
	text  string
	share float64
}

func (p *percent) String() string { return p.text }

func (p *percent) Set(s string) error {
	if p.text != "" {
		return fmt.Errorf("-canary given twice (%q, then %q): give one share", p.text, s)
	}
	num, ok := strings.CutSuffix(s, "%")
	if i := strings.LastIndex(s, "%"); !ok && i >= 0 {
		return fmt.Errorf("want a percentage that ends with its %% sign, as 10%%; %q has %q after its %% sign", s, s[i+1:])
	}
	if !ok && strings.ContainsAny(s, "٪％﹪") {
		return fmt.Errorf("want a percentage with the %% sign, as 10%%; %q has a percent sign other than %%", s)
	}
	if !ok {
		return fmt.Errorf("want a percentage with its %% sign, as 10%% for a tenth of the processes; %q has none, and a bare number (0.1 or 10) is not read as either", s)
	}
	digits := strings.Count(num, ".") <= 1 && strings.Trim(num, "0123456789.") == "" && strings.Trim(num, ".") != ""
	v, err := strconv.ParseFloat(num, 64)
	if !digits || err != nil {
		return fmt.Errorf("want a percentage in digits, as 10%% or 0.5%%; got %q", s)
	}
	if v < 0.01 || v > 99.99 {
		return fmt.Errorf("want from 0.01%% to 99.99%% of the processes, got %s (without -canary the push goes to every process)", s)
	}
	p.text, p.share = s, v/100
	return nil
}
