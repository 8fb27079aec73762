package bulwark_test

// The retry contract (see Retry) against a reference model: rapid draws
// calls (methods, keys, a script of outcomes per attempt), bursts of
// concurrent calls, rates from 0.1 to 1,000 a second, clock jumps and
// Updates; the real Transport runs them in a synctest bubble over an
// in-memory host, and the model says from the script alone how many
// attempts each call makes and what its caller gets. Also the harness the
// other model tests share: the scripted host and the bubble runner.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bulwark-http/bulwark"
	"pgregory.net/rapid"
)

// outcome is what the scripted host does with one attempt.
type outcome uint8

const (
	oOK   outcome = iota // 200 after the call's latency
	oSlow                // 200 after slowLatency
	o500                 // retryable statuses
	o502
	o503
	o504
	o408
	o429     // without Retry-After: no pause of the host
	o501     // not retryable: no retry changes it
	o400     // the request's fault
	oTimeout // no answer: waits for the attempt's context to end
	oReset   // a reset connection: transient
	oRefused // a refused connection: transient
	oNoHost  // no such host: permanent
	numOutcome
)

var outcomeNames = [...]string{"ok", "slow", "500", "502", "503", "504", "408", "429", "501", "400", "timeout", "reset", "refused", "nohost"}

func (o outcome) String() string { return outcomeNames[o] }

// status is o's status code; 0 for an outcome that is an error.
func (o outcome) status() int {
	return [...]int{200, 200, 500, 502, 503, 504, 408, 429, 501, 400, 0, 0, 0, 0}[o]
}

// slowLatency is how long a slow success takes.
const slowLatency = 40 * time.Millisecond

// scriptHost is an in-memory host: each call names its script in the
// X-Call header (registered with add), and attempt n of it does script[n]
// (the last repeats), answering (or failing) after the call's latency; a
// timeout never answers.
type scriptHost struct {
	mu       sync.Mutex
	scripts  map[string]hostScript
	attempts map[string]int
}

type hostScript struct {
	out []outcome
	lat time.Duration // an answer's latency; a slow one's is slowLatency
}

func newScriptHost() *scriptHost {
	return &scriptHost{scripts: map[string]hostScript{}, attempts: map[string]int{}}
}

func (h *scriptHost) add(id string, s hostScript) {
	h.mu.Lock()
	h.scripts[id] = s
	h.mu.Unlock()
}

// sent is how many attempts of call id reached the host.
func (h *scriptHost) sent(id string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.attempts[id]
}

func (h *scriptHost) RoundTrip(req *http.Request) (*http.Response, error) {
	id := req.Header.Get("X-Call")
	h.mu.Lock()
	s, ok := h.scripts[id]
	n := h.attempts[id]
	h.attempts[id] = n + 1
	h.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("scriptHost: no script for call %q", id)
	}
	o := s.out[min(n, len(s.out)-1)]
	lat := s.lat
	if o == oSlow {
		lat = slowLatency
	}
	if o == oTimeout {
		<-req.Context().Done()
		return nil, context.Cause(req.Context())
	}
	if lat > 0 {
		tm := time.NewTimer(lat)
		defer tm.Stop()
		select {
		case <-tm.C:
		case <-req.Context().Done():
			return nil, context.Cause(req.Context())
		}
	}
	switch o {
	case oReset:
		return nil, &net.OpError{Op: "read", Net: "tcp", Err: &os.SyscallError{Syscall: "read", Err: syscall.ECONNRESET}}
	case oRefused:
		return nil, refusedErr()
	case oNoHost:
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: req.URL.Hostname(), IsNotFound: true}}
	}
	return &http.Response{StatusCode: o.status(), Header: http.Header{}, Body: http.NoBody, Request: req}, nil
}

// disagreement is the panic a model test raises inside its bubble when
// the Transport and the model disagree; inBubble turns it into rapid's
// failure outside the bubble, where rapid's T may fail the test.
type disagreement struct{ msg string }

