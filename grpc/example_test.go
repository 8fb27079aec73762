package bulwarkgrpc_test

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/bulwark-http/bulwark"
	bulwarkgrpc "github.com/bulwark-http/bulwark/grpc"
)

// A channel's calls share the Transport's per-host state: here its
// breaker, forced open by an operator, refuses the call before it is sent,
// as UNAVAILABLE that is still bulwark.ErrBreakerOpen.
func Example() {
	t, err := bulwark.New(bulwark.Config{})
	if err != nil {
		panic(err)
	}
	cc, err := grpc.NewClient("passthrough:///orders.internal:443",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(bulwarkgrpc.UnaryClientInterceptor(t)),
		grpc.WithStreamInterceptor(bulwarkgrpc.StreamClientInterceptor(t)))
	if err != nil {
		panic(err)
	}
	defer cc.Close()
	if err := t.ControlBreaker("orders.internal:443", bulwark.BreakerForceOpen); err != nil {
		panic(err)
	}
	err = cc.Invoke(context.Background(), mGet, &testpb.SimpleRequest{}, new(testpb.SimpleResponse))
	fmt.Println(status.Code(err), errors.Is(err, bulwark.ErrBreakerOpen))
	// Output: Unavailable true
}
