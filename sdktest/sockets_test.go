package sdktest

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
)

// TestS3OverSockets is TestS3Blip's checks over a real connection on
// 127.0.0.1 (no bubble; the SDK's backoff shortened to 5 ms to keep the
// wall time small): every call's first request is answered 503, so each
// of the SDK's operations is resent once by the SDK, through bulwark,
// which sends each of them once. Every signature is valid, every object
// written reads back whole.
func TestS3OverSockets(t *testing.T) {
	backend := s3mem.New()
	if err := backend.CreateBucket(bucket); err != nil {
		t.Fatal(err)
	}
	fake := gofakes3.New(backend).Server()
	first := &firstTry{first: fault{status: http.StatusServiceUnavailable, text: "<Error><Code>ServiceUnavailable</Code></Error>"}}
	j := &injector{next: fake, start: time.Now(), callOf: headerOf(callHeader), check: checkSigV4, plan: first.plan}
	srv := httptest.NewServer(j)
	defer srv.Close()
	client, tr := through(t, http.DefaultTransport.(*http.Transport).Clone(), true)
	defer client.CloseIdleConnections()
	opts := func(hc s3.HTTPClient) s3.Options {
		return s3.Options{
			Region:                     s3Region,
			Credentials:                credentials.NewStaticCredentialsProvider(s3Key, s3Secret, ""),
			BaseEndpoint:               aws.String(srv.URL),
			UsePathStyle:               true,
			HTTPClient:                 hc,
			RequestChecksumCalculation: aws.RequestChecksumCalculationWhenRequired,
			ResponseChecksumValidation: aws.ResponseChecksumValidationWhenRequired,
			Retryer: retry.NewStandard(func(o *retry.StandardOptions) {
				o.Backoff = retry.BackoffDelayerFunc(func(int, error) (time.Duration, error) { return 5 * time.Millisecond, nil })
			}),
		}
	}
	rawBase := http.DefaultTransport.(*http.Transport).Clone()
	defer rawBase.CloseIdleConnections()
	f := &s3Fixture{j: j, tr: tr, s3: s3.New(opts(client)), raw: s3.New(opts(&http.Client{Transport: rawBase}))}
	var written syncSet
	for i := range 10 {
		id := fmt.Sprintf("sock-%d", i)
		_, err := f.s3.PutObject(context.Background(), &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(id), Body: bytes.NewReader(object(id))},
			s3.WithAPIOptions(smithyhttp.AddHeaderValue(callHeader, id)))
		if err != nil {
			t.Fatalf("put %s: %v", id, err)
		}
		written.add(id)
	}
	f.checkAttempts(t)
	for call, n := range j.perCall() {
		if n != 2 {
			t.Errorf("call %s reached the server %d times, want 2: the first answered 503, the SDK's resend", call, n)
		}
	}
	f.j.plan = nil
	f.checkWritten(t, &written)
}
