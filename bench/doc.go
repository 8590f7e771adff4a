// Package bench measures dabb against gRPC-Go, rpcx, net/rpc, Kitex and a raw-TCP
// reference on one workload, the 581-byte BenchmarkMessage echo of the rpcx
// and Kitex benchmarks. It is its own module, so the peers never enter
// dabb's go.mod.
//
//	cd bench
//	go run ./cmd/dabbbench                     # the table, CSV and chart in results/
//	go test -run '^$' -bench . -benchmem       # allocations per call, in one process
//
// The frameworks live in bench/frameworks, the message in bench/proto, the
// dabb service in bench/echo. The Dubbo rows, run only when named, compare
// dabb over Dubbo's hessian2 bodies (bench/dubboecho) with dubbo-go, whose
// program is a module of its own (bench/dubbogo).
package bench
