// Package comexample declares in Go the Java interfaces and classes of
// com.example that the dubbo-go peer of the dubbo module's tests serves:
// com.example.Greeter and com.example.inventory.InventoryService, their
// POJOs registered with dubbo.RegisterPOJO, and the typed clients rpcgen
// generates from the declarations.
package comexample

import (
	"context"
	"errors"

	"github.com/dabbrpc/dabb/dubbo"
)

//go:generate go run github.com/dabbrpc/dabb/cmd/rpcgen -type Greeter
//go:generate go run github.com/dabbrpc/dabb/cmd/rpcgen -type InventoryService

// Greeter is com.example.Greeter.
//
//dabb:dubbo com.example.Greeter
type Greeter interface {
	// SayHello is String sayHello(String name): "hello " and the name.
	//dabb:idempotent
	SayHello(ctx context.Context, name string) (string, error)

	// Greet is HelloReply greet(HelloRequest req).
	//dabb:idempotent
	//dabb:timeout 10s
	Greet(ctx context.Context, req *HelloRequest) (*HelloReply, error)

	// Fail is String fail(String why): it always throws a
	// java.lang.RuntimeException whose message is why.
	Fail(ctx context.Context, why string) (string, error)
}

// InventoryService is com.example.inventory.InventoryService.
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

// HelloRequest is com.example.HelloRequest {String name}.
type HelloRequest struct {
	Name string `hessian:"name"`
}

// HelloReply is com.example.HelloReply {String message; int length}.
type HelloReply struct {
	Message string `hessian:"message"`
	Length  int32  `hessian:"length"`
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
		dubbo.RegisterPOJO("com.example.HelloRequest", HelloRequest{}),
		dubbo.RegisterPOJO("com.example.HelloReply", HelloReply{}),
		dubbo.RegisterPOJO("com.example.inventory.DeductRequest", DeductRequest{}),
		dubbo.RegisterPOJO("com.example.inventory.DeductReply", DeductReply{}),
	); err != nil {
		panic(err) // constant arguments: a failure is a bug of this file
	}
}
