// Package inventory is the demo service: stock kept per SKU, deducted by
// orders. A Deduct that is retried after a timeout must not deduct twice, so
// every deduction carries a request id and the store remembers the answer it
// gave for each id (the idempotency lesson: check-and-apply is one atomic
// step, keyed by an id that every retry repeats).
package inventory

import (
	"context"

	pb "github.com/dabbrpc/dabb/internal/inventory/inventorypb"
)

//go:generate go run github.com/dabbrpc/dabb/cmd/rpcgen -type Inventory

// Inventory is the service's interface: the contract both sides share.
type Inventory interface {
	// Deduct takes count units of sku out of stock, once per request id.
	// A request id reused for another sku or count is a bad request.
	Deduct(ctx context.Context, req *pb.DeductRequest) (*pb.DeductReply, error)
	// Stock reports how many units of sku are left.
	//dabb:idempotent
	//dabb:timeout 200ms
	Stock(ctx context.Context, req *pb.StockRequest) (*pb.StockReply, error)
}