func disagree(format string, args ...any) {
	panic(disagreement{fmt.Sprintf(format, args...)})
}

// inBubble runs f in a synctest bubble on rapid's behalf: f may draw with
// rt (rapid's actions and draws work in the bubble), and reports a
// disagreement with disagree. rapid's own panics (data exhausted while
// shrinking) pass through to it, so it shrinks as usual. f must leave no
// goroutine running: every call it starts it waits for.
func inBubble(t *testing.T, rt *rapid.T, f func()) {
	var saved any
	synctest.Test(t, func(*testing.T) {
		defer func() { saved = recover() }()
		f()
	})
	switch p := saved.(type) {
	case nil:
	case disagreement:
		rt.Fatal(p.msg)
	default:
		panic(p)
	}
}

// drawGap draws the time before a call: log-uniform from 1 ms to 10 s, so
// rates from 1,000 to 0.1 a second.
func drawGap(rt *rapid.T, label string) time.Duration {
	e := rapid.Float64Range(-3, 1).Draw(rt, label)
	return time.Duration(math.Pow(10, e) * float64(time.Second))
}

// drawScript draws a call's outcomes, one per attempt, the last repeating.
func drawScript(rt *rapid.T, label string) []outcome {
	return rapid.SliceOfN(rapid.SampledFrom(allOutcomes()), 1, 5).Draw(rt, label)
}

func allOutcomes() []outcome {
	all := make([]outcome, numOutcome)
	for i := range all {
		all[i] = outcome(i)
	}
	return all
}

// The retry model: the contract's checks in its order, from the script.

// retryable is the contract's list of outcomes another try may change.
func (o outcome) retryable() bool {
	switch o {
	case o500, o502, o503, o504, o408, o429, oTimeout, oReset, oRefused:
		return true
	}
	return false
}

// modelAttempts is how many attempts the contract sends for a call with
// this script, under MaxAttempts max (1 with retries off), for a request
// replayable or not.
func modelAttempts(script []outcome, replayable bool, max int) int {
	for n := 1; ; n++ {
		o := script[min(n-1, len(script)-1)]
		if !o.retryable() || !replayable || n >= max {
			return n
		}
	}
}

// modelRequest is one drawn request: its method and whether it carries an
// Idempotency-Key.
type modelRequest struct {
	method string
	keyed  bool
}

func (r modelRequest) replayable() bool {
	switch r.method {
	case http.MethodGet, http.MethodHead, http.MethodPut, http.MethodDelete, http.MethodOptions:
		return true
	}
	return r.keyed
}

func drawRequest(rt *rapid.T) modelRequest {
	return modelRequest{
		method: rapid.SampledFrom([]string{"GET", "PUT", "DELETE", "POST", "PATCH"}).Draw(rt, "method"),
		keyed:  rapid.Bool().Draw(rt, "keyed"),
	}
}

// retryPolicy is the retry model's policy: retries alone, with waits
// short enough that the call's 30 s deadline never refuses one (the
// deadline's check is TestRetryDeadline's), and an attempt timeout that
// is set, so a timed-out attempt takes 50 ms.
func retryPolicy(maxAttempts int, disabled bool) bulwark.Policy {
	return bulwark.Policy{
		Timeout:  bulwark.Timeout{Attempt: 50 * time.Millisecond},
		Breaker:  bulwark.Breaker{Disabled: true},
		Bulkhead: bulwark.Bulkhead{Disabled: true},
		Retry: bulwark.Retry{MaxAttempts: maxAttempts, Base: time.Millisecond, Cap: 10 * time.Millisecond,
			Disabled: disabled, Budget: bulwark.Budget{Disabled: true}},
	}
}

