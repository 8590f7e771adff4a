// Command dabbbench runs the benchmark workload, a 581-byte protobuf echo,
// on dabb and its peers (gRPC-Go, rpcx, net/rpc, Kitex and two raw-TCP
// references) and writes one table of calls/s, latency and CPU per call.
//
//	cd bench && go run ./cmd/dabbbench                   # every framework, c = 1,16,128,1024
//	go run ./cmd/dabbbench -frameworks dabb,grpc -c 1,128 -duration 3s
//	go run ./cmd/dabbbench -payload 16k -mix=false
//	go run ./cmd/dabbbench -frameworks dabb,grpc,dabb-tls,grpc-tls -c 1,128
//
// The TLS frameworks, dabb-tls and grpc-tls, run only when named. Their
// server processes get the run's certificates in DABBBENCH_TLS.
// The Dubbo frameworks, dabb-hessian2 and dubbo-go, also run only when
// named ("-frameworks default,dubbo" adds them to the default list).
// dubbo-go is a program of its own module (bench/dubbogo), which the
// command builds and runs as both the server and the client process; its
// client runs the closed loop itself and reports each window (remote.go).
//
// Each framework's server runs in a separate process (this program with
// -server), so the CPU time of each side is its own getrusage. The client
// is one shared client of the framework, called back to back by C
// goroutines (a closed loop); each window has a warm-up and then a
// measured part. With -mix, a last point measures small calls while
// -large goroutines make 1 MiB calls on the same client.
//
// Every server and client is started up front, then the points are
// measured in -rounds rounds (default 3): in each round, point after
// point, every framework in turn, the order rotated by one framework per
// round (round r starts at framework r mod n) and run backwards in odd
// rounds, so that the machine's drift over minutes falls on all of them
// alike. The table reports, per framework and point, the round with the
// median calls/s, whole; the CSV keeps every round. Rounds after the
// first warm up for half of -warmup, at least 250ms. A window in which no
// call completes for 30 s (a lost reply) stops the run with an error.
//
// With -cpuprofile DIR, each framework's server writes its CPU profile
// there (go tool pprof DIR/dabb-server.pprof), and the client process,
// which runs every framework's client in turn, writes all-client.pprof
// (<framework>-client.pprof when there is one framework).
//
// With -calls N -framework F -addr HOST:PORT, the command is a client
// alone: it makes N calls, one after the other, to F's server at that
// address (a process started with -server -framework F) and exits;
// scripts/instructions.sh counts the instructions of both processes.
//
// With -allocs (the default), after the sweep the command runs the
// in-process benchmarks of the bench module (go test -bench, client and
// server in one process) and adds allocations per call, with the
// protobuf codec floor beside them, to the table; go test's output goes
// to inproc.txt in -out.
//
// The table goes to stdout and, with a CSV and an SVG chart, to -out
// (results/bench.{md,csv,svg}, or bench-16k.* and bench-1m.* for the
// large payloads). A progress line goes to stderr.
package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
)

func main() {
	if os.Getenv(roleEnv) == "server" || slices.Contains(os.Args[1:], "-server") {
		if err := serverMain(os.Args[1:], os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	if callsMode(os.Args[1:]) {
		if err := callsMain(os.Args[1:], os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	cfg, err := parseFlags(os.Args[1:])
	if err == flag.ErrHelp {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if err := run(cfg, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
