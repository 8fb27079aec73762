package sdktest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// llmAPI is a local server speaking as much of OpenAI's API as the tests
// call: a chat completion (POST /v1/chat/completions) and a model (GET
// /v1/models/{id}).
var llmAPI = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/v1/chat/completions":
		_, _ = io.WriteString(w, `{"id":"chatcmpl-1","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`)
	case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/models/"):
		fmt.Fprintf(w, `{"id":%q,"object":"model","created":0,"owned_by":"sdktest"}`, strings.TrimPrefix(r.URL.Path, "/v1/models/"))
	default:
		http.NotFound(w, r)
	}
})

// newOpenAI is OpenAI's client, with its own defaults (2 retries, its own
// backoff), over the injector in front of llmAPI, through bulwark or not.
func newOpenAI(t *testing.T, withBulwark bool, plan func(time.Duration, *http.Request) fault, opts ...option.RequestOption) (openai.Client, *injector, *bulwark.Transport) {
	t.Helper()
	j := &injector{next: llmAPI, start: time.Now(), callOf: headerOf(callHeader), plan: plan}
	hc, tr := through(t, memServer{j}, withBulwark)
	opts = append([]option.RequestOption{option.WithBaseURL("http://llm.sdktest/v1/"), option.WithAPIKey("sk-sdktest"), option.WithHTTPClient(hc)}, opts...)
	return openai.NewClient(opts...), j, tr
}

// complete is one chat completion, keyed with the caller's Idempotency-Key
// when keyed.
func complete(ctx context.Context, c openai.Client, id string, keyed bool) error {
	opts := []option.RequestOption{option.WithHeader(callHeader, id)}
	if keyed {
		opts = append(opts, option.WithHeader("Idempotency-Key", "key-"+id))
	}
	res, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
		Model:    "m",
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
	}, opts...)
	if err == nil && (len(res.Choices) != 1 || res.Choices[0].Message.Content != "ok") {
		err = errors.New("completion answered wrong")
	}
	return err
}

// model is one GET of a model.
func model(ctx context.Context, c openai.Client, id string) error {
	_, err := c.Models.Get(ctx, "m", option.WithHeader(callHeader, id))
	return err
}

// llmCall is the blip's mix: keyed completions and model reads.
func llmCall(c openai.Client) func(context.Context, string) error {
	return func(ctx context.Context, id string) error {
		if id[len(id)-1]%2 == 0 {
			return complete(ctx, c, id, true)
		}
		return model(ctx, c, id)
	}
}

// TestOpenAIBlip: OpenAI's SDK during a 2 s blip of 503s, with and
// without bulwark below it.
func TestOpenAIBlip(t *testing.T) {
	compareBlip(t, func(t *testing.T, withBulwark bool) blipRun {
		c, j, _ := newOpenAI(t, withBulwark, blip503(""))
		// The SDK's backoff (0.5 s, then 1 s) makes a call in the blip
		// last over a second: many callers, for enough calls.
		return runBlip(j, 100, 200*time.Millisecond, llmCall(c))
	})
}

// TestOpenAIShouldRetryFalse: a 500 with x-should-retry: false reaches the
// server exactly as often as the SDK alone sends it (once per call), for
// a GET and for a POST keyed by the caller.
func TestOpenAIShouldRetryFalse(t *testing.T) {
	counts := map[bool]int{}
	for _, withBulwark := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			c, j, _ := newOpenAI(t, withBulwark, func(time.Duration, *http.Request) fault {
				return fault{status: http.StatusInternalServerError, header: []string{"x-should-retry", "false"}}
			})
			for i := range 5 {
				if err := model(t.Context(), c, fmt.Sprintf("get-%d", i)); err == nil {
					t.Fatal("a 500 answered as success")
				}
				if err := complete(t.Context(), c, fmt.Sprintf("post-%d", i), true); err == nil {
					t.Fatal("a 500 answered as success")
				}
			}
			counts[withBulwark] = len(j.all())
			for call, n := range j.perCall() {
				if n != 1 {
					t.Errorf("bulwark %v: call %s sent %d times after x-should-retry: false, want 1", withBulwark, call, n)
				}
			}
		})
	}
	t.Logf("x-should-retry: false, 10 calls: %d requests with the SDK alone, %d with bulwark below", counts[false], counts[true])
	if counts[true] != counts[false] {
		t.Errorf("%d requests with bulwark, %d without: want the SDK's own", counts[true], counts[false])
	}
}

