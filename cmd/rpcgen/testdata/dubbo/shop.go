// Package shop is the Dubbo case: a Java interface declared in Go, with
// primitive, POJO, void and overloaded methods, derived and given Java
// types, an idempotent method with a timeout, and types from another
// package.
package shop

import (
	"context"
	"time"

	"github.com/dabbrpc/dabb/cmd/rpcgen/testdata/types/shared"
)

// Reservation is com.example.shop.Reservation.
type Reservation struct {
	Sku   string
	Count int32
}

// Receipt is com.example.shop.Receipt.
type Receipt struct {
	Remaining int64
}

// Shop is com.example.shop.ShopService.
//
//dabb:dubbo com.example.shop.ShopService version=1.0.0 group=gold
type Shop interface {
	// Deduct takes count units of sku; false when the stock is short.
	Deduct(ctx context.Context, sku int64, count int32) (bool, error)

	// Stock reports the units of sku left.
	//dabb:idempotent
	//dabb:timeout 200ms
	Stock(ctx context.Context, sku int64) (int64, error)

	// Reserve is Receipt reserve(Reservation).
	Reserve(ctx context.Context, r *Reservation) (*Receipt, error)

	// ReserveAll is the overload reserve(Reservation[]).
	//dabb:java reserve(com.example.shop.Reservation[])
	ReserveAll(ctx context.Context, rs []*Reservation) (*Receipt, error)

	// Restock is void restock(String sku, long count, java.util.Date at).
	//dabb:java restock
	Restock(ctx context.Context, sku string, count int64, at time.Time) error

	// Note takes a type of another package, named as Java's Object.
	//dabb:java note(java.lang.Object)
	Note(context.Context, *shared.PingRequest) error

	// Ping has no parameters after the context.
	//dabb:idempotent
	Ping(ctx context.Context) error
}
