package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/bulwark-http/bulwark/config"
	"github.com/bulwark-http/bulwark/redisfleet"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	redis.SetLogger(redisfleet.DebugLog{})
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}

func ctl(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var o, e bytes.Buffer
	code = run(t.Context(), args, &o, &e)
	return code, o.String(), e.String()
}

func writeFile(t *testing.T, name, text string) string {
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestValidate: a good file is valid with its version; a bad one is
// refused with file, line, column and field; a name of the programs'
// registry gets the hint to push it unchecked.
func TestValidate(t *testing.T) {
	good := writeFile(t, "good.yaml", "version: v1\ndefault:\n  breaker: {failureRate: 0.5}\n")
	if code, out, errs := ctl(t, "validate", good); code != 0 || !strings.Contains(out, "valid, version v1") {
		t.Fatalf("validate good: %d %q %q", code, out, errs)
	}
	bad := writeFile(t, "bad.yaml", "version: v2\ndefault:\n  breaker: {failureRate: 2}\n")
	if code, _, errs := ctl(t, "validate", bad); code != 1 || !strings.Contains(errs, bad+":3:") || !strings.Contains(errs, "breaker.failureRate") {
		t.Fatalf("validate bad: %d %q", code, errs)
	}
	named := writeFile(t, "named.yaml", "default:\n  fallback: {func: last-rate}\n")
	if code, _, errs := ctl(t, "validate", named); code != 1 || !strings.Contains(errs, "push -unchecked") {
		t.Fatalf("validate named: %d %q", code, errs)
	}
	if code, _, _ := ctl(t, "frobnicate"); code != 2 {
		t.Fatalf("unknown command: %d, want 2", code)
	}
}

// startRedis starts a redis-server of the test's own on 127.0.0.1, or
// skips the test when the binary is absent.
func startRedis(t *testing.T) string {
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server not installed")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	cmd := exec.Command("redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", t.TempDir(), "--loglevel", "warning")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := "127.0.0.1:" + port
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	for i := 0; c.Ping(t.Context()).Err() != nil; i++ {
		if i > 500 {
			t.Fatal("redis-server did not answer")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return addr
}

// TestPushStatusRollback: against a real redis-server and two following
// processes, push -wait shows both running the version, a bad push
// unchecked shows both refusals with the error and exits 1, and rollback
// returns them to the version before.
func TestPushStatusRollback(t *testing.T) {
	addr := startRedis(t)
	for _, id := range []string{"pod-a", "pod-b"} {
		rc := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		t.Cleanup(func() { _ = rc.Close() })
		f, err := redisfleet.New(rc, redisfleet.Options{ID: id})
		if err != nil {
			t.Fatal(err)
		}
		tr, err := bulwark.New(bulwark.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tr.Close() })
		fl := f.ConfigFollower(tr, redisfleet.FollowOptions{Registry: config.Registry{}, Logger: slog.New(slog.DiscardHandler)})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = fl.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
	}
	// Both processes have written their first ack (of an empty store).
	for i := 0; ; i++ {
		_, out, _ := ctl(t, "-redis", addr, "status")
		if strings.Contains(out, "2 processes") {
			break
		}
		if i > 500 {
			t.Fatalf("status never showed both processes: %q", out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	v1 := writeFile(t, "v1.yaml", "version: v1\ndefault:\n  breaker: {failureRate: 0.5}\n")
	code, out, errs := ctl(t, "-redis", addr, "push", "-wait", "5s", v1)
	if code != 0 || !strings.Contains(out, "2 run v1; 0 refused; 0 not yet at seq 1") {
		t.Fatalf("push v1: %d\n%s%s", code, out, errs)
	}
	bad := writeFile(t, "bad.yaml", "version: bad\ndefault:\n  breaker: {failureRate: 2}\n")
	if code, _, errs := ctl(t, "-redis", addr, "push", bad); code != 1 || !strings.Contains(errs, "breaker.failureRate") {
		t.Fatalf("checked push of a bad file: %d %q", code, errs)
	}
	code, out, errs = ctl(t, "-redis", addr, "push", "-unchecked", "-wait", "5s", bad)
	if code != 1 || strings.Count(out, "breaker.failureRate: value 2: must be in") != 2 || !strings.Contains(out, "2 run v1; 2 refused") {
		t.Fatalf("unchecked push of a bad file: %d\n%s%s", code, out, errs)
	}
	code, out, errs = ctl(t, "-redis", addr, "rollback", "-wait", "5s")
	if code != 0 || !strings.Contains(out, "version v1 for every process") || !strings.Contains(out, "2 run v1; 0 refused") {
		t.Fatalf("rollback: %d\n%s%s", code, out, errs)
	}
	t.Log("\n" + out)
}

// contents reads every key of the Redis at addr as one comparable text,
// each value by its type.
func contents(t *testing.T, addr string) string {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	ctx := t.Context()
	keys, err := c.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		var v any
		switch typ := c.Type(ctx, k).Val(); typ {
		case "hash":
			v, err = c.HGetAll(ctx, k).Result()
		case "zset":
			v, err = c.ZRangeWithScores(ctx, k, 0, -1).Result()
		default:
			t.Fatalf("key %s of type %s: read it here too", k, typ)
		}
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s = %v\n", k, v)
	}
	return b.String()
}

// TestPushCanaryShare: -canary takes a percentage with its sign. Each other
// form (a bare 10 or 0.1, NaN, an infinity, 0% or 100% and beyond, under
// one basis point, an exponent) is refused as a misuse (exit 2) with a
// message saying what it takes, and every key in Redis reads the same
// after; 10% pushes a canary of a tenth.
func TestPushCanaryShare(t *testing.T) {
	addr := startRedis(t)
	v1 := writeFile(t, "v1.yaml", "version: v1\ndefault:\n  breaker: {failureRate: 0.5}\n")
	v2 := writeFile(t, "v2.yaml", "version: v2\ndefault:\n  breaker: {failureRate: 0.4}\n")
	if code, out, errs := ctl(t, "-redis", addr, "push", v1); code != 0 {
		t.Fatalf("push v1: %d %s%s", code, out, errs)
	}
	if code, out, errs := ctl(t, "-redis", addr, "push", "-canary", "50%", v2); code != 0 || !strings.Contains(out, "version v2 for the canary (50% of the processes") {
		t.Fatalf("push -canary 50%%: %d %s%s", code, out, errs)
	}
	before := contents(t, addr)
	for _, share := range []string{"10", "0.1", "25", "1", "NaN", "NaN%", "Inf", "+Inf%", "-Inf%", "-5%", "0%", "100%", "150%",
		"0.001%", "1e1%", "0x10%", "10 %", "%", ".%", "ten%", "10%%", ""} {
		code, out, errs := ctl(t, "-redis", addr, "push", "-canary", share, v1)
		if code != 2 || out != "" || !strings.Contains(errs, "invalid value") || !strings.Contains(errs, "%") {
			t.Errorf("push -canary %q: %d %q %q, want a misuse (2) saying the form", share, code, out, errs)
		}
		first, _, _ := strings.Cut(errs, "\n")
		t.Logf("push -canary %-8q exit %d: %s", share, code, first)
		if after := contents(t, addr); after != before {
			t.Fatalf("push -canary %q changed Redis:\nbefore:\n%s\nafter:\n%s", share, before, after)
		}
	}
	code, out, errs := ctl(t, "-redis", addr, "push", "-canary", "10%", v1)
	if code != 0 || !strings.Contains(out, "version v1 for the canary (10% of the processes") {
		t.Fatalf("push -canary 10%%: %d %s%s", code, out, errs)
	}
	if _, out, _ = ctl(t, "-redis", addr, "status"); !strings.Contains(out, "canary v1 (10%)") {
		t.Fatalf("status after push -canary 10%%: %s", out)
	}
	if _, _, errs = ctl(t, "-redis", addr, "push", "-h"); !strings.Contains(errs, "10% for a tenth") {
		t.Fatalf("push -h does not say the form -canary takes: %s", errs)
	}
}

// TestCommandMisuse: what a command would silently ignore (a flag of
// another command, an argument it takes none of, a second -canary) is a
// misuse, exit 2, saying what is wrong, and Redis is unchanged; a -canary
// with text after its % sign, or another percent sign, is told so rather
// than that it has none.
func TestCommandMisuse(t *testing.T) {
	addr := startRedis(t)
	v1 := writeFile(t, "v1.yaml", "version: v1\ndefault:\n  breaker: {failureRate: 0.5}\n")
	v2 := writeFile(t, "v2.yaml", "version: v2\ndefault:\n  breaker: {failureRate: 0.4}\n")
	for _, args := range [][]string{{"push", v1}, {"push", v1}, {"push", "-canary", "50%", v2}} {
		if code, out, errs := ctl(t, append([]string{"-redis", addr}, args...)...); code != 0 {
			t.Fatalf("%q: %d %s%s", args, code, out, errs)
		}
	}
	before := contents(t, addr)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"rollback", "-canary", "10%"}, "-canary does not apply to rollback"},
		{[]string{"rollback", "-unchecked"}, "-unchecked does not apply to rollback"},
		{[]string{"rollback", "extra"}, `rollback takes no argument, got "extra"`},
		{[]string{"promote", v1}, "promote takes no argument, got " + strconv.Quote(v1)},
		{[]string{"promote", "-canary", "10%"}, "-canary does not apply to promote"},
		{[]string{"status", "-wait", "1s"}, "-wait does not apply to status"},
		{[]string{"status", "x"}, `status takes no argument, got "x"`},
		{[]string{"validate", "-canary", "10%", v1}, "-canary does not apply to validate"},
		{[]string{"push"}, "push takes one FILE, got none"},
		{[]string{"push", v1, v2}, "push takes one FILE, got 2 arguments"},
		{[]string{"push", v1, "-canary", "10%"}, "push takes one FILE, got 3 arguments"},
		{[]string{"push", "-canary", "10%", "-canary", "20%", v2}, `-canary given twice ("10%", then "20%")`},
		{[]string{"push", "-canary", "10% ", v2}, `"10% " has " " after its % sign`},
		{[]string{"push", "-canary", "10%x", v2}, `"10%x" has "x" after its % sign`},
		{[]string{"push", "-canary", "10%\n", v2}, `"10%\n" has "\n" after its % sign`},
		{[]string{"push", "-canary", "10٪", v2}, `"10٪" has a percent sign other than %`},
		{[]string{"push", "-canary", "10％", v2}, `"10％" has a percent sign other than %`},
	} {
		code, out, errs := ctl(t, append([]string{"-redis", addr}, tc.args...)...)
		if code != 2 || out != "" || !strings.Contains(errs, tc.want) || strings.Contains(errs, "has none") {
			t.Errorf("%q: %d %q %q, want a misuse (2) saying %q", tc.args, code, out, errs, tc.want)
		}
		if after := contents(t, addr); after != before {
			t.Fatalf("%q changed Redis:\nbefore:\n%s\nafter:\n%s", tc.args, before, after)
		}
	}
}
