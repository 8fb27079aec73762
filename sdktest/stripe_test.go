package sdktest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stripe/stripe-go/v82"
)

// stripeAPI is a local server speaking as much of Stripe's API as the
// tests call: creating a customer.
var stripeAPI = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	if r.Method != http.MethodPost || r.URL.Path != "/v1/customers" {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":"cus_%s","object":"customer"}`, r.Header.Get("Idempotency-Key"))
})

// newStripe is stripe-go's client, with its own defaults (2 retries, its
// own backoff from 500 ms), over the injector in front of stripeAPI,
// through bulwark or not. Its calls are named by their Idempotency-Key,
// which stripe-go sets on every POST and keeps on each resend.
func newStripe(t *testing.T, withBulwark bool, plan func(time.Duration, *http.Request) fault) (*stripe.Client, *injector) {
	t.Helper()
	j := &injector{next: stripeAPI, start: time.Now(), callOf: headerOf("Idempotency-Key"), plan: plan}
	hc, _ := through(t, memServer{j}, withBulwark)
	backends := stripe.NewBackendsWithConfig(&stripe.BackendConfig{
		URL:               stripe.String("http://stripe.sdktest"),
		HTTPClient:        hc,
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
		EnableTelemetry:   stripe.Bool(false),
		MaxNetworkRetries: stripe.Int64(stripe.DefaultMaxNetworkRetries),
	})
	return stripe.NewClient("sk_test_sdktest", stripe.WithBackends(backends)), j
}

// createCustomer is one keyed write, named id.
func createCustomer(c *stripe.Client, id string) error {
	p := &stripe.CustomerCreateParams{Email: stripe.String(id + "@sdktest.invalid")}
	p.SetIdempotencyKey(id)
	cus, err := c.V1Customers.Create(context.Background(), p)
	if err == nil && cus.ID != "cus_"+id {
		err = fmt.Errorf("customer %q for key %q", cus.ID, id)
	}
	return err
}

// TestStripeBlip: stripe-go's keyed writes during a 2 s blip of 503s, with
// and without bulwark below: no key is sent more times than stripe-go
// alone sends one (1 + its 2 retries), requests per call with bulwark
// are at most stripe-go's alone + 0.05, and at least 99 % of the calls
// from 1 s after the blip succeed.
func TestStripeBlip(t *testing.T) {
	compareBlip(t, func(t *testing.T, withBulwark bool) blipRun {
		// A proxy's 503, which stripe-go retries (it does not retry one
		// carrying a Stripe error object).
		c, j := newStripe(t, withBulwark, blip503("upstream unavailable"))
		run := runBlip(j, 60, 200*time.Millisecond, func(_ context.Context, id string) error { return createCustomer(c, id) })
		return run
	})
}

// TestStripeShouldRetryFalse: 500s answered with and without
// Stripe-Should-Retry: false reach the server as often through bulwark as
// from stripe-go alone. (stripe-go reads the header only for a response
// whose body is no Stripe error: it retries such a 500 three times per key
// whatever the header says, and never retries a Stripe error object's.)
func TestStripeShouldRetryFalse(t *testing.T) {
	for _, header := range [][]string{{"Stripe-Should-Retry", "false"}, nil} {
		for _, text := range []string{"internal error", ""} {
			got := map[bool]int{}
			for _, withBulwark := range []bool{false, true} {
				synctest.Test(t, func(t *testing.T) {
					c, j := newStripe(t, withBulwark, func(time.Duration, *http.Request) fault {
						return fault{status: http.StatusInternalServerError, header: header, text: text}
					})
					for i := range 5 {
						if err := createCustomer(c, fmt.Sprintf("k%d", i)); err == nil {
							t.Fatal("a 500 answered as success")
						}
					}
					got[withBulwark] = len(j.all())
				})
			}
			what := text
			if what == "" {
				what = "a Stripe error object"
			}
			t.Logf("500 %v, body %q: 5 keyed writes reached the server %d times from stripe-go alone, %d through bulwark", header, what, got[false], got[true])
			if got[true] != got[false] {
				t.Errorf("500 %v, body %q: %d requests through bulwark, %d from stripe-go alone", header, text, got[true], got[false])
			}
		}
	}
}
