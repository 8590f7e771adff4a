package dabb_test

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/internal/inventory"
	pb "github.com/dabbrpc/dabb/internal/inventory/inventorypb"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/registry/static"
)

// A server publishes the inventory service to a registry; a client finds
// it there and calls it through the generated stub.
func Example() {
	ctx := context.Background()
	reg := static.New() // a registry without a server; zk:// or etcd:// in production
	defer reg.Close()

	srv := dabb.NewServer(dabb.WithRegistry(reg), dabb.WithLogger(quiet))
	if err := inventory.RegisterInventoryServer(srv, inventory.NewStore(map[string]int64{"sku-42": 10})); err != nil {
		panic(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	defer func() { srv.Shutdown(ctx); <-done }()

	client, err := proxy.NewClient(reg, proxy.WithLogger(quiet))
	if err != nil {
		panic(err)
	}
	defer client.Close()
	inv := inventory.NewInventoryClient(client)

	// Wait until the server has published itself.
	for {
		if ins, _ := client.Instances(ctx, inventory.InventoryServiceName); len(ins) > 0 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	reply, err := inv.Deduct(ctx, &pb.DeductRequest{Sku: "sku-42", Count: 3, RequestId: "order-1"})
	if err != nil {
		panic(err)
	}
	fmt.Println("remaining:", reply.GetRemaining())

	// A retry of the same request id deducts nothing.
	reply, err = inv.Deduct(ctx, &pb.DeductRequest{Sku: "sku-42", Count: 3, RequestId: "order-1"})
	if err != nil {
		panic(err)
	}
	fmt.Println("duplicate:", reply.GetDuplicate())

	stock, err := inv.Stock(ctx, &pb.StockRequest{Sku: "sku-42"})
	if err != nil {
		panic(err)
	}
	fmt.Println("stock:", stock.GetCount())
	// Output:
	// remaining: 7
	// duplicate: true
	// stock: 7
}
