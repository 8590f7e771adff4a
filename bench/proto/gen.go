// Package benchpb holds the benchmark workload's message, BenchmarkMessage
// (581 bytes marshaled as [NewMessage] fills it), and its gRPC service
// stub, generated from bench.proto.
//
//	req := benchpb.NewMessage(0)  // the standard 581-byte message
//	reply := &benchpb.BenchmarkMessage{}
//	benchpb.CopyTo(reply, req)    // a server's echo ...
//	benchpb.Answer(reply)         // ... with field1 = "OK", field2 = 100
//	err := benchpb.Check(req, reply)
package benchpb

// After editing bench.proto, regenerate with `go generate` in this
// directory. It needs the protobuf compiler and the Go plugins (on PATH,
// e.g. in $(go env GOPATH)/bin):
//
//	apt-get install -y protobuf-compiler
//	go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
//	go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
//
// The Kitex stubs in ../kitex_gen come from the same file through
// kitexgen.sh, which runs the Kitex generator pinned in bench/go.mod.
//
//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative bench.proto
//go:generate sh kitexgen.sh
