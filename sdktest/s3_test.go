package sdktest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"github.com/bulwark-http/bulwark"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
)

const (
	s3Key    = "AKIDSDKTEST"
	s3Secret = "sdktest-secret"
	s3Region = "us-east-1"
	bucket   = "sdktest"
)

// checkSigV4 recomputes a request's SigV4 signature with the SDK's own
// signer, from the headers the request says it signed and the time it
// says it was signed at, and checks the payload hash against the body: a
// resend whose headers changed after signing (a bulwark header among the
// signed ones, say) or whose body is not the one signed fails it.
func checkSigV4(r *http.Request, body []byte) error {
	auth := r.Header.Get("Authorization")
	rest, ok := strings.CutPrefix(auth, "AWS4-HMAC-SHA256 ")
	if !ok {
		return fmt.Errorf("not SigV4: %q", auth)
	}
	var cred, signed, sig string
	for f := range strings.SplitSeq(rest, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(f), "=")
		switch k {
		case "Credential":
			cred = v
		case "SignedHeaders":
			signed = v
		case "Signature":
			sig = v
		}
	}
	scope := strings.Split(cred, "/") // key/date/region/service/aws4_request
	if len(scope) != 5 || scope[0] != s3Key {
		return fmt.Errorf("credential scope %q", cred)
	}
	at, err := time.Parse("20060102T150405Z", r.Header.Get("X-Amz-Date"))
	if err != nil {
		return fmt.Errorf("X-Amz-Date: %w", err)
	}
	payload := r.Header.Get("X-Amz-Content-Sha256")
	if payload != "UNSIGNED-PAYLOAD" {
		sum := sha256.Sum256(body)
		if hex.EncodeToString(sum[:]) != payload {
			return fmt.Errorf("payload hash %s is not the body's", payload)
		}
	}
	again, _ := http.NewRequest(r.Method, "http://"+r.Host+r.URL.RequestURI(), nil)
	again.Host = r.Host
	for h := range strings.SplitSeq(signed, ";") {
		switch h {
		case "host":
		case "content-length":
			again.ContentLength = r.ContentLength
		default:
			again.Header[http.CanonicalHeaderKey(h)] = r.Header.Values(h)
		}
	}
	signer := v4.NewSigner(func(o *v4.SignerOptions) { o.DisableURIPathEscaping = true })
	creds := aws.Credentials{AccessKeyID: s3Key, SecretAccessKey: s3Secret}
	if err := signer.SignHTTP(context.Background(), creds, again, payload, scope[3], scope[2], at); err != nil {
		return err
	}
	want := again.Header.Get("Authorization")
	if !strings.HasSuffix(want, "Signature="+sig) || !strings.Contains(want, "SignedHeaders="+signed+",") {
		return fmt.Errorf("signature mismatch: sent %q, recomputed %q", auth, want)
	}
	return nil
}

// s3Fixture is an S3 client over a gofakes3 server behind the injector,
// through bulwark or not.
type s3Fixture struct {
	j   *injector
	tr  *bulwark.Transport // nil without bulwark
	s3  *s3.Client
	raw *s3.Client // the same server, no faults, no bulwark: for reading back
}

func newS3(t *testing.T, withBulwark bool, plan func(time.Duration, *http.Request) fault) *s3Fixture {
	t.Helper()
	backend := s3mem.New()
	if err := backend.CreateBucket(bucket); err != nil {
		t.Fatal(err)
	}
	fake := gofakes3.New(backend).Server()
	j := &injector{next: fake, start: time.Now(), callOf: headerOf(callHeader), check: checkSigV4, plan: plan}
	client, tr := through(t, memServer{j}, withBulwark)
	opts := func(hc s3.HTTPClient) s3.Options {
		return s3.Options{
			Region:                     s3Region,
			Credentials:                credentials.NewStaticCredentialsProvider(s3Key, s3Secret, ""),
			BaseEndpoint:               aws.String("http://s3.sdktest"),
			UsePathStyle:               true,
			HTTPClient:                 hc,
			RequestChecksumCalculation: aws.RequestChecksumCalculationWhenRequired,
			ResponseChecksumValidation: aws.ResponseChecksumValidationWhenRequired,
		}
	}
	return &s3Fixture{j: j, tr: tr, s3: s3.New(opts(client)), raw: s3.New(opts(&http.Client{Transport: memServer{fake}}))}
}

// object is the body written under key: distinct per key, so that a
// mix-up shows.
func object(key string) []byte {
	return bytes.Repeat([]byte(key+"|"), 64)
}

// s3Call is one operation of the blip's mix: a write of a new object for
// even calls, a read of a seeded one for odd.
func (f *s3Fixture) s3Call(ctx context.Context, id string, written *syncSet) error {
	tag := s3.WithAPIOptions(smithyhttp.AddHeaderValue(callHeader, id))
	if strings.HasSuffix(id, "0") || strings.HasSuffix(id, "2") || strings.HasSuffix(id, "4") || strings.HasSuffix(id, "6") || strings.HasSuffix(id, "8") {
		_, err := f.s3.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(id), Body: bytes.NewReader(object(id))}, tag)
		if err == nil {
			written.add(id)
		}
		return err
	}
	out, err := f.s3.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String("seed")}, tag)
	if err != nil {
		return err
	}
	defer out.Body.Close()
	b, err := io.ReadAll(out.Body)
	if err == nil && !bytes.Equal(b, object("seed")) {
		err = errors.New("seed read back altered")
	}
	return err
}

