module github.com/bulwark-http/bulwark/bench

go 1.26.0

require (
	github.com/bulwark-http/bulwark v0.0.0
	github.com/cristalhq/hedgedhttp v0.9.2
	github.com/failsafe-go/failsafe-go v0.9.8
	github.com/hashicorp/go-retryablehttp v0.7.8
	github.com/sony/gobreaker/v2 v2.4.0
	google.golang.org/grpc v1.85.0
)

require (
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260817212433-ac3dfec99bb1 // indirect
)

require (
	github.com/DataDog/sketches-go v1.4.8 // indirect
	github.com/bits-and-blooms/bitset v1.24.4 // indirect
	github.com/bulwark-http/bulwark/grpc v0.0.0
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/go-logr/logr v1.4.4 // indirect
	github.com/go-logr/stdr v1.2.2 // indirect
	github.com/hashicorp/go-cleanhttp v0.5.2 // indirect
	github.com/influxdata/tdigest v0.0.1 // indirect
	go.opentelemetry.io/auto/sdk v1.2.1 // indirect
	go.opentelemetry.io/otel v1.47.0 // indirect
	go.opentelemetry.io/otel/log v1.47.0 // indirect
	go.opentelemetry.io/otel/metric v1.47.0 // indirect
	go.opentelemetry.io/otel/trace v1.47.0 // indirect
	golang.org/x/time v0.16.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

replace github.com/bulwark-http/bulwark => ../

replace github.com/bulwark-http/bulwark/grpc => ../grpc
