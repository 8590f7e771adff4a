// Package catalog names its service explicitly and prints several durations.
package catalog

import (
	"context"

	"github.com/dabbrpc/dabb/cmd/rpcgen/testdata/types/pb"
)

// Catalog is published under a versioned name.
//
//dabb:service acme.catalog.v1.Catalog
type Catalog interface {
	//dabb:timeout 2s
	Lookup(context.Context, *pb.StockRequest) (*pb.StockReply, error)
	//dabb:timeout 1500us
	Quick(context.Context, *pb.StockRequest) (*pb.StockReply, error)
	//dabb:timeout 1m30s
	//dabb:idempotent
	Slow(context.Context, *pb.StockRequest) (*pb.StockReply, error)
	//dabb:timeout 1h
	Report(context.Context, *pb.StockRequest) (*pb.StockReply, error)
}