// TestS3Blip: the AWS SDK's S3 client, writes and reads, during a 2 s blip
// of 503s, with and without bulwark below it: the server's requests per
// call with bulwark are at most the SDK's alone + 0.05, at least 99 % of
// the calls from 1 s after the blip succeed, every request's signature
// (each resend's included) is valid, and every object written reads back
// whole.
func TestS3Blip(t *testing.T) {
	compareBlip(t, func(t *testing.T, withBulwark bool) blipRun {
		f := newS3(t, withBulwark, blip503(""))
		ctx := context.Background()
		if _, err := f.raw.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String("seed"), Body: bytes.NewReader(object("seed"))}); err != nil {
			t.Fatal(err)
		}
		var written syncSet
		run := runBlip(f.j, 8, 50*time.Millisecond, func(ctx context.Context, id string) error { return f.s3Call(ctx, id, &written) })
		f.checkAttempts(t)
		f.checkWritten(t, &written)
		if f.tr != nil {
			h := f.tr.Snapshot().Hosts[0]
			t.Logf("bulwark's host: calls %+v, breaker changes %v", h.Calls, h.Breaker.Changes)
		}
		return run
	})
}

// checkAttempts checks every request the server received: its signature
// is valid, and no call sent one attempt number twice (the server would
// count that attempt twice).
func (f *s3Fixture) checkAttempts(t *testing.T) {
	t.Helper()
	attempts := map[string]map[string]bool{}
	bad := 0
	for _, h := range f.j.all() {
		n := h.header.Get("Amz-Sdk-Request")
		if attempts[h.call] == nil {
			attempts[h.call] = map[string]bool{}
		}
		if attempts[h.call][n] {
			t.Errorf("call %s sent %q twice: the server counts one attempt twice", h.call, n)
		}
		attempts[h.call][n] = true
		if h.sigErr != nil {
			bad++
			if bad < 3 {
				t.Errorf("%s %s (%s): %v", h.method, h.path, n, h.sigErr)
			}
		}
	}
	t.Logf("%d requests, %d bad signatures", len(f.j.all()), bad)
}

// checkWritten reads back every object written and checks it is whole.
func (f *s3Fixture) checkWritten(t *testing.T, written *syncSet) {
	t.Helper()
	for _, key := range written.list() {
		out, err := f.raw.GetObject(context.Background(), &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
		if err != nil {
			t.Errorf("object %s, written, does not read back: %v", key, err)
			continue
		}
		b, _ := io.ReadAll(out.Body)
		out.Body.Close()
		if !bytes.Equal(b, object(key)) {
			t.Errorf("object %s read back %d bytes, want the %d written", key, len(b), len(object(key)))
		}
	}
	t.Logf("%d objects written and read back whole", len(written.list()))
}

// TestCheckSigV4Catches: the signature check passes the SDK's requests
// and fails one whose signed header changed after signing, or whose body
// is not the one signed.
func TestCheckSigV4Catches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var seen []*http.Request
		var bodies [][]byte
		f := newS3(t, false, nil)
		f.j.check = func(r *http.Request, body []byte) error {
			seen, bodies = append(seen, r), append(bodies, body)
			return checkSigV4(r, body)
		}
		_, err := f.s3.PutObject(context.Background(), &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String("k"), Body: bytes.NewReader(object("k"))})
		if err != nil {
			t.Fatal(err)
		}
		r, body := seen[0], bodies[0]
		if err := checkSigV4(r, body); err != nil {
			t.Fatalf("the SDK's own request: %v", err)
		}
		r.Header.Set("Amz-Sdk-Request", "attempt=2; max=3")
		if err := checkSigV4(r, body); err == nil {
			t.Error("a signed header changed after signing passed the check")
		}
		r.Header.Set("Amz-Sdk-Request", seen[0].Header.Get("Amz-Sdk-Request"))
		if err := checkSigV4(r, append([]byte("x"), body...)); err == nil {
			t.Error("a body that is not the one signed passed the check")
		}
	})
}

// TestS3RetryAfter: every call's first request is answered 503 SlowDown
// with X-Amz-Retry-After: 300 (milliseconds), from three callers at once.
// Through bulwark, no request reaches the server sooner than 300 ms after
// such an answer, and every call succeeds as it does alone.
func TestS3RetryAfter(t *testing.T) {
	for _, withBulwark := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			var mu sync.Mutex
			slowed := &firstTry{first: fault{status: http.StatusServiceUnavailable, header: []string{"X-Amz-Retry-After", "300"},
				text: "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"}}
			f := newS3(t, withBulwark, slowed.plan)
			var written syncSet
			var wg sync.WaitGroup
			failed := 0
			for w := range 3 {
				wg.Go(func() {
					for i := range 4 {
						if err := f.s3Call(context.Background(), fmt.Sprintf("w%d-%d", w, 2*i), &written); err != nil {
							mu.Lock()
							failed++
							mu.Unlock()
						}
						time.Sleep(10 * time.Millisecond)
					}
				})
			}
			wg.Wait()
			early := slowed.sooner(f.j.all(), 300*time.Millisecond)
			t.Logf("bulwark %v: %d requests, %d sooner than 300 ms after an X-Amz-Retry-After: 300; %d of 12 calls failed", withBulwark, len(f.j.all()), early, failed)
			if withBulwark && (early > 0 || failed > 0) {
				t.Errorf("through bulwark: %d requests sooner than asked, %d calls failed; want none", early, failed)
			}
		})
	}
}
