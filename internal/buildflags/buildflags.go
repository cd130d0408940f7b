// Package buildflags holds the build tags every lockfs binary is built
// with, so that the Makefile, the benchmark harness and the integration
// tests build the same program.
package buildflags

// Tags is the -tags value for go build.
//
// disable_grpc_modules leaves out cloud.google.com/go/storage's gRPC
// DirectPath dependencies (grpc's xds and rls balancers, envoy's control
// plane, OpenTelemetry's exporters): lockfs's gcs backend speaks the JSON
// API (storage.NewClient), which never uses them. Without them the binary
// is 36 MB instead of 56, its package initialisers allocate 1.4 MiB
// instead of 2.5, and the pages of the binary a running daemon keeps
// resident shrink with it. The Makefile's TAGS must say the same.
const Tags = "disable_grpc_modules"
