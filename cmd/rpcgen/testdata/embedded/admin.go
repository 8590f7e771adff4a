// Package admin flattens embedded interfaces: one from this package, one from
// another package (with its own directives), an interface literal and any.
package admin

import (
	"context"

	"github.com/dabbrpc/dabb/cmd/rpcgen/testdata/types/pb"
	"github.com/dabbrpc/dabb/cmd/rpcgen/testdata/types/shared"
)

// Health reports health.
type Health interface {
	// Check reports whether the instance is healthy.
	//dabb:timeout 50ms
	Check(ctx context.Context, req *pb.StockRequest) (*pb.StockReply, error)
}

// Ops embeds Health too; Check must appear once.
type Ops interface {
	Health
	Restart(ctx context.Context, req *pb.DeductRequest) (*pb.DeductReply, error)
}

// ReadOnly is an alias of an interface literal.
type ReadOnly = interface {
	//dabb:timeout 1s
	Status(ctx context.Context, req *pb.StockRequest) (*pb.StockReply, error)
}

// Admin is the administrative service.
type Admin interface {
	Health
	shared.Pinger
	Ops
	interface {
		// Drain stops taking new calls.
		//dabb:idempotent
		Drain(ctx context.Context, req *pb.DeductRequest) (*pb.DeductReply, error)
	}
	ReadOnly
	any // adds nothing
	// Stock is declared here and by shared.Pinger; the first one wins.
	Stock(ctx context.Context, req *pb.StockRequest) (*pb.StockReply, error)
}
