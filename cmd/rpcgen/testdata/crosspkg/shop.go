// Package shop takes messages from several packages: two named pb (one of
// them through an embedded interface), one named like the runtime's proxy
// package, one whose name is not its directory's, one through an alias, and
// one through pb's alias of a type of an internal package it may not import.
package shop

import (
	"context"

	"github.com/dabbrpc/dabb/cmd/rpcgen/testdata/types/pb"
	"github.com/dabbrpc/dabb/cmd/rpcgen/testdata/types/proxy"
	"github.com/dabbrpc/dabb/cmd/rpcgen/testdata/types/shared"
	"github.com/dabbrpc/dabb/cmd/rpcgen/testdata/types/v2"
)

// Request is an alias; the generated code names the aliased type.
type Request = pb.DeductRequest

type (
	// Shop sells things.
	Shop interface {
		shared.Orderer
		Deduct(ctx context.Context, req *Request) (*pb.DeductReply, error)
		Stock(ctx context.Context, req *pb.StockRequest) (*pb.StockReply, error)
		Route(ctx context.Context, req *proxy.Route) (*shapes.Shape, error)
		Note(ctx context.Context, req *pb.Note) (*pb.Note, error)
	}
)
