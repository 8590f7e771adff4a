// The demo's Java face: the store served as com.example.inventory.InventoryService to Dubbo consumers.

package main

import (
	"context"
	"errors"
	"strconv"
	"strings"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/dubbo"
	"github.com/dabbrpc/dabb/internal/inventory"
	pb "github.com/dabbrpc/dabb/internal/inventory/inventorypb"
)

//go:generate go run github.com/dabbrpc/dabb/cmd/rpcgen -type InventoryService

// javaApplication is the application name the demo's provider URL carries.
const javaApplication = "dabb-inventory"

// InventoryService is the demo's Java face, the Dubbo declaration that
// inventoryservice_dabb.go serves and calls. A Java sku is the decimal
// form of the store's sku: 10086 is "10086".
//
//dabb:dubbo com.example.inventory.InventoryService
type InventoryService interface {
	// Deduct is boolean deduct(long sku, int count): true when deducted,
	// false when the stock is short.
	Deduct(ctx context.Context, sku int64, count int32) (bool, error)

	// Stock is long stock(long sku): the units of sku left.
	//dabb:idempotent
	Stock(ctx context.Context, sku int64) (int64, error)

	// DeductOnce is DeductReply deductOnce(DeductRequest req): a repeated
	// requestId deducts nothing and answers the first reply with
	// duplicate set.
	//dabb:idempotent
	DeductOnce(ctx context.Context, req *DeductRequest) (*DeductReply, error)
}

// DeductRequest is com.example.inventory.DeductRequest
// {String sku; int count; String requestId}.
type DeductRequest struct {
	Sku       string `hessian:"sku"`
	Count     int32  `hessian:"count"`
	RequestID string `hessian:"requestId"`
}

// DeductReply is com.example.inventory.DeductReply
// {long remaining; boolean duplicate}.
type DeductReply struct {
	Remaining int64 `hessian:"remaining"`
	Duplicate bool  `hessian:"duplicate"`
}

func init() {
	if err := errors.Join(
		dubbo.RegisterPOJO("com.example.inventory.DeductRequest", DeductRequest{}),
		dubbo.RegisterPOJO("com.example.inventory.DeductReply", DeductReply{}),
	); err != nil {
		panic(err) // constant arguments: a failure is a bug of this file
	}
}

// javaInventory is InventoryService over the store.
type javaInventory struct {
	store inventory.Inventory
}

// Deduct takes count units of sku: true when deducted, false when the
// stock is short. An unknown sku and a count ≤ 0 are errors, which Java
// sees as IllegalArgumentException.
func (j javaInventory) Deduct(ctx context.Context, sku int64, count int32) (bool, error) {
	_, err := j.store.Deduct(ctx, &pb.DeductRequest{Sku: strconv.FormatInt(sku, 10), Count: count})
	if errors.Is(err, inventory.ErrInsufficientStock) {
		return false, nil
	}
	return err == nil, err
}

// Stock returns the units of sku left; an unknown sku is an error.
func (j javaInventory) Stock(ctx context.Context, sku int64) (int64, error) {
	reply, err := j.store.Stock(ctx, &pb.StockRequest{Sku: strconv.FormatInt(sku, 10)})
	if err != nil {
		return 0, err
	}
	return reply.GetCount(), nil
}

// DeductOnce is the store's idempotent deduction: a repeated requestId
// deducts nothing and answers the first reply with duplicate set.
func (j javaInventory) DeductOnce(ctx context.Context, req *DeductRequest) (*DeductReply, error) {
	if req == nil {
		req = &DeductRequest{} // Java's null: refused below as a count of 0
	}
	reply, err := j.store.Deduct(ctx, &pb.DeductRequest{Sku: req.Sku, Count: req.Count, RequestId: req.RequestID})
	if err != nil {
		return nil, err
	}
	return &DeductReply{Remaining: reply.GetRemaining(), Duplicate: reply.GetDuplicate()}, nil
}

// isDubboRegistry reports whether url names Dubbo's ZooKeeper layout, in
// which the demo also serves its Java interface.
func isDubboRegistry(url string) bool { return strings.HasPrefix(url, "zookeeper://") }

// registerJava adds the Java interface to srv, serving store.
func registerJava(srv *dabb.Server, store inventory.Inventory) error {
	return RegisterInventoryServiceDubboServer(srv, javaInventory{store}, dubbo.WithApplication(javaApplication))
}
