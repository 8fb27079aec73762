package bulwarkgrpc_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"net/http"

	bulwarkgrpc "github.com/bulwark-http/bulwark/grpc"
	"github.com/bulwark-http/bulwark/server"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// The server half on a gRPC server: one Shedder for the service's HTTP
// handler and its gRPC server (one pool of workers), the deadline cap,
// and the pass-up mark, installed by ServerOptions. Here the Shedder has
// one worker and no queue, and a long-lived stream holds that worker for
// as long as it lasts, so a unary call beside it is refused
// RESOURCE_EXHAUSTED, with the wait it asks for and the priority refused
// as details (and, when the interceptor rather than the tap refuses it,
// as the trailers grpc-retry-pushback-ms and bulwark-shed-priority too).
func ExampleServerOptions() {
	mux := http.NewServeMux() // the service's HTTP side, behind the same Shedder
	shedder, err := server.NewShedder(mux, server.ShedConfig{Workers: 1, Queue: -1, ReservedCritical: -1})
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(bulwarkgrpc.ServerOptions(bulwarkgrpc.ServerConfig{Shedder: shedder})...)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()

	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Close()
	client := healthpb.NewHealthClient(cc)
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(context.Background(), "bulwark-priority", "low"))
	defer cancel()

	watch, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := watch.Recv(); err != nil { // the stream is served: it holds the worker
		log.Fatal(err)
	}
	_, err = client.Check(ctx, &healthpb.HealthCheckRequest{})
	fmt.Println(status.Code(err))
	for _, d := range status.Convert(err).Details() {
		switch d := d.(type) {
		case *errdetails.RetryInfo:
			fmt.Println("retry after", d.GetRetryDelay().AsDuration())
		case *errdetails.ErrorInfo:
			fmt.Println(d.GetDomain(), d.GetReason(), "priority", d.GetMetadata()["bulwark-shed-priority"])
		}
	}
	fmt.Println("refused:", shedder.Stats().ShedTotal())
	// Output:
	// ResourceExhausted
	// retry after 1s
	// bulwark SHED priority low
	// refused: 1
}
