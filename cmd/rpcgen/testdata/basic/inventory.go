// Package inventory is the basic case: two methods, one idempotent with a
// timeout, messages from another package.
package inventory

import (
	"context"

	"github.com/dabbrpc/dabb/cmd/rpcgen/testdata/types/pb"
)

// Inventory keeps stock per item.
type Inventory interface {
	// Deduct takes count units of sku out of stock, once per request id.
	// It is not idempotent.
	Deduct(ctx context.Context, req *pb.DeductRequest) (*pb.DeductReply, error)

	// Stock reports how many units of sku are left.
	//dabb:idempotent
	//dabb:timeout 200ms
	Stock(ctx context.Context, req *pb.StockRequest) (*pb.StockReply, error)
}
