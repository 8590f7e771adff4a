// Package codecs has a service of protobuf messages and one of plain Go
// types in one file: the file imports the codec of each.
package codecs

import (
	"context"

	"github.com/dabbrpc/dabb/cmd/rpcgen/testdata/types/pb"
	"github.com/dabbrpc/dabb/internal/inventory/inventorypb"
)

// Stock speaks protobuf only: it needs the protobuf codec.
type Stock interface {
	Deduct(ctx context.Context, req *inventorypb.DeductRequest) (*inventorypb.DeductReply, error)
}

// Ledger answers one protobuf request with a plain Go type: it needs the
// JSON codec.
type Ledger interface {
	Balance(ctx context.Context, req *inventorypb.StockRequest) (*pb.StockReply, error)
}
