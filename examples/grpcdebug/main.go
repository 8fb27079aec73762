// Command grpcdebug serves bulwark's debug page (package debug) for one
// Transport that protects an HTTP upstream and a gRPC upstream at once,
// so the page shows them side by side: the HTTP calls go through the
// Transport as an http.RoundTripper, the gRPC calls through its client
// interceptor (package bulwarkgrpc), and both land in the same Snapshot.
// Both upstreams are its own, on 127.0.0.1, and both fail a tenth of
// their calls: the HTTP one with 503, the gRPC one (grpc-go's health
// service) with UNAVAILABLE.
//
//	go run ./grpcdebug                       # serves the page until interrupted
//	go run ./grpcdebug -screenshot page.png  # or captures it with headless Chromium
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"sync/atomic"
	"time"

	"github.com/bulwark-http/bulwark"
	"github.com/bulwark-http/bulwark/debug"
	bulwarkgrpc "github.com/bulwark-http/bulwark/grpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "grpcdebug:", err)
		os.Exit(1)
	}
}

func run() error {
	shot := flag.String("screenshot", "", "capture the page with headless Chromium into this PNG file and exit")
	chromium := flag.String("chromium", "/usr/bin/chromium", "the Chromium binary -screenshot runs")
	calls := flag.Int("calls", 300, "calls made to each upstream before the page is served (1..100000)")
	flag.Parse()
	if *calls < 1 || *calls > 100000 {
		return fmt.Errorf("-calls %d: must be within 1..100000", *calls)
	}

	// The HTTP upstream: every tenth request answers 503.
	var n atomic.Int64
	httpLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	httpSrv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1)%10 == 0 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok")
	})}
	go httpSrv.Serve(httpLn)
	defer httpSrv.Close()

	// The gRPC upstream: grpc-go's health service; every tenth call
	// answers UNAVAILABLE.
	var g atomic.Int64
	grpcLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	grpcSrv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if g.Add(1)%10 == 0 {
			return nil, status.Error(codes.Unavailable, "busy")
		}
		return h(ctx, req)
	}))
	healthpb.RegisterHealthServer(grpcSrv, health.NewServer())
	go grpcSrv.Serve(grpcLn)
	defer grpcSrv.Stop()

	tr, err := bulwark.New(bulwark.Config{})
	if err != nil {
		return err
	}
	defer tr.Close()
	cc, err := grpc.NewClient("passthrough:///"+grpcLn.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(bulwarkgrpc.UnaryClientInterceptor(tr)))
	if err != nil {
		return err
	}
	defer cc.Close()

	ctx := context.Background()
	httpClient := &http.Client{Transport: tr}
	hc := healthpb.NewHealthClient(cc)
	for range *calls {
		if resp, err := httpClient.Get("http://" + httpLn.Addr().String() + "/orders"); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		_, _ = hc.Check(ctx, &healthpb.HealthCheckRequest{})
	}

	page := debug.Handler(tr)
	defer page.(io.Closer).Close()
	mux := http.NewServeMux()
	mux.Handle("/debug/bulwark/", page)
	adminLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	admin := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go admin.Serve(adminLn)
	defer admin.Close()
	// Calm hosts open (?calm=open), should either be calm: the page
	// folds calm hosts away.
	url := "http://" + adminLn.Addr().String() + "/debug/bulwark/?calm=open"
	fmt.Printf("HTTP upstream %s, gRPC upstream %s; the page: %s\n", httpLn.Addr(), grpcLn.Addr(), url)

	if *shot == "" {
		sig, stop := signal.NotifyContext(ctx, os.Interrupt)
		defer stop()
		<-sig.Done()
		return nil
	}
	dir, err := os.MkdirTemp("", "grpcdebug-chromium")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cctx, *chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
		"--user-data-dir="+dir, "--window-size=1400,1100", "--screenshot="+*shot, url)
	cmd.WaitDelay = 5 * time.Second
	if out, err := cmd.CombinedOutput(); err != nil {
		return errors.Join(fmt.Errorf("chromium: %w", err), errors.New(string(out)))
	}
	fmt.Println("screenshot:", *shot)
	return nil
}