// checkCall compares one call's attempts and result with the model's.
func checkCall(h *scriptHost, id string, req modelRequest, script []outcome, max int, resp *http.Response, err error) {
	want := modelAttempts(script, req.replayable(), max)
	if got := h.sent(id); got != want {
		disagree("call %s (%s keyed=%v, script %v, MaxAttempts %d): %d attempts, model %d", id, req.method, req.keyed, script, max, got, want)
	}
	last := script[min(want-1, len(script)-1)]
	switch {
	case last.status() != 0:
		if err != nil || resp.StatusCode != last.status() {
			disagree("call %s (script %v, %d attempts): got %v %v, model status %d", id, script, want, resp, err, last.status())
		}
		resp.Body.Close()
	case err == nil:
		resp.Body.Close()
		disagree("call %s (script %v): status %d, model the error of %v", id, script, resp.StatusCode, last)
	default:
		var re *bulwark.RetryError
		isRetry := errors.As(err, &re)
		if isRetry != (want > 1) || isRetry && re.Attempts != want {
			disagree("call %s (script %v): error %v, model %d attempts", id, script, err, want)
		}
		if last == oTimeout && !errors.Is(err, bulwark.ErrAttemptTimeout) {
			disagree("call %s: error %v, model ErrAttemptTimeout", id, err)
		}
	}
}

// modelCall sends one call with a fresh id and returns what its caller got.
func modelCall(c *http.Client, id string, r modelRequest) (*http.Response, error) {
	req, _ := http.NewRequest(r.method, "http://model.test/"+id, nil)
	req.Header.Set("X-Call", id)
	if r.keyed {
		req.Header.Set(bulwark.IdempotencyKeyHeader, "k-"+id)
	}
	return c.Do(req)
}

func TestRetryModel(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		inBubble(t, rt, func() {
			h := newScriptHost()
			max, disabled := rapid.IntRange(1, 5).Draw(rt, "maxAttempts"), false
			tr, err := bulwark.New(bulwark.Config{Base: h, Default: retryPolicy(max, disabled)})
			if err != nil {
				disagree("New: %v", err)
			}
			defer tr.Close()
			c := &http.Client{Transport: tr}
			n := 0
			effMax := func() int {
				if disabled {
					return 1
				}
				return max
			}
			rt.Repeat(map[string]func(*rapid.T){
				"call": func(rt *rapid.T) {
					time.Sleep(drawGap(rt, "gap"))
					req, script := drawRequest(rt), drawScript(rt, "script")
					lat := time.Duration(rapid.IntRange(0, 20).Draw(rt, "latMs")) * time.Millisecond
					n++
					id := strconv.Itoa(n)
					h.add(id, hostScript{out: script, lat: lat})
					resp, err := modelCall(c, id, req)
					checkCall(h, id, req, script, effMax(), resp, err)
				},
				"burst": func(rt *rapid.T) {
					k := rapid.IntRange(2, 8).Draw(rt, "k")
					type one struct {
						id     string
						req    modelRequest
						script []outcome
						resp   *http.Response
						err    error
					}
					calls := make([]one, k)
					for i := range calls {
						n++
						calls[i] = one{id: strconv.Itoa(n), req: drawRequest(rt), script: drawScript(rt, "script")}
						h.add(calls[i].id, hostScript{out: calls[i].script, lat: time.Duration(rapid.IntRange(0, 20).Draw(rt, "latMs")) * time.Millisecond})
					}
					var wg sync.WaitGroup
					for i := range calls {
						wg.Go(func() { calls[i].resp, calls[i].err = modelCall(c, calls[i].id, calls[i].req) })
					}
					wg.Wait()
					for _, o := range calls {
						checkCall(h, o.id, o.req, o.script, effMax(), o.resp, o.err)
					}
				},
				"jump": func(rt *rapid.T) {
					time.Sleep(time.Duration(rapid.Int64Range(int64(time.Second), int64(2*time.Hour)).Draw(rt, "jump")))
				},
				"update": func(rt *rapid.T) {
					max, disabled = rapid.IntRange(1, 5).Draw(rt, "maxAttempts"), rapid.Bool().Draw(rt, "disabled")
					if err := tr.Update(bulwark.Config{Base: h, Default: retryPolicy(max, disabled)}); err != nil {
						disagree("Update: %v", err)
					}
				},
			})
		})
	})
}