// TestOpenAIRetryAfterMs: each call's first request is answered 429 with
// retry-after-ms: 300; three callers at once. Through bulwark no request
// reaches the server sooner than 300 ms after a 429 (the pause holds the
// other callers too), and each call still succeeds.
func TestOpenAIRetryAfterMs(t *testing.T) {
	for _, withBulwark := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			limited := &firstTry{first: fault{status: http.StatusTooManyRequests, header: []string{"retry-after-ms", "300"}}}
			c, j, _ := newOpenAI(t, withBulwark, limited.plan)
			var wg sync.WaitGroup
			for w := range 3 {
				wg.Go(func() {
					for i := range 4 {
						if err := complete(context.Background(), c, fmt.Sprintf("w%d-%d", w, i), true); err != nil {
							t.Errorf("call failed: %v", err)
						}
						time.Sleep(10 * time.Millisecond)
					}
				})
			}
			wg.Wait()
			early := limited.sooner(j.all(), 300*time.Millisecond)
			t.Logf("bulwark %v: %d requests, %d of them sooner than 300 ms after a 429 with retry-after-ms: 300", withBulwark, len(j.all()), early)
			if withBulwark && early > 0 {
				t.Errorf("through bulwark %d requests reached the server sooner than asked", early)
			}
			for _, g := range gaps(j.all()) {
				if g < 300*time.Millisecond {
					t.Errorf("bulwark %v: a call's retry came %v after its 429, want ≥ 300ms", withBulwark, g)
				}
			}
		})
	}
}

// TestOpenAIHungConnection: the first request of each call hangs, after
// 300 quick calls from which bulwark learned a short attempt timeout. The
// SDK, with a 2 s request timeout, gives up on it and does not retry (its
// own rule: a request timeout ends the call). Through bulwark each call
// ends as it does alone, after as many requests: bulwark neither cuts the
// hung request early nor sends it again beneath the SDK.
func TestOpenAIHungConnection(t *testing.T) {
	outcome := map[bool]string{}
	for _, withBulwark := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			hung := &firstTry{first: fault{hang: true}, rest: fault{delay: 20 * time.Millisecond},
				match: func(r *http.Request) bool { return r.Method == http.MethodPost }}
			c, j, _ := newOpenAI(t, withBulwark, hung.plan, option.WithRequestTimeout(2*time.Second))
			for i := range 300 {
				if err := model(t.Context(), c, fmt.Sprintf("q%d", i)); err != nil {
					t.Fatal(err)
				}
			}
			var got []string
			for i := range 5 {
				start := time.Now()
				err := complete(t.Context(), c, fmt.Sprintf("c%d", i), true)
				got = append(got, fmt.Sprintf("%v after %v", errors.Is(err, context.DeadlineExceeded), time.Since(start)))
			}
			per := j.perCall()
			for i := range 5 {
				got[i] += fmt.Sprintf(", %d requests", per[fmt.Sprintf("c%d", i)])
			}
			outcome[withBulwark] = strings.Join(got, "; ")
			t.Logf("bulwark %v: timed out: %s", withBulwark, outcome[withBulwark])
		})
	}
	if outcome[true] != outcome[false] {
		t.Errorf("a hung request under the SDK: with bulwark %s; alone %s", outcome[true], outcome[false])
	}
}

// TestOpenAISlowFirstByte: after 300 quick calls on the host (bulwark
// learns an attempt timeout from them), a completion whose first byte
// comes much later succeeds through bulwark, sent once, as through a
// plain client: 1.5 s after 50 ms calls, and 30 s after 2 s calls under
// the SDK's request timeout of a minute (without a timeout of the SDK's,
// bulwark's default Total of 30 s bounds a call to a host that hangs).
func TestOpenAISlowFirstByte(t *testing.T) {
	for _, tc := range []struct {
		quick, slow time.Duration
		opts        []option.RequestOption
	}{
		{50 * time.Millisecond, 1500 * time.Millisecond, nil},
		{2 * time.Second, 30 * time.Second, []option.RequestOption{option.WithRequestTimeout(time.Minute)}},
	} {
		for _, withBulwark := range []bool{false, true} {
			synctest.Test(t, func(t *testing.T) {
				c, j, tr := newOpenAI(t, withBulwark, func(_ time.Duration, r *http.Request) fault {
					if r.Method == http.MethodPost {
						return fault{delay: tc.slow}
					}
					return fault{delay: tc.quick}
				}, tc.opts...)
				for i := range 300 {
					if err := model(t.Context(), c, fmt.Sprintf("q%d", i)); err != nil {
						t.Fatal(err)
					}
				}
				learned := "none (plain client)"
				if tr != nil {
					l := tr.Snapshot().Hosts[0].Learned
					learned = fmt.Sprintf("%v (%s)", l.AttemptTimeout, l.AttemptFrom)
				}
				start := time.Now()
				err := complete(t.Context(), c, "slow", false)
				took := time.Since(start)
				n := j.perCall()["slow"]
				t.Logf("bulwark %v: quick calls %v, attempt timeout %s; a completion with a %v first byte: err %v after %v, %d requests", withBulwark, tc.quick, learned, tc.slow, err, took, n)
				if err != nil || n != 1 || took != tc.slow {
					t.Errorf("bulwark %v: completion err %v after %v and %d requests; want success after %v, sent once", withBulwark, err, took, n, tc.slow)
				}
			})
		}
	}
}
