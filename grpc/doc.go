// Package bulwarkgrpc protects gRPC client calls with a bulwark.Transport:
// the same policies, per-host state, Snapshot, Update and fleet as the
// Transport's HTTP calls.
//
// The package is named bulwarkgrpc, not grpc, though it lives in the
// directory grpc: its users import google.golang.org/grpc beside it.
package bulwarkgrpc
