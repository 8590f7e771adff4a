// Package dabb is interface-first RPC for Go. Write a Go interface, and
// rpcgen writes the typed client stub and the server glue. Calls travel as
// Dubbo-compatible frames over a few pooled TCP connections, to instances
// found in ZooKeeper or etcd.
//
// This package is the server side. A service is an interface whose methods
// look like
//
//	Deduct(ctx context.Context, req *pb.DeductRequest) (*pb.DeductReply, error)
//
// marked for the generator:
//
//	//go:generate go run github.com/dabbrpc/dabb/cmd/rpcgen -type Inventory
//
// which writes inventory_dabb.go with NewInventoryClient, RegisterInventoryServer
// and InventoryServiceDesc. Serve it:
//
//	s := dabb.NewServer(dabb.WithRegistry(reg))
//	if err := inventory.RegisterInventoryServer(s, impl); err != nil { ... }
//	go s.ListenAndServe("127.0.0.1:20880")
//	...
//	s.Shutdown(ctx) // withdraw from the registry, drain, close
//
// and call it through a proxy.Client:
//
//	c, err := proxy.NewClient(reg) // fails for an unknown balancer or codec
//	inv := inventory.NewInventoryClient(c)
//	reply, err := inv.Deduct(ctx, &pb.DeductRequest{Sku: "sku-42", Count: 1})
//
// A handler's error reaches the caller as status 70 (service error), with
// the error's text. A handler may choose 25 (serialization error), 40 (bad
// request) or 60 (not found) by returning a *protocol.Error with that
// status. Any other status reaches the caller as 70. So does any status of
// an error the handler got from a call of its own: a caller must not take
// a downstream timeout or overload for one of this server.
//
// A local *protocol.Error's Code and Details reach the caller with it,
// whatever its status ([protocol.NewError]). A handler's panic is answered
// 70 "handler panic (id …)"; its text and stack go to the server's log
// under that id. A handler that returns a nil reply and a nil error is
// answered 70 too.
//
// The request's deadline budget is the handler context's deadline. Calls
// made with that context pass what remains of it on.
//
// [WithTLS] serves over TLS; [RemotePeer] tells a handler who called.
// [WithInterceptor] wraps every call; [RequireToken] and
// [RequirePeerIdentity] are ready interceptors. They are credential checks
// ([CredentialCheck]): a health check passes them unless
// [WithHealthCredentials] says otherwise. docs/security.md has the whole
// story.
package dabb
