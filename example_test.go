package dabb_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log"
	"net"
	"os"
	"time"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/internal/inventory"
	pb "github.com/dabbrpc/dabb/internal/inventory/inventorypb"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/registry"
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

	if err := waitPublished(ctx, reg, inventory.InventoryServiceName); err != nil {
		panic(err)
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

// mTLS with a token, as the README's "Secure it" shows: the server admits
// only the payments service's certificate, carrying a valid token. The
// PEM files are made by the README's openssl commands; this example is
// compiled, not run.
func Example_secure() {
	ctx := context.Background()
	reg := static.New() // zk:// or etcd:// in production
	defer reg.Close()
	store := inventory.NewStore(map[string]int64{"sku-42": 10})

	ca, err := os.ReadFile("ca.pem")
	if err != nil {
		log.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	token := func(context.Context) (string, error) { return os.Getenv("INVENTORY_TOKEN"), nil }

	// The server: mTLS, and only payments.internal with the token may call.
	serverCert, err := tls.LoadX509KeyPair("server.pem", "server-key.pem")
	if err != nil {
		log.Fatal(err)
	}
	s := dabb.NewServer(dabb.WithRegistry(reg),
		dabb.WithTLS(&tls.Config{
			Certificates: []tls.Certificate{serverCert},
			ClientCAs:    pool,
			ClientAuth:   tls.RequireAndVerifyClientCert,
		}),
		dabb.WithInterceptor(
			dabb.RequirePeerIdentity(dabb.Identities{DNSNames: []string{"payments.internal"}}),
			dabb.RequireToken(os.Getenv("INVENTORY_TOKEN")),
		))
	if err := inventory.RegisterInventoryServer(s, store); err != nil {
		log.Fatal(err)
	}
	go s.ListenAndServe("127.0.0.1:20880")
	defer s.Shutdown(ctx)

	// The client: the payments service's certificate, and the token.
	clientCert, err := tls.LoadX509KeyPair("client.pem", "client-key.pem")
	if err != nil {
		log.Fatal(err)
	}
	c, err := proxy.NewClient(reg,
		proxy.WithTLS(&tls.Config{Certificates: []tls.Certificate{clientCert}, RootCAs: pool}),
		proxy.WithCredentials(proxy.BearerToken(token)))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	if err := waitPublished(ctx, reg, inventory.InventoryServiceName); err != nil {
		log.Fatal(err)
	}
	stock, err := inventory.NewInventoryClient(c).Stock(ctx, &pb.StockRequest{Sku: "sku-42"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("stock:", stock.GetCount())
}

// waitPublished waits until reg lists an instance of service: the server
// has published itself. It gives up after 5 seconds.
func waitPublished(ctx context.Context, reg registry.Registry, service string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	w, err := reg.Watch(ctx, service)
	if err != nil {
		return fmt.Errorf("watch %s: %w", service, err)
	}
	defer w.Stop()
	for {
		ins, err := w.Next(ctx)
		if err != nil {
			return fmt.Errorf("%s not published within 5s: %w", service, err)
		}
		if len(ins) > 0 {
			return nil
		}
	}
}
