package bulwark_test

// The retry contract (see Retry) against a reference model: rapid draws
// calls (methods, keys, a script of outcomes per attempt), bursts of
// concurrent calls, rates from 0.1 to 1,000 a second, clock jumps and
// Updates; the real Transport runs them in a synctest bubble over an
// in-memory host, and the model says from the script alone how many
// attempts each call makes and what its caller gets. Also the harness the
// other model tests share: the scripted host and the bubble runner.

import (
	"errors"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/bulwark-http/bulwark"
	"pgregory.net/rapid"
)

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
