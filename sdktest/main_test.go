// Package sdktest runs the SDKs people call (the AWS SDK for Go v2,
// OpenAI's Go SDK, stripe-go) over bulwark with faults injected below:
// their own retries, signatures and idempotency keys against bulwark's
// rules. It is a nested module so that the root gains none of their
// dependencies.
//
// Each test runs in a testing/synctest bubble over an in-memory server (a
// RoundTripper that hands the request to an http.Handler), so the SDKs'
// backoffs and the faults' delays run on the bubble's clock: seconds of
// simulated traffic cost milliseconds, and the figures do not move with
// the machine's load.
package sdktest

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
