// Package fleet has two services generated into one file.
package fleet

import (
	"context"

	"github.com/dabbrpc/dabb/cmd/rpcgen/testdata/types/pb"
)

// Cars rents cars.
type Cars interface {
	//dabb:idempotent
	Rent(ctx context.Context, req *pb.DeductRequest) (*pb.DeductReply, error)
}

// Trucks rents trucks.
type Trucks interface {
	Rent(ctx context.Context, req *pb.DeductRequest) (*pb.DeductReply, error)
	//dabb:timeout 3s
	Return(ctx context.Context, req *Cargo) (*pb.StockReply, error)
}

// Cargo is declared here.
type Cargo struct{ Tons int }
