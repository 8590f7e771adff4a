// Package inventorypb holds the protobuf messages of the inventory demo,
// generated from inventory.proto: DeductRequest and DeductReply for
// Inventory.Deduct, StockRequest and StockReply for Inventory.Stock.
//
//	req := &inventorypb.DeductRequest{Sku: "sku-42", Count: 2, RequestId: "r-1"}
package inventorypb

// After editing inventory.proto, regenerate inventory.pb.go with
// `go generate` in this directory. It needs, installed once, the protobuf
// compiler and the Go plugin at the google.golang.org/protobuf version of
// go.mod (on PATH, e.g. in $(go env GOPATH)/bin):
//
//	apt-get install -y protobuf-compiler
//	go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
//
//go:generate protoc --go_out=. --go_opt=paths=source_relative inventory.proto
