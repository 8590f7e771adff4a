// Package shared declares an interface that others embed.
package shared

import (
	"context"

	"github.com/dabbrpc/dabb/cmd/rpcgen/testdata/types/internal/hidden"
	orders "github.com/dabbrpc/dabb/cmd/rpcgen/testdata/types/otherpb"
	"github.com/dabbrpc/dabb/cmd/rpcgen/testdata/types/pb"
)

// PingRequest is a ping.
type PingRequest struct{ Seq int }

// PingReply answers a ping.
type PingReply struct{ Seq int }

// Pinger is embedded by services that answer pings.
type Pinger interface {
	// Ping answers with the same sequence number.
	//dabb:idempotent
	Ping(ctx context.Context, req *PingRequest) (*PingReply, error)
	// Stock is also in Admin's own methods via another route.
	Stock(ctx context.Context, req *pb.StockRequest) (*pb.StockReply, error)
}

// Orderer takes orders; its messages come from a package named pb that is
// not ../pb.
type Orderer interface {
	Order(ctx context.Context, req *orders.Order) (*orders.Receipt, error)
}

// Noter names its message by its internal package, which packages outside
// testdata/types may not import.
type Noter interface {
	Note(ctx context.Context, req *hidden.Note) (*hidden.Note, error)
}
